//! Transmission replies: simple replies and structured reply chunks.

use crate::consts::{SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC, chunk};

/// Bytes of a simple reply header.
pub const SIMPLE_REPLY_BYTES: usize = 16;
/// Bytes of a structured chunk header.
pub const CHUNK_HEADER_BYTES: usize = 20;

/// A simple reply header: magic, error, cookie (read data, if any, follows).
pub fn simple(cookie: u64, error: u32) -> [u8; SIMPLE_REPLY_BYTES] {
    let mut bytes = [0u8; SIMPLE_REPLY_BYTES];
    bytes[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    bytes[4..8].copy_from_slice(&error.to_be_bytes());
    bytes[8..16].copy_from_slice(&cookie.to_be_bytes());
    bytes
}

/// A structured chunk header for a payload of `len` bytes.
pub fn chunk_header(
    cookie: u64,
    chunk_type: u16,
    done: bool,
    len: u32,
) -> [u8; CHUNK_HEADER_BYTES] {
    let mut bytes = [0u8; CHUNK_HEADER_BYTES];
    bytes[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    let flags = if done { chunk::FLAG_DONE } else { 0 };
    bytes[4..6].copy_from_slice(&flags.to_be_bytes());
    bytes[6..8].copy_from_slice(&chunk_type.to_be_bytes());
    bytes[8..16].copy_from_slice(&cookie.to_be_bytes());
    bytes[16..20].copy_from_slice(&len.to_be_bytes());
    bytes
}

/// The header and offset of an `OFFSET_DATA` chunk carrying `data_len` bytes (the data itself
/// follows, written by the caller straight from its buffer).
pub fn offset_data_prefix(
    cookie: u64,
    offset: u64,
    data_len: u32,
    done: bool,
) -> [u8; CHUNK_HEADER_BYTES + 8] {
    let mut bytes = [0u8; CHUNK_HEADER_BYTES + 8];
    bytes[..CHUNK_HEADER_BYTES].copy_from_slice(&chunk_header(
        cookie,
        chunk::OFFSET_DATA,
        done,
        8 + data_len,
    ));
    bytes[CHUNK_HEADER_BYTES..].copy_from_slice(&offset.to_be_bytes());
    bytes
}

/// An `OFFSET_HOLE` chunk: `len` bytes of zeroes at `offset`.
pub fn offset_hole(cookie: u64, offset: u64, len: u32, done: bool) -> Vec<u8> {
    let mut bytes = chunk_header(cookie, chunk::OFFSET_HOLE, done, 12).to_vec();
    bytes.extend_from_slice(&offset.to_be_bytes());
    bytes.extend_from_slice(&len.to_be_bytes());
    bytes
}

/// A `BLOCK_STATUS` chunk: extents (length, flags) of one metadata context.
pub fn block_status(cookie: u64, context_id: u32, extents: &[(u32, u32)], done: bool) -> Vec<u8> {
    let len = 4 + 8 * extents.len() as u32;
    let mut bytes = chunk_header(cookie, chunk::BLOCK_STATUS, done, len).to_vec();
    bytes.extend_from_slice(&context_id.to_be_bytes());
    for &(length, flags) in extents {
        bytes.extend_from_slice(&length.to_be_bytes());
        bytes.extend_from_slice(&flags.to_be_bytes());
    }
    bytes
}

/// An `ERROR` chunk (always final) with a message for the user.
pub fn error(cookie: u64, errno: u32, message: &str) -> Vec<u8> {
    let message = &message.as_bytes()[..message.len().min(u16::MAX as usize)];
    let mut bytes = chunk_header(cookie, chunk::ERROR, true, 6 + message.len() as u32).to_vec();
    bytes.extend_from_slice(&errno.to_be_bytes());
    bytes.extend_from_slice(&(message.len() as u16).to_be_bytes());
    bytes.extend_from_slice(message);
    bytes
}

/// A `NONE` chunk: the reply is complete.
pub fn done(cookie: u64) -> [u8; CHUNK_HEADER_BYTES] {
    chunk_header(cookie, chunk::NONE, true, 0)
}
