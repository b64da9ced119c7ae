//! Model-based property test: random operation sequences run against the file system and an
//! in-memory model, compared after every step — including clean unmount/open and stops that
//! leave the logs as a crash would. One unnamed file (`O_TMPFILE`) at a time may be held
//! open, written, named or closed unnamed; a crash ends the hold.

use std::collections::BTreeMap;

use fs::{Fs, FsError, Kind};
use proptest::prelude::*;
use testkit::*;

#[derive(Debug, Clone)]
enum Op {
    Write {
        file: usize,
        offset: u64,
        len: usize,
        tag: u64,
    },
    WriteBuffer {
        file: usize,
        block: u64,
        shift: u64,
        blocks: u64,
        tag: u64,
    },
    Truncate {
        file: usize,
        size: u64,
    },
    Punch {
        file: usize,
        offset: u64,
        len: u64,
    },
    Allocate {
        file: usize,
        offset: u64,
        len: u64,
        keep_size: bool,
    },
    Unlink {
        file: usize,
    },
    Rename {
        from: usize,
        to: usize,
    },
    Mkdir {
        dir: usize,
    },
    Rmdir {
        dir: usize,
    },
    /// An unnamed file in `dir` (0: the root, else `DIRS[dir - 1]`), held open.
    TmpMake {
        dir: usize,
    },
    TmpWrite {
        offset: u64,
        len: usize,
        tag: u64,
    },
    /// Names the held unnamed file `file_path(file)` and closes it.
    TmpLink {
        file: usize,
    },
    /// Closes the held unnamed file: it is gone.
    TmpClose,
    Reopen,
    Crash,
}

const DIRS: [&str; 3] = ["/d0", "/d1", "/d0/e"];

fn file_path(i: usize) -> String {
    let dir = ["", "/d0", "/d1", "/d0/e"][i % 4];
    format!("{dir}/f{}", i / 4)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..8, 0u64..200_000, 1usize..40_000, any::<u64>())
            .prop_map(|(file, offset, len, tag)| Op::Write { file, offset, len, tag }),
        // One whole aligned block: what writers remap into their files themselves once the
        // checkpoint shares the block's chunk with them.
        4 => (0usize..8, 0u64..48, any::<u64>())
            .prop_map(|(file, block, tag)| Op::Write { file, offset: block * 4096, len: 4096, tag }),
        2 => (0usize..8, 0u64..40, prop_oneof![Just(0u64), 1u64..4096], 1u64..8, any::<u64>())
            .prop_map(|(file, block, shift, blocks, tag)| Op::WriteBuffer { file, block, shift, blocks, tag }),
        2 => (0usize..8, 0u64..250_000).prop_map(|(file, size)| Op::Truncate { file, size }),
        2 => (0usize..8, 0u64..200_000, 1u64..60_000)
            .prop_map(|(file, offset, len)| Op::Punch { file, offset, len }),
        2 => (0usize..8, 0u64..200_000, 1u64..60_000, any::<bool>())
            .prop_map(|(file, offset, len, keep_size)| Op::Allocate { file, offset, len, keep_size }),
        1 => (0usize..8).prop_map(|file| Op::Unlink { file }),
        2 => (0usize..8, 0usize..8).prop_map(|(from, to)| Op::Rename { from, to }),
        2 => (0usize..3).prop_map(|dir| Op::Mkdir { dir }),
        1 => (0usize..3).prop_map(|dir| Op::Rmdir { dir }),
        1 => (0usize..4).prop_map(|dir| Op::TmpMake { dir }),
        2 => (0u64..200_000, 1usize..40_000, any::<u64>())
            .prop_map(|(offset, len, tag)| Op::TmpWrite { offset, len, tag }),
        1 => (0usize..8).prop_map(|file| Op::TmpLink { file }),
        1 => Just(Op::TmpClose),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
    ]
}

#[derive(Debug, Default)]
struct Model {
    dirs: Vec<String>,
    files: BTreeMap<String, Vec<u8>>,
}

impl Model {
    fn parent_exists(&self, path: &str) -> bool {
        let parent = &path[..path.rfind('/').unwrap()];
        parent.is_empty() || self.dirs.iter().any(|d| d == parent)
    }
}

fn compare(fs: &Fs, model: &Model) -> Result<(), TestCaseError> {
    let mut dirs = vec![String::new()];
    dirs.extend(model.dirs.iter().cloned());
    for dir in &dirs {
        let shown = if dir.is_empty() { "/" } else { dir.as_str() };
        let mut expect: Vec<String> = model
            .dirs
            .iter()
            .chain(model.files.keys())
            .filter(|p| p[..p.rfind('/').unwrap()] == *dir)
            .map(|p| p[p.rfind('/').unwrap() + 1..].to_owned())
            .collect();
        expect.sort();
        let got: Vec<String> = fs
            .readdir(shown)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        prop_assert_eq!(got, expect, "entries of {}", shown);
    }
    for (path, content) in &model.files {
        let file = fs.open_read(path).unwrap();
        prop_assert_eq!(file.len(), content.len() as u64, "size of {}", path);
        let mut back = vec![0xAAu8; content.len() + 7];
        let n = file.read_at(&mut back, 0).unwrap();
        prop_assert_eq!(n, content.len());
        if back[..n] != content[..] {
            let first = back.iter().zip(content).position(|(a, b)| a != b).unwrap();
            return Err(TestCaseError::fail(format!(
                "{path} differs first at byte {first}"
            )));
        }
        // The same bytes lent in place, from an unaligned offset past the end of the file.
        let from = content.len() / 3 + 1;
        let (covered, lent) = file
            .read_with(from as u64, content.len() as u64, |slices| slices.concat())
            .unwrap();
        let expect = content.get(from..).unwrap_or_default();
        prop_assert_eq!(covered, expect.len() as u64, "bytes lent from {}", path);
        prop_assert!(lent == expect, "{} lent other bytes from {}", path, from);
    }
    Ok(())
}

/// Every path's (mode, modification time), the root included: recovery must bring back
/// exactly what the running file system showed (times are the ones its records carry).
fn attributes(fs: &Fs, model: &Model) -> Vec<(String, u32, u64)> {
    std::iter::once("/".to_owned())
        .chain(model.dirs.iter().cloned())
        .chain(model.files.keys().cloned())
        .map(|path| {
            let stat = fs.stat(&path).unwrap();
            (path, stat.mode, stat.mtime_ns)
        })
        .collect()
}

fn run(ops: Vec<Op>, name: &str, mode: fs::CheckpointMode) -> Result<(), TestCaseError> {
    let shm = shm_volume(name, 128 << 20);
    let options = fs::FsOptions {
        checkpoint: mode,
        ..small_options()
    };
    let mut fs = Fs::format(open_volume(&shm.dir), &small_format(), options.clone()).unwrap();
    let mut model = Model::default();
    // The held unnamed file and what it holds.
    let mut tmp: Option<(fs::File, Vec<u8>)> = None;
    for op in ops {
        match &op {
            Op::Write {
                file,
                offset,
                len,
                tag,
            } => {
                let path = file_path(*file);
                let data = pattern(*tag, *offset, *len);
                let result = fs.create(&path).and_then(|f| f.write_at(&data, *offset));
                if model.parent_exists(&path) {
                    result.unwrap();
                    let content = model.files.entry(path).or_default();
                    let end = *offset as usize + len;
                    if content.len() < end {
                        content.resize(end, 0);
                    }
                    content[*offset as usize..end].copy_from_slice(&data);
                } else {
                    prop_assert!(matches!(result, Err(FsError::NotFound(_))), "{:?}", result);
                }
            }
            Op::WriteBuffer {
                file,
                block,
                shift,
                blocks,
                tag,
            } => {
                let path = file_path(*file);
                let offset = block * 4096 + shift;
                let data = pattern(*tag, offset, (blocks * 4096) as usize);
                let result = fs.create(&path).and_then(|f| {
                    let mut b = fs.buffer(data.len() as u64)?;
                    b.write(0, &data)?;
                    f.write_buffer(b, offset)
                });
                if model.parent_exists(&path) {
                    result.unwrap();
                    let content = model.files.entry(path).or_default();
                    let end = offset as usize + data.len();
                    if content.len() < end {
                        content.resize(end, 0);
                    }
                    content[offset as usize..end].copy_from_slice(&data);
                } else {
                    prop_assert!(result.is_err());
                }
            }
            Op::Truncate { file, size } => {
                let path = file_path(*file);
                let result = fs.truncate(&path, *size);
                match model.files.get_mut(&path) {
                    Some(content) => {
                        result.unwrap();
                        content.resize(*size as usize, 0);
                    }
                    None => prop_assert!(result.is_err()),
                }
            }
            Op::Punch { file, offset, len } => {
                let path = file_path(*file);
                let result = fs
                    .open_file(&path, fs::OpenOptions::read_write())
                    .and_then(|f| f.punch_hole(*offset, *len));
                match model.files.get_mut(&path) {
                    Some(content) => {
                        result.unwrap();
                        let end = ((offset + len) as usize).min(content.len());
                        if (*offset as usize) < end {
                            content[*offset as usize..end].fill(0);
                        }
                    }
                    None => prop_assert!(result.is_err()),
                }
            }
            Op::Allocate {
                file,
                offset,
                len,
                keep_size,
            } => {
                let path = file_path(*file);
                let result = fs
                    .open_file(&path, fs::OpenOptions::read_write())
                    .and_then(|f| f.allocate(*offset, *len, *keep_size));
                match model.files.get_mut(&path) {
                    Some(content) => {
                        result.unwrap();
                        let end = (offset + len) as usize;
                        if !keep_size && content.len() < end {
                            content.resize(end, 0);
                        }
                    }
                    None => prop_assert!(result.is_err()),
                }
            }
            Op::Unlink { file } => {
                let path = file_path(*file);
                let result = fs.unlink(&path);
                match model.files.remove(&path) {
                    Some(_) => result.unwrap(),
                    None => prop_assert!(result.is_err()),
                }
            }
            Op::Rename { from, to } => {
                let (from, to) = (file_path(*from), file_path(*to));
                let result = fs.rename(&from, &to);
                if model.files.contains_key(&from) && model.parent_exists(&to) {
                    result.unwrap();
                    let content = model.files.remove(&from).unwrap();
                    model.files.insert(to, content);
                } else {
                    prop_assert!(result.is_err(), "rename {} -> {}", from, to);
                }
            }
            Op::Mkdir { dir } => {
                let path = DIRS[*dir];
                let result = fs.mkdir(path, 0o755);
                if model.parent_exists(path) && !model.dirs.iter().any(|d| d == path) {
                    result.unwrap();
                    model.dirs.push(path.to_owned());
                } else {
                    prop_assert!(result.is_err());
                }
            }
            Op::Rmdir { dir } => {
                let path = DIRS[*dir];
                let result = fs.rmdir(path);
                let prefix = format!("{path}/");
                let exists = model.dirs.iter().any(|d| d == path);
                let empty = !model
                    .dirs
                    .iter()
                    .chain(model.files.keys())
                    .any(|p| p.starts_with(&prefix));
                if exists && empty {
                    result.unwrap();
                    model.dirs.retain(|d| d != path);
                } else {
                    prop_assert!(result.is_err());
                }
            }
            Op::TmpMake { dir } => {
                let path = if *dir == 0 { "/" } else { DIRS[*dir - 1] };
                let exists = *dir == 0 || model.dirs.iter().any(|d| d == path);
                let result = fs.create_unnamed(path, 0o600, true, false);
                if tmp.is_some() {
                    // One at a time: this one is closed at once.
                    drop(result);
                } else if exists {
                    tmp = Some((result.unwrap(), Vec::new()));
                } else {
                    prop_assert!(matches!(result, Err(FsError::NotFound(_))), "{:?}", result);
                }
            }
            Op::TmpWrite { offset, len, tag } => {
                if let Some((file, content)) = &mut tmp {
                    let data = pattern(*tag, *offset, *len);
                    file.write_at(&data, *offset).unwrap();
                    let end = *offset as usize + len;
                    if content.len() < end {
                        content.resize(end, 0);
                    }
                    content[*offset as usize..end].copy_from_slice(&data);
                }
            }
            Op::TmpLink { file } => {
                if let Some((held, content)) = tmp.take() {
                    let path = file_path(*file);
                    let result = held.link(&path);
                    if model.parent_exists(&path) && !model.files.contains_key(&path) {
                        result.unwrap();
                        model.files.insert(path, content);
                    } else {
                        prop_assert!(result.is_err(), "link of the unnamed file as {}", path);
                    }
                }
            }
            Op::TmpClose => tmp = None,
            Op::Reopen => {
                tmp = None;
                let before = attributes(&fs, &model);
                fs.unmount().unwrap();
                fs = Fs::open(open_volume(&shm.dir), options.clone()).unwrap();
                prop_assert_eq!(attributes(&fs, &model), before, "attributes after a reopen");
            }
            Op::Crash => {
                let before = attributes(&fs, &model);
                fs.abandon();
                // Closed after the crash point: recovery drops it.
                tmp = None;
                fs = Fs::open(open_volume(&shm.dir), options.clone()).unwrap();
                prop_assert_eq!(attributes(&fs, &model), before, "attributes after a crash");
            }
        }
        compare(&fs, &model).map_err(|e| TestCaseError::fail(format!("after {op:?}: {e}")))?;
        let _ = Kind::File;
    }
    // Finally, a crash and a check of everything.
    fs.abandon();
    drop(tmp);
    let fs = Fs::open(open_volume(&shm.dir), options.clone()).unwrap();
    compare(&fs, &model)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn the_file_system_agrees_with_the_model(ops in prop::collection::vec(op(), 1..50)) {
        run(ops, "model", fs::CheckpointMode::Background)?;
    }

    /// The checkpoint runs only under pressure, so stops find many writes still in the logs.
    #[test]
    fn recovery_with_writes_in_the_logs_agrees_with_the_model(ops in prop::collection::vec(op(), 1..50)) {
        run(ops, "model-lazy", fs::CheckpointMode::OnDemand)?;
    }
}
