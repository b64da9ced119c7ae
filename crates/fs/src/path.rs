//! Path and name rules: absolute paths of `/`-separated names, names 1..=255 bytes without
//! `/` or NUL. `.` components are skipped; `..` is refused (a library file system has no
//! current directory to be relative to, and refusing keeps rename cycle checks simple).
//!
//! An absolute path has no length limit, as on kernel file systems: `PATH_MAX` bounds one
//! system call's argument, not how deep a tree grows, and the paths this file system is given
//! are built from a working directory (the preload library) or from a directory's inode
//! (`locus mount`), so a tree made one relative step at a time — `mkdir` in a directory
//! whose own path is already 4000 bytes — goes deeper than any one argument could reach.

use crate::error::{FsError, Result};

/// Longest name in bytes.
pub const MAX_NAME: usize = 255;
/// The kernel's `PATH_MAX`: the longest path one system call takes, its NUL included.
pub const MAX_PATH: usize = 4096;

/// Checks one name.
pub fn check_name(name: &str) -> Result<()> {
    if name.len() > MAX_NAME {
        return Err(FsError::NameTooLong(name.to_owned()));
    }
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(FsError::Invalid(format!(
            "`{name}` is not a valid file name"
        )));
    }
    Ok(())
}

/// Longest symbolic link target in bytes (the kernel's `PATH_MAX` less its NUL).
pub const MAX_TARGET: usize = MAX_PATH - 1;

/// Checks a symbolic link's target: 1..=4095 bytes without NUL. A target is any path,
/// absolute or relative, and may name something outside the file system or nothing at all;
/// whoever follows it decides.
pub fn check_target(target: &str) -> Result<()> {
    if target.len() > MAX_TARGET {
        return Err(FsError::NameTooLong(format!("{}...", &target[..64])));
    }
    if target.is_empty() || target.contains('\0') {
        return Err(FsError::Invalid(format!(
            "`{target}` is not a valid symbolic link target"
        )));
    }
    Ok(())
}

/// The names of an absolute path, in order (empty for `/`).
pub fn components(path: &str) -> Result<Vec<&str>> {
    if !path.starts_with('/') {
        return Err(FsError::Invalid(format!(
            "`{path}` is not an absolute path"
        )));
    }
    let mut out = Vec::new();
    for name in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if name == ".." {
            return Err(FsError::Invalid(format!("`{path}`: `..` is not supported")));
        }
        check_name(name)?;
        out.push(name);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_and_limits_hold() {
        assert_eq!(components("/").unwrap(), Vec::<&str>::new());
        assert_eq!(components("//a/./b/").unwrap(), vec!["a", "b"]);
        assert!(matches!(components("a/b"), Err(FsError::Invalid(_))));
        assert!(matches!(components("/a/../b"), Err(FsError::Invalid(_))));
        let long = "x".repeat(256);
        assert!(matches!(
            components(&format!("/{long}")),
            Err(FsError::NameTooLong(_))
        ));
        assert!(components(&format!("/{}", "x".repeat(255))).is_ok());
        // Deeper than one system call's argument may reach: the names count, not the whole.
        let deep = format!("/{}", "x".repeat(255)).repeat(64);
        assert_eq!(components(&deep).unwrap().len(), 64);
        assert!(matches!(check_name("a\0b"), Err(FsError::Invalid(_))));
    }
}
