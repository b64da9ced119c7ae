//! libCacheSim's CSV block-trace form: a header line names the columns, among them `op`,
//! `size` (bytes) and the address as `lbn`/`lba` (512-byte sectors) or `offset` (bytes),
//! e.g. `version,time,op,size,lbn`. `op` is a SCSI opcode in hex (`28` READ(10), `2a`
//! WRITE(10), also READ/WRITE(6), (12), (16)) or a word (`read`, `write`, `r`, `w`). Other
//! opcodes (SYNCHRONIZE CACHE, ...) are not accesses and are skipped.

use cache::Op;

use super::{Line, ReaderState, Request, number};

const SECTOR_BYTES: u64 = 512;

#[derive(Debug, Clone)]
pub(crate) struct Columns {
    op: usize,
    size: usize,
    address: usize,
    address_unit: u64,
    count: usize,
}

pub(crate) fn parse(line: &str, state: &mut ReaderState) -> Result<Line, String> {
    if line.trim().is_empty() {
        return Ok(Line::Skip);
    }
    let Some(columns) = &state.columns else {
        state.columns = Some(header(line)?);
        return Ok(Line::Skip);
    };
    let mut fields: [&str; 16] = [""; 16];
    let mut count = 0;
    for field in line.split(',') {
        if count == fields.len() {
            return Err("more than 16 fields".into());
        }
        fields[count] = field;
        count += 1;
    }
    if count != columns.count {
        return Err(format!(
            "{count} fields, but the header names {}",
            columns.count
        ));
    }
    let Some(op) = op(fields[columns.op])? else {
        return Ok(Line::Skip);
    };
    let len_bytes = number(fields[columns.size], "size")?;
    let address = number(fields[columns.address], "address")?;
    let offset_bytes = address
        .checked_mul(columns.address_unit)
        .ok_or_else(|| format!("address {address} overflows 64 bits in bytes"))?;
    Ok(Line::Request(Request {
        stream: 0,
        offset_bytes,
        len_bytes,
        op,
    }))
}

fn header(line: &str) -> Result<Columns, String> {
    let names: Vec<String> = line
        .split(',')
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    let find = |wanted: &[&str]| names.iter().position(|n| wanted.contains(&n.as_str()));
    let op = find(&["op"]).ok_or("the header has no `op` column")?;
    let size = find(&["size"]).ok_or("the header has no `size` column")?;
    let (address, address_unit) = match (find(&["lbn", "lba"]), find(&["offset"])) {
        (Some(column), _) => (column, SECTOR_BYTES),
        (None, Some(column)) => (column, 1),
        (None, None) => return Err("the header has no `lbn`, `lba` or `offset` column".into()),
    };
    if names.len() > 16 {
        return Err("the header names more than 16 columns".into());
    }
    Ok(Columns {
        op,
        size,
        address,
        address_unit,
        count: names.len(),
    })
}

/// Read, write, or `None` for another command.
fn op(text: &str) -> Result<Option<Op>, String> {
    let text = text.trim();
    // The common case first, without allocating: two hex digits.
    match text.as_bytes() {
        b"28" => return Ok(Some(Op::Read)),
        b"2a" | b"2A" => return Ok(Some(Op::Write)),
        _ => {}
    }
    for (word, op) in [
        ("read", Op::Read),
        ("r", Op::Read),
        ("write", Op::Write),
        ("w", Op::Write),
    ] {
        if text.eq_ignore_ascii_case(word) {
            return Ok(Some(op));
        }
    }
    let hex = text.trim_start_matches("0x").trim_start_matches("0X");
    let code = u8::from_str_radix(hex, 16)
        .map_err(|_| format!("op `{text}` is neither a SCSI opcode in hex nor read/write"))?;
    Ok(match code {
        0x08 | 0x28 | 0xa8 | 0x88 => Some(Op::Read),
        0x0a | 0x2a | 0xaa | 0x8a => Some(Op::Write),
        _ => None,
    })
}
