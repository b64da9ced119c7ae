//! MSR Cambridge traces: `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`, with
//! `Type` `Read` or `Write` and `Offset`, `Size` in bytes. Each (host, disk) is its own
//! address space.

use cache::Op;

use super::{Line, Request, number};

pub(crate) fn parse(line: &str) -> Result<Line, String> {
    if line.trim().is_empty() {
        return Ok(Line::Skip);
    }
    let fields: Vec<&str> = line.split(',').collect();
    if fields.len() != 7 {
        return Err(format!(
            "{} fields, expected 7 (Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime)",
            fields.len()
        ));
    }
    let op = match fields[3].trim().to_ascii_lowercase().as_str() {
        "read" => Op::Read,
        "write" => Op::Write,
        other => return Err(format!("Type `{other}` is neither Read nor Write")),
    };
    let disk = number(fields[2], "DiskNumber")?;
    let host = fields[1]
        .trim()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    Ok(Line::Request(Request {
        stream: host ^ disk.rotate_left(32),
        offset_bytes: number(fields[4], "Offset")?,
        len_bytes: number(fields[5], "Size")?,
        op,
    }))
}
