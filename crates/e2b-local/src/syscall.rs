//! The two helpers every module that calls libc directly needs: a result checked into an
//! `io::Error`, and a path as a C string.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A libc call's result: negative is `errno`'s error (async-signal-safe, so a `pre_exec`
/// hook may use it).
pub(crate) fn check(result: libc::c_int) -> io::Result<()> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A path as libc takes it; a NUL byte in it is an error.
pub(crate) fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}
