//! User-defined file metadata as envd keeps it: `X-Metadata-<key>: value` upload headers
//! become `user.e2b.<key>` extended attributes on the file, and every `EntryInfo` reads
//! them back (the prefix stripped), including ones set inside the sandbox with `setfattr`.

use std::collections::BTreeMap;
use std::ffi::{CString, c_char, c_void};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use http::HeaderMap;

/// The xattr namespace of metadata (`user.` is what unprivileged processes may set).
const PREFIX: &str = "user.e2b.";

/// The Linux limit on a whole xattr name is 255 bytes, prefix included.
const MAX_KEY: usize = 255 - PREFIX.len();

/// envd's budget for one file's metadata (names with prefix plus values): one ext4 block.
const MAX_TOTAL: usize = 4096;

/// The `X-Metadata-*` headers of a request, keys lowercased, first value of each.
pub(crate) fn from_headers(headers: &HeaderMap) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (name, value) in headers {
        // `HeaderName`s are lowercase already.
        let Some(key) = name.as_str().strip_prefix("x-metadata-") else {
            continue;
        };
        if out.contains_key(key) {
            continue;
        }
        // A value that is not visible ASCII is kept as bytes so validation can refuse it.
        out.insert(
            key.to_owned(),
            String::from_utf8_lossy(value.as_bytes()).into_owned(),
        );
    }
    out
}

/// envd's `ValidateMetadata`, with its texts.
pub(crate) fn validate(metadata: &BTreeMap<String, String>) -> Result<(), String> {
    let mut total = 0usize;
    for (key, value) in metadata {
        if key.is_empty() {
            return Err("metadata key must not be empty".to_owned());
        }
        if key.len() > MAX_KEY {
            return Err(format!("metadata key {key:?} exceeds {MAX_KEY} bytes"));
        }
        printable("key", key)?;
        printable(&format!("value for key {key:?}"), value)?;
        total += PREFIX.len() + key.len() + value.len();
    }
    if total > MAX_TOTAL {
        return Err(format!(
            "total metadata size {total} exceeds {MAX_TOTAL} bytes"
        ));
    }
    Ok(())
}

fn printable(label: &str, text: &str) -> Result<(), String> {
    match text.bytes().position(|b| !(0x20..=0x7e).contains(&b)) {
        None => Ok(()),
        Some(at) => Err(format!(
            "metadata {label} contains non-printable-ASCII byte 0x{:02x} at offset {at}",
            text.as_bytes()[at]
        )),
    }
}

/// True when the filesystem keeps no extended attributes (envd then stores nothing and
/// reports none).
pub(crate) fn unsupported(error: &io::Error) -> bool {
    error.raw_os_error() == Some(libc::ENOTSUP)
}

fn cstring(text: &str) -> io::Result<CString> {
    CString::new(text).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Splits the NUL-separated name list `listxattr` fills in.
fn names(buffer: &[u8]) -> Vec<String> {
    buffer
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .filter_map(|n| std::str::from_utf8(n).ok().map(str::to_owned))
        .collect()
}

/// Calls a `listxattr`-style function with a buffer grown to fit.
fn list_with(call: impl Fn(*mut c_char, usize) -> isize) -> io::Result<Vec<String>> {
    loop {
        let size = call(std::ptr::null_mut(), 0);
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buffer = vec![0u8; size.unsigned_abs()];
        let got = call(buffer.as_mut_ptr().cast(), buffer.len());
        if got >= 0 {
            buffer.truncate(got.unsigned_abs());
            return Ok(names(&buffer));
        }
        let error = io::Error::last_os_error();
        // The list grew between the two calls: ask again.
        if error.raw_os_error() != Some(libc::ERANGE) {
            return Err(error);
        }
    }
}

/// Replaces the open file's metadata with `metadata`: keys not in it are removed, since
/// truncating a file keeps its attributes and an overwrite must not keep stale ones.
pub(crate) fn write(file: &impl AsRawFd, metadata: &BTreeMap<String, String>) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: `fd` is open for the duration of the call; the buffer is valid for `size`.
    let existing = list_with(|buf, size| unsafe { libc::flistxattr(fd, buf, size) })?;
    for name in existing {
        let Some(key) = name.strip_prefix(PREFIX) else {
            continue;
        };
        if metadata.contains_key(key) {
            continue;
        }
        let name = cstring(&name)?;
        // SAFETY: `name` is a NUL-terminated string alive for the call.
        if unsafe { libc::fremovexattr(fd, name.as_ptr()) } != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::ENODATA) {
                return Err(error);
            }
        }
    }
    for (key, value) in metadata {
        let name = cstring(&format!("{PREFIX}{key}"))?;
        // SAFETY: `name` and `value` are alive and sized for the call.
        let set = unsafe {
            libc::fsetxattr(
                fd,
                name.as_ptr(),
                value.as_ptr().cast::<c_void>(),
                value.len(),
                0,
            )
        };
        if set != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The metadata on `path` (a symlink's own, never its target's: a link may point out of
/// the sandbox). Empty when there is none or the filesystem keeps none; entries that are
/// not UTF-8 (set by hand inside the sandbox) are skipped, as envd skips them.
pub(crate) fn read(path: &Path) -> BTreeMap<String, String> {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return BTreeMap::new();
    };
    // SAFETY: `c_path` is NUL-terminated and alive; the buffer is valid for `size`.
    let Ok(all) = list_with(|buf, size| unsafe { libc::llistxattr(c_path.as_ptr(), buf, size) })
    else {
        return BTreeMap::new();
    };
    let mut out = BTreeMap::new();
    for name in all {
        let Some(key) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Ok(c_name) = cstring(&name) else {
            continue;
        };
        let mut value = vec![0u8; 4096];
        // SAFETY: both strings are NUL-terminated; the buffer is valid for its length.
        let got = unsafe {
            libc::lgetxattr(
                c_path.as_ptr(),
                c_name.as_ptr(),
                value.as_mut_ptr().cast::<c_void>(),
                value.len(),
            )
        };
        if got < 0 {
            continue;
        }
        value.truncate(got.unsigned_abs());
        if let Ok(text) = String::from_utf8(value) {
            out.insert(key.to_owned(), text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_uses_envd_rules_and_texts() {
        let one = |k: &str, v: &str| BTreeMap::from([(k.to_owned(), v.to_owned())]);
        assert_eq!(validate(&one("owner", "alice smith")), Ok(()));
        assert_eq!(
            validate(&one("", "x")),
            Err("metadata key must not be empty".to_owned())
        );
        assert_eq!(
            validate(&one("k", "caf\u{e9}")),
            Err(
                "metadata value for key \"k\" contains non-printable-ASCII byte 0xc3 at offset 3"
                    .to_owned()
            )
        );
        assert!(validate(&one(&"k".repeat(MAX_KEY + 1), "")).is_err());
        assert!(validate(&one("k", &"v".repeat(MAX_TOTAL))).is_err());
    }

    #[test]
    fn write_replaces_and_read_strips_the_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = std::fs::File::create(&path).unwrap();
        let first = BTreeMap::from([
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), "2".to_owned()),
        ]);
        write(&file, &first).unwrap();
        assert_eq!(read(&path), first);
        let second = BTreeMap::from([("b".to_owned(), "3".to_owned())]);
        write(&file, &second).unwrap();
        assert_eq!(
            read(&path),
            second,
            "a key absent from the new set is removed"
        );
        write(&file, &BTreeMap::new()).unwrap();
        assert!(read(&path).is_empty());
    }
}
