//! Extended attributes: named values an inode carries besides its data (`setfattr`,
//! `cp --preserve=xattr`, `rsync -X`, `tar --xattrs`). Each inode keeps its own map in DRAM;
//! a set or a removal is one journal record, a snapshot stores every map. The limits are
//! the kernel's for one attribute (name 255 bytes, value 64 KiB) and 256 KiB of names and
//! values per inode. Byte layout: docs/format/fs-metadata.md.

use std::collections::BTreeMap;

use crate::codec::{Decoder, Encoder};
use crate::error::{FsError, Result};

/// Longest name, in bytes (the kernel's `XATTR_NAME_MAX`).
pub const MAX_XATTR_NAME: usize = 255;
/// Largest value, in bytes (the kernel's `XATTR_SIZE_MAX`).
pub const MAX_XATTR_VALUE: usize = 64 << 10;
/// Most bytes of names and values one inode carries.
pub const MAX_XATTR_BYTES: usize = 256 << 10;

/// An inode's extended attributes, by name.
pub(crate) type Xattrs = BTreeMap<String, Box<[u8]>>;

/// How a set treats an existing attribute of the name (`setxattr(2)`'s flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XattrSet {
    /// Create it or replace it.
    #[default]
    Any,
    /// Create it; `Exists` (`EEXIST`) if it is there (`XATTR_CREATE`).
    Create,
    /// Replace it; `NoData` (`ENODATA`) if it is not (`XATTR_REPLACE`).
    Replace,
}

/// Checks a name: 1..=255 bytes, no NUL, in a namespace locus stores — `user.`, `trusted.`
/// and `security.` — or one of the two POSIX ACLs (`system.posix_acl_access`,
/// `system.posix_acl_default`, whose values [`crate::acl`] checks and keeps in step with
/// the mode). Other `system.` names and `security.capability` are `NotSupported`: the
/// kernel would have to act on them (drop the capability on a write), and storing them
/// unenforced would mislead.
pub fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_XATTR_NAME || name.contains('\0') {
        return Err(FsError::Invalid(format!(
            "extended attribute name of {} bytes (1..={MAX_XATTR_NAME}, no NUL)",
            name.len()
        )));
    }
    let stored = ["user.", "trusted.", "security."]
        .iter()
        .any(|prefix| name.len() > prefix.len() && name.starts_with(prefix));
    if (!stored || name == "security.capability") && !crate::acl::is_acl(name) {
        return Err(FsError::NotSupported(format!(
            "extended attribute {name}: locus stores user., trusted. and security. names \
             (not security.capability) and POSIX ACLs"
        )));
    }
    Ok(())
}

/// Checks a value's length.
pub(crate) fn check_value(name: &str, value: &[u8]) -> Result<()> {
    if value.len() > MAX_XATTR_VALUE {
        return Err(FsError::TooBig(format!(
            "extended attribute {name}: a value of {} bytes (at most {MAX_XATTR_VALUE})",
            value.len()
        )));
    }
    Ok(())
}

/// Bytes `name = value` counts against [`MAX_XATTR_BYTES`] and adds to a snapshot.
pub(crate) fn entry_bytes(name: &str, value: &[u8]) -> usize {
    2 + name.len() + 4 + value.len()
}

/// Writes one attribute: u16 name length, name, u32 value length, value.
pub(crate) fn encode(e: &mut Encoder, name: &str, value: &[u8]) {
    e.u16(name.len() as u16);
    e.0.extend_from_slice(name.as_bytes());
    e.u32(value.len() as u32);
    e.0.extend_from_slice(value);
}

/// Reads a name written by [`encode`], checked as [`check_name`] checks it.
pub(crate) fn decode_name(d: &mut Decoder<'_>) -> Result<String> {
    let len = d.u16("extended attribute name length")? as usize;
    let bytes = d.take(len, "extended attribute name")?;
    let name =
        std::str::from_utf8(bytes).map_err(|_| d.error("extended attribute name is not UTF-8"))?;
    check_name(name).map_err(|e| d.error(e.to_string()))?;
    Ok(name.to_owned())
}

/// Reads one attribute written by [`encode`]; a POSIX ACL's value must be a valid ACL
/// (or empty, the removals and "no ACL" records write).
pub(crate) fn decode(d: &mut Decoder<'_>) -> Result<(String, Box<[u8]>)> {
    let name = decode_name(d)?;
    let len = d.u32("extended attribute value length")? as usize;
    if len > MAX_XATTR_VALUE {
        return Err(d.error(format!(
            "extended attribute {name} has a value of {len} bytes (at most {MAX_XATTR_VALUE})"
        )));
    }
    let value = d.take(len, "extended attribute value")?;
    if crate::acl::is_acl(&name) && !value.is_empty() {
        crate::acl::Acl::decode(&name, value).map_err(|e| d.error(e.to_string()))?;
    }
    Ok((name, value.into()))
}

/// Whether `name` may be set to `value` in `attrs` as `how` asks, and if not, why.
pub(crate) fn check_set(attrs: &Xattrs, name: &str, value: &[u8], how: XattrSet) -> Result<()> {
    let old = attrs.get(name);
    match (how, old) {
        (XattrSet::Create, Some(_)) => {
            return Err(FsError::Exists(format!("extended attribute {name}")));
        }
        (XattrSet::Replace, None) => {
            return Err(FsError::NoData(format!("extended attribute {name}")));
        }
        _ => {}
    }
    let used: usize = attrs.iter().map(|(n, v)| entry_bytes(n, v)).sum();
    let after = used - old.map_or(0, |v| entry_bytes(name, v)) + entry_bytes(name, value);
    if after > MAX_XATTR_BYTES {
        return Err(FsError::XattrFull(format!(
            "extended attribute {name}: the inode's attributes would take {after} bytes \
             (at most {MAX_XATTR_BYTES})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_outside_the_stored_namespaces_are_refused_by_kind() {
        check_name("user.a").unwrap();
        check_name("trusted.overlay.opaque").unwrap();
        check_name("security.selinux").unwrap();
        assert!(matches!(check_name("user."), Err(FsError::NotSupported(_))));
        check_name("system.posix_acl_access").unwrap();
        check_name("system.posix_acl_default").unwrap();
        assert!(matches!(
            check_name("system.posix_acl_other"),
            Err(FsError::NotSupported(_))
        ));
        assert!(matches!(
            check_name("system.nfs4_acl"),
            Err(FsError::NotSupported(_))
        ));
        assert!(matches!(
            check_name("security.capability"),
            Err(FsError::NotSupported(_))
        ));
        assert!(matches!(check_name("plain"), Err(FsError::NotSupported(_))));
        assert!(matches!(check_name(""), Err(FsError::Invalid(_))));
        assert!(matches!(
            check_name(&format!("user.{}", "x".repeat(251))),
            Err(FsError::Invalid(_))
        ));
        check_name(&format!("user.{}", "x".repeat(250))).unwrap();
    }

    #[test]
    fn sets_are_checked_against_flags_and_the_inode_s_room() {
        let mut attrs = Xattrs::new();
        check_set(&attrs, "user.a", b"1", XattrSet::Any).unwrap();
        assert!(matches!(
            check_set(&attrs, "user.a", b"1", XattrSet::Replace),
            Err(FsError::NoData(_))
        ));
        for name in ["user.a", "user.b", "user.c"] {
            attrs.insert(name.into(), vec![0; MAX_XATTR_VALUE].into());
        }
        check_set(&attrs, "user.d", &[0; MAX_XATTR_VALUE - 100], XattrSet::Any).unwrap();
        attrs.insert("user.d".into(), vec![0; MAX_XATTR_VALUE - 100].into());
        assert!(matches!(
            check_set(&attrs, "user.a", b"1", XattrSet::Create),
            Err(FsError::Exists(_))
        ));
        // Full: a replacement that shrinks fits, a new attribute does not.
        check_set(&attrs, "user.a", b"1", XattrSet::Replace).unwrap();
        assert!(matches!(
            check_set(&attrs, "user.e", &[0; 100], XattrSet::Any),
            Err(FsError::XattrFull(_))
        ));
        assert!(matches!(
            check_value("user.c", &[0; MAX_XATTR_VALUE + 1]),
            Err(FsError::TooBig(_))
        ));
    }

    #[test]
    fn an_attribute_round_trips_and_garbage_is_named() {
        let mut e = Encoder::default();
        encode(&mut e, "user.k", b"value\0with nul");
        let mut d = Decoder::new(&e.0, "test");
        let (name, value) = decode(&mut d).unwrap();
        assert_eq!(
            (name.as_str(), &*value),
            ("user.k", &b"value\0with nul"[..])
        );
        let mut bad = Encoder::default();
        encode(&mut bad, "system.x", b"");
        let err = decode(&mut Decoder::new(&bad.0, "test")).unwrap_err();
        assert!(err.to_string().contains("system.x"), "{err}");
        let err = decode(&mut Decoder::new(&e.0[..e.0.len() - 1], "test")).unwrap_err();
        assert!(
            err.to_string().contains("extended attribute value"),
            "{err}"
        );
    }
}
