//! fio's own I/O logs (`write_iolog=`). Version 2: a `fio version 2 iolog` line, then
//! `file action [offset length]`; version 3 puts a timestamp (ms) first. Actions `read` and
//! `write` are accesses; `add`, `open`, `close`, `sync`, `datasync`, `trim`, `wait` are not.
//! Each file is its own address space.

use cache::Op;

use super::{Line, ReaderState, Request, number};

pub(crate) fn parse(line: &str, version: u32, state: &mut ReaderState) -> Result<Line, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with("fio version") {
        return Ok(Line::Skip);
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let words = if version == 3 {
        let (time, rest) = words.split_first().ok_or("empty line")?;
        number(time, "timestamp")?;
        rest
    } else {
        &words[..]
    };
    let [file, action, rest @ ..] = words else {
        return Err("expected `file action [offset length]`".into());
    };
    let op = match *action {
        "read" => Op::Read,
        "write" => Op::Write,
        "add" | "open" | "close" | "sync" | "datasync" | "trim" | "wait" => return Ok(Line::Skip),
        other => return Err(format!("unknown action `{other}`")),
    };
    let [offset, length] = rest else {
        return Err(format!("`{action}` needs an offset and a length"));
    };
    let next = state.files.len() as u64;
    let stream = *state.files.entry((*file).to_owned()).or_insert(next);
    Ok(Line::Request(Request {
        stream,
        offset_bytes: number(offset, "offset")?,
        len_bytes: number(length, "length")?,
        op,
    }))
}
