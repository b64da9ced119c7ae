//! Per-block policy state indexed by dense block id, grown on first use.

use std::ops::Deref;

use crate::policy::BlockId;

/// A vector of per-block state that grows to hold any block id it is asked for. Reads go
/// through `Deref` to the slice (only for ids already seen); `get_mut` grows.
#[derive(Debug, Default)]
pub(crate) struct BlockTable<T> {
    blocks: Vec<T>,
}

impl<T: Clone + Default> BlockTable<T> {
    /// The state of `id`, created with `T::default()` if the table does not reach it yet.
    #[inline]
    pub(crate) fn get_mut(&mut self, id: BlockId) -> &mut T {
        let index = id as usize;
        if index >= self.blocks.len() {
            self.blocks.resize(index + 1, T::default());
        }
        &mut self.blocks[index]
    }
}

impl<T> Deref for BlockTable<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.blocks
    }
}
