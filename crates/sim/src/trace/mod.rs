//! Block traces: readers for the formats users bring, format detection, and the conversion of
//! requests into block accesses with dense block ids.
//!
//! One reader per format, each a function from one line to at most one request. Readers take
//! any `BufRead` (no file handling here: the simulator does no I/O of its own). A malformed
//! line is an error naming the trace and line number, or is counted and skipped when the
//! caller asks for that.

mod blkparse;
mod disksim;
mod fio;
mod libcachesim;
mod msr;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::BufRead;

use cache::{Access, Op};

use crate::error::{Result, SimError};

/// Most blocks one request may touch (1 GiB of 4 KiB blocks): a bound against corrupt sizes.
pub const MAX_BLOCKS_PER_REQUEST: u64 = 1 << 18;
/// Most distinct blocks a trace may name (dense ids are u32).
pub const MAX_DISTINCT_BLOCKS: usize = u32::MAX as usize - 1;
/// Longest line accepted.
const MAX_LINE_BYTES: usize = 64 * 1024;

/// Trace formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// libCacheSim CSV with a header naming an `op` column (e.g. `version,time,op,size,lbn`).
    LibCacheSim,
    /// MSR Cambridge CSV: `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`.
    Msr,
    /// fio iolog version 2: `file action [offset length]`.
    FioV2,
    /// fio iolog version 3: `time file action [offset length]`.
    FioV3,
    /// blkparse's default text output (queue events, `Q`).
    Blkparse,
    /// MQSim/DiskSim ASCII: `time device lba size_sectors type` (type 1 = read).
    DiskSim,
}

impl Format {
    /// Every format, by its command-line name.
    pub const ALL: [(&'static str, Format); 6] = [
        ("libcachesim", Format::LibCacheSim),
        ("msr", Format::Msr),
        ("fio2", Format::FioV2),
        ("fio3", Format::FioV3),
        ("blkparse", Format::Blkparse),
        ("disksim", Format::DiskSim),
    ];

    /// Parses a command-line name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|&(_, f)| f)
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, f)| *f == self)
            .map(|&(n, _)| n)
            .expect("listed")
    }
}

/// One request of a trace, in bytes. `stream` separates address spaces (devices, files).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Device or file the request addresses.
    pub stream: u64,
    /// First byte.
    pub offset_bytes: u64,
    /// Length in bytes.
    pub len_bytes: u64,
    /// Read or write.
    pub op: Op,
}

/// What a reader made of one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Line {
    /// A read or write.
    Request(Request),
    /// Not an access (header, comment, other action): ignored, not an error.
    Skip,
}

/// Per-reader state carried across lines (column positions, file names).
#[derive(Debug, Default)]
pub(crate) struct ReaderState {
    columns: Option<libcachesim::Columns>,
    files: HashMap<String, u64>,
}

/// A trace as block accesses, ready to simulate.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Block accesses in order, with dense block ids `0..distinct_blocks`.
    pub accesses: Vec<Access>,
    /// Requests read (each may touch several blocks).
    pub requests: u64,
    /// Read requests.
    pub read_requests: u64,
    /// Write requests.
    pub write_requests: u64,
    /// Distinct blocks touched.
    pub distinct_blocks: u32,
    /// Malformed lines skipped (only with `skip_bad`).
    pub skipped_lines: u64,
    /// Block size the requests were split by.
    pub block_bytes: u64,
}

/// How to read a trace.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// The format, or `None` to detect it from the first lines.
    pub format: Option<Format>,
    /// Block size to split requests into.
    pub block_bytes: u64,
    /// Count and skip malformed lines instead of failing.
    pub skip_bad: bool,
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self {
            format: None,
            block_bytes: 4096,
            skip_bad: false,
        }
    }
}

/// Reads a whole trace. `name` names it in errors.
pub fn read_trace(input: impl BufRead, name: &str, options: &ReadOptions) -> Result<Trace> {
    if options.block_bytes == 0
        || !options.block_bytes.is_power_of_two()
        || options.block_bytes > (1 << 30)
    {
        return Err(SimError::Invalid(format!(
            "block size {} must be a power of two between 1 byte and 1 GiB",
            options.block_bytes
        )));
    }
    let mut input = input;
    let mut pending = Vec::new();
    let format = match options.format {
        Some(format) => format,
        None => {
            // Look at the first non-empty lines, keeping them to parse afterwards.
            let mut line = String::new();
            while pending.len() < 8 {
                line.clear();
                let read = read_line(&mut input, &mut line, name, pending.len() as u64 + 1)?;
                if read == 0 {
                    break;
                }
                pending.push(line.clone());
                if !line.trim().is_empty() {
                    break;
                }
            }
            detect(pending.last().map_or("", String::as_str), name)?
        }
    };

    let mut builder = Builder::new(options.block_bytes, name);
    let mut state = ReaderState::default();
    let mut line_number = 0u64;
    // The first non-empty line the format skipped: named when no line is a request.
    let mut first_skipped: Option<(u64, String)> = None;
    let mut handle = |text: &str,
                      line_number: u64,
                      builder: &mut Builder<'_>,
                      state: &mut ReaderState|
     -> Result<()> {
        let parsed = match format {
            Format::LibCacheSim => libcachesim::parse(text, state),
            Format::Msr => msr::parse(text),
            Format::FioV2 => fio::parse(text, 2, state),
            Format::FioV3 => fio::parse(text, 3, state),
            Format::Blkparse => blkparse::parse(text),
            Format::DiskSim => disksim::parse(text),
        };
        match parsed {
            Ok(Line::Request(request)) => builder.add(request, line_number),
            Ok(Line::Skip) => {
                if first_skipped.is_none() && !text.trim().is_empty() {
                    first_skipped = Some((line_number, text.chars().take(60).collect()));
                }
                Ok(())
            }
            Err(_) if options.skip_bad => {
                builder.trace.skipped_lines += 1;
                Ok(())
            }
            Err(problem) => Err(SimError::Parse {
                source_name: name.to_owned(),
                line: line_number,
                problem,
            }),
        }
    };
    for text in &pending {
        line_number += 1;
        handle(
            text.trim_end_matches(['\n', '\r']),
            line_number,
            &mut builder,
            &mut state,
        )?;
    }
    let mut line = String::new();
    loop {
        line.clear();
        line_number += 1;
        if read_line(&mut input, &mut line, name, line_number)? == 0 {
            break;
        }
        handle(
            line.trim_end_matches(['\n', '\r']),
            line_number,
            &mut builder,
            &mut state,
        )?;
    }
    let trace = builder.finish();
    if trace.requests == 0 {
        let hint = if options.format.is_some() {
            "; is the trace in another format? (without --format it is detected)"
        } else {
            ""
        };
        return Err(match first_skipped {
            Some((line, text)) => SimError::Parse {
                source_name: name.to_owned(),
                line,
                problem: format!(
                    "no line of the trace is a {} request (this one is `{text}`){hint}",
                    format.name()
                ),
            },
            None => SimError::NoRequests {
                source_name: name.to_owned(),
                lines: line_number - 1,
                skipped: trace.skipped_lines,
            },
        });
    }
    Ok(trace)
}

fn read_line(
    input: &mut impl BufRead,
    line: &mut String,
    name: &str,
    line_number: u64,
) -> Result<usize> {
    let read = input.read_line(line).map_err(|source| {
        if source.kind() == std::io::ErrorKind::InvalidData {
            SimError::Parse {
                source_name: name.to_owned(),
                line: line_number,
                problem: "not UTF-8 text (a trace is a text file)".into(),
            }
        } else {
            SimError::Io {
                source_name: name.to_owned(),
                source,
            }
        }
    })?;
    if line.len() > MAX_LINE_BYTES {
        return Err(SimError::Parse {
            source_name: name.to_owned(),
            line: line_number,
            problem: format!("line longer than {MAX_LINE_BYTES} bytes"),
        });
    }
    Ok(read)
}

/// Tells the format from the first non-empty line, where that is unambiguous.
pub fn detect(first_line: &str, name: &str) -> Result<Format> {
    let line = first_line.trim();
    let unknown = |why: &str| SimError::UnknownFormat {
        source_name: name.to_owned(),
        why: why.to_owned(),
    };
    if line.is_empty() {
        return Err(unknown("it is empty"));
    }
    if line.starts_with("fio version 2 iolog") {
        return Ok(Format::FioV2);
    }
    if line.starts_with("fio version 3 iolog") {
        return Ok(Format::FioV3);
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    if words.len() >= 7 && blkparse::is_device(words[0]) {
        return Ok(Format::Blkparse);
    }
    if line.contains(',') {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.iter().any(|f| f.eq_ignore_ascii_case("op")) {
            return Ok(Format::LibCacheSim);
        }
        if fields.len() == 7 && matches!(fields[3].to_ascii_lowercase().as_str(), "read" | "write")
        {
            return Ok(Format::Msr);
        }
        return Err(unknown(
            "a CSV line that is neither a libCacheSim header with an `op` column nor an MSR record",
        ));
    }
    if words.len() == 5 && words.iter().all(|w| w.parse::<f64>().is_ok()) {
        return Ok(Format::DiskSim);
    }
    Err(unknown("the first line matches no known format"))
}

/// Splits requests into block accesses and gives blocks dense ids.
struct Builder<'a> {
    name: &'a str,
    block_shift: u32,
    ids: HashMap<(u64, u64), u32, BuildHasherDefault<MixHasher>>,
    trace: Trace,
}

impl<'a> Builder<'a> {
    fn new(block_bytes: u64, name: &'a str) -> Self {
        Self {
            name,
            block_shift: block_bytes.trailing_zeros(),
            ids: HashMap::default(),
            trace: Trace {
                block_bytes,
                ..Trace::default()
            },
        }
    }

    #[inline]
    fn add(&mut self, request: Request, line: u64) -> Result<()> {
        self.trace.requests += 1;
        match request.op {
            Op::Read => self.trace.read_requests += 1,
            Op::Write => self.trace.write_requests += 1,
        }
        if request.len_bytes == 0 {
            return Ok(());
        }
        let end = request
            .offset_bytes
            .checked_add(request.len_bytes)
            .ok_or_else(|| SimError::Parse {
                source_name: self.name.to_owned(),
                line,
                problem: "offset + length overflows 64 bits".into(),
            })?;
        let first = request.offset_bytes >> self.block_shift;
        let last = (end - 1) >> self.block_shift;
        if last - first >= MAX_BLOCKS_PER_REQUEST {
            return Err(SimError::Parse {
                source_name: self.name.to_owned(),
                line,
                problem: format!(
                    "a request of {} bytes touches more than {MAX_BLOCKS_PER_REQUEST} blocks",
                    request.len_bytes
                ),
            });
        }
        for block in first..=last {
            let next = self.ids.len();
            let id = *self
                .ids
                .entry((request.stream, block))
                .or_insert(next as u32);
            if self.ids.len() > MAX_DISTINCT_BLOCKS {
                return Err(SimError::TooLarge {
                    source_name: self.name.to_owned(),
                    problem: "more than 2^32 - 2 distinct blocks".into(),
                });
            }
            self.trace.accesses.push(Access {
                block: id,
                op: request.op,
            });
        }
        Ok(())
    }

    fn finish(mut self) -> Trace {
        self.trace.distinct_blocks = self.ids.len() as u32;
        self.trace
    }
}

/// A fast hasher for integer keys (the trace's block numbers): a multiply-rotate mix. Not
/// DoS-resistant, which a simulator reading the user's own trace does not need.
#[derive(Debug, Default, Clone, Copy)]
struct MixHasher(u64);

impl Hasher for MixHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    #[inline]
    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Parses an unsigned decimal field, naming it in the error.
pub(crate) fn number(text: &str, what: &str) -> std::result::Result<u64, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("{what} `{}` is not a non-negative integer", text.trim()))
}
