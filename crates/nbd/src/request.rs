//! Transmission requests: the 28-byte header, and the checks a server must make before
//! acting on (or allocating for) a request.

use crate::consts::{REQUEST_MAGIC, command, command_flags, errno, transmission_flags};
use crate::error::{NbdError, Result};

/// Bytes of a request header.
pub const REQUEST_BYTES: usize = 28;

/// A decoded request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// `NBD_CMD_FLAG_*`.
    pub flags: u16,
    /// `NBD_CMD_*`.
    pub command: u16,
    /// The client's cookie, echoed in every reply to this request.
    pub cookie: u64,
    /// Offset in the export.
    pub offset: u64,
    /// Length (for writes, the payload that follows).
    pub length: u32,
}

/// What the connection negotiated, which the checks depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Export size.
    pub size_bytes: u64,
    /// Transmission flags sent to the client.
    pub transmission_flags: u16,
    /// Structured replies were negotiated.
    pub structured_replies: bool,
    /// Metadata contexts were selected.
    pub meta_contexts: bool,
    /// Largest payload (and read) the server accepts.
    pub max_payload_bytes: u32,
    /// Requests should be multiples of this (the advertised minimum block size).
    pub min_block_bytes: u32,
}

impl Request {
    /// Decodes a header. A wrong magic leaves no way to find the next request: disconnect.
    pub fn decode(bytes: &[u8; REQUEST_BYTES]) -> Result<Self> {
        let magic = u32::from_be_bytes(bytes[0..4].try_into().expect("4 bytes"));
        if magic != REQUEST_MAGIC {
            return Err(NbdError::Disconnect(format!(
                "request magic {magic:#010x} is not {REQUEST_MAGIC:#010x}"
            )));
        }
        Ok(Self {
            flags: u16::from_be_bytes(bytes[4..6].try_into().expect("2 bytes")),
            command: u16::from_be_bytes(bytes[6..8].try_into().expect("2 bytes")),
            cookie: u64::from_be_bytes(bytes[8..16].try_into().expect("8 bytes")),
            offset: u64::from_be_bytes(bytes[16..24].try_into().expect("8 bytes")),
            length: u32::from_be_bytes(bytes[24..28].try_into().expect("4 bytes")),
        })
    }

    /// Encodes a header (for tests and clients).
    pub fn encode(&self) -> [u8; REQUEST_BYTES] {
        let mut bytes = [0u8; REQUEST_BYTES];
        bytes[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        bytes[4..6].copy_from_slice(&self.flags.to_be_bytes());
        bytes[6..8].copy_from_slice(&self.command.to_be_bytes());
        bytes[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        bytes[16..24].copy_from_slice(&self.offset.to_be_bytes());
        bytes[24..28].copy_from_slice(&self.length.to_be_bytes());
        bytes
    }

    /// Whether a write payload of `length` bytes follows the header (it must be read, or
    /// skipped, even when the request is refused, to keep the stream in step).
    pub fn has_payload(&self) -> bool {
        self.command == command::WRITE
    }

    /// Checks the request against what was negotiated. An oversized write payload is refused
    /// with a disconnect: the server will not read that much to skip it.
    pub fn check(&self, limits: &Limits) -> Result<()> {
        let refuse = |errno: u32, message: String| Err(NbdError::Request { errno, message });
        let flag = |bit: u16| limits.transmission_flags & bit != 0;
        let known_flags = command_flags::FUA
            | command_flags::NO_HOLE
            | command_flags::DF
            | command_flags::REQ_ONE
            | command_flags::FAST_ZERO;
        if self.flags & !known_flags != 0 {
            return refuse(
                errno::EINVAL,
                format!("unknown command flags {:#x}", self.flags),
            );
        }
        if self.has_payload() && self.length > limits.max_payload_bytes {
            return Err(NbdError::Disconnect(format!(
                "write payload of {} bytes exceeds the advertised maximum of {}",
                self.length, limits.max_payload_bytes
            )));
        }
        match self.command {
            command::READ
            | command::WRITE
            | command::TRIM
            | command::WRITE_ZEROES
            | command::CACHE
            | command::BLOCK_STATUS => {}
            command::FLUSH | command::DISC => {
                if self.offset != 0 || self.length != 0 {
                    return refuse(
                        errno::EINVAL,
                        "flush and disconnect take no offset or length".into(),
                    );
                }
                return Ok(());
            }
            other => return refuse(errno::EINVAL, format!("unknown command {other}")),
        }
        let writes = matches!(
            self.command,
            command::WRITE | command::TRIM | command::WRITE_ZEROES
        );
        if writes && flag(transmission_flags::READ_ONLY) {
            return refuse(errno::EPERM, "the export is read-only".into());
        }
        let needs = |command: u16, bit: u16| self.command == command && !flag(bit);
        if needs(command::TRIM, transmission_flags::SEND_TRIM)
            || needs(command::WRITE_ZEROES, transmission_flags::SEND_WRITE_ZEROES)
            || needs(command::CACHE, transmission_flags::SEND_CACHE)
        {
            return refuse(
                errno::EINVAL,
                format!("command {} was not advertised", self.command),
            );
        }
        if self.command == command::BLOCK_STATUS
            && !(limits.structured_replies && limits.meta_contexts)
        {
            return refuse(
                errno::EINVAL,
                "block status needs structured replies and a metadata context".into(),
            );
        }
        if self.flags & command_flags::FUA != 0 && !flag(transmission_flags::SEND_FUA) {
            return refuse(errno::EINVAL, "FUA was not advertised".into());
        }
        if self.flags & command_flags::DF != 0
            && (self.command != command::READ || !flag(transmission_flags::SEND_DF))
        {
            return refuse(errno::EINVAL, "DF applies to reads when advertised".into());
        }
        if self.flags & command_flags::FAST_ZERO != 0
            && (self.command != command::WRITE_ZEROES || !flag(transmission_flags::SEND_FAST_ZERO))
        {
            return refuse(
                errno::EINVAL,
                "FAST_ZERO applies to write zeroes when advertised".into(),
            );
        }
        // The protocol leaves zero-length requests unspecified; qemu-nbd answers them as
        // the no-ops they are, and so does locus — except block status, whose reply must
        // describe at least one extent.
        if self.length == 0 && self.command == command::BLOCK_STATUS {
            return refuse(errno::EINVAL, "zero-length block status".into());
        }
        let block = u64::from(limits.min_block_bytes.max(1));
        if !self.offset.is_multiple_of(block) || !u64::from(self.length).is_multiple_of(block) {
            return refuse(
                errno::EINVAL,
                format!(
                    "{} bytes at {} are not aligned to the minimum block size {block}",
                    self.length, self.offset
                ),
            );
        }
        if self.command == command::READ && self.length > limits.max_payload_bytes {
            return refuse(
                errno::EINVAL,
                format!(
                    "read of {} bytes exceeds the maximum of {}",
                    self.length, limits.max_payload_bytes
                ),
            );
        }
        let end = self.offset.checked_add(u64::from(self.length));
        if end.is_none_or(|end| end > limits.size_bytes) {
            let errno = if matches!(self.command, command::WRITE | command::WRITE_ZEROES) {
                errno::ENOSPC
            } else {
                errno::EINVAL
            };
            return refuse(
                errno,
                format!(
                    "{} bytes at {} run past the export's {} bytes",
                    self.length, self.offset, limits.size_bytes
                ),
            );
        }
        Ok(())
    }
}
