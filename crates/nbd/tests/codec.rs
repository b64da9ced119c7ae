//! The codec against byte layouts written out from the protocol document.

use nbd::consts::{command, command_flags, errno, info, option, transmission_flags};
use nbd::options::{ERR_INVALID, MAX_OPTION_BYTES};
use nbd::{
    ClientFlags, Limits, NbdError, NbdOption, OptionHeader, Request, handshake, option_reply, reply,
};

#[test]
fn greeting_is_nbdmagic_ihaveopt_and_fixed_newstyle_no_zeroes() {
    let greeting = handshake::greeting();
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    assert_eq!(&greeting[8..16], b"IHAVEOPT");
    assert_eq!(&greeting[16..], &[0, 3]);
}

#[test]
fn client_flags_with_unknown_bits_end_the_session() {
    assert_eq!(
        ClientFlags::decode([0, 0, 0, 3]).unwrap(),
        ClientFlags {
            fixed_newstyle: true,
            no_zeroes: true
        }
    );
    assert!(matches!(
        ClientFlags::decode([0, 0, 0, 4]),
        Err(NbdError::Disconnect(_))
    ));
}

#[test]
fn option_headers() {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(b"IHAVEOPT");
    bytes[8..12].copy_from_slice(&7u32.to_be_bytes());
    bytes[12..].copy_from_slice(&12u32.to_be_bytes());
    assert_eq!(
        OptionHeader::decode(&bytes).unwrap(),
        OptionHeader { option: 7, len: 12 }
    );
    bytes[0] = b'X';
    assert!(matches!(
        OptionHeader::decode(&bytes),
        Err(NbdError::Disconnect(_))
    ));
    assert_eq!(MAX_OPTION_BYTES, 65536);
}

fn string(s: &str) -> Vec<u8> {
    let mut bytes = (s.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(s.as_bytes());
    bytes
}

#[test]
fn go_with_information_requests() {
    let mut data = string("disk");
    data.extend_from_slice(&2u16.to_be_bytes());
    data.extend_from_slice(&info::BLOCK_SIZE.to_be_bytes());
    data.extend_from_slice(&info::NAME.to_be_bytes());
    assert_eq!(
        NbdOption::decode(option::GO, &data).unwrap(),
        NbdOption::Info {
            go: true,
            name: "disk".into(),
            requests: vec![info::BLOCK_SIZE, info::NAME]
        }
    );
    // One request announced, none sent: invalid, the session goes on.
    let mut short = string("disk");
    short.extend_from_slice(&1u16.to_be_bytes());
    match NbdOption::decode(option::INFO, &short) {
        Err(NbdError::Option { reply, message, .. }) => {
            assert_eq!(reply, ERR_INVALID);
            assert!(message.contains("ends inside"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn meta_context_queries() {
    let mut data = string("");
    data.extend_from_slice(&1u32.to_be_bytes());
    data.extend_from_slice(&string("base:allocation"));
    assert_eq!(
        NbdOption::decode(option::SET_META_CONTEXT, &data).unwrap(),
        NbdOption::MetaContext {
            set: true,
            name: String::new(),
            queries: vec!["base:allocation".into()]
        }
    );
    let mut huge = string("");
    huge.extend_from_slice(&1_000_000u32.to_be_bytes());
    assert!(matches!(
        NbdOption::decode(option::LIST_META_CONTEXT, &huge),
        Err(NbdError::Option { .. })
    ));
}

#[test]
fn simple_options_take_no_data_and_unknown_ones_are_reported() {
    assert_eq!(
        NbdOption::decode(option::LIST, &[]).unwrap(),
        NbdOption::List
    );
    assert!(matches!(
        NbdOption::decode(option::LIST, &[1]),
        Err(NbdError::Option { .. })
    ));
    assert_eq!(
        NbdOption::decode(option::STARTTLS, &[]).unwrap(),
        NbdOption::StartTls
    );
    assert_eq!(
        NbdOption::decode(42, &[1, 2, 3]).unwrap(),
        NbdOption::Unknown(42)
    );
    assert_eq!(
        NbdOption::decode(option::EXPORT_NAME, b"").unwrap(),
        NbdOption::ExportName(String::new())
    );
    assert!(matches!(
        NbdOption::decode(option::EXPORT_NAME, &[0xff]),
        Err(NbdError::Disconnect(_))
    ));
}

#[test]
fn option_replies() {
    let ack = option_reply::ack(option::STRUCTURED_REPLY);
    assert_eq!(
        ack,
        [
            [0, 3, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9],
            [0, 0, 0, 8, 0, 0, 0, 1],
            [0, 0, 0, 0, 0, 0, 0, 0]
        ]
        .concat()[..20]
    );
    let export = option_reply::info_export(option::GO, 1 << 30, transmission_flags::HAS_FLAGS);
    assert_eq!(&export[16..20], &12u32.to_be_bytes());
    assert_eq!(&export[20..22], &info::EXPORT.to_be_bytes());
    assert_eq!(&export[22..30], &(1u64 << 30).to_be_bytes());
    let sizes = option_reply::info_block_size(option::GO, 512, 4096, 32 << 20);
    assert_eq!(sizes.len(), 20 + 14);
    let server = option_reply::server(option::LIST, "disk", "1 GiB");
    assert_eq!(&server[20..24], &4u32.to_be_bytes());
    assert_eq!(&server[24..], b"disk1 GiB");
    let name_reply = handshake::export_name_reply(4096, 1, false);
    assert_eq!(name_reply.len(), 8 + 2 + 124);
    assert_eq!(handshake::export_name_reply(4096, 1, true).len(), 10);
}

fn limits() -> Limits {
    Limits {
        size_bytes: 1 << 20,
        transmission_flags: transmission_flags::HAS_FLAGS
            | transmission_flags::SEND_FLUSH
            | transmission_flags::SEND_FUA,
        structured_replies: true,
        meta_contexts: false,
        max_payload_bytes: 32 << 20,
        min_block_bytes: 512,
    }
}

fn request(command: u16, flags: u16, offset: u64, length: u32) -> Request {
    Request {
        flags,
        command,
        cookie: 0xdead_beef_0bad_cafe,
        offset,
        length,
    }
}

#[test]
fn requests_round_trip_and_are_checked() {
    let write = request(command::WRITE, command_flags::FUA, 4096, 512);
    let bytes = write.encode();
    assert_eq!(&bytes[..4], &[0x25, 0x60, 0x95, 0x13]);
    assert_eq!(Request::decode(&bytes).unwrap(), write);
    assert!(write.check(&limits()).is_ok());

    let errno_of = |r: Request, l: &Limits| match r.check(l) {
        Err(NbdError::Request { errno, .. }) => errno,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let mut read_only = limits();
    read_only.transmission_flags |= transmission_flags::READ_ONLY;
    assert_eq!(errno_of(write, &read_only), errno::EPERM);
    assert_eq!(
        errno_of(request(command::READ, 0, (1 << 20) - 512, 1024), &limits()),
        errno::EINVAL
    );
    assert_eq!(
        errno_of(request(command::WRITE, 0, u64::MAX - 511, 512), &limits()),
        errno::ENOSPC
    );
    assert_eq!(
        errno_of(request(command::TRIM, 0, 0, 512), &limits()),
        errno::EINVAL,
        "TRIM not advertised"
    );
    assert_eq!(
        errno_of(request(command::BLOCK_STATUS, 0, 0, 512), &limits()),
        errno::EINVAL
    );
    assert_eq!(errno_of(request(99, 0, 0, 512), &limits()), errno::EINVAL);
    assert_eq!(
        errno_of(request(command::READ, 1 << 9, 0, 512), &limits()),
        errno::EINVAL,
        "unknown flag"
    );
    assert_eq!(
        errno_of(request(command::FLUSH, 0, 8, 0), &limits()),
        errno::EINVAL
    );
    assert!(request(command::FLUSH, 0, 0, 0).check(&limits()).is_ok());
    assert_eq!(
        errno_of(request(command::READ, 0, 100, 512), &limits()),
        errno::EINVAL,
        "unaligned offset"
    );
    assert_eq!(
        errno_of(request(command::WRITE, 0, 0, 100), &limits()),
        errno::EINVAL,
        "unaligned length"
    );
    assert!(matches!(
        request(command::WRITE, 0, 0, (32 << 20) + 1).check(&limits()),
        Err(NbdError::Disconnect(_))
    ));
    let mut bad = bytes;
    bad[0] = 0;
    assert!(matches!(
        Request::decode(&bad),
        Err(NbdError::Disconnect(_))
    ));
}

#[test]
fn replies() {
    let simple = reply::simple(7, errno::EIO);
    assert_eq!(
        simple,
        [
            [0x67, 0x44, 0x66, 0x98],
            5u32.to_be_bytes(),
            [0, 0, 0, 0],
            7u32.to_be_bytes()
        ]
        .concat()[..]
    );
    let data = reply::offset_data_prefix(7, 4096, 512, true);
    assert_eq!(&data[..4], &[0x66, 0x8e, 0x33, 0xef]);
    assert_eq!(&data[4..6], &1u16.to_be_bytes(), "done");
    assert_eq!(&data[6..8], &1u16.to_be_bytes(), "OFFSET_DATA");
    assert_eq!(&data[16..20], &520u32.to_be_bytes(), "offset + data");
    let hole = reply::offset_hole(7, 0, 4096, false);
    assert_eq!(hole.len(), 20 + 12);
    let status = reply::block_status(7, 1, &[(4096, 0), (8192, 3)], true);
    assert_eq!(&status[16..20], &20u32.to_be_bytes());
    let error = reply::error(7, errno::EINVAL, "bad");
    assert_eq!(&error[6..8], &0x8001u16.to_be_bytes());
    assert_eq!(&error[20..], [0, 0, 0, 22, 0, 3, b'b', b'a', b'd']);
}
