//! Option replies: `magic, option, type, length, data`.

use crate::consts::{OPTION_REPLY_MAGIC, info, reply};

/// Encodes one option reply with `data`.
pub fn encode(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    let len = u32::try_from(data.len()).expect("option reply data fits in 32 bits");
    let mut bytes = Vec::with_capacity(20 + data.len());
    bytes.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&reply_type.to_be_bytes());
    bytes.extend_from_slice(&len.to_be_bytes());
    bytes.extend_from_slice(data);
    bytes
}

/// `NBD_REP_ACK`.
pub fn ack(option: u32) -> Vec<u8> {
    encode(option, reply::ACK, &[])
}

/// An error reply (`reply_type` has bit 31 set) with a message for the user.
pub fn error(option: u32, reply_type: u32, message: &str) -> Vec<u8> {
    debug_assert!(
        reply_type & reply::ERROR_BIT != 0,
        "not an error reply type"
    );
    encode(option, reply_type, message.as_bytes())
}

/// `NBD_REP_SERVER`: one export for `NBD_OPT_LIST`, with an optional description.
pub fn server(option: u32, name: &str, description: &str) -> Vec<u8> {
    let mut data = Vec::with_capacity(4 + name.len() + description.len());
    data.extend_from_slice(&(name.len() as u32).to_be_bytes());
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(description.as_bytes());
    encode(option, reply::SERVER, &data)
}

/// `NBD_REP_INFO` / `NBD_INFO_EXPORT`: size and transmission flags.
pub fn info_export(option: u32, size_bytes: u64, transmission_flags: u16) -> Vec<u8> {
    let mut data = Vec::with_capacity(12);
    data.extend_from_slice(&info::EXPORT.to_be_bytes());
    data.extend_from_slice(&size_bytes.to_be_bytes());
    data.extend_from_slice(&transmission_flags.to_be_bytes());
    encode(option, reply::INFO, &data)
}

/// `NBD_REP_INFO` / `NBD_INFO_NAME` or `NBD_INFO_DESCRIPTION`.
pub fn info_text(option: u32, info_type: u16, text: &str) -> Vec<u8> {
    let mut data = Vec::with_capacity(2 + text.len());
    data.extend_from_slice(&info_type.to_be_bytes());
    data.extend_from_slice(text.as_bytes());
    encode(option, reply::INFO, &data)
}

/// `NBD_REP_INFO` / `NBD_INFO_BLOCK_SIZE`: minimum, preferred and maximum block sizes.
pub fn info_block_size(option: u32, minimum: u32, preferred: u32, maximum: u32) -> Vec<u8> {
    let mut data = Vec::with_capacity(14);
    data.extend_from_slice(&info::BLOCK_SIZE.to_be_bytes());
    for value in [minimum, preferred, maximum] {
        data.extend_from_slice(&value.to_be_bytes());
    }
    encode(option, reply::INFO, &data)
}

/// `NBD_REP_META_CONTEXT`: a context id and its name.
pub fn meta_context(option: u32, id: u32, name: &str) -> Vec<u8> {
    let mut data = Vec::with_capacity(4 + name.len());
    data.extend_from_slice(&id.to_be_bytes());
    data.extend_from_slice(name.as_bytes());
    encode(option, reply::META_CONTEXT, &data)
}
