//! Which paths belong to locus: a path under the mount prefix (`LOCUS_MOUNT`, default
//! `/locus`), after `.`, `..` and repeated slashes are folded lexically — the file system
//! has no symbolic links, so folding `..` by name is what the kernel would do. The prefix
//! itself is the file system's root; `/locusx` is not under `/locus`.

/// Where a path leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Inside the file system: the absolute path there (`/` for the mount point itself), and
    /// whether the caller's path ended in `/` (only a directory satisfies that).
    Locus { path: String, trailing_slash: bool },
    /// Elsewhere: the kernel's business.
    Kernel,
}

/// Folds `path` (absolute) to its normal form: no `.`, no `..`, no empty names. `None` for
/// a relative path.
pub fn normalize(path: &[u8]) -> Option<Vec<u8>> {
    if path.first() != Some(&b'/') {
        return None;
    }
    let mut names: Vec<&[u8]> = Vec::new();
    for name in path.split(|&b| b == b'/') {
        match name {
            b"" | b"." => {}
            b".." => {
                names.pop();
            }
            name => names.push(name),
        }
    }
    let mut out = Vec::with_capacity(path.len());
    for name in &names {
        out.push(b'/');
        out.extend_from_slice(name);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    Some(out)
}

/// The mount prefix, normalized.
#[derive(Debug, Clone)]
pub struct MountPrefix {
    prefix: Vec<u8>,
}

impl MountPrefix {
    /// `prefix` must be absolute and not `/` (everything would be locus, the volume too).
    pub fn new(prefix: &str) -> Result<Self, String> {
        let prefix = normalize(prefix.as_bytes())
            .ok_or_else(|| format!("LOCUS_MOUNT={prefix}: not an absolute path"))?;
        if prefix == b"/" {
            return Err("LOCUS_MOUNT=/: the mount prefix cannot be the root".into());
        }
        Ok(Self { prefix })
    }

    /// The prefix, e.g. `/locus`.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// True when the (absolute) `path` lies under the prefix; cheap enough for every call:
    /// paths that do not even start with the prefix's bytes are answered by one comparison.
    pub fn classify(&self, path: &[u8]) -> Target {
        if !path.starts_with(&self.prefix[..1]) {
            return Target::Kernel;
        }
        // Fast exit before allocating: a path that neither starts with the prefix nor holds
        // a `.` name (which could fold onto it) is the kernel's.
        if !path.starts_with(&self.prefix) && !path.windows(2).any(|w| w == b"/.") {
            return Target::Kernel;
        }
        let Some(normal) = normalize(path) else {
            return Target::Kernel;
        };
        let rest = match normal.strip_prefix(self.prefix.as_slice()) {
            Some(b"") => b"/".as_slice(),
            Some(rest) if rest.starts_with(b"/") => rest,
            _ => return Target::Kernel,
        };
        match std::str::from_utf8(rest) {
            Ok(inner) => Target::Locus {
                path: inner.to_owned(),
                trailing_slash: path.ends_with(b"/") && inner != "/",
            },
            // The file system's names are UTF-8; a name that is not cannot exist there.
            Err(_) => Target::Locus {
                path: String::from_utf8_lossy(rest).into_owned(),
                trailing_slash: false,
            },
        }
    }

    /// The outside path of an inside one (`/a` → `/locus/a`), as the kernel would see it.
    pub fn outside(&self, inner: &str) -> Vec<u8> {
        let mut out = self.prefix.clone();
        if inner != "/" {
            out.extend_from_slice(inner.as_bytes());
        }
        out
    }

    /// Resolves `relative` against the locus directory `dir` (an inside path): the result
    /// may leave the file system through `..`.
    pub fn join(&self, dir: &str, relative: &[u8]) -> (Target, Vec<u8>) {
        let mut full = self.outside(dir);
        full.push(b'/');
        full.extend_from_slice(relative);
        let normal = normalize(&full).expect("absolute");
        let mut target = self.classify(&normal);
        if let Target::Locus { trailing_slash, .. } = &mut target {
            *trailing_slash = relative.ends_with(b"/");
        }
        (target, normal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn locus(path: &str) -> Target {
        Target::Locus {
            path: path.into(),
            trailing_slash: false,
        }
    }

    #[test]
    fn paths_under_the_prefix_are_locus_and_others_are_not() {
        let m = MountPrefix::new("/locus/").unwrap();
        assert_eq!(m.prefix(), b"/locus");
        assert_eq!(m.classify(b"/locus"), locus("/"));
        assert_eq!(m.classify(b"/locus/a/b"), locus("/a/b"));
        assert_eq!(m.classify(b"//locus//a/./b"), locus("/a/b"));
        assert_eq!(m.classify(b"/tmp/../locus/a"), locus("/a"));
        assert_eq!(m.classify(b"/locus/a/../../etc"), Target::Kernel);
        assert_eq!(m.classify(b"/locusx/a"), Target::Kernel);
        assert_eq!(m.classify(b"/loc"), Target::Kernel);
        assert_eq!(m.classify(b"locus/a"), Target::Kernel);
        assert_eq!(m.classify(b"/dev/shm/locus/node0.pmem"), Target::Kernel);
        assert_eq!(
            m.classify(b"/locus/d/"),
            Target::Locus {
                path: "/d".into(),
                trailing_slash: true
            }
        );
    }

    #[test]
    fn relative_paths_resolve_against_locus_directories() {
        let m = MountPrefix::new("/locus").unwrap();
        assert_eq!(m.join("/d", b"f").0, locus("/d/f"));
        assert_eq!(m.join("/", b"./f").0, locus("/f"));
        let (target, path) = m.join("/d", b"../../etc/passwd");
        assert_eq!(target, Target::Kernel);
        assert_eq!(path, b"/etc/passwd");
    }

    #[test]
    fn bad_prefixes_are_refused() {
        assert!(MountPrefix::new("/").is_err());
        assert!(MountPrefix::new("/a/..").is_err());
        assert!(MountPrefix::new("relative").is_err());
    }
}
