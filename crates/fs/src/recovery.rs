//! Format and open (recovery).
//!
//! Open finds everything from the root at the start of device 0's owner area, by global
//! addresses (device + offset: relative, never pointers): the snapshot, and each thread
//! slot's journal and log area. It then
//! 1. loads the snapshot;
//! 2. reads every journal's records of the snapshot's epoch (a torn last record ends a
//!    journal: its operation never returned);
//! 3. takes each slot's retired watermark as the highest the snapshot or a committed
//!    checkpoint batch says, and reads each log area's live records above it (torn records
//!    fail their checksum and are dropped);
//! 4. replays journal operations and live log records merged by their global order;
//! 5. gives the volume the set of pages the file system owns (snapshot, slot areas, every
//!    file's blocks, the buffers of live records), refusing a page owned twice.
//!
//! The live records are queued for the checkpoint again, so nothing recovery found waits in
//! a log for long. Damage never panics: it is an error naming the structure.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use volume::{Extent, GlobalAddress, Volume};

use crate::apply::{self, Move, NewInode, Problem, RenameDirs};
use crate::buffers::BufferSet;
use crate::checksums::Checksums;
use crate::error::{FsError, Result};
use crate::extent_map::{BLOCK, ExtentMap};
use crate::fs::{
    FormatOptions, Fs, FsOptions, ROOT_INO, Recovered, check_format, check_options,
    check_slot_limit, now_ns,
};
use crate::inode::{Attr, ByIno, Inode, Owner};
use crate::journal::{Journal, JournalRecord, Kind, MetaOp};
use crate::log::{LogArea, LogRecord};
use crate::progress::Pending;
use crate::root::{Root, SlotAreas};
use crate::snapshot::{INDEX_MAGIC, InodeImage, MAX_PIECES, Snapshot, SnapshotIndex};

/// The inodes while the logs are replayed: the running file system's own, built from the
/// snapshot and changed by the same [`apply`] functions the live path calls.
type Table = crate::inode::InodeTable;

/// What [`Fs::check`] found on a file system that would open.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FsCheck {
    /// Generation of the root copy in use.
    pub generation: u64,
    /// Epoch of the snapshot and journals.
    pub epoch: u64,
    /// Thread slots with log areas and journals.
    pub slots: u64,
    /// The volume memory those areas hold.
    pub slot_bytes: u64,
    /// Thread slots the file system may have ([`crate::FormatOptions::slot_limit`]; 0 in
    /// a report written before it was kept).
    #[serde(default)]
    pub slot_limit: u64,
    /// Regular files.
    pub files: u64,
    /// Directories, the root included.
    pub directories: u64,
    /// Sum of the files' sizes.
    pub file_bytes: u64,
    /// Bytes of blocks mapped into files.
    pub mapped_bytes: u64,
    /// Journal records written since the snapshot (replayed at open): left by a crash, or
    /// kept by a clean unmount that found replaying them cheaper than a new snapshot.
    pub journal_records: u64,
    /// Bytes the journals hold (records and epoch markers): what a clean unmount weighs
    /// against `snapshot_bytes`.
    #[serde(default)]
    pub journal_bytes: u64,
    /// The snapshot's length.
    #[serde(default)]
    pub snapshot_bytes: u64,
    /// Logged writes not yet checkpointed (replayed at open).
    pub log_records: u64,
    /// Newest logged writes whose data fails the checksum their records carry: a crash cut
    /// them short (they never returned), and open drops them.
    #[serde(default)]
    pub torn_writes: u64,
    /// Bytes those writes carry.
    pub log_bytes: u64,
    /// Volume memory the file system owns: snapshot, logs, journals, file blocks, buffers.
    pub owned_bytes: u64,
    /// Pieces the snapshot is in: 0 when it is one extent, else how many its index names.
    pub snapshot_pieces: u64,
    /// The root copy not in use, when it is damaged (not merely an older generation): what
    /// is wrong with it. The journals show it was not the file system's root (a crash cut
    /// its update short, or it was damaged after the other replaced it); the next root
    /// update, such as `locus fsck --repair`, rewrites it.
    pub damaged_root_copy: Option<String>,
    /// Whether every data block has a checksum (`locus format --data-checksums`).
    pub data_checksums: bool,
}

/// Whether the data of `write` (an area's newest write, its records as recovery read them,
/// not covered by the area's confirmation word: [`LogArea::unconfirmed_newest`]) fails its
/// data checksums: a crash kept its records and lost some of its data — stored behind the
/// same fence — so it never returned, and is dropped. With the confirmation word damaged
/// (`unreadable`), such data could as well be a whole write changed in place after it
/// returned: that is damage, named, not guessed around.
fn torn(volume: &Volume, area: usize, write: &[LogRecord], unreadable: bool) -> Result<bool> {
    for record in write {
        let Some(sum) = record.data_sum else {
            continue;
        };
        // No write is longer; replay names such a record as damage.
        if record.length > crate::fs::MAX_IO {
            continue;
        }
        let region = volume.region(&extent_of(record.buffer, record.length))?;
        let mut data = vec![0u8; record.length as usize];
        region.read(0, &mut data)?;
        if pmem::data_checksum(&data) == sum {
            continue;
        }
        if unreadable {
            return Err(FsError::DamagedLog {
                area: area as u32,
                problem: format!(
                    "the header's confirmation word is damaged and the data of record {}, \
                     the newest write, fails its checksum: a write a crash cut short cannot \
                     be told from one changed after it returned",
                    record.sequence
                ),
            });
        }
        tracing::warn!(
            area,
            sequence = record.sequence,
            inode = record.inode,
            offset = record.offset,
            length = record.length,
            "dropping the newest logged write: a crash cut it short (its data fails its checksum)"
        );
        return Ok(true);
    }
    Ok(false)
}

/// What one replay step is.
enum Step {
    Meta(u32, JournalRecord),
    Data(u32, LogRecord),
}

impl Step {
    fn order(&self) -> u64 {
        match self {
            Step::Meta(_, r) => r.order,
            Step::Data(_, r) => r.order,
        }
    }
}

fn extent_of(addr: u64, len: u64) -> Extent {
    Extent {
        start: GlobalAddress::from_raw(addr),
        len_bytes: len.next_multiple_of(BLOCK),
    }
}

impl Fs {
    /// Makes a new, empty file system on `volume` (freshly opened: nothing owned yet) and
    /// opens it. Whatever file system was there is gone.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// let topology = topology::Topology::read_live()?;
    /// let volume = volume::Volume::open("/dev/shm/locus".as_ref(), topology, &Default::default())?;
    /// let fs = fs::Fs::format(Arc::new(volume), &fs::FormatOptions::default(), fs::FsOptions::default())?;
    /// let file = fs.create("/hello")?;
    /// file.write_at(b"durable when this returns", 0)?;
    /// # Ok(()) }
    /// ```
    pub fn format(volume: Arc<Volume>, format: &FormatOptions, options: FsOptions) -> Result<Fs> {
        check_format(format)?;
        check_options(&options)?;
        let owner = volume.owner_area(0)?;
        Root::clear(&owner)?;
        let now = now_ns();
        // Whoever formats owns the root directory.
        let formatter = Owner::of_process();
        let snapshot = Snapshot {
            epoch: 1,
            next_ino: ROOT_INO + 1,
            next_order: 1,
            retired: Vec::new(),
            inodes: vec![InodeImage {
                ino: ROOT_INO,
                kind: Kind::Dir,
                mode: 0o755,
                uid: formatter.uid,
                gid: formatter.gid,
                mtime: now,
                atime: now,
                ctime: now,
                target: String::new(),
                rdev: 0,
                size: 0,
                parent: ROOT_INO,
                entries: Vec::new(),
                runs: Vec::new(),
                xattrs: Vec::new(),
            }],
        };
        let (checksums, checksum_areas) = if format.data_checksums {
            let (dir, areas) = Checksums::create(&volume)?;
            (Some(dir), areas)
        } else {
            (None, Vec::new())
        };
        let bytes = snapshot.encode();
        let extent = volume.alloc_local(bytes.len() as u64)?;
        let region = volume.region(&extent)?;
        region.write(0, &bytes)?;
        region.persist(0, bytes.len() as u64)?;
        let root = Root {
            generation: 1,
            epoch: 1,
            volume_uuid: volume.uuid(),
            snapshot_addr: extent.start.raw(),
            snapshot_len: bytes.len() as u64,
            slot_limit: format.slot_limit,
            log_records: format.log_records,
            journal_bytes: format.journal_bytes,
            granule: format.granule,
            slots: Vec::new(),
            checksums,
        };
        root.write(&owner)?;
        // Open marks what the file system owns; hand its pages back first.
        volume.free(extent)?;
        for area in checksum_areas {
            volume.free(area)?;
        }
        Fs::open(volume, options)
    }

    /// Checks the file system on `volume` (freshly opened: nothing owned yet) without
    /// changing anything on media: reads the root, snapshot, journals and logs, replays them
    /// in DRAM, checks the directory tree and that no memory is claimed twice or lies outside
    /// the volume (the volume's allocator is left with it marked owned). Damage is the same
    /// named error [`Fs::open`] would give; [`FsError::NoFileSystem`] when there is none.
    pub fn check(volume: &Volume) -> Result<FsCheck> {
        Fs::offline(volume)?.check()
    }

    /// A read-only view of the file system on a volume no process has open: its files as
    /// recovery would leave them (checkpointed blocks with the logged writes over them),
    /// read straight from the devices. Nothing is written and nothing is marked owned, so
    /// tools (`locus status`) can look inside files of a stopped volume.
    pub fn offline(volume: &Volume) -> Result<OfflineFs<'_>> {
        let loaded = load(volume)?;
        let paths = crate::scrub::paths(&loaded.inodes)
            .into_iter()
            .map(|(ino, path)| (path, ino))
            .collect();
        Ok(OfflineFs {
            volume,
            loaded,
            paths,
        })
    }

    /// Reads every block of file data the file system on `volume` names (freshly opened:
    /// nothing owned yet) — its files' blocks and the buffers of logged writes — and checks
    /// each against its data checksum, without changing anything on media. An error when
    /// the file system is damaged (as [`Fs::check`]) or has no data checksums.
    pub fn scrub(volume: &Volume) -> Result<crate::ScrubReport> {
        let loaded = load(volume)?;
        let Some(checksums) = &loaded.checksums else {
            return Err(crate::scrub::no_checksums());
        };
        crate::scrub::scrub(volume, checksums, &loaded.inodes)
    }

    /// Cuts damaged journals and log areas of the file system on `volume` (freshly opened:
    /// nothing owned yet) back to what provably precedes the damage, so that it opens again
    /// — the repair `locus fsck --repair` makes of damage [`Fs::check`] names in them.
    ///
    /// What is kept is the file system as it was at one point of its history: every journal
    /// and log record up to the global order of the last record before the first damage (in
    /// any of them; a record that does not replay counts as damage too), nothing after. The
    /// rest is erased from the areas, and the report names it: the damage, the records and
    /// writes dropped, the files they touched, and the files *at risk* — whose kept contents
    /// may name memory a dropped operation had freed and a later write reused (read them,
    /// with data checksums a reused block fails its check). Damage elsewhere (the root in
    /// use, the snapshot, memory claimed twice) is not repaired: the error names it.
    /// Open the file system afterwards to fold what is kept into a fresh snapshot.
    pub fn salvage(volume: &Volume) -> Result<crate::SalvageReport> {
        let mut s = Salvage::new();
        let loaded = loop {
            s.retry = None;
            match load_salvaging(volume, Some(&mut s), false) {
                Ok(loaded) => break loaded,
                Err(error) => match s.retry.take() {
                    Some(through) => s.through = through,
                    None => return Err(error),
                },
            }
        };
        let owner = volume.owner_area(0)?;
        let (root, _) = Root::read_reporting(&owner)?;
        // Erase what is dropped: each journal from its cut on; every record slot of a log
        // area but the kept records.
        for (index, areas) in root.slots.iter().enumerate() {
            let cut = s.journal_cut[index];
            if cut < areas.journal_len {
                let region = volume.region(&extent_of(areas.journal_addr, areas.journal_len))?;
                region.fill(cut, areas.journal_len - cut, 0)?;
                region.persist(cut, areas.journal_len - cut)?;
            }
            let region = volume.region(&extent_of(areas.log_addr, areas.log_len))?;
            let kept: std::collections::HashSet<u64> = s.log_kept[index].iter().copied().collect();
            let erased = LogArea::erase_all_but(&region, &kept)?;
            if erased > 0 {
                region.persist(0, areas.log_len)?;
            }
        }
        let paths = crate::scrub::paths(&loaded.inodes);
        let name = |ino: &u64| {
            paths
                .get(ino)
                .cloned()
                .unwrap_or_else(|| format!("inode {ino}"))
        };
        let report = crate::SalvageReport {
            damage: s.damage.iter().chain(&s.replay_damage).cloned().collect(),
            kept_through_order: s.through,
            dropped_journal_records: s.dropped_journal,
            dropped_writes: s.dropped_writes,
            dropped_write_bytes: s.dropped_bytes,
            unreadable_records: s.unreadable,
            // Files the kept history does not have (created by dropped operations) are gone
            // with them: counted, not named.
            files_losing_writes: s
                .dropped_inodes
                .iter()
                .filter(|i| loaded.inodes.contains_key(i))
                .map(name)
                .collect(),
            files_at_risk: s
                .at_risk
                .iter()
                .filter(|i| loaded.inodes.contains_key(i))
                .map(name)
                .collect(),
        };
        drop(loaded);
        // What is left must now load as it is.
        load(volume).map_err(|e| {
            FsError::corrupt(
                "file-system journals and logs",
                format!("still damaged after cutting them back: {e}"),
            )
        })?;
        Ok(report)
    }

    /// Changes what `FormatOptions` chose for the file system on `volume` (which no process
    /// has open), keeping every file: the settings `tune` names, all in one new root, written
    /// as every root change is (the copy not in use, with the next generation, then
    /// persisted), so a crash leaves all of them as they were or all changed. The file system
    /// must load as recovery would load it (damage is refused: `locus fsck` reports and
    /// repairs it), and every setting is checked before anything is written; nothing is
    /// replayed or moved.
    ///
    /// The slot limit may not go below the slots that have areas already (as many threads
    /// once changed the file system at once): the root names each of them, and their logs
    /// may hold writes.
    ///
    /// Data checksums on: the tables and their directory are made in free memory
    /// (`Checksums::create`), and every block of data the files hold — checkpointed blocks
    /// and the buffer blocks of logged writes still visible — gets its entry from the bytes
    /// it holds now; once those are durable, the root names the directory. A crash before
    /// the root leaves tables in memory nothing names (free again at the next open). The
    /// entries bless what is there: `locus scrub` afterwards finds only damage that comes
    /// later. Refused when the tables would leave less free memory than the checkpoint's
    /// reserve needs (`keep_free`). Off: a root without the directory; the tables are free
    /// memory at the next open.
    pub fn tune(volume: &Volume, tune: &Tune) -> Result<Tuned> {
        if let Some(limit) = tune.slot_limit {
            check_slot_limit(limit)?;
        }
        let loaded = load(volume)?;
        let root = &loaded.root;
        let made = root.slots.len() as u32;
        let slots = tune.slot_limit.map(|limit| SlotLimitChange {
            before: root.slot_limit,
            after: limit,
            made,
        });
        if let Some(limit) = tune.slot_limit
            && limit < made
        {
            return Err(FsError::Invalid(format!(
                "thread slots {limit}: {made} slots have their log and journal areas already \
                 (as many threads once changed the file system at once), so the limit can go \
                 down to {made}, not below"
            )));
        }
        let mut checksums = tune.data_checksums.map(|on| ChecksumsChange {
            before: root.checksums.is_some(),
            after: on,
            blocks: 0,
            table_bytes: 0,
        });
        let mut dir = root.checksums;
        let checksums_change = checksums.as_mut().filter(|c| c.before != c.after);
        let change_checksums = checksums_change.is_some();
        if let Some(change) = checksums_change {
            dir = if change.after {
                // The entries bless the logged writes' data as it is: recovery, having
                // checked the newest of each log whole, confirms them too, so that damage
                // to it later is found by its entries, not taken for a write cut short.
                for log in &loaded.logs {
                    let last = log.next_sequence() - 1;
                    if last > 0 && !log.confirms(last) {
                        log.confirmer().store(last)?;
                    }
                }
                Some(make_checksums(volume, &loaded, change)?)
            } else {
                None
            };
        }
        if change_checksums || slots.is_some_and(|c| c.before != c.after) {
            root.write_next(&loaded.owner, |next| {
                next.slot_limit = tune.slot_limit.unwrap_or(next.slot_limit);
                next.checksums = dir;
            })?;
        }
        Ok(Tuned { slots, checksums })
    }

    /// [`Fs::tune`] of the slot limit alone.
    pub fn set_slot_limit(volume: &Volume, limit: u32) -> Result<SlotLimitChange> {
        let tune = Tune {
            slot_limit: Some(limit),
            ..Tune::default()
        };
        Ok(Fs::tune(volume, &tune)?.slots.expect("asked for"))
    }

    /// [`Fs::tune`] of data checksums alone.
    pub fn set_data_checksums(volume: &Volume, on: bool) -> Result<ChecksumsChange> {
        let tune = Tune {
            data_checksums: Some(on),
            ..Tune::default()
        };
        Ok(Fs::tune(volume, &tune)?.checksums.expect("asked for"))
    }

    /// Whether the file system on `volume` keeps data checksums (reads only its root).
    pub fn has_data_checksums(volume: &Volume) -> Result<bool> {
        let (root, _) = Root::read_reporting(&volume.owner_area(0)?)?;
        Ok(root.checksums.is_some())
    }

    /// Gives the devices `locus extend` added to `volume` (which no process has open) their
    /// data-checksum tables, when the file system keeps data checksums: zeroed tables on
    /// those devices (they hold no data yet: the file system does not open while a device
    /// has no table), a new directory naming every table, then one new root naming it, so a
    /// crash leaves the old directory named (the new tables are free memory at the next
    /// open) or the new one. The file system must load as recovery would (damage is refused).
    /// Returns the tables made and the memory they and the directory took; `(0, 0)` when
    /// every device has its table or there are no data checksums.
    pub fn add_device_tables(volume: &Volume) -> Result<(u32, u64)> {
        // Without data checksums there is nothing to make, whatever state the rest is in.
        if !Fs::has_data_checksums(volume)? {
            return Ok((0, 0));
        }
        let loaded = load_salvaging(volume, None, true)?;
        let Some(dir) = loaded.root.checksums else {
            return Ok((0, 0));
        };
        loaded.mark_owned(volume)?;
        let Some((dir, extents)) = Checksums::add_tables(volume, dir)? else {
            return Ok((0, 0));
        };
        // The tables and the directory are durable before a root names them.
        volume.fence();
        loaded
            .root
            .write_next(&loaded.owner, |next| next.checksums = Some(dir))?;
        let bytes = extents.iter().map(|e| e.len_bytes).sum();
        Ok((extents.len() as u32 - 1, bytes))
    }

    /// Opens the file system on `volume` (freshly opened: nothing owned yet), recovering
    /// whatever a crash left in the logs.
    pub fn open(volume: Arc<Volume>, options: FsOptions) -> Result<Fs> {
        check_options(&options)?;
        let Loaded {
            owner,
            root,
            inodes,
            next_ino,
            next_order,
            journals,
            logs,
            live,
            owned,
            buffer_runs,
            snapshot_pieces,
            snapshot_bytes,
            checksums,
            journal_records,
            kept_records,
            damaged_root_copy,
            torn_writes,
            ..
        } = load(&volume)?;
        let replayed = crate::fs::ReplaySummary {
            torn_writes,
            log_records: live.len() as u64,
            log_bytes: live.iter().map(|(_, r)| r.length).sum(),
            journal_records: journal_records - kept_records,
            kept_records,
        };
        volume.mark_owned(owned_extents(&owned))?;

        // Build the running file system.
        let devices = (0..volume.device_count())
            .map(|d| volume.device_region(d))
            .collect::<volume::Result<Vec<_>>>()?;
        let recovered = Arc::new(BufferSet::sealed_with(
            buffer_runs.iter().map(|&(s, l)| extent_of(s, l)).collect(),
            live.len() as u64,
        ));
        let mut pending: Vec<VecDeque<Pending>> =
            (0..root.slots.len()).map(|_| VecDeque::new()).collect();
        for (slot, r) in &live {
            pending[*slot as usize].push_back(Pending {
                slot: *slot,
                page: crate::buffers::NO_PAGE,
                seq: r.sequence,
                order: r.order,
                ino: r.inode,
                offset: r.offset,
                len: r.length,
                set: Arc::clone(&recovered),
                mtime: r.mtime,
                remapped: None,
            });
        }
        Fs::start(
            Recovered {
                volume,
                devices,
                owner,
                root,
                snapshot_pieces,
                snapshot_bytes,
                inodes,
                next_ino,
                next_order,
                slots: logs
                    .into_iter()
                    .zip(journals)
                    .zip(pending)
                    .map(|((l, j), p)| (l, j, p))
                    .collect(),
                checksums,
                replayed,
                damaged_root_copy: damaged_root_copy.is_some(),
            },
            options,
            crate::checkpoint::spawn,
        )
    }
}

/// A stopped file system's files, read-only ([`Fs::offline`]).
pub struct OfflineFs<'v> {
    volume: &'v Volume,
    loaded: Loaded,
    paths: HashMap<String, u64>,
}

impl std::fmt::Debug for OfflineFs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OfflineFs")
            .field("inodes", &self.loaded.inodes.len())
            .finish_non_exhaustive()
    }
}

impl OfflineFs<'_> {
    /// [`Fs::check`] of what this view loaded: the summary, and the memory the file system
    /// owns marked owned in the volume's allocator (refusing memory claimed twice or
    /// outside the volume).
    pub fn check(&self) -> Result<FsCheck> {
        let loaded = &self.loaded;
        loaded.mark_owned(self.volume)?;
        let files = loaded.inodes.values().filter(|i| i.kind == Kind::File);
        Ok(FsCheck {
            generation: loaded.root.generation,
            epoch: loaded.root.epoch,
            slots: loaded.root.slots.len() as u64,
            slot_bytes: loaded.root.slots.iter().map(SlotAreas::bytes).sum(),
            slot_limit: u64::from(loaded.root.slot_limit),
            files: files.clone().count() as u64,
            directories: loaded
                .inodes
                .values()
                .filter(|i| i.kind == Kind::Dir)
                .count() as u64,
            file_bytes: files.clone().map(|i| i.size.load(Ordering::Acquire)).sum(),
            mapped_bytes: files
                .map(|i| i.extents.read().expect("extent map").mapped_blocks() * BLOCK)
                .sum(),
            journal_records: loaded.journal_records,
            journal_bytes: loaded.journals.iter().map(Journal::used).sum(),
            snapshot_bytes: loaded.snapshot_bytes,
            log_records: loaded.live.len() as u64,
            torn_writes: loaded.torn_writes,
            log_bytes: loaded.live.iter().map(|(_, r)| r.length).sum(),
            owned_bytes: loaded.owned.iter().map(|o| o.1).sum(),
            snapshot_pieces: loaded.snapshot_pieces.len() as u64,
            damaged_root_copy: loaded.damaged_root_copy.clone(),
            data_checksums: loaded.checksums.is_some(),
        })
    }

    fn inode(&self, path: &str) -> Result<&Arc<Inode>> {
        self.paths
            .get(path)
            .and_then(|ino| self.loaded.inodes.get(ino))
            .ok_or_else(|| FsError::NotFound(path.to_owned()))
    }

    /// The paths of the regular files directly in directory `dir` (`/` or `/a/b`), sorted.
    pub fn files_in(&self, dir: &str) -> Vec<String> {
        let prefix = if dir.ends_with('/') {
            dir.to_owned()
        } else {
            format!("{dir}/")
        };
        let mut files: Vec<String> = self
            .paths
            .iter()
            .filter(|(path, ino)| {
                path.strip_prefix(&prefix)
                    .is_some_and(|name| !name.is_empty() && !name.contains('/'))
                    && self
                        .loaded
                        .inodes
                        .get(ino)
                        .is_some_and(|i| i.kind == Kind::File)
            })
            .map(|(path, _)| path.clone())
            .collect();
        files.sort();
        files
    }

    /// The size of the file at `path`.
    pub fn size(&self, path: &str) -> Result<u64> {
        Ok(self.inode(path)?.size.load(Ordering::Acquire))
    }

    /// Reads from `offset` of the file at `path` into `buf`; the bytes read (fewer at the
    /// end of the file, 0 past it). Holes read as zeros.
    pub fn read_at(&self, path: &str, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let inode = self.inode(path)?;
        match inode.kind {
            Kind::File => {}
            Kind::Dir => return Err(FsError::IsDir(path.to_owned())),
            kind => {
                return Err(FsError::NotSupported(format!(
                    "{path} is a {kind:?}, which holds no data"
                )));
            }
        }
        let size = inode.size.load(Ordering::Acquire);
        let end = size.min(offset.saturating_add(buf.len() as u64));
        if offset >= end {
            return Ok(0);
        }
        let out = &mut buf[..(end - offset) as usize];
        out.fill(0);
        // Checkpointed blocks first, then the logged writes over them (the overlay holds
        // the newest bytes of every range it covers).
        for run in inode.extents.read().expect("extent map").runs() {
            let (from, to) = (
                run.file_block * BLOCK,
                (run.file_block + run.blocks) * BLOCK,
            );
            let (start, stop) = (from.max(offset), to.min(end));
            if start < stop {
                self.copy(
                    run.addr + (start - from),
                    &mut out[(start - offset) as usize..(stop - offset) as usize],
                )?;
            }
        }
        for piece in inode.overlay.lookup(offset, end) {
            let at = (piece.start - offset) as usize..(piece.end - offset) as usize;
            self.copy(piece.src, &mut out[at])?;
        }
        Ok(out.len())
    }

    /// Copies device bytes from global address `src` into `out`, a block at a time (a run
    /// of pages is contiguous on its device, but reading per block never asks more).
    fn copy(&self, mut src: u64, mut out: &mut [u8]) -> Result<()> {
        while !out.is_empty() {
            let n = ((BLOCK - src % BLOCK) as usize).min(out.len());
            let at = GlobalAddress::from_raw(src);
            let (head, rest) = out.split_at_mut(n);
            self.volume
                .device_region(at.device())?
                .read(at.offset(), head)?;
            out = rest;
            src += n as u64;
        }
        Ok(())
    }
}

/// What steps 1-5 of recovery find, before anything is changed: the state the file system
/// opens with, and every piece of memory it owns.
struct Loaded {
    owner: pmem::Region,
    root: Root,
    inodes: Table,
    next_ino: u64,
    next_order: u64,
    journals: Vec<Journal>,
    journal_records: u64,
    /// Of `journal_records`, those in journals a clean unmount sealed where they ended
    /// (kept instead of folded into a snapshot).
    kept_records: u64,
    logs: Vec<LogArea>,
    live: Vec<(u32, LogRecord)>,
    owned: Vec<(u64, u64, Holder)>,
    buffer_runs: Vec<(u64, u64)>,
    /// The pieces the snapshot is in, when the root names an index (else empty).
    snapshot_pieces: Vec<Extent>,
    /// The snapshot's length.
    snapshot_bytes: u64,
    damaged_root_copy: Option<String>,
    checksums: Option<Checksums>,
    /// Newest writes dropped because their data failed its checksums ([`torn`]).
    torn_writes: u64,
}

impl Loaded {
    /// Marks what the file system owns as allocated in `volume` (before allocating in it).
    fn mark_owned(&self, volume: &Volume) -> Result<()> {
        volume.mark_owned(owned_extents(&self.owned))?;
        Ok(())
    }
}

/// The extents of the ownership list (sorted by address), each run of claims that follow
/// one another without a gap on one device as one extent: the allocator then reserves a
/// volume of many small files in a few large steps, not a block at a time (files written
/// one after another lie side by side). Claims that share a block stay apart, so that the
/// allocator refuses the second as before.
fn owned_extents(owned: &[(u64, u64, Holder)]) -> impl Iterator<Item = Extent> + '_ {
    let mut claims = owned
        .iter()
        .map(|&(start, len, _)| extent_of(start, len))
        .peekable();
    std::iter::from_fn(move || {
        let mut extent = claims.next()?;
        while let Some(next) = claims.peek()
            && next.start.device() == extent.start.device()
            && next.start.raw() == extent.start.raw() + extent.len_bytes
        {
            extent.len_bytes += next.len_bytes;
            claims.next();
        }
        Some(extent)
    })
}

/// Settings [`Fs::tune`] changes; `None` leaves one as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tune {
    /// Thread slots the file system may have (`FormatOptions::slot_limit`).
    pub slot_limit: Option<u32>,
    /// Data checksums on or off (`FormatOptions::data_checksums`).
    pub data_checksums: Option<bool>,
}

/// What [`Fs::tune`] did, for each setting it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuned {
    /// The slot limit, when [`Tune::slot_limit`] was given.
    pub slots: Option<SlotLimitChange>,
    /// Data checksums, when [`Tune::data_checksums`] was given.
    pub checksums: Option<ChecksumsChange>,
}

/// Turning data checksums on for `loaded` ([`Fs::tune`]): the tables made in free memory,
/// every block of data given its entry, fenced. Returns the directory's address.
fn make_checksums(volume: &Volume, loaded: &Loaded, change: &mut ChecksumsChange) -> Result<u64> {
    loaded.mark_owned(volume)?;
    let need = crate::checksums::table_bytes(volume)?;
    let keep = keep_free(volume, &loaded.root, loaded.live.len() as u64);
    let free = volume.free_bytes();
    if free < need + keep {
        return Err(FsError::Invalid(format!(
            "the volume is too full for data checksums: their tables need {need} bytes and the \
             checkpoint's reserve {keep}, and {free} are free; remove files first"
        )));
    }
    // (Room on each device: a table lives on the device whose blocks it covers.)
    let (dir, extents) = Checksums::create(volume).map_err(|e| {
        if e.kind() == crate::ErrorKind::NoSpace {
            FsError::Invalid(format!(
                "a device of the volume is too full for its data-checksum table ({e}); remove \
                 files first"
            ))
        } else {
            e
        }
    })?;
    change.table_bytes = extents.iter().map(|e| e.len_bytes).sum();
    let tables = Checksums::load(volume, dir, false)?;
    change.blocks = crate::scrub::fill_entries(volume, &tables, &loaded.inodes)?;
    // The entries are durable (each reading thread fenced its own) before a root names them.
    volume.fence();
    Ok(dir)
}

/// What [`Fs::tune`] did to the slot limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLimitChange {
    /// The limit before.
    pub before: u32,
    /// The limit now.
    pub after: u32,
    /// Slots that have their areas (the checkpoint's and the threads' so far).
    pub made: u32,
}

/// What [`Fs::tune`] did to data checksums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChecksumsChange {
    /// Data checksums before.
    pub before: bool,
    /// Data checksums now.
    pub after: bool,
    /// Blocks of data given an entry (turned on).
    pub blocks: u64,
    /// Volume memory the tables and their directory took (turned on).
    pub table_bytes: u64,
}

/// Free memory a file system opened on `volume` must still find beyond what `root` names
/// and new checksum tables would take: the running file system's reserve as it counts it at
/// open (twice the snapshot, what the `live_records` logged writes may add to the next one —
/// bounded here by two blocks each — and 1/512 of the volume, at least 1 MiB), doubled, so
/// that writers still have room after it.
fn keep_free(volume: &Volume, root: &Root, live_records: u64) -> u64 {
    let floor = crate::fs::reserve_floor(volume.data_bytes());
    2 * (2 * root.snapshot_len + floor + live_records * 2 * BLOCK)
}

/// Reads the root, snapshot, journals and logs, replays them in DRAM and lists what the file
/// system owns (refusing memory claimed twice). Writes nothing.
fn load(volume: &Volume) -> Result<Loaded> {
    load_salvaging(volume, None, false)
}

/// What `Fs::repair` keeps of damaged journals and logs: the records of global order up to
/// `through` that precede every damage. One pass of [`load_salvaging`] finds the damage
/// with `through` as given; when the damage asks for a lower one, the pass sets `retry` and
/// fails, and the caller runs it again with that (each pass only lowers it, so it ends).
#[derive(Debug)]
pub(crate) struct Salvage {
    /// Keep records of global order up to this.
    pub(crate) through: u64,
    /// Set by a pass that found `through` must be lower.
    pub(crate) retry: Option<u64>,
    /// The damaged journals and logs the last pass found.
    pub(crate) damage: Vec<String>,
    /// Records that failed to replay (found by earlier passes: they are dropped since).
    pub(crate) replay_damage: Vec<String>,
    /// Per journal: the byte offset from which its records are dropped (its length when
    /// nothing is).
    pub(crate) journal_cut: Vec<u64>,
    /// Per log area: the sequences of the records kept.
    pub(crate) log_kept: Vec<Vec<u64>>,
    /// Journal records dropped.
    pub(crate) dropped_journal: u64,
    /// Logged writes (records) dropped, and their bytes.
    pub(crate) dropped_writes: u64,
    pub(crate) dropped_bytes: u64,
    /// Damaged records dropped unread: what they did, and the files they touched, cannot be
    /// named.
    pub(crate) unreadable: u64,
    /// Inodes the dropped records named.
    pub(crate) dropped_inodes: std::collections::BTreeSet<u64>,
    /// Inodes whose kept contents may name memory a dropped record had freed — blocks a
    /// dropped checkpoint batch replaced or whose records' buffers it released, blocks a
    /// dropped removal, truncation or hole gave back — which later writes may have reused.
    pub(crate) at_risk: std::collections::BTreeSet<u64>,
}

impl Salvage {
    pub(crate) fn new() -> Self {
        Self {
            through: u64::MAX,
            retry: None,
            damage: Vec::new(),
            replay_damage: Vec::new(),
            journal_cut: Vec::new(),
            log_kept: Vec::new(),
            dropped_journal: 0,
            dropped_writes: 0,
            dropped_bytes: 0,
            unreadable: 0,
            dropped_inodes: std::collections::BTreeSet::new(),
            at_risk: std::collections::BTreeSet::new(),
        }
    }

    /// A dropped journal record: what it would have freed puts inodes at risk; returns the
    /// log sequences (slot, through) a dropped batch had retired.
    fn drop_journal_record(&mut self, op: &MetaOp) -> Vec<(u32, u64)> {
        self.dropped_journal += 1;
        match op {
            MetaOp::Batch { maps, retired, .. } => {
                self.at_risk.extend(maps.iter().map(|m| m.ino));
                return retired.clone();
            }
            MetaOp::Remove { ino, .. }
            | MetaOp::DropUnnamed { ino }
            | MetaOp::Truncate { ino, .. }
            | MetaOp::Punch { ino, .. } => {
                self.at_risk.insert(*ino);
            }
            MetaOp::Rename { replaced, .. } if *replaced != 0 => {
                self.at_risk.insert(*replaced);
            }
            _ => {}
        }
        Vec::new()
    }

    /// Damage `error` means nothing after order `last_kept` can be trusted.
    fn cut(&mut self, last_kept: u64, error: &FsError) -> FsError {
        self.retry = Some(last_kept.min(self.through.saturating_sub(1)));
        FsError::corrupt(
            "file-system journals and logs",
            format!("salvage must keep less: {error}"),
        )
    }
}

/// [`load`], or with `salvage` the pass of a repair: damaged journals and logs are cut
/// before their damage instead of refused, and only records up to `salvage.through` replay.
fn load_salvaging(
    volume: &Volume,
    mut salvage: Option<&mut Salvage>,
    adding_tables: bool,
) -> Result<Loaded> {
    let owner = volume.owner_area(0)?;
    let (root, other_copy) = Root::read_reporting(&owner)?;
    if root.volume_uuid != volume.uuid() {
        return Err(FsError::corrupt(
            "file-system root",
            format!(
                "it belongs to volume {}, not this one ({})",
                volume::hex(&root.volume_uuid),
                volume::hex(&volume.uuid())
            ),
        ));
    }
    // A damaged copy next to the root: either a root update a crash cut short, or the
    // file system's real root, damaged — then the journals, reset to its epoch when it was
    // committed, are past the copy in use, and opening that copy would roll back.
    let damaged_root_copy = match other_copy {
        None => None,
        Some((copy, damage)) => {
            for (index, areas) in root.slots.iter().enumerate() {
                let region = volume.region(&extent_of(areas.journal_addr, areas.journal_len))?;
                if let Some(epoch) = Journal::epoch_at_start(&region)?
                    && epoch > root.epoch
                {
                    let what = match &damage {
                        FsError::Corrupt { problem, .. } => problem.clone(),
                        other => other.to_string(),
                    };
                    return Err(FsError::corrupt(
                        format!("file-system root copy {copy}"),
                        format!(
                            "{what}; it was the root in use (the journal of slot {index} is at \
                             epoch {epoch}, past the other copy's {}, generation {}), and \
                             opening the older copy would roll the file system back",
                            root.epoch, root.generation
                        ),
                    ));
                }
            }
            Some(damage.to_string())
        }
    };
    let checksums = match root.checksums {
        Some(dir) => Some(Checksums::load(volume, dir, adding_tables)?),
        None => None,
    };
    // 1. The snapshot (or an index of the pieces it is in).
    let snapshot_region = volume.region(&extent_of(root.snapshot_addr, root.snapshot_len))?;
    let mut bytes = vec![0u8; root.snapshot_len as usize];
    snapshot_region.read(0, &mut bytes)?;
    let mut snapshot_pieces = Vec::new();
    if bytes.len() >= 8 && bytes[..8] == INDEX_MAGIC.to_le_bytes() {
        let mut page = SnapshotIndex::decode(&bytes)?;
        let total = page.total;
        let mut joined = Vec::new();
        let mut pieces = 0u64;
        loop {
            for &(addr, len) in &page.pieces {
                pieces += 1;
                if joined.len() as u64 + len > total || pieces > u64::from(MAX_PIECES) {
                    return Err(FsError::corrupt(
                        "file-system snapshot index",
                        format!("its pages name more than {total} bytes or {MAX_PIECES} pieces"),
                    ));
                }
                let region = volume.region(&extent_of(addr, len))?;
                let at = joined.len();
                joined.resize(at + len as usize, 0);
                region.read(0, &mut joined[at..])?;
                snapshot_pieces.push(extent_of(addr, len));
            }
            let Some((addr, len)) = page.next else { break };
            // The next page is owned with the pieces, and freed with them.
            let region = volume.region(&extent_of(addr, len))?;
            let mut next = vec![0u8; len as usize];
            region.read(0, &mut next)?;
            snapshot_pieces.push(extent_of(addr, len));
            page = SnapshotIndex::decode(&next)?;
            if page.total != total {
                return Err(FsError::corrupt(
                    "file-system snapshot index",
                    format!("a page says {} bytes, the first {total}", page.total),
                ));
            }
        }
        if joined.len() as u64 != total {
            return Err(FsError::corrupt(
                "file-system snapshot index",
                format!("its pages name {} bytes, it says {total}", joined.len()),
            ));
        }
        bytes = joined;
    }
    // The table is built as the inodes are decoded (each from its bytes, without a vector
    // of images in between); a snapshot of another epoch is refused before it is used.
    let mut loading = Loading::with_capacity_for(bytes.len() as u64);
    let snapshot = Snapshot::decode_each(&bytes, |image| loading.add(image))?;
    let snapshot_bytes = bytes.len() as u64;
    if snapshot.epoch != root.epoch {
        return Err(FsError::corrupt(
            "file-system snapshot",
            format!("epoch {} but the root is at {}", snapshot.epoch, root.epoch),
        ));
    }
    let mut inodes = loading.finish()?;
    let mut next_ino = snapshot.next_ino;
    let mut next_order = snapshot.next_order;

    // 2. Journals.
    let mut retired: Vec<u64> = (0..root.slots.len())
        .map(|i| snapshot.retired.get(i).copied().unwrap_or(0))
        .collect();
    let mut steps: Vec<Step> = Vec::new();
    let mut journal_records = 0u64;
    // Of those, in journals a clean unmount sealed where they ended.
    let mut kept_records = 0u64;
    let mut journals = Vec::new();
    // Before the first record of the journals and logs: nothing after the snapshot.
    let none_kept = snapshot.next_order.saturating_sub(1);
    if let Some(s) = salvage.as_deref_mut() {
        s.journal_cut = root.slots.iter().map(|a| a.journal_len).collect();
        s.log_kept = vec![Vec::new(); root.slots.len()];
        s.dropped_journal = 0;
        s.dropped_writes = 0;
        s.dropped_bytes = 0;
        s.dropped_inodes.clear();
        s.at_risk.clear();
        s.damage.clear();
        s.unreadable = 0;
    }
    // Per slot: log records through this sequence were retired by a dropped batch (their
    // buffers may have been reused).
    let mut released_by_dropped = vec![0u64; root.slots.len()];
    for (index, areas) in root.slots.iter().enumerate() {
        let region = volume.region(&extent_of(areas.journal_addr, areas.journal_len))?;
        let (journal, records) = match salvage.as_deref_mut() {
            None => Journal::recover(region, index as u32, root.epoch)?,
            Some(s) => {
                let (found, damage) = Journal::salvage(&region, index as u32, root.epoch)?;
                // The damaged record's order is past the last one before it, whatever is kept.
                let last_good = found.last().map_or(none_kept, |(_, r)| r.order);
                let mut kept = Vec::new();
                for (at, record) in found {
                    if record.order <= s.through {
                        kept.push(record);
                    } else {
                        s.journal_cut[index] = s.journal_cut[index].min(at);
                        for (slot, seq) in s.drop_journal_record(&record.op) {
                            if let Some(r) = released_by_dropped.get_mut(slot as usize) {
                                *r = (*r).max(seq);
                            }
                        }
                    }
                }
                if let Some((at, error, after)) = damage {
                    s.journal_cut[index] = s.journal_cut[index].min(at);
                    // The damaged record's operation is lost unread.
                    s.unreadable += 1;
                    for op in after {
                        match op {
                            Some(op) => {
                                for (slot, seq) in s.drop_journal_record(&op) {
                                    if let Some(r) = released_by_dropped.get_mut(slot as usize) {
                                        *r = (*r).max(seq);
                                    }
                                }
                            }
                            None => {
                                s.dropped_journal += 1;
                                s.unreadable += 1;
                            }
                        }
                    }
                    s.damage.push(error.to_string());
                    if last_good < s.through {
                        return Err(s.cut(last_good, &error));
                    }
                }
                (Journal::new(region, root.epoch), kept)
            }
        };
        for record in records {
            if let MetaOp::Batch { retired: r, .. } = &record.op {
                for &(slot, seq) in r {
                    let watermark = retired.get_mut(slot as usize).ok_or_else(|| {
                        FsError::corrupt(
                            format!("journal of slot {index}"),
                            format!("a batch retires records of slot {slot}, which does not exist"),
                        )
                    })?;
                    *watermark = (*watermark).max(seq);
                }
            }
            journal_records += 1;
            kept_records += u64::from(journal.is_sealed());
            steps.push(Step::Meta(index as u32, record));
        }
        journals.push(journal);
    }

    // 3. Log areas.
    let mut logs = Vec::new();
    let mut torn_writes = 0u64;
    for (index, areas) in root.slots.iter().enumerate() {
        let region = volume.region(&extent_of(areas.log_addr, areas.log_len))?;
        let (log, live) = match salvage.as_deref_mut() {
            None => {
                let (mut log, mut live) = LogArea::recover(region, retired[index])?;
                if let Some((first, unreadable)) = log.unconfirmed_newest(&live)
                    && torn(volume, index, &live[first..], unreadable)?
                {
                    log.drop_newest_write(&mut live, first);
                    torn_writes += 1;
                }
                (Some(log), live)
            }
            Some(s) => {
                let (mut found, damage, beyond) = LogArea::salvage(&region, retired[index])?;
                // A write a crash cut short, its record whole but not all of its data,
                // never returned: dropped like a torn record. Only when nothing was cut:
                // behind damage, the last write found had successors, so it is whole (and
                // the confirmation word may name one of those instead).
                if damage.is_none()
                    && beyond.is_empty()
                    && let Some((first, unreadable)) =
                        LogArea::unconfirmed_newest_in(&region, &found)?
                    && torn(volume, index, &found[first..], unreadable)?
                {
                    found.truncate(first);
                    torn_writes += 1;
                }
                // Whole records past the damage are dropped; the damaged slot(s) unread.
                for record in &beyond {
                    s.dropped_writes += 1;
                    s.dropped_bytes += record.length;
                    s.dropped_inodes.insert(record.inode);
                }
                if damage.is_some() {
                    s.unreadable += 1;
                }
                // Everything salvage found precedes the damage.
                let last_good = found.iter().map(|r| r.order).max().unwrap_or(none_kept);
                if let Some(error) = damage {
                    s.damage.push(error.to_string());
                    if last_good < s.through {
                        return Err(s.cut(last_good, &error));
                    }
                }
                let mut kept = Vec::new();
                for record in found {
                    if record.order <= s.through {
                        s.log_kept[index].push(record.sequence);
                        if record.sequence <= released_by_dropped[index] {
                            s.at_risk.insert(record.inode);
                        }
                        kept.push(record);
                    } else {
                        s.dropped_writes += 1;
                        s.dropped_bytes += record.length;
                        s.dropped_inodes.insert(record.inode);
                    }
                }
                // A plan only: repair erases the rest, then opens the file system anew.
                (None, kept)
            }
        };
        if let Some(log) = log {
            if log.id() != index as u32 {
                return Err(FsError::corrupt(
                    format!("log area of slot {index}"),
                    format!("its header says area {}", log.id()),
                ));
            }
            logs.push(log);
        }
        steps.extend(live.into_iter().map(|r| Step::Data(index as u32, r)));
    }

    // 4. Replay in global order. Orders come from one counter, so two records sharing one
    // can only be damage.
    steps.sort_by_key(Step::order);
    if let Some(pair) = steps.windows(2).find(|w| w[0].order() == w[1].order()) {
        return Err(FsError::corrupt(
            "file-system journals and logs",
            format!("two records carry the global order {}", pair[0].order()),
        ));
    }
    let mut live: Vec<(u32, LogRecord)> = Vec::new();
    let mut last_replayed = none_kept;
    let mut times_set = TimesSet::default();
    for step in steps {
        let order = step.order();
        let replayed = replay_step(&mut inodes, &mut times_set, &mut next_ino, &mut live, step);
        if let Err(error) = replayed {
            return Err(match salvage.as_deref_mut() {
                Some(s) => {
                    s.replay_damage.push(error.to_string());
                    s.cut(last_replayed, &error)
                }
                None => error,
            });
        }
        last_replayed = order;
        next_order = next_order.max(order + 1);
    }
    // Unnamed files (`O_TMPFILE`) not named before the crash: the processes that held them
    // are gone, and so are they.
    let unnamed: Vec<u64> = inodes
        .iter()
        .filter(|(_, inode)| inode.attr().unnamed)
        .map(|(&ino, _)| ino)
        .collect();
    for ino in &unnamed {
        inodes.remove(ino);
    }
    if !unnamed.is_empty() {
        tracing::info!(
            count = unnamed.len(),
            "dropped unnamed files (O_TMPFILE) that were never named before the crash"
        );
    }
    check_tree(&inodes)?;
    let unrecorded = unmap_unretired_remaps(&inodes, &live);
    if unrecorded > 0 {
        tracing::info!(
            blocks = unrecorded,
            "blocks the snapshot took from their writers before their records retired are the \
             live records' again"
        );
    }

    // 5. Ownership.
    let mut owned: Vec<(u64, u64, Holder)> = Vec::new();
    owned.push((
        root.snapshot_addr,
        root.snapshot_len.next_multiple_of(BLOCK),
        if snapshot_pieces.is_empty() {
            Holder::Snapshot
        } else {
            Holder::SnapshotIndex
        },
    ));
    for (i, piece) in snapshot_pieces.iter().enumerate() {
        owned.push((piece.start.raw(), piece.len_bytes, Holder::SnapshotPiece(i)));
    }
    for (i, areas) in root.slots.iter().enumerate() {
        owned.push((
            areas.log_addr,
            areas.log_len.next_multiple_of(BLOCK),
            Holder::LogArea(i),
        ));
        owned.push((
            areas.journal_addr,
            areas.journal_len.next_multiple_of(BLOCK),
            Holder::Journal(i),
        ));
    }
    if let Some(checksums) = &checksums {
        for (i, area) in checksums.areas().iter().enumerate() {
            owned.push((
                area.start.raw(),
                area.len_bytes,
                match i.checked_sub(1) {
                    None => Holder::ChecksumDirectory,
                    Some(device) => Holder::ChecksumTable(device),
                },
            ));
        }
    }
    for (ino, inode) in &inodes {
        inode.extents.read().expect("extent map").each_run(|run| {
            owned.push((
                run.addr,
                run.blocks * BLOCK,
                Holder::File {
                    ino: *ino,
                    block: run.file_block,
                },
            ));
        });
    }
    let buffer_runs = merge_pages(live.iter().map(|(_, r)| (r.buffer, r.length)));
    for &(start, len) in &buffer_runs {
        owned.push((start, len, Holder::LiveBuffers));
    }
    // Two claims of one start overlap whichever comes first.
    owned.sort_unstable_by_key(|o| o.0);
    for pair in owned.windows(2) {
        if pair[0].0 + pair[0].1 > pair[1].0 {
            return Err(FsError::corrupt(
                "file-system metadata",
                format!(
                    "{} and {} claim the same memory at {}",
                    pair[0].2,
                    pair[1].2,
                    GlobalAddress::from_raw(pair[1].0)
                ),
            ));
        }
    }
    Ok(Loaded {
        damaged_root_copy,
        owner,
        root,
        inodes,
        next_ino,
        next_order,
        journals,
        journal_records,
        kept_records,
        logs,
        live,
        owned,
        buffer_runs,
        snapshot_pieces,
        snapshot_bytes,
        checksums,
        torn_writes,
    })
}

/// What owns a range of the volume's memory, named only when two claim the same pages (a
/// label per file run, formatted at every open, was a tenth of a mount's time on a volume
/// of many small files).
#[derive(Debug, Clone, Copy)]
enum Holder {
    Snapshot,
    SnapshotIndex,
    SnapshotPiece(usize),
    LogArea(usize),
    Journal(usize),
    ChecksumDirectory,
    ChecksumTable(usize),
    File { ino: u64, block: u64 },
    LiveBuffers,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Snapshot => write!(f, "the snapshot"),
            Holder::SnapshotIndex => write!(f, "the snapshot index"),
            Holder::SnapshotPiece(i) => write!(f, "snapshot piece {i}"),
            Holder::LogArea(i) => write!(f, "log area of slot {i}"),
            Holder::Journal(i) => write!(f, "journal of slot {i}"),
            Holder::ChecksumDirectory => write!(f, "the data-checksum directory"),
            Holder::ChecksumTable(device) => {
                write!(f, "the data-checksum table of device {device}")
            }
            Holder::File { ino, block } => write!(f, "file {ino} block {block}"),
            Holder::LiveBuffers => write!(f, "buffers of live log records"),
        }
    }
}

/// Takes out of the files' block maps every block that is the page of a live record of
/// that very block, and returns how many.
///
/// A writer remaps a single-block overwrite into its file's block table itself, once its
/// record is durable (`Overlay::remap_block`); a checkpoint batch then records the mapping
/// and retires the record in one journal record. A snapshot written between batches encodes
/// the block tables as they are, such blocks included, with the retired watermarks of
/// before. So after a crash the recovered map can name a page that a live record names too.
/// The record is replayed (it covers its whole block, so whatever the map had there is
/// hidden); without its block in the map it is what it was at runtime: a logged write the
/// checkpoint will remap into a hole, freeing nothing. The block it replaced is free, as it
/// would have been once the record retired.
fn unmap_unretired_remaps(inodes: &Table, live: &[(u32, LogRecord)]) -> u64 {
    let mut unmapped = 0;
    for (_, record) in live {
        if record.length != BLOCK
            || !record.offset.is_multiple_of(BLOCK)
            || !record.buffer.is_multiple_of(BLOCK)
        {
            continue;
        }
        let Some(inode) = inodes.get(&record.inode) else {
            continue;
        };
        let block = record.offset / BLOCK;
        let mut extents = inode.extents.write().expect("extent map");
        if extents.get(block) == Some(record.buffer) {
            extents.punch(block, block + 1);
            unmapped += 1;
        }
    }
    unmapped
}

/// Page runs covering every `(address, length)`, merged.
/// Replays one step of recovery (step 4) into `inodes`: a journal record through `replay`, a
/// live data record through `apply::write` (kept in `live`). A failed check is damage,
/// named with the record.
fn replay_step(
    inodes: &mut Table,
    times_set: &mut TimesSet,
    next_ino: &mut u64,
    live: &mut Vec<(u32, LogRecord)>,
    step: Step,
) -> Result<()> {
    match step {
        Step::Meta(slot, record) => {
            replay(inodes, times_set, *next_ino, &record).map_err(|problem| {
                FsError::corrupt(
                    format!("journal of slot {slot} (record of order {})", record.order),
                    problem,
                )
            })?;
            if let MetaOp::Create { ino, .. } | MetaOp::CreateUnnamed { ino, .. } = record.op {
                *next_ino = (*next_ino).max(ino + 1);
            }
        }
        Step::Data(slot, record) => {
            // A write to a file that is gone is fine (removed since, or unlinked while
            // open); to an inode number never handed out, it can only be damage.
            if !inodes.contains_key(&record.inode) && record.inode >= *next_ino {
                return Err(FsError::corrupt(
                    format!("log area of slot {slot} (record {})", record.sequence),
                    format!(
                        "it writes inode {}, which was never created (the next is {})",
                        record.inode, next_ino
                    ),
                ));
            }
            if let Some(inode) = inodes.get(&record.inode) {
                apply::write(
                    inode,
                    record.offset,
                    record.length,
                    record.buffer,
                    record.order,
                    record.mtime,
                )
                .map_err(|problem| {
                    FsError::corrupt(
                        format!("log area of slot {slot} (record {})", record.sequence),
                        problem,
                    )
                })?;
            }
            live.push((slot, record));
        }
    }
    Ok(())
}

fn merge_pages(spans: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut pages: Vec<(u64, u64)> = spans
        .map(|(addr, len)| {
            let start = addr - addr % BLOCK;
            (start, (addr + len).next_multiple_of(BLOCK))
        })
        .collect();
    pages.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (start, end) in pages {
        match merged.last_mut() {
            Some(last)
                if start <= last.1
                    && GlobalAddress::from_raw(start).device()
                        == GlobalAddress::from_raw(last.0).device() =>
            {
                last.1 = last.1.max(end);
            }
            _ => merged.push((start, end)),
        }
    }
    merged.into_iter().map(|(s, e)| (s, e - s)).collect()
}

/// The inode table as a snapshot's inodes are decoded into it ([`Snapshot::decode_each`]).
struct Loading {
    inodes: Table,
}

impl Loading {
    /// Room for the inodes a snapshot of `bytes` can hold (each takes at least
    /// [`crate::snapshot::INODE_BYTES`]), so the table does not grow while it loads.
    fn with_capacity_for(bytes: u64) -> Self {
        let most = bytes / crate::snapshot::INODE_BYTES;
        Self {
            inodes: Table::with_capacity_and_hasher(most.min(1 << 24) as usize, ByIno),
        }
    }

    /// One inode, made in place from its image.
    fn add(&mut self, image: InodeImage) -> Result<()> {
        let unnamed = image.is_unnamed();
        // A snapshot lists each file's runs in order (built in one pass); runs in another
        // order are mapped one by one, which finds a block mapped twice.
        let extents = match ExtentMap::from_sorted_runs(&image.runs) {
            Some(extents) => extents,
            None => {
                let mut extents = ExtentMap::new();
                let mut replaced = Vec::new();
                for run in &image.runs {
                    extents.map(run.file_block, run.blocks, run.addr, &mut replaced);
                    if !replaced.is_empty() {
                        return Err(FsError::corrupt(
                            "file-system snapshot",
                            format!("file {} maps block {} twice", image.ino, run.file_block),
                        ));
                    }
                }
                extents
            }
        };
        let attr = Attr {
            mode: image.mode,
            uid: image.uid,
            gid: image.gid,
            parent: if unnamed { 0 } else { image.parent },
            // Counted from the entries in `finish`, once every inode is in.
            links: 0,
            unlinked: unnamed,
            unnamed,
            never_named: false,
        };
        let mut inode = Arc::new(Inode::new(image.ino, image.kind, attr, image.mtime));
        // Filled in place: the inode is moved once, into its allocation.
        let fill = Arc::get_mut(&mut inode).expect("a new inode is not shared");
        fill.set_contents(image.size, image.entries.into_iter().collect(), extents);
        fill.set_times(image.atime, image.ctime);
        fill.set_target(&image.target);
        fill.rdev = image.rdev;
        if !image.xattrs.is_empty() {
            fill.set_xattrs(image.xattrs.into_iter().collect());
        }
        match self.inodes.entry(image.ino) {
            std::collections::hash_map::Entry::Occupied(_) => Err(FsError::corrupt(
                "file-system snapshot",
                format!("inode {} appears twice", image.ino),
            )),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(inode);
                Ok(())
            }
        }
    }

    /// The table, with each inode's link count counted from the entries naming it (an
    /// entry naming no inode is left to [`check_tree`]).
    fn finish(self) -> Result<Table> {
        let inodes = self.inodes;
        for dir in inodes.values().filter(|i| i.kind == Kind::Dir) {
            for ino in dir.entries.lock().expect("directory").values() {
                if let Some(named) = inodes.get(ino) {
                    named.attr().links += 1;
                }
            }
        }
        match inodes.get(&ROOT_INO) {
            Some(root) if root.kind == Kind::Dir => {
                root.attr().links = 1;
                Ok(inodes)
            }
            _ => Err(FsError::corrupt(
                "file-system snapshot",
                "the root directory (inode 1) is missing",
            )),
        }
    }
}

/// Every entry names an existing inode; every directory but the root is named exactly once
/// and its parent names it; the root is not named; every file and symbolic link is named as
/// many times as its link count says.
fn check_tree(inodes: &Table) -> Result<()> {
    let mut named: HashMap<u64, u64, ByIno> =
        HashMap::with_capacity_and_hasher(inodes.len(), ByIno);
    for (&dir, inode) in inodes {
        let mut subdirs = 0;
        for (name, &ino) in inode.entries.lock().expect("directory").iter() {
            let Some(child) = inodes.get(&ino) else {
                return Err(FsError::corrupt(
                    "file-system namespace",
                    format!("directory {dir} entry `{name}` names missing inode {ino}"),
                ));
            };
            let names = named.entry(ino).or_insert(0);
            *names += 1;
            if ino == ROOT_INO || (child.kind == Kind::Dir && *names > 1) {
                return Err(FsError::corrupt(
                    "file-system namespace",
                    format!("directory {ino} has more than one name"),
                ));
            }
            if child.kind == Kind::Dir {
                let parent = child.attr().parent;
                if parent != dir {
                    return Err(FsError::corrupt(
                        "file-system namespace",
                        format!("directory {ino} is in {dir} but says its parent is {parent}"),
                    ));
                }
                subdirs += 1;
            }
        }
        // The count the namespace operations keep from here on ([`Inode::subdirs`]).
        inode.subdirs.store(subdirs, Ordering::Relaxed);
    }
    if let Some(orphan) = inodes
        .keys()
        .find(|&&i| i != ROOT_INO && !named.contains_key(&i))
    {
        return Err(FsError::corrupt(
            "file-system namespace",
            format!("inode {orphan} has no name"),
        ));
    }
    for (&ino, &names) in &named {
        let links = inodes[&ino].attr().links;
        if links != names {
            return Err(FsError::corrupt(
                "file-system namespace",
                format!("inode {ino} has {names} names but a link count of {links}"),
            ));
        }
    }
    Ok(())
}

fn existing(inodes: &Table, ino: u64) -> Result<Arc<Inode>, Problem> {
    inodes
        .get(&ino)
        .cloned()
        .ok_or_else(|| format!("inode {ino} does not exist"))
}

/// Per inode, the order of the last replayed `SetTimes` that set its modification time: a
/// checkpoint batch logged later may carry the time of a write from before it.
type TimesSet = HashMap<u64, u64, ByIno>;

/// Replays one journaled operation with the live path's [`apply`] function. An operation
/// that cannot apply can only come from damage (dependent operations are logged in order).
fn replay(
    inodes: &mut Table,
    times_set: &mut TimesSet,
    next_ino: u64,
    record: &JournalRecord,
) -> Result<(), Problem> {
    // An inode's own changes (size, hole, mode, times) may follow its removal: a file
    // unlinked while open is still truncated and stamped through its handles. Skipped, as
    // writes to it are; an inode never handed out is damage.
    let changed = |ino: u64| -> Result<Option<Arc<Inode>>, Problem> {
        match inodes.get(&ino) {
            Some(inode) => Ok(Some(Arc::clone(inode))),
            None if ino < next_ino => Ok(None),
            None => Err(format!("inode {ino} does not exist")),
        }
    };
    match &record.op {
        MetaOp::Create {
            parent,
            ino,
            kind,
            mode,
            time,
            name,
            target,
            rdev,
            uid,
            gid,
        } => {
            if inodes.contains_key(ino) {
                return Err(format!("create of inode {ino}, which exists"));
            }
            let dir = existing(inodes, *parent)?;
            let new = NewInode {
                ino: *ino,
                kind: *kind,
                mode: *mode,
                time: *time,
                name,
                target,
                rdev: *rdev,
                owner: Owner {
                    uid: *uid,
                    gid: *gid,
                },
            };
            let inode = apply::create(&dir, &mut dir.entries.lock().expect("directory"), &new)?;
            inodes.insert(*ino, inode);
        }
        MetaOp::CreateUnnamed {
            ino,
            mode,
            time,
            uid,
            gid,
        } => {
            if inodes.contains_key(ino) {
                return Err(format!("create of unnamed inode {ino}, which exists"));
            }
            let owner = Owner {
                uid: *uid,
                gid: *gid,
            };
            inodes.insert(*ino, apply::create_unnamed(*ino, *mode, *time, owner));
        }
        MetaOp::DropUnnamed { ino } => {
            let inode = existing(inodes, *ino)?;
            if !inode.attr().unnamed {
                return Err(format!("drop of inode {ino}, which has a name"));
            }
            inodes.remove(ino);
        }
        MetaOp::Remove {
            parent,
            ino,
            name,
            time,
        } => {
            if ino == parent {
                return Err(format!("directory {ino} removes itself"));
            }
            let dir = existing(inodes, *parent)?;
            let removed = inodes.get(ino).cloned();
            let removed_entries = removed
                .as_ref()
                .filter(|i| i.kind == Kind::Dir)
                .map(|i| i.entries.lock().expect("directory"));
            apply::remove(
                &dir,
                &mut dir.entries.lock().expect("directory"),
                name,
                *ino,
                *time,
                removed_entries.as_deref(),
            )?;
            drop(removed_entries);
            if removed.is_none_or(|r| apply::unname(&r, &mut r.attr(), *time)) {
                inodes.remove(ino);
            }
        }
        MetaOp::Link {
            parent,
            ino,
            name,
            time,
        } => {
            if ino == parent {
                return Err(format!("directory {ino} links itself"));
            }
            let dir = existing(inodes, *parent)?;
            let inode = existing(inodes, *ino)?;
            apply::link(
                &dir,
                &mut dir.entries.lock().expect("directory"),
                &inode,
                &mut inode.attr(),
                name,
                *time,
            )?;
        }
        MetaOp::Rename {
            src_parent,
            src_name,
            dst_parent,
            dst_name,
            ino,
            replaced,
            time,
        } => {
            // Distinct inodes, so that no lock below is taken twice.
            if ino == src_parent || ino == dst_parent {
                return Err(format!("directory {ino} moves into itself"));
            }
            if *replaced != 0 && (replaced == src_parent || replaced == dst_parent) {
                return Err(format!("rename replaces its own directory {replaced}"));
            }
            let src = existing(inodes, *src_parent)?;
            let dst = existing(inodes, *dst_parent)?;
            let moving = inodes.get(ino).cloned();
            let replaced_inode = inodes.get(replaced).cloned().filter(|_| *replaced != 0);
            let replaced_entries = replaced_inode
                .as_ref()
                .filter(|i| i.kind == Kind::Dir && i.ino != *ino)
                .map(|i| i.entries.lock().expect("directory"));
            let moved = Move {
                ino: *ino,
                src_name,
                dst_name,
                replaced: *replaced,
                time: *time,
            };
            let mut src_entries = src.entries.lock().expect("directory");
            if src_parent == dst_parent {
                apply::rename(
                    &src,
                    &dst,
                    RenameDirs::Same(&mut src_entries),
                    moving.as_deref(),
                    replaced_entries.as_deref(),
                    &moved,
                )?;
            } else {
                apply::rename(
                    &src,
                    &dst,
                    RenameDirs::Two(
                        &mut src_entries,
                        &mut dst.entries.lock().expect("directory"),
                    ),
                    moving.as_deref(),
                    replaced_entries.as_deref(),
                    &moved,
                )?;
            }
            drop(src_entries);
            drop(replaced_entries);
            if replaced_inode.is_some_and(|r| apply::unname(&r, &mut r.attr(), *time)) {
                inodes.remove(replaced);
            }
        }
        MetaOp::Exchange {
            a_parent,
            a_name,
            b_parent,
            b_name,
            a_ino,
            b_ino,
            time,
        } => {
            // Four distinct inodes but for the two directories, so no lock is taken twice.
            if a_ino == b_ino
                || [a_ino, b_ino]
                    .iter()
                    .any(|i| *i == a_parent || *i == b_parent)
            {
                return Err(format!(
                    "exchange of {a_ino} and {b_ino} between directories {a_parent} and {b_parent}"
                ));
            }
            let (a_dir, b_dir) = (existing(inodes, *a_parent)?, existing(inodes, *b_parent)?);
            let (a, b) = (existing(inodes, *a_ino)?, existing(inodes, *b_ino)?);
            let mut a_entries = a_dir.entries.lock().expect("directory");
            let mut b_entries =
                (a_parent != b_parent).then(|| b_dir.entries.lock().expect("directory"));
            let dirs = match b_entries.as_mut() {
                None => RenameDirs::Same(&mut a_entries),
                Some(b_entries) => RenameDirs::Two(&mut a_entries, b_entries),
            };
            apply::exchange((&a_dir, &b_dir), dirs, (&a, &b), (a_name, b_name), *time)?;
        }
        MetaOp::Truncate {
            ino,
            size,
            time,
            tail,
        } => {
            let Some(file) = changed(*ino)? else {
                return Ok(());
            };
            apply::truncate(
                &file,
                &mut file.extents.write().expect("extent map"),
                *size,
                *tail,
                *time,
            )?;
        }
        MetaOp::Punch {
            ino,
            first_block,
            blocks,
            time,
        } => {
            let Some(file) = changed(*ino)? else {
                return Ok(());
            };
            apply::punch(
                &file,
                &mut file.extents.write().expect("extent map"),
                *first_block,
                *blocks,
                *time,
            )?;
        }
        MetaOp::Allocate {
            ino,
            size,
            time,
            runs,
        } => {
            let Some(file) = changed(*ino)? else {
                return Ok(());
            };
            apply::allocate(
                &file,
                &mut file.extents.write().expect("extent map"),
                runs,
                *size,
                *time,
            )?;
        }
        MetaOp::SetMode { ino, mode, time } => {
            let Some(inode) = changed(*ino)? else {
                return Ok(());
            };
            apply::set_mode(&inode, &mut inode.attr(), *mode, *time);
        }
        MetaOp::SetOwner {
            ino,
            uid,
            gid,
            mode,
            time,
        } => {
            let Some(inode) = changed(*ino)? else {
                return Ok(());
            };
            let owner = Owner {
                uid: *uid,
                gid: *gid,
            };
            apply::set_owner(&inode, &mut inode.attr(), owner, *mode, *time);
        }
        MetaOp::SetXattr {
            ino,
            name,
            value,
            time,
        } => {
            let Some(inode) = changed(*ino)? else {
                return Ok(());
            };
            let mut xattrs = inode.xattrs.lock().expect("extended attributes");
            apply::set_xattr(&inode, &mut xattrs, name, value, *time);
        }
        MetaOp::SetAcl {
            ino,
            mode,
            value,
            time,
        } => {
            let Some(inode) = changed(*ino)? else {
                return Ok(());
            };
            let mut attr = inode.attr();
            let mut xattrs = inode.xattrs.lock().expect("extended attributes");
            apply::set_acl(&inode, &mut attr, &mut xattrs, *mode, value, *time);
        }
        MetaOp::RemoveXattr { ino, name, time } => {
            let Some(inode) = changed(*ino)? else {
                return Ok(());
            };
            let mut xattrs = inode.xattrs.lock().expect("extended attributes");
            apply::remove_xattr(&inode, &mut xattrs, name, *time)?;
        }
        MetaOp::SetTimes {
            ino,
            atime,
            mtime,
            ctime,
        } => {
            let Some(inode) = changed(*ino)? else {
                return Ok(());
            };
            apply::set_times(&inode, *atime, *mtime, *ctime);
            if *mtime != 0 {
                times_set.insert(*ino, record.order);
            }
        }
        MetaOp::Batch { maps, sizes, .. } => {
            // Entries of files removed since are skipped; an inode never handed out is
            // damage — the journal record that created it lost, though the checkpoint moved
            // writes into it, so it was durable (a torn append is never named again).
            for ino in maps
                .iter()
                .map(|m| m.ino)
                .chain(sizes.iter().map(|z| z.ino))
            {
                changed(ino).map_err(|_| {
                    format!(
                        "a checkpoint batch names inode {ino}, which was never created (the \
                         next is {next_ino}): the record that created it is lost"
                    )
                })?;
            }
            apply::batch(
                maps,
                sizes,
                |ino| inodes.get(&ino).cloned(),
                |ino| times_set.get(&ino).copied().unwrap_or(0),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_pages_merge_within_a_device_only() {
        let a = GlobalAddress::new(0, 1 << 21).raw();
        let b = GlobalAddress::new(1, 0).raw();
        let merged = merge_pages([(a + 100, 50), (a + 1000, 4000), (b, 1)].into_iter());
        assert_eq!(merged, vec![(a, 2 * BLOCK), (b, BLOCK)]);
    }

    #[test]
    fn claims_side_by_side_are_reserved_as_one_extent() {
        let file = |block| Holder::File { ino: 9, block };
        let a = GlobalAddress::new(0, 1 << 21).raw();
        let b = GlobalAddress::new(1, 0).raw();
        let owned = [
            (a, BLOCK, file(0)),
            (a + BLOCK, 3 * BLOCK, file(1)),
            (a + 4 * BLOCK, 100, Holder::LiveBuffers),
            // A gap of one block.
            (a + 6 * BLOCK, BLOCK, file(4)),
            // In the block the last claim rounds up to: kept apart (the allocator refuses it).
            (a + 6 * BLOCK + 100, BLOCK, file(5)),
            (b, BLOCK, Holder::Snapshot),
        ];
        let extents: Vec<(u64, u64)> = owned_extents(&owned)
            .map(|e| (e.start.raw(), e.len_bytes))
            .collect();
        assert_eq!(
            extents,
            vec![
                (a, 5 * BLOCK),
                (a + 6 * BLOCK, BLOCK),
                (a + 6 * BLOCK + 100, BLOCK),
                (b, BLOCK),
            ]
        );
    }
}
