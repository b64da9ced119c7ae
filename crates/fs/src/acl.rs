//! POSIX access control lists (`setfacl`, `getfacl`, `cp -a`, `rsync -A`, `tar --acls`).
//! They are the extended attributes [`ACCESS`] and [`DEFAULT`] in the kernel's byte
//! layout, kept in step with the permission bits as the kernel's file systems keep them:
//! an access ACL's owner, group-class and other entries are the mode's three digits (a
//! `chmod` changes both, in one journal record), an ACL that says no more than a mode is
//! stored as that mode alone, and what is made in a directory with a default ACL inherits
//! it. Enforcing them is the kernel's work: through `locus mount` it checks every access
//! against them; the file system validates, stores and inherits.
//!
//! Layout (little-endian): a u32 version (2), then 8-byte entries — u16 tag, u16
//! permissions (rwx = 4, 2, 1), u32 user or group id (named entries only) — in the order
//! owner, named users by id, owning group, named groups by id, mask, other.

use crate::error::{FsError, Result};

/// The access ACL's attribute name.
pub const ACCESS: &str = "system.posix_acl_access";
/// A directory's default ACL, which what is made in it inherits.
pub const DEFAULT: &str = "system.posix_acl_default";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
/// The id of an entry that names no one.
const NO_ID: u32 = u32::MAX;

/// One entry: whom (`tag`, and `id` for a named user or group) and what (`perm`, rwx).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

/// A decoded, valid ACL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Acl(Vec<Entry>);

/// Whether `name` is one of the two ACL attributes.
pub(crate) fn is_acl(name: &str) -> bool {
    name == ACCESS || name == DEFAULT
}

impl Acl {
    /// Reads and checks `bytes`, the value of attribute `name`: the kernel's checks (one
    /// owner, owning-group and other entry; a mask when anything is named; entries in order,
    /// ids increasing; rwx permissions only), each failure naming the problem.
    pub(crate) fn decode(name: &str, bytes: &[u8]) -> Result<Acl> {
        let bad = |what: String| FsError::Invalid(format!("{name}: {what}"));
        if bytes.len() < 4 || !(bytes.len() - 4).is_multiple_of(8) {
            return Err(bad(format!(
                "{} bytes are not a 4-byte header and 8-byte entries",
                bytes.len()
            )));
        }
        let version = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(bad(format!(
                "version {version}; locus reads version {VERSION}"
            )));
        }
        let mut entries = Vec::with_capacity((bytes.len() - 4) / 8);
        for (i, raw) in bytes[4..].chunks_exact(8).enumerate() {
            let entry = Entry {
                tag: u16::from_le_bytes([raw[0], raw[1]]),
                perm: u16::from_le_bytes([raw[2], raw[3]]),
                id: u32::from_le_bytes(raw[4..8].try_into().expect("4 bytes")),
            };
            if !matches!(
                entry.tag,
                USER_OBJ | USER | GROUP_OBJ | GROUP | MASK | OTHER
            ) {
                return Err(bad(format!("entry {i} has tag {:#x}", entry.tag)));
            }
            if entry.perm & !7 != 0 {
                return Err(bad(format!(
                    "entry {i} has permissions {:#o}, beyond rwx",
                    entry.perm
                )));
            }
            if let Some(prev) = entries.last().copied() {
                let Entry { tag, id, .. } = prev;
                let in_order = tag < entry.tag
                    || (tag == entry.tag && matches!(tag, USER | GROUP) && id < entry.id);
                if !in_order {
                    return Err(bad(format!(
                        "entry {i} (tag {:#x}, id {}) is out of order or repeated",
                        entry.tag, entry.id
                    )));
                }
            }
            entries.push(entry);
        }
        let acl = Acl(entries);
        for (tag, what) in [
            (USER_OBJ, "owner"),
            (GROUP_OBJ, "owning group"),
            (OTHER, "other"),
        ] {
            if acl.find(tag).is_none() {
                return Err(bad(format!("no {what} entry")));
            }
        }
        if acl.named() && acl.find(MASK).is_none() {
            return Err(bad("named users or groups but no mask entry".into()));
        }
        Ok(acl)
    }

    /// The attribute's bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 8 * self.0.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.0 {
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            let id = if matches!(e.tag, USER | GROUP) {
                e.id
            } else {
                NO_ID
            };
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    fn find(&self, tag: u16) -> Option<usize> {
        self.0.iter().position(|e| e.tag == tag)
    }

    fn perm(&self, tag: u16) -> u32 {
        self.find(tag).map_or(0, |i| u32::from(self.0[i].perm))
    }

    /// Whether it names users or groups besides the owner and the owning group.
    fn named(&self) -> bool {
        self.0.iter().any(|e| matches!(e.tag, USER | GROUP))
    }

    /// The permission digits it gives — owner, group class (the mask when there is one,
    /// else the owning group), other — over `mode`'s other bits; and whether it says no
    /// more than that mode (nothing named: it is then kept as the mode alone).
    pub(crate) fn mode(&self, mode: u32) -> (u32, bool) {
        let group = if self.find(MASK).is_some() {
            self.perm(MASK)
        } else {
            self.perm(GROUP_OBJ)
        };
        let digits = self.perm(USER_OBJ) << 6 | group << 3 | self.perm(OTHER);
        ((mode & !0o777) | digits, !self.named())
    }

    /// Sets each of the owner, group-class (the mask when there is one, else the owning
    /// group) and other entries to `f(its permissions, mode's digit for it)`.
    fn with_mode_digits(&mut self, mode: u32, f: impl Fn(u16, u16) -> u16) {
        let group_tag = if self.find(MASK).is_some() {
            MASK
        } else {
            GROUP_OBJ
        };
        for e in &mut self.0 {
            let shift = match e.tag {
                USER_OBJ => 6,
                t if t == group_tag => 3,
                OTHER => 0,
                _ => continue,
            };
            e.perm = f(e.perm, ((mode >> shift) & 7) as u16);
        }
    }

    /// `chmod`: the owner, group-class and other entries take `mode`'s digits.
    pub(crate) fn chmod(&mut self, mode: u32) {
        self.with_mode_digits(mode, |_, digit| digit);
    }

    /// What a file or directory made with `mode` in a directory whose default ACL this is
    /// gets: its access ACL (`None` when the mode says it all) and its mode. The creator's
    /// `mode` limits the owner, group-class and other entries; the umask plays no part.
    pub(crate) fn inherit(&self, mode: u32) -> (Option<Acl>, u32) {
        let mut acl = self.clone();
        acl.with_mode_digits(mode, |perm, digit| perm & digit);
        let (mode, plain) = acl.mode(mode);
        ((!plain).then_some(acl), mode)
    }

    /// The group digit that gives the owning group only what this ACL gives it (its entry
    /// limited by the mask): the mode a file can hold safely before its ACL is stored.
    pub(crate) fn owning_group_only(&self, mode: u32) -> u32 {
        let group = self.perm(GROUP_OBJ) & ((mode >> 3) & 7);
        (mode & !0o070) | group << 3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let acl = Acl(entries
            .iter()
            .map(|&(tag, perm, id)| Entry { tag, perm, id })
            .collect());
        acl.encode()
    }

    /// `user::rw- user:1000:rwx group::r-- mask::rwx other::---`
    fn named() -> Vec<u8> {
        acl(&[
            (USER_OBJ, 6, NO_ID),
            (USER, 7, 1000),
            (GROUP_OBJ, 4, NO_ID),
            (MASK, 7, NO_ID),
            (OTHER, 0, NO_ID),
        ])
    }

    #[test]
    fn an_acl_reads_back_and_gives_its_mode() {
        let bytes = named();
        let a = Acl::decode(ACCESS, &bytes).unwrap();
        assert_eq!(a.encode(), bytes);
        assert_eq!(a.mode(0o100_000 | 0o4000), (0o104_670, false));
        let plain = acl(&[
            (USER_OBJ, 7, NO_ID),
            (GROUP_OBJ, 5, NO_ID),
            (OTHER, 1, NO_ID),
        ]);
        assert_eq!(Acl::decode(ACCESS, &plain).unwrap().mode(0), (0o751, true));
    }

    #[test]
    fn garbage_is_refused_naming_the_problem() {
        let refused = |bytes: &[u8], what: &str| {
            let e = Acl::decode(ACCESS, bytes).unwrap_err().to_string();
            assert!(e.contains(what), "{e} lacks {what}");
        };
        refused(&[2, 0, 0], "header");
        refused(&named()[..11], "8-byte entries");
        let mut v3 = named();
        v3[0] = 3;
        refused(&v3, "version 3");
        refused(
            &acl(&[(USER_OBJ, 6, NO_ID), (GROUP_OBJ, 4, NO_ID), (0x40, 0, 0)]),
            "tag 0x40",
        );
        refused(
            &acl(&[
                (USER_OBJ, 8, NO_ID),
                (GROUP_OBJ, 4, NO_ID),
                (OTHER, 0, NO_ID),
            ]),
            "beyond rwx",
        );
        refused(
            &acl(&[
                (GROUP_OBJ, 4, NO_ID),
                (USER_OBJ, 6, NO_ID),
                (OTHER, 0, NO_ID),
            ]),
            "out of order",
        );
        refused(
            &acl(&[
                (USER_OBJ, 6, NO_ID),
                (USER, 4, 7),
                (USER, 4, 7),
                (GROUP_OBJ, 4, NO_ID),
                (MASK, 4, NO_ID),
                (OTHER, 0, NO_ID),
            ]),
            "repeated",
        );
        refused(
            &acl(&[(USER_OBJ, 6, NO_ID), (OTHER, 0, NO_ID)]),
            "owning group",
        );
        refused(
            &acl(&[
                (USER_OBJ, 6, NO_ID),
                (USER, 4, 7),
                (GROUP_OBJ, 4, NO_ID),
                (OTHER, 0, NO_ID),
            ]),
            "no mask",
        );
    }

    #[test]
    fn chmod_sets_the_owner_mask_and_other_entries() {
        let mut a = Acl::decode(ACCESS, &named()).unwrap();
        a.chmod(0o640);
        assert_eq!(a.mode(0), (0o640, false));
        // The named user and the owning group keep their entries; the mask limits them.
        assert_eq!(a.perm(USER), 7);
        assert_eq!(a.perm(GROUP_OBJ), 4);
        assert_eq!(a.perm(MASK), 4);
    }

    #[test]
    fn what_is_made_inherits_the_default_acl_limited_by_its_mode() {
        let default = Acl::decode(DEFAULT, &named()).unwrap();
        let (access, mode) = default.inherit(0o100_666);
        assert_eq!(mode, 0o100_660);
        let access = access.unwrap();
        assert_eq!(access.perm(USER), 7, "named entries are kept");
        assert_eq!(access.perm(MASK), 6, "the mask is limited by the mode");
        assert_eq!(default.owning_group_only(mode), 0o100_640);
        let plain = acl(&[
            (USER_OBJ, 7, NO_ID),
            (GROUP_OBJ, 5, NO_ID),
            (OTHER, 0, NO_ID),
        ]);
        let (access, mode) = Acl::decode(DEFAULT, &plain).unwrap().inherit(0o40_777);
        assert_eq!((access, mode), (None, 0o40_750));
    }
}
