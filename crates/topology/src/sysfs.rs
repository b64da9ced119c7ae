//! Reading sysfs files under a configurable root, with errors that name the file.
//!
//! Every read in this crate goes through [`Sysfs`], so fixture trees in tests and the real
//! `/sys` take exactly the same paths, and no error can lose the name of its file.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{Result, TopologyError};

/// Largest sysfs attribute we read. The kernel caps attributes at one page; a file bigger
/// than this is not a sysfs attribute and is refused before it is read whole.
const MAX_ATTRIBUTE_BYTES: u64 = 64 * 1024;

/// A sysfs tree: `/sys` on a live machine, a fixture directory in tests.
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
}

impl Sysfs {
    /// A sysfs tree rooted at `root` (the directory that holds `devices/`, `class/`, `bus/`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root this tree reads from.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The full path of `relative` inside this tree.
    pub fn path(&self, relative: impl AsRef<Path>) -> PathBuf {
        self.root.join(relative)
    }

    /// Reads an attribute that must exist.
    pub fn read(&self, relative: impl AsRef<Path>) -> Result<String> {
        let path = self.path(relative);
        read_attribute(&path).map_err(|source| TopologyError::Read { path, source })
    }

    /// Reads an attribute that may be absent; any other failure is an error.
    pub fn read_optional(&self, relative: impl AsRef<Path>) -> Result<Option<String>> {
        let path = self.path(relative);
        match read_attribute(&path) {
            Ok(text) => Ok(Some(text)),
            Err(source) if source.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(TopologyError::Read { path, source }),
        }
    }

    /// Reads an attribute holding one unsigned decimal number.
    pub fn read_u64(&self, relative: impl AsRef<Path>) -> Result<u64> {
        let relative = relative.as_ref();
        let text = self.read(relative)?;
        parse_u64(&text).map_err(|problem| TopologyError::malformed(self.path(relative), problem))
    }

    /// Reads an optional attribute holding one unsigned decimal number.
    pub fn read_u64_optional(&self, relative: impl AsRef<Path>) -> Result<Option<u64>> {
        let relative = relative.as_ref();
        match self.read_optional(relative)? {
            None => Ok(None),
            Some(text) => parse_u64(&text)
                .map(Some)
                .map_err(|problem| TopologyError::malformed(self.path(relative), problem)),
        }
    }

    /// Reads a `numa_node` attribute: a node id, or -1 for "no affinity".
    pub fn read_numa_node(&self, relative: impl AsRef<Path>) -> Result<Option<u32>> {
        let relative = relative.as_ref();
        let text = self.read(relative)?;
        parse_numa_node(&text)
            .map_err(|problem| TopologyError::malformed(self.path(relative), problem))
    }

    /// Names in a directory that must exist, sorted so output never depends on readdir order.
    pub fn list(&self, relative: impl AsRef<Path>) -> Result<Vec<String>> {
        let path = self.path(relative);
        list_dir(&path).map_err(|source| TopologyError::Read { path, source })
    }

    /// Names in a directory that may be absent (a subsystem the kernel was built without).
    pub fn list_optional(&self, relative: impl AsRef<Path>) -> Result<Vec<String>> {
        let path = self.path(relative);
        match list_dir(&path) {
            Ok(names) => Ok(names),
            Err(source) if source.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(source) => Err(TopologyError::Read { path, source }),
        }
    }

    /// Whether `relative` exists (following symlinks).
    pub fn exists(&self, relative: impl AsRef<Path>) -> bool {
        self.path(relative).exists()
    }
}

fn read_attribute(path: &Path) -> io::Result<String> {
    use std::io::Read;
    let file = fs::File::open(path)?;
    let mut text = String::new();
    // `take` bounds the read even when the size in the inode is a lie, as it is for sysfs
    // (every attribute reports 4096).
    let read = file
        .take(MAX_ATTRIBUTE_BYTES + 1)
        .read_to_string(&mut text)?;
    if read as u64 > MAX_ATTRIBUTE_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("longer than {MAX_ATTRIBUTE_BYTES} bytes, not a sysfs attribute"),
        ));
    }
    Ok(text)
}

fn list_dir(path: &Path) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(path)? {
        let entry = entry?;
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_owned());
        }
    }
    names.sort_by(|a, b| natural_cmp(a, b));
    Ok(names)
}

/// Orders `node2` before `node10`: names compare by their text, with digit runs as numbers.
pub fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn split(s: &str) -> (String, Vec<u64>) {
        let mut text = String::new();
        let mut numbers = Vec::new();
        let mut current: Option<u64> = None;
        for c in s.chars() {
            if let Some(d) = c.to_digit(10) {
                current = Some(
                    current
                        .unwrap_or(0)
                        .saturating_mul(10)
                        .saturating_add(d.into()),
                );
            } else {
                if let Some(n) = current.take() {
                    numbers.push(n);
                    text.push('#');
                }
                text.push(c);
            }
        }
        if let Some(n) = current {
            numbers.push(n);
            text.push('#');
        }
        (text, numbers)
    }
    split(a).cmp(&split(b)).then_with(|| a.cmp(b))
}

pub(crate) fn parse_u64(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    trimmed
        .parse()
        .map_err(|_| format!("expected an unsigned number, found `{trimmed}`"))
}

pub(crate) fn parse_numa_node(text: &str) -> Result<Option<u32>, String> {
    let trimmed = text.trim();
    match trimmed.parse::<i64>() {
        Ok(-1) => Ok(None),
        Ok(n) if (0..=i64::from(crate::cpulist::MAX_LIST_ID)).contains(&n) => {
            Ok(Some(u32::try_from(n).expect("range checked")))
        }
        _ => Err(format!("expected a NUMA node id or -1, found `{trimmed}`")),
    }
}

/// The number in a name such as `node12` or `pmem3`, if the name is `prefix` + digits.
pub(crate) fn numbered(name: &str, prefix: &str) -> Option<u32> {
    let digits = name.strip_prefix(prefix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order_sorts_numbers_by_value() {
        let mut names = vec!["node10", "node2", "node1", "dax1.0", "dax0.10", "dax0.2"];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            names,
            ["dax0.2", "dax0.10", "dax1.0", "node1", "node2", "node10"]
        );
    }

    #[test]
    fn numa_node_values() {
        assert_eq!(parse_numa_node("-1\n"), Ok(None));
        assert_eq!(parse_numa_node("3\n"), Ok(Some(3)));
        assert!(parse_numa_node("-2").is_err());
        assert!(parse_numa_node("x").is_err());
    }

    #[test]
    fn numbered_names() {
        assert_eq!(numbered("node12", "node"), Some(12));
        assert_eq!(numbered("nodes", "node"), None);
        assert_eq!(numbered("node", "node"), None);
        assert_eq!(numbered("pmem1s", "pmem"), None);
    }
}
