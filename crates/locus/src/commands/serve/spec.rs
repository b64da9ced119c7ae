//! `--export NAME=fs:/PATH[,size=SIZE][,ro]` and `--export
//! NAME=cache:PATH,nvram=SIZE,dram=SIZE[,policy=nbm|nvlru|lru]`, parsed into a [`Spec`].

use exports::{CacheSpec, ExportSpec};

/// One `--export`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    /// A file of the file system.
    Fs(ExportSpec),
    /// A cache device over a backing store.
    Cache(CacheSpec),
}

impl Spec {
    pub fn name(&self) -> &str {
        match self {
            Spec::Fs(s) => &s.name,
            Spec::Cache(s) => &s.name,
        }
    }
}

/// Parses one `--export`.
pub fn parse(text: &str) -> Result<Spec, String> {
    let (name, rest) = text.split_once('=').ok_or_else(|| {
        format!(
            "{text:?}: expected NAME=fs:/PATH[,size=SIZE][,ro] or \
             NAME=cache:PATH,nvram=SIZE,dram=SIZE[,policy=nbm|nvlru|lru]"
        )
    })?;
    if name.is_empty() || name.len() > nbd::consts::MAX_STRING_BYTES {
        return Err(format!("{text:?}: the export name must be 1 to 4096 bytes"));
    }
    if let Some(cache) = rest.strip_prefix("cache:") {
        return parse_cache(text, name, cache).map(Spec::Cache);
    }
    parse_fs(text, name, rest).map(Spec::Fs)
}

/// `cache:PATH,nvram=SIZE,dram=SIZE[,policy=nbm|nvlru|lru]`.
fn parse_cache(text: &str, name: &str, rest: &str) -> Result<CacheSpec, String> {
    exports::check_cache_name(name).map_err(|e| format!("{text:?}: {e}"))?;
    let mut parts = rest.split(',');
    let backing = parts.next().unwrap_or_default();
    if backing.is_empty() {
        return Err(format!(
            "{text:?}: cache:PATH needs the backing store's path (a block device or a file)"
        ));
    }
    let (mut nvram, mut dram, mut policy) = (None, None, cachedev::PolicyKind::Nbm);
    let mut writeback: Option<Option<cachedev::Watermarks>> = None;
    let block = u64::from(cachedev::BLOCK_BYTES);
    let size = |what: &str, value: &str| -> Result<u64, String> {
        let bytes = crate::size::parse_size(value).map_err(|e| format!("{text:?}: {e}"))?;
        if !bytes.is_multiple_of(block) {
            return Err(format!(
                "{text:?}: {what}={value} is not a multiple of the {block}-byte block"
            ));
        }
        Ok(bytes)
    };
    for part in parts {
        match part.split_once('=') {
            Some(("nvram", v)) => nvram = Some(size("nvram", v)?),
            Some(("dram", v)) => dram = Some(size("dram", v)?),
            Some(("policy", "nbm")) => policy = cachedev::PolicyKind::Nbm,
            Some(("policy", "nvlru")) => policy = cachedev::PolicyKind::NvLru,
            Some(("policy", "lru")) => policy = cachedev::PolicyKind::Lru,
            Some(("writeback", "off")) => writeback = Some(None),
            Some(("writeback", marks)) => {
                let parsed = marks.split_once(':').and_then(|(high, low)| {
                    Some(cachedev::Watermarks {
                        high: high.parse().ok()?,
                        low: low.parse().ok()?,
                    })
                });
                match parsed {
                    Some(w) if w.low < w.high && w.high <= 100 => writeback = Some(Some(w)),
                    _ => {
                        return Err(format!(
                            "{text:?}: writeback={marks}: expected HIGH:LOW percentages with \
                             LOW < HIGH <= 100 (e.g. 90:70), or off"
                        ));
                    }
                }
            }
            Some(("policy", other)) => {
                return Err(format!(
                    "{text:?}: unknown policy {other:?} (nbm, nvlru or lru)"
                ));
            }
            _ => {
                return Err(format!(
                    "{text:?}: unknown setting {part:?} (nvram=SIZE, dram=SIZE, \
                     policy=nbm|nvlru|lru, writeback=HIGH:LOW|off)"
                ));
            }
        }
    }
    let (Some(nvram_bytes), Some(dram_bytes)) = (nvram, dram) else {
        return Err(format!(
            "{text:?}: a cache export needs nvram=SIZE and dram=SIZE"
        ));
    };
    if nvram_bytes == 0 {
        return Err(format!("{text:?}: nvram must hold at least one block"));
    }
    // Background write-back by default where the policy has an order for it.
    let writeback = match writeback {
        Some(Some(_)) if policy == cachedev::PolicyKind::Lru => {
            return Err(format!(
                "{text:?}: lru has no write-back order of its own; writeback= needs nbm or nvlru"
            ));
        }
        Some(w) => w,
        None if policy == cachedev::PolicyKind::Lru => None,
        None => Some(cachedev::Watermarks::DEFAULT),
    };
    Ok(CacheSpec {
        name: name.to_owned(),
        backing: backing.into(),
        config: cachedev::CacheConfig {
            nvram_bytes,
            dram_bytes,
            policy,
            writeback,
        },
    })
}

/// `fs:/PATH[,size=SIZE][,ro]`.
fn parse_fs(text: &str, name: &str, rest: &str) -> Result<ExportSpec, String> {
    let mut parts = rest.split(',');
    let target = parts.next().unwrap_or_default();
    let path = target.strip_prefix("fs:").ok_or_else(|| {
        format!(
            "{text:?}: the export must be a file system path, fs:/PATH, or a cache, \
             cache:PATH"
        )
    })?;
    if !path.starts_with('/') || path == "/" {
        return Err(format!(
            "{text:?}: {path:?} is not an absolute file path in the file system"
        ));
    }
    let mut spec = ExportSpec {
        name: name.to_owned(),
        path: path.to_owned(),
        size: None,
        read_only: false,
    };
    for part in parts {
        match part.split_once('=') {
            Some(("size", size)) => {
                let size = crate::size::parse_size(size).map_err(|e| format!("{text:?}: {e}"))?;
                spec.size = Some(exports::check_size(size).map_err(|e| format!("{text:?}: {e}"))?);
            }
            None if part == "ro" => spec.read_only = true,
            None if part == "rw" => spec.read_only = false,
            _ => {
                return Err(format!(
                    "{text:?}: unknown setting {part:?} (size=SIZE, ro)"
                ));
            }
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_specs_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse("disk=fs:/vm/disk.img,size=2G,ro"),
            Ok(Spec::Fs(ExportSpec {
                name: "disk".into(),
                path: "/vm/disk.img".into(),
                size: Some(2 << 30),
                read_only: true
            }))
        );
        assert!(matches!(
            parse("d=fs:/x"),
            Ok(Spec::Fs(ExportSpec {
                size: None,
                read_only: false,
                ..
            }))
        ));
        assert_eq!(
            parse("c=cache:/dev/vdb,nvram=64M,dram=16M,policy=nvlru"),
            Ok(Spec::Cache(CacheSpec {
                name: "c".into(),
                backing: "/dev/vdb".into(),
                config: cachedev::CacheConfig {
                    nvram_bytes: 64 << 20,
                    dram_bytes: 16 << 20,
                    policy: cachedev::PolicyKind::NvLru,
                    writeback: Some(cachedev::Watermarks::DEFAULT),
                }
            }))
        );
        match parse("c=cache:/b,nvram=4K,dram=4K,writeback=80:40") {
            Ok(Spec::Cache(c)) => assert_eq!(
                c.config.writeback,
                Some(cachedev::Watermarks { high: 80, low: 40 })
            ),
            other => panic!("{other:?}"),
        }
        match parse("c=cache:/b,nvram=4K,dram=4K,policy=lru") {
            Ok(Spec::Cache(c)) => assert_eq!(c.config.writeback, None),
            other => panic!("{other:?}"),
        }
        for (bad, says) in [
            ("disk", "expected NAME=fs:/PATH"),
            ("d=/x", "cache:PATH"),
            ("=fs:/x", "1 to 4096 bytes"),
            ("d=/x", "fs:/PATH"),
            ("d=fs:x", "absolute"),
            ("d=fs:/", "absolute"),
            ("d=fs:/x,size=1000", "multiple of 512"),
            ("d=fs:/x,size=lots", "lots"),
            ("d=fs:/x,fast", "unknown setting"),
            ("c=cache:/b,nvram=1M", "nvram=SIZE and dram=SIZE"),
            (
                "c=cache:/b,nvram=1M,dram=1000",
                "not a multiple of the 4096-byte block",
            ),
            ("c=cache:/b,nvram=0,dram=4K", "at least one block"),
            ("c=cache:/b,nvram=4K,dram=4K,policy=arc", "unknown policy"),
            ("c=cache:,nvram=4K,dram=4K", "backing store's path"),
            ("c=cache:/b,nvram=4K,dram=4K,writeback=40:80", "LOW < HIGH"),
            ("c=cache:/b,nvram=4K,dram=4K,writeback=90", "HIGH:LOW"),
            (
                "c=cache:/b,nvram=4K,dram=4K,policy=lru,writeback=90:70",
                "no write-back order",
            ),
            ("a/b=cache:/b,nvram=4K,dram=4K", "names its NVRAM file"),
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
