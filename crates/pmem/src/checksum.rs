//! The data checksum a log record carries for the bytes it points at, so that one fence can
//! make a write's data and its record durable together: a crash that keeps the record and
//! loses some of the data leaves a record whose checksum the data fails.
//!
//! Definition (docs/format/fs-log.md): the bytes are read as 8-byte little-endian words, the
//! last one padded with zeros; word `i` belongs to lane `i mod 4`; each lane's checksum is the
//! CRC-32C of its words' bytes in order (0 for a lane with none); the checksum is the CRC-32C
//! of the four lane checksums (4-byte little-endian each) followed by the length in bytes
//! (8-byte little-endian). Four lanes because the CPU's `crc32` instruction takes three
//! cycles and starts one a cycle: four independent chains keep it busy, so the checksum
//! costs the copy next to nothing ([`crate::cpu`] computes it from the registers the copy
//! stores from, so the checksum is of exactly the bytes stored, whatever another thread does
//! to the source meanwhile).

#![allow(unsafe_code, reason = "the CPU's crc32 instruction")]

use std::arch::x86_64::_mm_crc32_u64;

/// The CRC-32C (Castagnoli) polynomial, bit-reversed.
const POLY: u32 = 0x82F6_3B78;

/// The four lanes' running CRC states (inverted, as the `crc32` instruction chains them).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lanes {
    state: [u64; 4],
    hardware: bool,
}

impl Lanes {
    /// Empty lanes, updated with the `crc32` instruction when the CPU has it (SSE4.2).
    pub(crate) fn new() -> Self {
        Self::with(std::arch::is_x86_feature_detected!("sse4.2"))
    }

    fn with(hardware: bool) -> Self {
        Self {
            state: [u64::from(u32::MAX); 4],
            hardware,
        }
    }

    /// Lanes whose word `i` goes to `state[(i + rotation) % 4]` from now on: the state in
    /// the order a loop over 32-byte vectors starting at word `rotation` feeds them.
    pub(crate) fn rotated(&self, rotation: usize) -> [u64; 4] {
        std::array::from_fn(|j| self.state[(rotation + j) % 4])
    }

    /// Takes back states [`Lanes::rotated`] handed out, updated.
    pub(crate) fn unrotate(&mut self, rotation: usize, states: [u64; 4]) {
        for (j, state) in states.into_iter().enumerate() {
            self.state[(rotation + j) % 4] = state;
        }
    }

    /// Adds word `index` (its little-endian value).
    pub(crate) fn feed(&mut self, index: usize, word: u64) {
        let lane = &mut self.state[index % 4];
        *lane = if self.hardware {
            // SAFETY: `hardware` is set only on a CPU with SSE4.2.
            unsafe { crc32_word(*lane, word) }
        } else {
            soft_crc32_word(*lane, word)
        };
    }

    /// The checksum of `len` bytes whose words were fed.
    pub(crate) fn finish(&self, len: usize) -> u32 {
        let lane = |i: usize| u64::from(!(self.state[i] as u32));
        let mut last = Self::with(self.hardware);
        last.feed(0, lane(0) | lane(1) << 32);
        last.feed(0, lane(2) | lane(3) << 32);
        last.feed(0, len as u64);
        !(last.state[0] as u32)
    }
}

/// One `crc32` instruction over an 8-byte word.
///
/// # Safety
/// The CPU must have SSE4.2.
#[target_feature(enable = "sse4.2")]
pub(crate) unsafe fn crc32_word(state: u64, word: u64) -> u64 {
    _mm_crc32_u64(state, word)
}

/// What the `crc32` instruction computes over an 8-byte word, bit by bit.
fn soft_crc32_word(state: u64, word: u64) -> u64 {
    let mut crc = state as u32;
    for byte in word.to_le_bytes() {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (POLY & (crc & 1).wrapping_neg());
        }
    }
    u64::from(crc)
}

/// The data checksum of `bytes` (the module docs define it).
pub fn data_checksum(bytes: &[u8]) -> u32 {
    let mut lanes = Lanes::new();
    feed_all(&mut lanes, bytes);
    lanes.finish(bytes.len())
}

fn feed_all(lanes: &mut Lanes, bytes: &[u8]) {
    let mut words = bytes.chunks_exact(8);
    let mut index = 0;
    for word in words.by_ref() {
        lanes.feed(index, u64::from_le_bytes(word.try_into().expect("8 bytes")));
        index += 1;
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut padded = [0u8; 8];
        padded[..rest.len()].copy_from_slice(rest);
        lanes.feed(index, u64::from_le_bytes(padded));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, spelled out with a bitwise CRC-32C of byte strings.
    fn crc32c(data: &[u8]) -> u32 {
        let mut crc = u32::MAX;
        for &byte in data {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = (crc >> 1) ^ (POLY & (crc & 1).wrapping_neg());
            }
        }
        !crc
    }

    fn by_definition(bytes: &[u8]) -> u32 {
        let mut padded = bytes.to_vec();
        padded.resize(bytes.len().div_ceil(8) * 8, 0);
        let mut lanes: [Vec<u8>; 4] = Default::default();
        for (i, word) in padded.chunks_exact(8).enumerate() {
            lanes[i % 4].extend_from_slice(word);
        }
        let mut last = Vec::new();
        for lane in &lanes {
            last.extend_from_slice(&crc32c(lane).to_le_bytes());
        }
        last.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        crc32c(&last)
    }

    fn sample(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn hardware_and_software_lanes_compute_the_definition() {
        // The bitwise CRC-32C the definition is spelled with gives the standard check value.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        for len in (0..200).chain([4095, 4096, 4097, 65536]) {
            let bytes = sample(len, len as u64 + 7);
            let expected = by_definition(&bytes);
            let mut soft = Lanes::with(false);
            feed_all(&mut soft, &bytes);
            assert_eq!(soft.finish(len), expected, "software, {len} bytes");
            assert_eq!(data_checksum(&bytes), expected, "{len} bytes");
        }
    }

    #[test]
    fn any_changed_word_or_length_changes_the_checksum() {
        let bytes = sample(4096, 3);
        let sum = data_checksum(&bytes);
        for at in (0..4096).step_by(61) {
            let mut changed = bytes.clone();
            changed[at] ^= 0x10;
            assert_ne!(data_checksum(&changed), sum, "a bit flipped at byte {at}");
        }
        // Zeros past the end pad the last word: only the length tells them apart.
        let short = vec![0u8; 13];
        assert_ne!(data_checksum(&short), data_checksum(&short[..12]));
        assert_ne!(data_checksum(&[]), data_checksum(&[0]));
    }
}
