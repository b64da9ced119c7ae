//! Global addresses: one 64-bit space over every device of the volume.
//!
//! A global address is `device index << 56 | byte offset within the device`. Device indexes
//! are recorded in each device's superblock at format, so an address means the same bytes
//! after every restart, whatever order the devices are listed or discovered in.

use serde::{Deserialize, Serialize};

/// Bits of a global address that hold the device offset.
pub const OFFSET_BITS: u32 = 56;
/// Most devices in one volume (the index must fit in the top 8 bits).
pub const MAX_DEVICES: u32 = 1 << (64 - OFFSET_BITS);
/// Largest device offset (64 PiB - 1).
pub const MAX_OFFSET: u64 = (1 << OFFSET_BITS) - 1;

/// A device index and a byte offset within that device, packed into 64 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GlobalAddress(u64);

impl GlobalAddress {
    /// The address of `offset` on device `device`. Panics if either is out of range: callers
    /// build addresses from checked device sizes.
    pub fn new(device: u32, offset: u64) -> Self {
        assert!(device < MAX_DEVICES, "device index {device} out of range");
        assert!(offset <= MAX_OFFSET, "device offset {offset} out of range");
        Self(u64::from(device) << OFFSET_BITS | offset)
    }

    /// Reinterprets a stored 64-bit value (from media or an API caller).
    pub fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The 64-bit value to store.
    pub fn raw(self) -> u64 {
        self.0
    }

    /// The device index.
    pub fn device(self) -> u32 {
        (self.0 >> OFFSET_BITS) as u32
    }

    /// The byte offset within the device.
    pub fn offset(self) -> u64 {
        self.0 & MAX_OFFSET
    }

    /// This address moved forward by `bytes` on the same device.
    pub fn offset_by(self, bytes: u64) -> Self {
        Self::new(self.device(), self.offset() + bytes)
    }
}

impl std::fmt::Display for GlobalAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{:#x}", self.device(), self.offset())
    }
}

/// A contiguous range of one device: `len_bytes` from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Extent {
    /// First byte.
    pub start: GlobalAddress,
    /// Length in bytes (a multiple of the volume's block size).
    pub len_bytes: u64,
}

impl Extent {
    /// The device the extent is on.
    pub fn device(&self) -> u32 {
        self.start.device()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_device_and_offset() {
        for (device, offset) in [(0, 0), (3, 4096), (255, MAX_OFFSET), (17, 1 << 40)] {
            let address = GlobalAddress::new(device, offset);
            assert_eq!((address.device(), address.offset()), (device, offset));
            assert_eq!(GlobalAddress::from_raw(address.raw()), address);
        }
        assert_eq!(GlobalAddress::new(2, 0x1000).to_string(), "2:0x1000");
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn offset_beyond_56_bits_is_a_bug() {
        let _ = GlobalAddress::new(0, MAX_OFFSET + 1);
    }
}
