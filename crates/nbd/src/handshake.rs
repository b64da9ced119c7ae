//! The fixed-newstyle handshake: the server's greeting, the client's flags, option headers,
//! and the reply that ends `NBD_OPT_EXPORT_NAME`.

use crate::consts::{IHAVEOPT, NBD_MAGIC, client_flags, handshake_flags};
use crate::error::{NbdError, Result};

/// Bytes of the server greeting: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
pub const GREETING_BYTES: usize = 18;
/// Bytes of an option header: `IHAVEOPT`, option, length.
pub const OPTION_HEADER_BYTES: usize = 16;

/// The greeting a fixed-newstyle server sends first.
pub fn greeting() -> [u8; GREETING_BYTES] {
    let mut bytes = [0u8; GREETING_BYTES];
    bytes[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    bytes[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    let flags = handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES;
    bytes[16..18].copy_from_slice(&flags.to_be_bytes());
    bytes
}

/// What the client announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientFlags {
    /// The client speaks fixed newstyle.
    pub fixed_newstyle: bool,
    /// The client wants no zero padding after `NBD_OPT_EXPORT_NAME`.
    pub no_zeroes: bool,
}

impl ClientFlags {
    /// Decodes the client's 32-bit flags; unknown bits mean the client misunderstood us, and
    /// the protocol requires dropping the connection.
    pub fn decode(bytes: [u8; 4]) -> Result<Self> {
        let flags = u32::from_be_bytes(bytes);
        let known = client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES;
        if flags & !known != 0 {
            return Err(NbdError::Disconnect(format!(
                "client flags {flags:#x} set unknown bits"
            )));
        }
        Ok(Self {
            fixed_newstyle: flags & client_flags::FIXED_NEWSTYLE != 0,
            no_zeroes: flags & client_flags::NO_ZEROES != 0,
        })
    }
}

/// The header of one option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// The option code.
    pub option: u32,
    /// Bytes of data that follow.
    pub len: u32,
}

impl OptionHeader {
    /// Decodes an option header; a wrong magic ends the connection.
    pub fn decode(bytes: &[u8; OPTION_HEADER_BYTES]) -> Result<Self> {
        let magic = u64::from_be_bytes(bytes[0..8].try_into().expect("8 bytes"));
        if magic != IHAVEOPT {
            return Err(NbdError::Disconnect(format!(
                "option magic {magic:#018x} is not IHAVEOPT"
            )));
        }
        Ok(Self {
            option: u32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes")),
            len: u32::from_be_bytes(bytes[12..16].try_into().expect("4 bytes")),
        })
    }
}

/// The reply to `NBD_OPT_EXPORT_NAME`: size, transmission flags, and 124 zero bytes unless
/// the client asked for none.
pub fn export_name_reply(size_bytes: u64, transmission_flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(10 + 124);
    bytes.extend_from_slice(&size_bytes.to_be_bytes());
    bytes.extend_from_slice(&transmission_flags.to_be_bytes());
    if !no_zeroes {
        bytes.extend_from_slice(&[0u8; 124]);
    }
    bytes
}
