//! Numbers of the NBD protocol (NetworkBlockDevice/nbd `doc/proto.md`). All are sent in
//! network byte order.

/// `NBDMAGIC`, first 8 bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the server's second magic, and the start of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Start of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Start of every (compact) request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Start of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Start of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server → client, 16 bits).
pub mod handshake_flags {
    /// The server speaks fixed newstyle.
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    /// The server can omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Client flags (client → server, 32 bits).
pub mod client_flags {
    /// The client speaks fixed newstyle.
    pub const FIXED_NEWSTYLE: u32 = 1 << 0;
    /// The client wants no zero padding after `NBD_OPT_EXPORT_NAME`.
    pub const NO_ZEROES: u32 = 1 << 1;
}

/// Transmission flags (per export, 16 bits).
pub mod transmission_flags {
    /// Always set.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// Writes will be refused.
    pub const READ_ONLY: u16 = 1 << 1;
    /// `NBD_CMD_FLUSH` is understood.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// `NBD_CMD_FLAG_FUA` is understood.
    pub const SEND_FUA: u16 = 1 << 3;
    /// The medium is rotational.
    pub const ROTATIONAL: u16 = 1 << 4;
    /// `NBD_CMD_TRIM` is understood.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// `NBD_CMD_WRITE_ZEROES` is understood.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// `NBD_CMD_FLAG_DF` is understood.
    pub const SEND_DF: u16 = 1 << 7;
    /// Flush and FUA hold across every connection to the export.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    /// `NBD_CMD_CACHE` is understood.
    pub const SEND_CACHE: u16 = 1 << 10;
    /// `NBD_CMD_FLAG_FAST_ZERO` is understood.
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Option codes.
pub mod option {
    /// Choose an export and enter transmission (no reply on failure).
    pub const EXPORT_NAME: u32 = 1;
    /// End the negotiation.
    pub const ABORT: u32 = 2;
    /// List the exports.
    pub const LIST: u32 = 3;
    /// Upgrade to TLS.
    pub const STARTTLS: u32 = 5;
    /// Ask about an export.
    pub const INFO: u32 = 6;
    /// Ask about an export and enter transmission.
    pub const GO: u32 = 7;
    /// Use structured replies.
    pub const STRUCTURED_REPLY: u32 = 8;
    /// List metadata contexts.
    pub const LIST_META_CONTEXT: u32 = 9;
    /// Select metadata contexts.
    pub const SET_META_CONTEXT: u32 = 10;
    /// 64-bit request and reply headers.
    pub const EXTENDED_HEADERS: u32 = 11;
}

/// Option reply types.
pub mod reply {
    /// Option done.
    pub const ACK: u32 = 1;
    /// One export (to `NBD_OPT_LIST`).
    pub const SERVER: u32 = 2;
    /// One piece of export information.
    pub const INFO: u32 = 3;
    /// One metadata context.
    pub const META_CONTEXT: u32 = 4;
    /// Error replies have bit 31 set.
    pub const ERROR_BIT: u32 = 1 << 31;
}

/// Information types in `NBD_REP_INFO`.
pub mod info {
    /// Size and transmission flags.
    pub const EXPORT: u16 = 0;
    /// Canonical name.
    pub const NAME: u16 = 1;
    /// Human-readable description.
    pub const DESCRIPTION: u16 = 2;
    /// Minimum, preferred and maximum block sizes.
    pub const BLOCK_SIZE: u16 = 3;
}

/// Commands.
pub mod command {
    /// Read.
    pub const READ: u16 = 0;
    /// Write.
    pub const WRITE: u16 = 1;
    /// Disconnect.
    pub const DISC: u16 = 2;
    /// Flush.
    pub const FLUSH: u16 = 3;
    /// Discard.
    pub const TRIM: u16 = 4;
    /// Prefetch.
    pub const CACHE: u16 = 5;
    /// Write zeroes.
    pub const WRITE_ZEROES: u16 = 6;
    /// Query metadata.
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags.
pub mod command_flags {
    /// Force unit access.
    pub const FUA: u16 = 1 << 0;
    /// Write zeroes must allocate, not punch a hole.
    pub const NO_HOLE: u16 = 1 << 1;
    /// Do not fragment the structured read reply.
    pub const DF: u16 = 1 << 2;
    /// Block status: one extent is enough.
    pub const REQ_ONE: u16 = 1 << 3;
    /// Write zeroes: fail fast unless it is fast.
    pub const FAST_ZERO: u16 = 1 << 4;
}

/// Structured reply chunk types and flags.
pub mod chunk {
    /// This is the last chunk of the reply.
    pub const FLAG_DONE: u16 = 1 << 0;
    /// No payload (final chunk of a reply that needs nothing else).
    pub const NONE: u16 = 0;
    /// Data at an offset.
    pub const OFFSET_DATA: u16 = 1;
    /// A run of zeroes at an offset.
    pub const OFFSET_HOLE: u16 = 2;
    /// Extents of one metadata context.
    pub const BLOCK_STATUS: u16 = 5;
    /// An error.
    pub const ERROR: u16 = (1 << 15) | 1;
    /// An error at an offset.
    pub const ERROR_OFFSET: u16 = (1 << 15) | 2;
}

/// Error values in replies (fixed by the protocol, independent of the host's errno).
pub mod errno {
    /// Operation not permitted (write to a read-only export).
    pub const EPERM: u32 = 1;
    /// I/O error.
    pub const EIO: u32 = 5;
    /// Out of memory.
    pub const ENOMEM: u32 = 12;
    /// Invalid request.
    pub const EINVAL: u32 = 22;
    /// No space.
    pub const ENOSPC: u32 = 28;
    /// Offset + length beyond the export.
    pub const EOVERFLOW: u32 = 75;
    /// Not supported (fast zero that would be slow).
    pub const ENOTSUP: u32 = 95;
    /// Server shutting down.
    pub const ESHUTDOWN: u32 = 108;
}

/// `base:allocation` extent flags.
pub mod state {
    /// Not allocated.
    pub const HOLE: u32 = 1 << 0;
    /// Reads as zeroes.
    pub const ZERO: u32 = 1 << 1;
}

/// Longest string the protocol allows (export names, queries, messages).
pub const MAX_STRING_BYTES: usize = 4096;
