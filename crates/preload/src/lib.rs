//! `liblocus_preload.so`: unmodified programs on the locus file system.
//!
//! ```sh
//! LD_PRELOAD=target/release/liblocus_preload.so cp big.iso /locus/big.iso
//! ```
//!
//! Paths under the mount prefix (`LOCUS_MOUNT`, default `/locus`) are files of the file
//! system on the volume in `LOCUS_VOLUME` (default `/dev/shm/locus`, the embedded default,
//! created on first use); everything else goes to libc untouched. The volume is mounted on
//! the first locus call, inside the process: reads and writes are function calls into the
//! `fs` crate, no system call, and each write is atomic and durable when it returns.
//!
//! - [`calls`]: the intercepted functions, grouped as fd lifetime (`fd`), data (`io`), names
//!   and attributes (`meta`), directories (`dir`) and stdio (`stdio`);
//! - [`state`]: the fd table (locus fds are real kernel fd numbers reserved with a read-only
//!   descriptor of `/`), open file descriptions, the lazy mount and the fork/exit handlers;
//! - [`path`]: which paths are locus's; [`locks`]: advisory locks; [`stat`]: attributes as
//!   the `stat` family reports them; [`real`]: libc's definitions, found with `RTLD_NEXT`.
//!
//! One process mounts a volume at a time (the volume lock). A process that forks with no
//! locus fd open lets go of the volume first, so a shell's children can use it in turn; a
//! child inherits no usable locus state (calls on inherited locus fds fail with `EIO`), and
//! locus fds do not survive `exec`. docs/preload.md has the whole contract.
#![allow(unsafe_code)]

pub mod calls;
pub(crate) mod errno;
pub(crate) mod locks;
pub(crate) mod offsets;
pub mod path;
pub(crate) mod real;
pub mod stat;
pub mod state;
pub(crate) mod suspended;

/// Runs when the library is loaded: registers the fork and exit handlers.
extern "C" fn init() {
    state::install_handlers();
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;
