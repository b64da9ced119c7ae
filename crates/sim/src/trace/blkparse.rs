//! blkparse's default text output:
//! `  8,0    3        1     0.000000000   697  Q  WS 3417048 + 8 [kworker/u8:2]`
//! (device, CPU, sequence, time, pid, action, RWBS, sector + count, process). Only queue
//! events (`Q`) count, so a request traced through several stages is counted once; sectors
//! are 512 bytes. RWBS with `R` is a read, with `W` a write; discards and flushes are not
//! accesses. Lines that are not events (blkparse's closing summary) are skipped.

use cache::Op;

use super::{Line, Request, number};

const SECTOR_BYTES: u64 = 512;

/// `major,minor`.
pub(crate) fn is_device(word: &str) -> bool {
    let Some((major, minor)) = word.split_once(',') else {
        return false;
    };
    !major.is_empty()
        && !minor.is_empty()
        && major
            .bytes()
            .chain(minor.bytes())
            .all(|b| b.is_ascii_digit())
}

pub(crate) fn parse(line: &str) -> Result<Line, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    if words.first().is_none_or(|w| !is_device(w)) {
        return Ok(Line::Skip);
    }
    if words.len() < 7 {
        return Err(format!("{} fields, an event has at least 7", words.len()));
    }
    if words[5] != "Q" {
        return Ok(Line::Skip);
    }
    let rwbs = words[6];
    let op = if rwbs.contains('D') {
        return Ok(Line::Skip);
    } else if rwbs.contains('W') {
        Op::Write
    } else if rwbs.contains('R') {
        Op::Read
    } else {
        return Ok(Line::Skip);
    };
    let (sector, count) = match words.get(7..10) {
        Some([sector, "+", count]) => (number(sector, "sector")?, number(count, "sector count")?),
        _ => return Err("a queue event needs `sector + count`".into()),
    };
    let (major, minor) = words[0].split_once(',').expect("checked by is_device");
    let stream = number(major, "major")? << 32 | number(minor, "minor")?;
    let offset_bytes = sector
        .checked_mul(SECTOR_BYTES)
        .ok_or("sector overflows 64 bits in bytes")?;
    let len_bytes = count
        .checked_mul(SECTOR_BYTES)
        .ok_or("sector count overflows 64 bits in bytes")?;
    Ok(Line::Request(Request {
        stream,
        offset_bytes,
        len_bytes,
        op,
    }))
}
