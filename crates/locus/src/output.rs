//! Standard output that fails like a command-line tool should.
//!
//! `println!` panics when stdout is gone. locus's output goes through `outln!`/`out!`
//! instead, which return a [`StdoutError`] from the command; `main` turns a closed pipe
//! (`locus status | head -1`) into a quiet, successful exit — the reader has what it wanted —
//! and any other failure (`> /dev/full`) into one message and exit status 1.

use std::fmt;
use std::io;

/// Writing to standard output failed.
#[derive(Debug)]
pub struct StdoutError(pub io::Error);

impl StdoutError {
    /// The reader went away (EPIPE): not a failure of the command.
    pub fn is_closed_pipe(&self) -> bool {
        self.0.kind() == io::ErrorKind::BrokenPipe
    }
}

impl fmt::Display for StdoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "writing to standard output: {}", self.0)
    }
}

impl std::error::Error for StdoutError {}

/// Checks, before any work, that a file can be written at `path` (the directory exists and
/// takes it, or the file is writable), leaving nothing behind that was not there.
pub fn check_writable(path: &std::path::Path) -> io::Result<()> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Flushes what `out!` left in stdout's buffer (a line without its newline).
pub fn flush() -> Result<(), StdoutError> {
    io::Write::flush(&mut io::stdout()).map_err(StdoutError)
}

/// `println!` that returns a [`StdoutError`] from the enclosing function instead of panicking.
macro_rules! outln {
    () => {
        $crate::output::outln!("")
    };
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        ::std::writeln!(::std::io::stdout().lock(), $($arg)*)
            .map_err($crate::output::StdoutError)?;
    }};
}

/// `print!` that returns a [`StdoutError`] from the enclosing function instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        ::std::write!(::std::io::stdout().lock(), $($arg)*)
            .map_err($crate::output::StdoutError)?;
    }};
}

pub(crate) use {out, outln};
