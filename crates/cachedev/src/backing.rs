//! The backing store: a block device or file opened `O_DIRECT`, read and written through the
//! `uring` engine, every transfer in a buffer of the uDMA pool.

use std::path::Path;
use std::time::{Duration, Instant};

use uring::{DirectFile, Engine, PoolConfig, Strategy};

use crate::error::{CacheError, Result};

/// The backing store.
pub(crate) struct Backing {
    engine: Engine,
    path: String,
    size: u64,
    block_bytes: usize,
    /// Blocks read and written.
    pub(crate) reads: u64,
    pub(crate) writes: u64,
    /// Requests and their total time, for the backing-store latency.
    pub(crate) ops: u64,
    pub(crate) busy: Duration,
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backing")
            .field("path", &self.path)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl Backing {
    /// Opens `path` (a block device or an existing file) for `block_bytes` blocks.
    pub(crate) fn open(path: &Path, block_bytes: u32) -> Result<Self> {
        let shown = path.display().to_string();
        let file = DirectFile::open(path, None)
            .map_err(CacheError::backing(format!("opening {shown}")))?;
        let size = file.size_bytes();
        if size == 0 || !size.is_multiple_of(u64::from(block_bytes)) {
            return Err(CacheError::Config(format!(
                "the backing store {shown} has {size} bytes, not a positive multiple of the \
                 {block_bytes}-byte block"
            )));
        }
        let engine = Engine::new(file, Strategy::Pool, PoolConfig::default(), 8).map_err(
            CacheError::backing(format!("setting up io_uring for {shown}")),
        )?;
        Ok(Backing {
            engine,
            path: shown,
            size,
            block_bytes: block_bytes as usize,
            reads: 0,
            writes: 0,
            ops: 0,
            busy: Duration::ZERO,
        })
    }

    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    fn offset(&self, block: u64) -> u64 {
        block * self.block_bytes as u64
    }

    /// Reads `block` into `out`.
    pub(crate) fn read_block(&mut self, block: u64, out: &mut [u8]) -> Result<()> {
        let start = Instant::now();
        let doing = || format!("reading block {block} of {}", self.path);
        let n = self
            .engine
            .read_into(self.offset(block), &mut out[..self.block_bytes])
            .map_err(CacheError::backing(doing()))?;
        if n != self.block_bytes {
            return Err(CacheError::Backing {
                doing: doing(),
                source: std::io::Error::other(format!("{n} of {} bytes", self.block_bytes)),
            });
        }
        self.account(start);
        self.reads += 1;
        Ok(())
    }

    /// Writes `block` (durable only after [`Backing::sync`]).
    pub(crate) fn write_block(&mut self, block: u64, data: &[u8]) -> Result<()> {
        let start = Instant::now();
        self.engine
            .write_all(self.offset(block), data)
            .map_err(CacheError::backing(format!(
                "writing block {block} of {}",
                self.path
            )))?;
        self.account(start);
        self.writes += 1;
        Ok(())
    }

    /// Makes `[offset, offset + len)` read as zeros, durably.
    pub(crate) fn zero_range(&mut self, offset: u64, len: u64) -> Result<()> {
        let start = Instant::now();
        self.engine
            .file()
            .zero_range(offset, len)
            .map_err(CacheError::backing(format!(
                "zeroing {len} bytes at {offset} of {}",
                self.path
            )))?;
        self.account(start);
        Ok(())
    }

    /// Makes every write so far durable.
    pub(crate) fn sync(&mut self) -> Result<()> {
        let start = Instant::now();
        self.engine
            .file()
            .sync_data()
            .map_err(CacheError::backing(format!("syncing {}", self.path)))?;
        self.account(start);
        Ok(())
    }

    fn account(&mut self, start: Instant) {
        self.ops += 1;
        self.busy += start.elapsed();
    }
}
