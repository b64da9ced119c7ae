//! The volume manager (MBS-LVM): every node's persistent memory pooled into one global
//! address space, with each allocation served from the device nearest the requesting node.
//!
//! - Cluster manager: [`Volume::format`] / [`Volume::open`] join devices (each with a
//!   superblock naming its volume and index) into one space of [`GlobalAddress`]es.
//! - Space manager: a [`BuddyAllocator`] per device, in DRAM, rebuilt at open from the
//!   owner's extents ([`Volume::mark_owned`]), so a crash can leak nothing.
//! - Monitor: per requesting node a candidate list of devices in latency order and a fat
//!   list of nearly full ones, with hysteresis; [`Volume::decide_target`] is O(1).
//!
//! Invariants: an extent handed out lies in one device's data space and overlaps no other
//! live extent; a device opens only if its superblock is intact and every device of its
//! volume is present; allocation never touches persistent memory (only the owner's records
//! are durable).

mod address;
pub mod buddy;
mod check;
mod config;
mod error;
mod extend;
mod lock;
pub mod monitor;
mod served;
mod shards;
pub mod superblock;
mod volume;

pub use address::{Extent, GlobalAddress, MAX_DEVICES};
pub use buddy::BuddyAllocator;
pub use check::{CheckReport, DeviceCheck, check, check_held};
pub use config::{CONFIG_FILE, DEFAULT_DIR, DeviceConfig, VolumeConfig, may_create_default_in};
pub use error::{Result, VolumeError};
pub use extend::{Extended, GrowTo, Grown};
pub use lock::VolumeLock;
pub use monitor::Thresholds;
pub use served::{
    SERVED_FILE, STOPPING_WAIT, Served, UNRECORDED, after_stopping_server, clear_served,
    command_line, find_served, find_stopping, is_locus_mount, record_served, stopping_holder,
};
pub use volume::{
    DeviceSource, DeviceStats, MAX_ALLOC_BYTES, OpenOptions, Volume, default_config, hex,
};
