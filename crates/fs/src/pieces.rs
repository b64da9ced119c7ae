//! Allocating a length in pieces when free memory has no single extent that large: the one
//! "halve the size until it fits" rule, for snapshots and for callers' buffers.

use crate::error::{FsError, Result};

/// One piece: `len` bytes at offset `at` of the whole, held by `item`.
#[derive(Debug)]
pub(crate) struct Piece<T> {
    pub(crate) at: u64,
    pub(crate) len: u64,
    pub(crate) item: T,
}

/// Allocates `len` bytes with `alloc(at, n)` (`n` bytes for offset `at` of the whole): whole
/// if it can; otherwise in pieces of the largest
/// power-of-two size it still gets, halving the size each time `alloc` finds no space, down
/// to `min`. Each piece starts at a multiple of its size within the whole (so a piece of a
/// block or more starts on a block boundary of the whole). Pieces are appended to `pieces`
/// as they are allocated, so that on failure the caller still has them to give back. Fails
/// with the allocator's `NoSpace` once not even `min` is left, or when more than `max_pieces`
/// would be needed.
pub(crate) fn alloc_halving<T>(
    len: u64,
    min: u64,
    max_pieces: usize,
    pieces: &mut impl Extend<Piece<T>>,
    mut alloc: impl FnMut(u64, u64) -> Result<T>,
) -> Result<()> {
    debug_assert!(min.is_power_of_two());
    let mut size = len;
    let mut at = 0;
    let mut count = 0;
    while at < len {
        if count == max_pieces {
            return Err(FsError::Volume(volume::VolumeError::NoSpace {
                len_bytes: len,
            }));
        }
        let n = size.min(len - at);
        match alloc(at, n) {
            Ok(item) => {
                pieces.extend(std::iter::once(Piece { at, len: n, item }));
                count += 1;
                at += n;
            }
            Err(e) if e.kind() == crate::ErrorKind::NoSpace && size > min => {
                size = if size == len {
                    (len / 2).next_power_of_two().max(min)
                } else {
                    size / 2
                };
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_space() -> FsError {
        FsError::Volume(volume::VolumeError::NoSpace { len_bytes: 0 })
    }

    /// An allocator whose largest free extent is `largest`, with `total` bytes free.
    fn run(len: u64, largest: u64, total: u64, max: usize) -> (Result<()>, Vec<(u64, u64)>) {
        let mut free = total;
        let mut pieces = Vec::new();
        let result = alloc_halving(len, 4096, max, &mut pieces, |_, n| {
            if n > largest || n > free {
                return Err(no_space());
            }
            free -= n;
            Ok(())
        });
        (result, pieces.iter().map(|p| (p.at, p.len)).collect())
    }

    #[test]
    fn whole_when_it_fits() {
        assert_eq!(run(5 << 20, 8 << 20, 64 << 20, 8).1, [(0, 5 << 20)]);
    }

    #[test]
    fn halves_to_the_largest_power_of_two_it_gets_each_at_a_multiple_of_its_size() {
        let (result, pieces) = run(5 << 20, 1 << 20, 64 << 20, 8);
        result.unwrap();
        let want: Vec<(u64, u64)> = (0..5).map(|i| (i << 20, 1 << 20)).collect();
        assert_eq!(pieces, want);
        let (result, pieces) = run(5 << 20, 2 << 20, 64 << 20, 8);
        result.unwrap();
        assert_eq!(
            pieces,
            [(0, 2 << 20), (2 << 20, 2 << 20), (4 << 20, 1 << 20)]
        );
    }

    #[test]
    fn fails_with_no_space_and_leaves_the_pieces_it_got_to_the_caller() {
        let (result, pieces) = run(64 << 10, 16 << 10, 20 << 10, 8);
        assert_eq!(result.unwrap_err().kind(), crate::ErrorKind::NoSpace);
        assert_eq!(
            pieces,
            [(0, 16 << 10), (16 << 10, 4 << 10)],
            "the caller gives these back"
        );
        let (result, pieces) = run(64 << 10, 4096, 1 << 20, 4);
        assert_eq!(result.unwrap_err().kind(), crate::ErrorKind::NoSpace);
        assert_eq!(pieces.len(), 4, "stopped at the piece limit");
    }

    #[test]
    fn other_errors_stop_at_once() {
        let mut pieces: Vec<Piece<()>> = Vec::new();
        let err = alloc_halving(1 << 20, 4096, 8, &mut pieces, |_, _| {
            Err(FsError::Invalid("no".into()))
        })
        .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Invalid);
        assert!(pieces.is_empty());
    }
}
