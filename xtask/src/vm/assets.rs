//! What a guest boots from: the Debian cloud kernel with its modules, and a static busybox.
//!
//! Both are fetched with `apt-get download` (so they come through the same mirror as every
//! other Debian package) into `target/vm/cache/` and unpacked there once. When apt cannot
//! resolve or fetch (no network, no package lists), a kernel already in the cache is used.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The Debian meta-package whose dependency names the current cloud kernel.
const KERNEL_META_PACKAGE: &str = "linux-image-cloud-amd64";
const BUSYBOX_PACKAGE: &str = "busybox-static";

/// Modules the guest loads, in this order; their dependencies are loaded first.
pub const GUEST_MODULES: &[&str] = &[
    // Persistent memory: the order the NVDIMM stack needs.
    "libnvdimm",
    "nd_btt",
    "nfit",
    "nd_pmem",
    // Device-DAX on NVDIMM namespaces.
    "dax_pmem",
    "device_dax",
    // The NIC behind the PCI expander bridge, and the scratch disk.
    "virtio_pci",
    "virtio_net",
    "virtio_blk",
];

#[derive(Debug)]
pub struct Kernel {
    pub version: String,
    pub vmlinuz: PathBuf,
    pub modules_dir: PathBuf,
}

pub struct Assets {
    pub kernel: Kernel,
    pub busybox: PathBuf,
}

pub fn prepare(cache: &Path) -> Result<Assets> {
    fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let kernel = match resolve_kernel_package() {
        Ok(package) => {
            let deb = download(cache, &package)?;
            let dir = unpack(cache, &deb)?;
            kernel_in(&dir)?
        }
        Err(error) => {
            let cached = cached_kernel(cache)?.with_context(|| {
                format!("{error:#}; and no kernel is cached in {}", cache.display())
            })?;
            eprintln!(
                "vm-test: {error:#}; using the cached kernel {}",
                cached.version
            );
            cached
        }
    };
    let busybox_deb = match download(cache, BUSYBOX_PACKAGE) {
        Ok(deb) => deb,
        Err(error) => newest_deb(cache, BUSYBOX_PACKAGE)?.context(error)?,
    };
    let busybox = unpack(cache, &busybox_deb)?.join("bin/busybox");
    if !busybox.is_file() {
        bail!("{} has no bin/busybox", busybox_deb.display());
    }
    Ok(Assets { kernel, busybox })
}

/// `linux-image-cloud-amd64` depends on exactly one versioned image package; that is the one.
fn resolve_kernel_package() -> Result<String> {
    let output = Command::new("apt-cache")
        .args(["depends", KERNEL_META_PACKAGE])
        .output()
        .context("running apt-cache")?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("Depends: "))
        .map(str::trim)
        .find(|name| name.starts_with("linux-image-") && name.ends_with("-cloud-amd64"))
        .map(str::to_owned)
        .with_context(|| {
            format!(
                "apt-cache cannot resolve {KERNEL_META_PACKAGE} (run apt-get update?): {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )
        })
}

/// Downloads `package`'s .deb into `cache` unless a .deb of it is already there.
fn download(cache: &Path, package: &str) -> Result<PathBuf> {
    if let Some(deb) = newest_deb(cache, package)? {
        return Ok(deb);
    }
    eprintln!("vm-test: apt-get download {package}");
    let status = Command::new("apt-get")
        .args(["download", "-q", package])
        .current_dir(cache)
        .status()
        .context("running apt-get download")?;
    if !status.success() {
        bail!("apt-get download {package} failed ({status})");
    }
    newest_deb(cache, package)?.with_context(|| format!("apt-get left no .deb of {package}"))
}

fn newest_deb(cache: &Path, package: &str) -> Result<Option<PathBuf>> {
    let prefix = format!("{package}_");
    let mut debs: Vec<PathBuf> = fs::read_dir(cache)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with(&prefix) && name.ends_with(".deb")
        })
        .collect();
    debs.sort();
    Ok(debs.pop())
}

/// Unpacks a .deb into a directory next to it, once (a marker file records completion).
fn unpack(cache: &Path, deb: &Path) -> Result<PathBuf> {
    let stem = deb
        .file_stem()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let dir = cache.join(format!("{stem}.d"));
    let done = dir.join(".unpacked");
    if done.exists() {
        return Ok(dir);
    }
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    let status = Command::new("dpkg-deb")
        .arg("-x")
        .arg(deb)
        .arg(&dir)
        .status()
        .context("running dpkg-deb")?;
    if !status.success() {
        bail!("dpkg-deb -x {} failed ({status})", deb.display());
    }
    fs::write(&done, "")?;
    Ok(dir)
}

fn kernel_in(dir: &Path) -> Result<Kernel> {
    let modules_root = dir.join("lib/modules");
    let version = fs::read_dir(&modules_root)
        .with_context(|| format!("{} has no lib/modules", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .max()
        .with_context(|| format!("{} is empty", modules_root.display()))?;
    let vmlinuz = dir.join(format!("boot/vmlinuz-{version}"));
    if !vmlinuz.is_file() {
        bail!("{} is missing", vmlinuz.display());
    }
    Ok(Kernel {
        modules_dir: modules_root.join(&version),
        vmlinuz,
        version,
    })
}

fn cached_kernel(cache: &Path) -> Result<Option<Kernel>> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(cache)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("linux-image-") && name.ends_with(".d") && p.join(".unpacked").exists()
        })
        .collect();
    dirs.sort();
    dirs.pop().map(|dir| kernel_in(&dir)).transpose()
}

/// The `.ko` files to load for `wanted`, dependencies first, each once.
pub fn module_load_order(modules_dir: &Path, wanted: &[&str]) -> Result<Vec<PathBuf>> {
    let mut index = std::collections::BTreeMap::new();
    let mut pending = vec![modules_dir.join("kernel")];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else if let Some(name) = path.file_name().and_then(|n| n.to_str())
                && let Some(module) = name.strip_suffix(".ko")
            {
                index.insert(module.replace('-', "_"), path.clone());
            }
        }
    }
    let mut order = Vec::new();
    let mut visiting = Vec::new();
    for module in wanted {
        visit(module, &index, &mut order, &mut visiting)?;
    }
    Ok(order)
}

fn visit(
    module: &str,
    index: &std::collections::BTreeMap<String, PathBuf>,
    order: &mut Vec<PathBuf>,
    visiting: &mut Vec<String>,
) -> Result<()> {
    let path = index.get(module).with_context(|| {
        format!("kernel module {module} is not in the kernel package (built in?)")
    })?;
    if order.contains(path) {
        return Ok(());
    }
    if visiting.iter().any(|m| m == module) {
        bail!("module dependency cycle through {module}");
    }
    visiting.push(module.to_owned());
    for dependency in module_depends(path)? {
        visit(&dependency, index, order, visiting)?;
    }
    visiting.pop();
    order.push(path.clone());
    Ok(())
}

/// The `depends=` entry of a module's `.modinfo` section (what `modinfo -F depends` prints).
fn module_depends(path: &Path) -> Result<Vec<String>> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let key = b"depends=";
    for (at, window) in bytes.windows(key.len()).enumerate() {
        let starts_entry = at == 0 || bytes[at - 1] == 0;
        if window == key && starts_entry {
            let rest = &bytes[at + key.len()..];
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            let list = std::str::from_utf8(&rest[..end])
                .with_context(|| format!("{}: depends= is not text", path.display()))?;
            return Ok(list
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect());
        }
    }
    Ok(Vec::new())
}
