//! Little-endian encoding of on-media structures, and a decoder whose every failure names the
//! structure and what is wrong with it.

use crate::error::{FsError, Result};

/// Appends little-endian values to a byte vector.
#[derive(Debug, Default)]
pub(crate) struct Encoder(pub(crate) Vec<u8>);

impl Encoder {
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub(crate) fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A name: u16 length, then the bytes.
    pub(crate) fn name(&mut self, name: &str) -> &mut Self {
        self.u16(name.len() as u16);
        self.0.extend_from_slice(name.as_bytes());
        self
    }
    /// A symbolic link's target: u16 length, then the bytes.
    pub(crate) fn text(&mut self, text: &str) -> &mut Self {
        self.name(text)
    }
    pub(crate) fn pad_to(&mut self, multiple: usize) -> &mut Self {
        while !self.0.len().is_multiple_of(multiple) {
            self.0.push(0);
        }
        self
    }
}

/// Reads little-endian values, failing with [`FsError::Corrupt`] naming `structure`.
#[derive(Debug)]
pub(crate) struct Decoder<'a> {
    bytes: &'a [u8],
    at: usize,
    structure: &'a str,
}

impl<'a> Decoder<'a> {
    pub(crate) fn new(bytes: &'a [u8], structure: &'a str) -> Self {
        Self {
            bytes,
            at: 0,
            structure,
        }
    }

    pub(crate) fn error(&self, problem: impl Into<String>) -> FsError {
        FsError::corrupt(self.structure, problem)
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    // The fixed-size readers are inlined with the error kept out of line: a snapshot of
    // 100,000 small files is some two million of these calls, and as calls returning a
    // `Result` they were a fifth of a mount's instructions.
    #[inline]
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        match self.bytes.get(self.at..).and_then(|rest| rest.get(..n)) {
            Some(out) => {
                self.at += n;
                Ok(out)
            }
            None => Err(self.past_end(n, what)),
        }
    }

    #[cold]
    #[inline(never)]
    fn past_end(&self, n: usize, what: &str) -> FsError {
        self.error(format!(
            "{what} runs past the end ({n} bytes wanted at byte {}, {} left)",
            self.at,
            self.remaining()
        ))
    }

    /// `N` bytes.
    #[inline]
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N, what)?.try_into().expect("N bytes"))
    }

    #[inline]
    pub(crate) fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    #[inline]
    pub(crate) fn u16(&mut self, what: &str) -> Result<u16> {
        self.array(what).map(u16::from_le_bytes)
    }
    #[inline]
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }
    #[inline]
    pub(crate) fn u64(&mut self, what: &str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A name written by [`Encoder::name`]: 1..=255 bytes of UTF-8 without `/` or NUL.
    pub(crate) fn name(&mut self, what: &str) -> Result<String> {
        let len = self.u16(what)? as usize;
        let bytes = self.take(len, what)?;
        let name =
            std::str::from_utf8(bytes).map_err(|_| self.error(format!("{what} is not UTF-8")))?;
        crate::path::check_name(name).map_err(|e| self.error(format!("{what}: {e}")))?;
        Ok(name.to_owned())
    }

    /// A symbolic link's target written by [`Encoder::text`]: UTF-8, a valid target
    /// ([`crate::path::check_target`]).
    pub(crate) fn text(&mut self, what: &str) -> Result<String> {
        let len = self.u16(what)? as usize;
        let bytes = self.take(len, what)?;
        let text =
            std::str::from_utf8(bytes).map_err(|_| self.error(format!("{what} is not UTF-8")))?;
        crate::path::check_target(text).map_err(|e| self.error(format!("{what}: {e}")))?;
        Ok(text.to_owned())
    }
}
