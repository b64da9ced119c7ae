//! The MQSim/DiskSim ASCII form: `time device lba size_sectors type`, whitespace-separated,
//! 512-byte sectors, type 1 = read and 0 = write. Each device is its own address space.

use cache::Op;

use super::{Line, Request, number};

const SECTOR_BYTES: u64 = 512;

pub(crate) fn parse(line: &str) -> Result<Line, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    if words.is_empty() {
        return Ok(Line::Skip);
    }
    let [time, device, lba, sectors, kind] = words[..] else {
        return Err(format!(
            "{} fields, expected 5 (time device lba size_sectors type)",
            words.len()
        ));
    };
    time.parse::<f64>()
        .map_err(|_| format!("time `{time}` is not a number"))?;
    let op = match kind {
        "1" => Op::Read,
        "0" => Op::Write,
        other => return Err(format!("type `{other}` is neither 1 (read) nor 0 (write)")),
    };
    let lba = number(lba, "lba")?;
    let sectors = number(sectors, "size_sectors")?;
    Ok(Line::Request(Request {
        stream: number(device, "device")?,
        offset_bytes: lba
            .checked_mul(SECTOR_BYTES)
            .ok_or("lba overflows 64 bits in bytes")?,
        len_bytes: sectors
            .checked_mul(SECTOR_BYTES)
            .ok_or("size overflows 64 bits in bytes")?,
        op,
    }))
}
