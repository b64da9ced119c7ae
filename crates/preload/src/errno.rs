//! The calling thread's `errno`.

use std::ffi::c_int;

/// Sets `errno`.
pub(crate) fn set(errno: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, valid for the
    // thread's lifetime.
    unsafe { *libc::__errno_location() = errno };
}

/// Reads `errno`.
pub(crate) fn get() -> c_int {
    // SAFETY: as in `set`.
    unsafe { *libc::__errno_location() }
}
