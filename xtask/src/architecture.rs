//! Architecture invariants, checked mechanically (ARCHITECTURE.md states them in words):
//!
//! - every crate under `crates/` is named after its folder, inherits `[workspace.lints]`, and
//!   has a section in ARCHITECTURE.md;
//! - dependencies between locus crates point one way, downwards, as the table [`LAYERS`]
//!   allows;
//! - `unsafe` code (which the workspace lints deny) is allowed back in only where
//!   [`UNSAFE_ALLOWED`] says.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

/// Each crate and the locus crates it may depend on. A crate missing here fails the check,
/// so adding a crate means deciding its place.
const LAYERS: &[(&str, &[&str])] = &[
    ("topology", &[]),
    ("pmem", &["topology"]),
    ("volume", &["topology", "pmem"]),
    ("cache", &[]),
    ("uring", &["topology"]),
    ("nbd", &["topology"]),
    ("fs", &["topology", "pmem", "volume"]),
    ("fs-capi", &["topology", "volume", "fs"]),
    ("preload", &["topology", "volume", "fs"]),
    ("mount", &["topology", "volume", "fs", "uring"]),
    ("cachedev", &["topology", "volume", "fs", "cache", "uring"]),
    ("exports", &["fs", "nbd", "cachedev"]),
    ("sim", &["cache"]),
    // Test helpers: a dev-dependency only (no crate's [dependencies] may name it, as no
    // layer below lists it).
    ("testkit", &["topology", "pmem", "volume", "fs"]),
    (
        "locus",
        &[
            "topology", "pmem", "volume", "fs", "cache", "sim", "uring", "nbd", "exports", "mount",
            "cachedev",
        ],
    ),
];

/// Files that may re-allow `unsafe_code`, with the reason. Prefixes match whole crates.
const UNSAFE_ALLOWED: &[(&str, &str)] = &[
    (
        "crates/topology/src/sys.rs",
        "kernel NUMA and thread system calls (mbind, move_pages, sched_setaffinity, nice, the signal mask threads inherit)",
    ),
    (
        "crates/pmem/",
        "the only code that maps or stores to persistent memory",
    ),
    (
        "crates/uring/",
        "io_uring submission and the DMA buffers the kernel reads and writes",
    ),
    (
        "crates/nbd/src/server/sys.rs",
        "socket activation (adopting inherited fds), interface addresses, signal masks",
    ),
    (
        "crates/fs/src/fs/lend.rs",
        "File::read_with lends file bytes in place: Region::lend's contract, kept by the range lock",
    ),
    (
        "crates/fs/tests/mapped.rs",
        "the shared-mapping test loads and stores through the device pages File::map_shared returns",
    ),
    (
        "crates/fs-capi/",
        "the C API: turning C callers' pointers into handles and slices",
    ),
    (
        "crates/preload/",
        "the LD_PRELOAD library: stands in for libc functions, with C pointers and fds",
    ),
];

/// Returns every broken invariant as a sentence; empty when all hold.
pub fn check(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let architecture =
        fs::read_to_string(root.join("ARCHITECTURE.md")).context("reading ARCHITECTURE.md")?;

    let crates_dir = root.join("crates");
    let mut crate_dirs: Vec<_> = fs::read_dir(&crates_dir)
        .with_context(|| format!("listing {}", crates_dir.display()))?
        .collect::<std::io::Result<_>>()?;
    crate_dirs.sort_by_key(fs::DirEntry::file_name);

    for entry in crate_dirs {
        let folder = entry.file_name().to_string_lossy().into_owned();
        let manifest_path = entry.path().join("Cargo.toml");
        let text = fs::read_to_string(&manifest_path)
            .with_context(|| format!("reading {}", manifest_path.display()))?;
        let manifest: toml::Table = text
            .parse()
            .with_context(|| format!("parsing {}", manifest_path.display()))?;

        let name = manifest
            .get("package")
            .and_then(|p| p.get("name"))
            .and_then(toml::Value::as_str)
            .unwrap_or_default();
        if name != folder {
            problems.push(format!(
                "crates/{folder} is named `{name}`; crate name = folder name"
            ));
        }
        let inherits_lints = manifest
            .get("lints")
            .and_then(|l| l.get("workspace"))
            .and_then(toml::Value::as_bool)
            == Some(true);
        if !inherits_lints {
            problems.push(format!(
                "crates/{folder}/Cargo.toml lacks `[lints] workspace = true`"
            ));
        }
        if !architecture.contains(&format!("### `{folder}`")) {
            problems.push(format!("ARCHITECTURE.md has no `### `{folder}`` section"));
        }

        let Some((_, allowed)) = LAYERS.iter().find(|(c, _)| *c == folder) else {
            problems.push(format!(
                "crates/{folder} is not in xtask's LAYERS table: decide which crates it may use"
            ));
            continue;
        };
        for table in ["dependencies", "build-dependencies"] {
            let Some(deps) = manifest.get(table).and_then(toml::Value::as_table) else {
                continue;
            };
            for dep in deps.keys() {
                let is_locus_crate = LAYERS.iter().any(|(c, _)| c == dep);
                if is_locus_crate && !allowed.contains(&dep.as_str()) {
                    problems.push(format!(
                        "{folder} depends on {dep}, which its layer may not use ({table})"
                    ));
                }
            }
        }
    }

    for file in rust_files(root)? {
        let relative = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .to_string_lossy()
            .into_owned();
        let text = fs::read_to_string(&file)?;
        let reallows = match reallows_unsafe(&text) {
            Ok(found) => found,
            Err(e) => {
                problems.push(format!("{relative} does not parse as Rust: {e}"));
                continue;
            }
        };
        if reallows
            && !UNSAFE_ALLOWED
                .iter()
                .any(|(prefix, _)| relative.starts_with(prefix))
        {
            problems.push(format!(
                "{relative} allows unsafe code outside the permitted places"
            ));
        }
    }
    Ok(problems)
}

/// Whether any attribute of the file — inner or outer, on any item, however rustfmt wrapped
/// it, also inside `cfg_attr` — allows or expects the `unsafe_code` lint.
fn reallows_unsafe(text: &str) -> syn::Result<bool> {
    struct Finder(bool);
    impl<'ast> syn::visit::Visit<'ast> for Finder {
        fn visit_attribute(&mut self, attribute: &'ast syn::Attribute) {
            self.0 |= names_unsafe_code(&attribute.meta);
        }
    }
    fn names_unsafe_code(meta: &syn::Meta) -> bool {
        let syn::Meta::List(list) = meta else {
            return false;
        };
        let nested = list
            .parse_args_with(
                syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
            )
            .unwrap_or_default();
        if list.path.is_ident("cfg_attr") {
            // `cfg_attr(condition, attr, ...)`: the attributes after the condition.
            return nested.iter().skip(1).any(names_unsafe_code);
        }
        (list.path.is_ident("allow") || list.path.is_ident("expect"))
            && nested.iter().any(|m| m.path().is_ident("unsafe_code"))
    }
    let file = syn::parse_file(text)?;
    let mut finder = Finder(false);
    syn::visit::visit_file(&mut finder, &file);
    Ok(finder.0)
}

fn rust_files(root: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
    // xtask is automation, not shipped code, and names the lint in its own checks.
    let mut pending = vec![root.join("crates")];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                if !path.ends_with("fixtures") {
                    pending.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_keeps_its_invariants() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let problems = check(root).unwrap();
        assert!(problems.is_empty(), "{problems:#?}");
    }

    #[test]
    fn allowances_are_found_however_they_are_written() {
        for text in [
            "#![allow(unsafe_code)]",
            "#![allow(\n    unsafe_code,\n    reason = \"wrapped by rustfmt\"\n)]",
            "#![expect(dead_code, unsafe_code)]",
            "mod m { #[allow(clippy::all, unsafe_code)] fn f() {} }",
            "#[cfg_attr(test, allow(unsafe_code))] fn f() {}",
            "impl S { #[allow( unsafe_code )] fn f(&self) {} }",
        ] {
            assert!(reallows_unsafe(text).unwrap(), "{text}");
        }
        for text in [
            "#![allow(dead_code)]",
            "// allow(unsafe_code) in a comment\nfn f() {}",
            "const S: &str = \"allow(unsafe_code)\";",
            "#![deny(unsafe_code)]",
        ] {
            assert!(!reallows_unsafe(text).unwrap(), "{text}");
        }
    }

    #[test]
    fn an_upward_dependency_is_reported() {
        let dir = std::env::temp_dir().join(format!("locus-arch-{}", std::process::id()));
        let crate_dir = dir.join("crates/topology");
        fs::create_dir_all(crate_dir.join("src")).unwrap();
        fs::write(dir.join("ARCHITECTURE.md"), "### `topology`\n").unwrap();
        fs::write(
            crate_dir.join("Cargo.toml"),
            "[package]\nname = \"topology\"\n[dependencies]\nlocus = { path = \"../locus\" }\n\
             [lints]\nworkspace = true\n",
        )
        .unwrap();
        fs::write(crate_dir.join("src/lib.rs"), "#![allow(unsafe_code)]\n").unwrap();
        let problems = check(&dir).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            problems,
            vec![
                "topology depends on locus, which its layer may not use (dependencies)".to_owned(),
                "crates/topology/src/lib.rs allows unsafe code outside the permitted places"
                    .to_owned(),
            ]
        );
    }
}
