//! Data checksums on the data path (`crate::checksums`): the entries of blocks a writer or
//! the checkpoint has just filled, and reads that verify every block they touch.

use volume::GlobalAddress;

use super::state::Inner;
use crate::checksums::block_crc;
use crate::error::{FsError, Result};
use crate::extent_map::BLOCK;

const B: usize = BLOCK as usize;

impl Inner {
    /// With data checksums: stores the entries of the blocks under `[addr, addr + data.len())`,
    /// which this thread has just filled with `data` (blocks nothing names yet, so no one
    /// else stores to them). A block `data` covers whole is summed from `data`; an edge block
    /// is read back whole (its other bytes count too). Durable at the caller's next fence.
    pub(crate) fn note_filled(&self, addr: u64, data: &[u8]) -> Result<()> {
        let Some(checksums) = &self.checksums else {
            return Ok(());
        };
        let end = addr + data.len() as u64;
        let first = addr - addr % BLOCK;
        let mut crcs = [0u32; 16];
        let mut count = 0;
        let mut run_start = first;
        let mut block = first;
        let mut scratch = [0u8; B];
        while block < end {
            let crc = if block >= addr && block + BLOCK <= end {
                let at = (block - addr) as usize;
                block_crc(&data[at..at + B])
            } else {
                self.read_pmem(block, &mut scratch)?;
                block_crc(&scratch)
            };
            crcs[count] = crc;
            count += 1;
            block += BLOCK;
            if count == crcs.len() || block >= end {
                checksums.store(run_start, &crcs[..count])?;
                run_start = block;
                count = 0;
            }
        }
        Ok(())
    }

    /// With data checksums: stores the entries of `len` bytes of blocks at `addr` that were
    /// filled without passing through this process's hands (a caller's buffer), by reading
    /// them back.
    pub(crate) fn note_filled_in_place(&self, addr: u64, len: u64) -> Result<()> {
        if self.checksums.is_none() {
            return Ok(());
        }
        let first = addr - addr % BLOCK;
        let end = (addr + len).next_multiple_of(BLOCK);
        let mut block = vec![0u8; B];
        let mut at = first;
        while at < end {
            self.read_pmem(at, &mut block)?;
            self.note_filled(at, &block)?;
            at += BLOCK;
        }
        Ok(())
    }

    /// Reads `out.len()` bytes of file `ino` (at file offset `offset`) from persistent memory
    /// at `addr`, verifying every block they touch when the file system has data checksums.
    pub(crate) fn read_data(&self, ino: u64, offset: u64, addr: u64, out: &mut [u8]) -> Result<()> {
        let Some(checksums) = &self.checksums else {
            return self.read_pmem(addr, out);
        };
        let len = out.len() as u64;
        let mut pos = 0u64;
        let mut scratch = [0u8; B];
        while pos < len {
            let at = addr + pos;
            let block = at - at % BLOCK;
            let within = (at - block) as usize;
            let n = (BLOCK - within as u64).min(len - pos) as usize;
            let dst = &mut out[pos as usize..pos as usize + n];
            let good = if within == 0 && n == B {
                self.read_pmem(block, dst)?;
                checksums.matches(block, dst)?
            } else {
                self.read_pmem(block, &mut scratch)?;
                dst.copy_from_slice(&scratch[within..within + n]);
                checksums.matches(block, &scratch)?
            };
            if !good {
                return Err(damaged(ino, offset + pos, block));
            }
            pos += n as u64;
        }
        Ok(())
    }

    /// Verifies the blocks under `[addr, addr + len)` of file `ino` (at file offset `offset`)
    /// without keeping their bytes: before lending them in place.
    pub(crate) fn verify_data(&self, ino: u64, offset: u64, addr: u64, len: u64) -> Result<()> {
        let Some(checksums) = &self.checksums else {
            return Ok(());
        };
        let mut scratch = [0u8; B];
        let mut block = addr - addr % BLOCK;
        while block < addr + len {
            self.read_pmem(block, &mut scratch)?;
            if !checksums.matches(block, &scratch)? {
                let first = offset + block.saturating_sub(addr);
                return Err(damaged(ino, first, block));
            }
            block += BLOCK;
        }
        Ok(())
    }

    /// Reads the block at `block_addr` into `out` and says whether it matches its entry
    /// (always true without data checksums).
    pub(crate) fn read_block_checked(&self, block_addr: u64, out: &mut [u8]) -> Result<bool> {
        self.read_pmem(block_addr, out)?;
        match &self.checksums {
            Some(checksums) => checksums.matches(block_addr, out),
            None => Ok(true),
        }
    }
}

/// The error for a damaged block, logged where it is found.
pub(crate) fn damaged(ino: u64, offset: u64, block: u64) -> FsError {
    let block = GlobalAddress::from_raw(block).to_string();
    tracing::error!(ino, offset, %block, "data checksum mismatch: the block is damaged");
    FsError::DataChecksum { ino, offset, block }
}
