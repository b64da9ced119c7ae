//! `Fs::scrub`: reads every block of file data a file system names — its files' blocks and
//! the buffers of logged writes not yet moved into them — and checks each against its data
//! checksum, reporting every damaged block by file, offset and address.

use std::collections::HashMap;
use std::sync::Arc;

use volume::{GlobalAddress, Volume};

use crate::checksums::Checksums;
use crate::error::Result;
use crate::extent_map::BLOCK;
use crate::fs::ROOT_INO;
use crate::inode::Inode;
use crate::journal::Kind;

/// What a scrub found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ScrubReport {
    /// Files whose data was read.
    pub files: u64,
    /// Distinct 4 KiB blocks read and checked.
    pub blocks: u64,
    /// Every damaged block, in file order.
    pub damaged: Vec<DamagedBlock>,
}

/// What `Fs::salvage` cut from damaged journals and logs.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SalvageReport {
    /// Every damage found, as check names it.
    pub damage: Vec<String>,
    /// The file system is kept as of this global order: every record up to it, none after.
    pub kept_through_order: u64,
    /// Metadata operations (journal records) dropped.
    pub dropped_journal_records: u64,
    /// Logged writes (records) dropped, and their bytes.
    pub dropped_writes: u64,
    /// Bytes those writes carried.
    pub dropped_write_bytes: u64,
    /// Damaged records dropped unread: what they did is lost, and the files they touched
    /// (a logged write's file, a removal that freed memory others reused) cannot be named.
    pub unreadable_records: u64,
    /// Files the dropped writes were to, as the kept file system has them (`inode N` for a
    /// file open but unlinked); files only dropped operations created are gone with them.
    pub files_losing_writes: Vec<String>,
    /// Files whose kept contents may name memory a dropped operation had freed and a later
    /// write reused: read them before trusting them.
    pub files_at_risk: Vec<String>,
}

/// One block of data that fails its checksum.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DamagedBlock {
    /// The file's path (or `inode N` for a file removed while open).
    pub path: String,
    /// Its inode number.
    pub ino: u64,
    /// File offset of the first of the file's bytes the block holds.
    pub offset: u64,
    /// How many of the file's bytes the block holds.
    pub len: u64,
    /// The block's global address.
    pub address: String,
    /// `file block` (checkpointed data) or `logged write` (a write not yet moved into the
    /// file).
    pub held_by: &'static str,
}

/// Scrubs the files of `inodes` (as recovery loaded them: extent maps and the overlays of
/// logged writes) on `volume`: each device's blocks on a thread of their own, near the device
/// ([`per_device`]).
pub(crate) fn scrub(
    volume: &Volume,
    checksums: &Checksums,
    inodes: &HashMap<u64, Arc<Inode>>,
) -> Result<ScrubReport> {
    let paths = paths(inodes);
    let files = files(inodes);
    let held = distinct_blocks(&files);
    let found = per_device(volume, &held, |blocks| {
        let mut block = vec![0u8; BLOCK as usize];
        let mut damaged = Vec::new();
        for &index in blocks {
            let physical = held[index].physical;
            read_block(volume, physical, &mut block)?;
            if !checksums.matches(physical, &block)? {
                damaged.push(index);
            }
        }
        Ok(damaged)
    })?;
    let mut damaged: Vec<usize> = found.into_iter().flatten().collect();
    damaged.sort_unstable();
    let damaged = damaged
        .into_iter()
        .map(|index| {
            let held = held[index];
            let ino = files[held.file as usize].ino;
            DamagedBlock {
                path: paths
                    .get(&ino)
                    .cloned()
                    .unwrap_or_else(|| format!("inode {ino}")),
                ino,
                offset: held.offset,
                len: held.len,
                address: GlobalAddress::from_raw(held.physical).to_string(),
                held_by: held.held_by,
            }
        })
        .collect();
    Ok(ScrubReport {
        files: files.len() as u64,
        blocks: held.len() as u64,
        damaged,
    })
}

/// The files of `inodes`, by inode number.
fn files(inodes: &HashMap<u64, Arc<Inode>>) -> Vec<&Arc<Inode>> {
    let mut files: Vec<&Arc<Inode>> = inodes.values().filter(|i| i.kind == Kind::File).collect();
    files.sort_by_key(|i| i.ino);
    files
}

/// A block of data a file holds: where it is, and which of the file's bytes it holds.
#[derive(Debug, Clone, Copy)]
struct Held {
    physical: u64,
    /// Index of the file in the list the blocks were gathered from.
    file: u32,
    offset: u64,
    len: u64,
    held_by: &'static str,
}

/// Every distinct block of data `files` hold ([`data_blocks`]), file by file in file order;
/// a block two files or two logged writes share is listed once, for the first.
fn distinct_blocks(files: &[&Arc<Inode>]) -> Vec<Held> {
    let mut seen = std::collections::HashSet::new();
    let mut held = Vec::new();
    for (file, inode) in files.iter().enumerate() {
        for (offset, len, physical, held_by) in data_blocks(inode) {
            if seen.insert(physical) {
                held.push(Held {
                    physical,
                    file: file as u32,
                    offset,
                    len,
                    held_by,
                });
            }
        }
    }
    held
}

/// Runs `work` over the blocks of `held` (by their indexes in it) device by device, each device
/// on a thread of its own pinned to the CPUs of the device's node when that node has any — so
/// every device is read from its own node and the devices at once (scrub and turning
/// checksums on read all of a volume's data). Returns each device's result.
fn per_device<T: Send>(
    volume: &Volume,
    held: &[Held],
    work: impl Fn(&[usize]) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); volume.device_count() as usize];
    for (index, &block) in held.iter().enumerate() {
        let device = GlobalAddress::from_raw(block.physical).device() as usize;
        groups
            .get_mut(device)
            .ok_or_else(|| {
                crate::FsError::corrupt(
                    "data block address",
                    format!(
                        "{} is on no device of the volume",
                        GlobalAddress::from_raw(block.physical)
                    ),
                )
            })?
            .push(index);
    }
    let work = &work;
    std::thread::scope(|scope| {
        let threads: Vec<_> = groups
            .iter()
            .enumerate()
            .filter(|(_, blocks)| !blocks.is_empty())
            .map(|(device, blocks)| {
                let cpus = volume
                    .device_node(device as u32)
                    .and_then(|node| volume.topology().node(node))
                    .map(|node| node.cpus.clone())
                    .filter(|cpus| !cpus.is_empty());
                scope.spawn(move || {
                    if let Some(cpus) = cpus {
                        // Only placement: a thread left unpinned still does the work.
                        let _ = topology::pin_current_thread(&cpus);
                    }
                    work(blocks)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a device's scrub thread panicked"))
            .collect()
    })
}

/// The blocks of data a file's reads can return, as recovery loaded it — its extent map's
/// blocks and the buffer blocks of logged writes still visible over them — as (file offset,
/// file bytes, physical block, held by), in file order: what a data checksum covers.
pub(crate) fn data_blocks(inode: &Inode) -> Vec<(u64, u64, u64, &'static str)> {
    let mut blocks = Vec::new();
    for run in inode.extents.read().expect("extent map").runs() {
        for i in 0..run.blocks {
            blocks.push((
                (run.file_block + i) * BLOCK,
                BLOCK,
                run.addr + i * BLOCK,
                "file block",
            ));
        }
    }
    let size = inode.size.load(std::sync::atomic::Ordering::Acquire);
    for piece in inode.overlay.lookup(0, size) {
        let mut at = piece.start;
        while at < piece.end {
            let src = piece.src + (at - piece.start);
            let physical = src - src % BLOCK;
            let n = (BLOCK - src % BLOCK).min(piece.end - at);
            blocks.push((at, n, physical, "logged write"));
            at += n;
        }
    }
    blocks.sort_unstable();
    blocks
}

/// Gives every block of data the files of `inodes` hold ([`data_blocks`]) its entry in
/// `checksums`, from the bytes it holds now (`Fs::set_data_checksums`: checksums turned on
/// for a file system that had none), each device's blocks on a thread near it
/// ([`per_device`]), each thread fencing its own stores: durable when it returns. Returns the
/// blocks.
pub(crate) fn fill_entries(
    volume: &Volume,
    checksums: &Checksums,
    inodes: &HashMap<u64, Arc<Inode>>,
) -> Result<u64> {
    let held = distinct_blocks(&files(inodes));
    per_device(volume, &held, |blocks| {
        let mut block = vec![0u8; BLOCK as usize];
        for &index in blocks {
            let physical = held[index].physical;
            read_block(volume, physical, &mut block)?;
            checksums.store(physical, &[crate::checksums::block_crc(&block)])?;
        }
        // The entries are non-temporal stores of this thread: only its own fence drains them.
        volume.fence();
        Ok(())
    })?;
    Ok(held.len() as u64)
}

/// Reads the block at `physical` into `block`.
fn read_block(volume: &Volume, physical: u64, block: &mut [u8]) -> Result<()> {
    let at = GlobalAddress::from_raw(physical);
    volume
        .device_region(at.device())?
        .read(at.offset(), block)?;
    Ok(())
}

/// Every linked inode's path.
pub(crate) fn paths(inodes: &HashMap<u64, Arc<Inode>>) -> HashMap<u64, String> {
    let mut paths = HashMap::from([(ROOT_INO, "/".to_owned())]);
    let mut queue = vec![ROOT_INO];
    while let Some(dir) = queue.pop() {
        let Some(inode) = inodes.get(&dir) else {
            continue;
        };
        if inode.kind != Kind::Dir {
            continue;
        }
        let base = paths[&dir].clone();
        for (name, ino) in inode.entries().iter() {
            let path = if base == "/" {
                format!("/{name}")
            } else {
                format!("{base}/{name}")
            };
            if paths.insert(*ino, path).is_none() {
                queue.push(*ino);
            }
        }
    }
    paths
}
