//! The read path: where a file's bytes are (logged data over checkpointed extents, holes),
//! and copying them out.

use super::Piece;
use super::state::Inner;
use crate::error::Result;
use crate::extent_map::BLOCK;
use crate::inode::Inode;

impl Inner {
    /// Reads `buf.len()` bytes at `offset` as the file holds them now (the caller clamps to
    /// the size and holds the range shared).
    /// With data checksums, every block read is verified: a damaged one fails the read with
    /// [`crate::FsError::DataChecksum`] (and a log line), never returning its bytes.
    pub(crate) fn read_into(&self, inode: &Inode, offset: u64, buf: &mut [u8]) -> Result<()> {
        for (start, stop, source) in self.segments(inode, offset, buf.len() as u64) {
            let out = &mut buf[(start - offset) as usize..(stop - offset) as usize];
            match source {
                Some(addr) => self.read_data(inode.ino, start, addr, out)?,
                None => out.fill(0),
            }
        }
        Ok(())
    }

    /// Where the bytes `[offset, offset + len)` of `inode` are now, in file order: pieces of
    /// `(length, Some((region, offset)))` in persistent memory (newest logged data over
    /// checkpointed extents) or `(length, None)` for holes. The caller holds the range lock,
    /// so the answer stays true while it does. With data checksums, the blocks under every
    /// piece are verified first.
    pub(crate) fn pieces(&self, inode: &Inode, offset: u64, len: u64) -> Result<Vec<Piece<'_>>> {
        self.segments(inode, offset, len)
            .into_iter()
            .map(|(start, stop, source)| {
                let place = match source {
                    Some(addr) => {
                        self.verify_data(inode.ino, start, addr, stop - start)?;
                        Some(self.region_at(addr)?)
                    }
                    None => None,
                };
                Ok((stop - start, place))
            })
            .collect()
    }

    /// [`Inner::pieces`] as `(file start, file end, global address or None for a hole)`.
    fn segments(&self, inode: &Inode, offset: u64, len: u64) -> Vec<(u64, u64, Option<u64>)> {
        let end = offset + len;
        let runs = inode
            .extents
            .read()
            .expect("extent map")
            .lookup(offset / BLOCK, end.div_ceil(BLOCK));
        let pieces = inode.overlay.lookup(offset, end);
        // (file start, file end, source address or None for zeros), covering the range.
        let mut segments: Vec<(u64, u64, Option<u64>)> = Vec::new();
        let mut runs = runs.iter().peekable();
        let mut base = |from: u64, to: u64, out: &mut Vec<(u64, u64, Option<u64>)>| {
            let mut at = from;
            while at < to {
                while runs
                    .peek()
                    .is_some_and(|r| (r.file_block + r.blocks) * BLOCK <= at)
                {
                    runs.next();
                }
                match runs.peek() {
                    Some(run) if run.file_block * BLOCK <= at => {
                        let run_end = ((run.file_block + run.blocks) * BLOCK).min(to);
                        out.push((at, run_end, Some(run.addr + (at - run.file_block * BLOCK))));
                        at = run_end;
                    }
                    next => {
                        let hole_end = next.map_or(to, |r| (r.file_block * BLOCK).min(to));
                        out.push((at, hole_end, None));
                        at = hole_end;
                    }
                }
            }
        };
        let mut at = offset;
        for piece in &pieces {
            base(at, piece.start, &mut segments);
            segments.push((piece.start, piece.end, Some(piece.src)));
            at = piece.end;
        }
        base(at, end, &mut segments);
        if self.options.defragments() && segments.len() >= crate::defrag::SCATTERED_PIECES {
            self.defrag.read_scattered(inode.ino, &segments);
        }
        segments
    }
}
