//! A cache device served over NBD (`locus serve --export
//! NAME=cache:PATH,nvram=SIZE,dram=SIZE[,policy=nbm|nvlru|lru]`): the backing store at PATH
//! behind NVRAM (a file of the locus file system, `/.cache/NAME.nvram`) and DRAM.

use std::ops::Range;
use std::path::{Path, PathBuf};

use cachedev::{CacheConfig, CacheDevice, CacheError, CacheStats, PolicyKind};
use nbd::consts::errno;
use nbd::server::{Export, ExportError, Payload};

use crate::OpenError;

/// A cache export as asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSpec {
    /// Export name clients ask for.
    pub name: String,
    /// The backing store: a block device or a file.
    pub backing: PathBuf,
    /// NVRAM and DRAM sizes and the policy.
    pub config: CacheConfig,
}

impl CacheSpec {
    /// Where the export's NVRAM lives in the file system.
    pub fn nvram_path(&self) -> String {
        nvram_path(&self.name)
    }
}

/// The NVRAM file of cache export `name`.
pub fn nvram_path(name: &str) -> String {
    format!("{NVRAM_DIR}/{name}.nvram")
}

/// The directory of the file system holding cache exports' NVRAM files.
pub const NVRAM_DIR: &str = "/.cache";

/// Whether `name` can name a cache export (it names its NVRAM file): 1 to 200 of
/// `A-Z a-z 0-9 . _ -`, not starting with a dot.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a cache export's name names its NVRAM file: 1 to 200 of A-Z a-z 0-9 . _ -, not \
             starting with a dot (not {name:?})"
        ))
    }
}

/// A cache device served over NBD.
#[derive(Debug)]
pub struct CacheExport {
    device: CacheDevice,
    backing: PathBuf,
}

fn nbd_error(e: &CacheError) -> ExportError {
    let code = match e {
        CacheError::OutOfRange { .. } => errno::EINVAL,
        CacheError::Nvram { source, .. } if source.kind() == fs::ErrorKind::NoSpace => {
            errno::ENOSPC
        }
        _ => errno::EIO,
    };
    tracing::error!(error = %e, "cache export request failed");
    ExportError::new(code, e.to_string())
}

impl CacheExport {
    /// Opens (creating or recovering its NVRAM file) the cache `spec` names.
    pub fn open(fs: &fs::Fs, spec: &CacheSpec) -> Result<Self, OpenError> {
        check_name(&spec.name).map_err(|problem| OpenError::Refused {
            name: spec.name.clone(),
            problem,
        })?;
        let device = CacheDevice::open(fs, &spec.nvram_path(), &spec.backing, &spec.config)
            .map_err(|e| OpenError::Refused {
                name: spec.name.clone(),
                problem: e.to_string(),
            })?;
        crate::check_size(device.size()).map_err(|e| OpenError::Refused {
            name: spec.name.clone(),
            problem: format!("the backing store {} has {e}", spec.backing.display()),
        })?;
        Ok(CacheExport {
            device,
            backing: spec.backing.clone(),
        })
    }

    /// The device's counters.
    pub fn stats(&self) -> CacheStats {
        self.device.stats()
    }

    /// Writes every dirty block back so the backing store alone is complete; the export
    /// serves nothing more afterwards (for a clean stop).
    pub fn write_back_all(&self) -> Result<cachedev::WriteBackReport, CacheError> {
        self.device.write_back_all()
    }

    /// The backing store.
    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// The policy.
    pub fn policy(&self) -> PolicyKind {
        self.device.policy()
    }
}

impl Export for CacheExport {
    type Staged = Vec<u8>;

    fn size(&self) -> u64 {
        self.device.size()
    }

    fn read_only(&self) -> bool {
        false
    }

    fn description(&self) -> String {
        format!(
            "locus cache of {} ({} policy)",
            self.backing.display(),
            self.device.policy().name()
        )
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.device.read(offset, buf).map_err(|e| nbd_error(&e))
    }

    fn data_ranges(&self, offset: u64, len: u64) -> Result<Vec<Range<u64>>, ExportError> {
        // The cache does not track holes: every byte may hold data.
        #[allow(
            clippy::single_range_in_vec_init,
            reason = "one range: all of it is data"
        )]
        let all = vec![offset..offset + len];
        Ok(all)
    }

    fn receive(&self, payload: &mut Payload<'_>) -> Result<Vec<u8>, ExportError> {
        let mut buf = vec![0u8; payload.remaining() as usize];
        payload.receive(&mut buf)?;
        Ok(buf)
    }

    fn commit(&self, staged: Vec<u8>, offset: u64) -> Result<(), ExportError> {
        self.device
            .write(offset, &staged)
            .map_err(|e| nbd_error(&e))
    }

    fn write_zeroes(&self, offset: u64, len: u64, _provision: bool) -> Result<(), ExportError> {
        // Whole blocks: zeroed on the backing store at once and dropped from the cache;
        // partial blocks through the cache.
        self.device
            .write_zeroes(offset, len)
            .map_err(|e| nbd_error(&e))
    }

    fn zeroes_fast(&self, _offset: u64, _len: u64, _provision: bool) -> Result<bool, ExportError> {
        Ok(false)
    }

    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        // Whole blocks leave the cache and are discarded on the backing store (a hole in a
        // file, zeroed on a device); partial blocks are left as they are.
        self.device.discard(offset, len).map_err(|e| nbd_error(&e))
    }

    fn flush(&self) -> Result<(), ExportError> {
        // Every write was in NVRAM (or synced to the backing store) before its reply.
        Ok(())
    }

    fn cache(&self, _offset: u64, _len: u64) -> Result<(), ExportError> {
        Ok(())
    }
}

/// Either kind of export, for a server that serves both.
#[derive(Debug)]
pub enum AnyExport {
    /// A file of the file system.
    Fs(crate::FsExport),
    /// A cache device (boxed: its device is much larger than a file handle).
    Cache(Box<CacheExport>),
}

/// A received payload of either kind of export.
#[derive(Debug)]
pub enum AnyStaged {
    Fs(crate::Staged),
    Cache(Vec<u8>),
}

fn mismatch() -> ExportError {
    ExportError::io("a payload staged for another kind of export")
}

impl Export for AnyExport {
    type Staged = AnyStaged;

    fn size(&self) -> u64 {
        match self {
            AnyExport::Fs(e) => e.size(),
            AnyExport::Cache(e) => e.size(),
        }
    }

    fn read_only(&self) -> bool {
        match self {
            AnyExport::Fs(e) => e.read_only(),
            AnyExport::Cache(e) => e.read_only(),
        }
    }

    fn description(&self) -> String {
        match self {
            AnyExport::Fs(e) => e.description(),
            AnyExport::Cache(e) => e.description(),
        }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        match self {
            AnyExport::Fs(e) => e.read(offset, buf),
            AnyExport::Cache(e) => e.read(offset, buf),
        }
    }

    fn read_with(
        &self,
        offset: u64,
        len: u32,
        scratch: &mut Vec<u8>,
        send: &mut dyn FnMut(&[&[u8]]),
    ) -> Result<(), ExportError> {
        match self {
            AnyExport::Fs(e) => e.read_with(offset, len, scratch, send),
            AnyExport::Cache(e) => e.read_with(offset, len, scratch, send),
        }
    }

    fn data_ranges(&self, offset: u64, len: u64) -> Result<Vec<Range<u64>>, ExportError> {
        match self {
            AnyExport::Fs(e) => e.data_ranges(offset, len),
            AnyExport::Cache(e) => e.data_ranges(offset, len),
        }
    }

    fn receive(&self, payload: &mut Payload<'_>) -> Result<AnyStaged, ExportError> {
        match self {
            AnyExport::Fs(e) => e.receive(payload).map(AnyStaged::Fs),
            AnyExport::Cache(e) => e.receive(payload).map(AnyStaged::Cache),
        }
    }

    fn staged_node(&self, staged: &AnyStaged) -> Option<u32> {
        match (self, staged) {
            (AnyExport::Fs(e), AnyStaged::Fs(s)) => e.staged_node(s),
            _ => None,
        }
    }

    fn commit(&self, staged: AnyStaged, offset: u64) -> Result<(), ExportError> {
        match (self, staged) {
            (AnyExport::Fs(e), AnyStaged::Fs(s)) => e.commit(s, offset),
            (AnyExport::Cache(e), AnyStaged::Cache(s)) => e.commit(s, offset),
            _ => Err(mismatch()),
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64, provision: bool) -> Result<(), ExportError> {
        match self {
            AnyExport::Fs(e) => e.write_zeroes(offset, len, provision),
            AnyExport::Cache(e) => e.write_zeroes(offset, len, provision),
        }
    }

    fn zeroes_fast(&self, offset: u64, len: u64, provision: bool) -> Result<bool, ExportError> {
        match self {
            AnyExport::Fs(e) => e.zeroes_fast(offset, len, provision),
            AnyExport::Cache(e) => e.zeroes_fast(offset, len, provision),
        }
    }

    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        match self {
            AnyExport::Fs(e) => e.trim(offset, len),
            AnyExport::Cache(e) => e.trim(offset, len),
        }
    }

    fn flush(&self) -> Result<(), ExportError> {
        match self {
            AnyExport::Fs(e) => e.flush(),
            AnyExport::Cache(e) => e.flush(),
        }
    }

    fn cache(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        match self {
            AnyExport::Fs(e) => e.cache(offset, len),
            AnyExport::Cache(e) => e.cache(offset, len),
        }
    }
}
