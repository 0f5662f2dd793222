//! Files to the host: a sandbox file streamed to a host path under a cap, and `readlink -f`.
//!
//! What a framework delivers to its user (Hermes' `MEDIA:` tags) is made in the sandbox. The
//! bytes come over envd's `/files` download, never through a command's output, and go straight
//! to a temp file beside the destination the caller chose: nothing the sandbox sends names a
//! host path, and the host holds one network chunk at a time, however large the file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use e2b_client::{Download, Sandbox, StartOptions};
use futures::{Stream, StreamExt};

use super::{Backend, Inflight, TRANSFER_WINDOW};
use crate::error::{Error, FileRefusal};

/// The step errors about a download name.
const FETCH: &str = "fetch file";
/// The step errors about a path resolution name.
const REALPATH: &str = "resolve sandbox path";
/// The longest resolved path accepted (Linux's `PATH_MAX`).
const MAX_PATH_BYTES: usize = 4096;
/// The most output a helper command may print (a path, or a short error).
const HELPER_OUTPUT: u64 = 2 * MAX_PATH_BYTES as u64;
/// How long a helper command may run in the sandbox.
const HELPER_DEADLINE: Duration = Duration::from_secs(30);
/// `[ -f ]`: a regular file once links are followed, as Hermes' own fetch checks it.
const REGULAR_FILE: &str = r#"[ -f "$1" ]"#;
/// `readlink -f`: every component but the last must exist; links and `..` are resolved.
const READLINK: &str = r#"readlink -f "$1""#;

impl Backend {
    /// Copies the regular file `path` (absolute; links followed) out of the sandbox to
    /// `destination` on the host; returns its size.
    ///
    /// The bytes are streamed from envd's `/files` download into a new temp file beside
    /// `destination`, which is renamed onto it only once the whole file arrived: a failure of
    /// any kind (missing, not a regular file, more than `max_bytes`, a broken transfer, a host
    /// write) leaves neither the temp file nor anything at `destination`. The download fails
    /// at the first byte past `max_bytes` (before any byte when the announced length is
    /// larger). Admitted like a command (attach, lease, gates, sync); the transfer itself runs
    /// outside the backend's lock, counted as in flight so a cleanup waits for it (L8).
    pub fn fetch_file(&self, path: &str, destination: &Path, max_bytes: u64) -> Result<u64, Error> {
        check_sandbox_path(FETCH, path, self.info().map(|info| info.sandbox_id))?;
        let (download, sandbox_id, _in_flight) =
            self.file_operation(FETCH, TRANSFER_WINDOW, |inner, sandbox| {
                let id = sandbox.id().as_str().to_owned();
                // Both at once: the check costs no round trip of its own, and a fifo (whose
                // download would wait for a writer) is refused as soon as the check answers.
                let (_, download) = inner.block_on(futures::future::try_join(
                    regular_file(sandbox, path, &id),
                    open_download(sandbox, path, max_bytes, &id),
                ))?;
                Ok((download, id, InFlight::enter(&inner.inflight, path)))
            })?;
        let refused = |reason| Error::FileRefused {
            operation: FETCH,
            sandbox_id: Some(sandbox_id.clone()),
            path: path.to_owned(),
            reason,
        };
        let temp = TempFile::beside(destination)?;
        let mut file = temp.file()?;
        let written = self
            .inner
            .block_on(write_capped(download, &mut file, max_bytes))
            .map_err(|error| match error {
                Capped::Over => refused(FileRefusal::OverCap { max_bytes }),
                Capped::Source(source) if source.is_limit_exceeded() => {
                    refused(FileRefusal::OverCap { max_bytes })
                }
                Capped::Source(source) => Error::e2b(FETCH, Some(&sandbox_id), source),
                Capped::Write(source) => temp.io_error(source),
            })?;
        // No fsync: the copy is a delivery cache the caller reads at once; a crash loses a
        // file the sandbox still has.
        drop(file);
        temp.rename_onto(destination)?;
        Ok(written)
    }

    /// `readlink -f path` in the sandbox (`path` absolute): the canonical path, links and `..`
    /// resolved, or `None` when it cannot be resolved (a missing directory on the way, a link
    /// loop). One start request, admitted like a command. The answer is untrusted: it must be
    /// an absolute, normalised UTF-8 path without control characters, at most 4096 bytes.
    pub fn realpath(&self, path: &str) -> Result<Option<String>, Error> {
        check_sandbox_path(REALPATH, path, self.info().map(|info| info.sandbox_id))?;
        self.file_operation(REALPATH, TRANSFER_WINDOW, |inner, sandbox| {
            let id = sandbox.id().as_str().to_owned();
            let output = inner.block_on(helper(REALPATH, sandbox, READLINK, path, &id))?;
            match output.end.exit_code {
                0 => parse_resolved(&output.stdout, &id).map(Some),
                1 => Ok(None),
                code => Err(helper_failed(REALPATH, &id, code, &output.stderr)),
            }
        })
    }
}

/// Refuses what is no absolute sandbox path before anything is contacted (naming the
/// attached sandbox, if any).
fn check_sandbox_path(
    operation: &'static str,
    path: &str,
    sandbox_id: Option<String>,
) -> Result<(), Error> {
    let problem = if !path.starts_with('/') {
        Some("the path is not absolute")
    } else if path.contains('\0') {
        Some("the path contains a NUL byte")
    } else {
        None
    };
    match problem {
        Some(reason) => Err(Error::FileRefused {
            operation,
            sandbox_id,
            path: path.to_owned(),
            reason: FileRefusal::InvalidPath(reason),
        }),
        None => Ok(()),
    }
}

async fn helper(
    operation: &'static str,
    sandbox: &Sandbox,
    script: &str,
    path: &str,
    sandbox_id: &str,
) -> Result<e2b_client::CommandOutput, Error> {
    // The path is an argument, never part of the script: nothing in it is quoted or expanded.
    let mut options = StartOptions::exec(
        "/bin/sh".to_owned(),
        vec![
            "-c".to_owned(),
            script.to_owned(),
            "sh".to_owned(),
            path.to_owned(),
        ],
    );
    options.timeout = Some(HELPER_DEADLINE);
    sandbox
        .run(options, HELPER_OUTPUT)
        .await
        .map_err(|source| match source.is_limit_exceeded() {
            true => Error::UntrustedAnswer {
                operation,
                sandbox_id: sandbox_id.to_owned(),
                reason: format!("the sandbox printed more than {HELPER_OUTPUT} bytes"),
            },
            false => Error::e2b(operation, Some(sandbox_id), source),
        })
}

fn helper_failed(
    operation: &'static str,
    sandbox_id: &str,
    exit_code: i32,
    stderr: &[u8],
) -> Error {
    Error::SandboxCommand {
        operation,
        sandbox_id: sandbox_id.to_owned(),
        exit_code,
        stderr: String::from_utf8_lossy(stderr)
            .trim()
            .chars()
            .take(512)
            .collect(),
    }
}

async fn regular_file(sandbox: &Sandbox, path: &str, sandbox_id: &str) -> Result<(), Error> {
    let output = helper(FETCH, sandbox, REGULAR_FILE, path, sandbox_id).await?;
    match output.end.exit_code {
        0 => Ok(()),
        1 => Err(Error::FileRefused {
            operation: FETCH,
            sandbox_id: Some(sandbox_id.to_owned()),
            path: path.to_owned(),
            reason: FileRefusal::NotRegularFile,
        }),
        code => Err(helper_failed(FETCH, sandbox_id, code, &output.stderr)),
    }
}

async fn open_download(
    sandbox: &Sandbox,
    path: &str,
    max_bytes: u64,
    sandbox_id: &str,
) -> Result<Download, Error> {
    let refused = |reason| Error::FileRefused {
        operation: FETCH,
        sandbox_id: Some(sandbox_id.to_owned()),
        path: path.to_owned(),
        reason,
    };
    sandbox
        .read_file_stream(path, max_bytes)
        .await
        .map_err(|source| {
            if source.is_limit_exceeded() {
                refused(FileRefusal::OverCap { max_bytes })
            } else if source.is_not_found() || source.status() == Some(400) {
                // envd: 404 for a missing path, 400 for a directory.
                refused(FileRefusal::NotRegularFile)
            } else {
                Error::e2b(FETCH, Some(sandbox_id), source)
            }
        })
}

/// `readlink -f`'s answer: one path and its newline, checked like any sandbox answer.
fn parse_resolved(stdout: &[u8], sandbox_id: &str) -> Result<String, Error> {
    let refuse = |reason: &str| Error::UntrustedAnswer {
        operation: REALPATH,
        sandbox_id: sandbox_id.to_owned(),
        reason: format!("readlink -f answered {reason}"),
    };
    let line = stdout.strip_suffix(b"\n").unwrap_or(stdout);
    if line.len() > MAX_PATH_BYTES {
        return Err(refuse(&format!("more than {MAX_PATH_BYTES} bytes")));
    }
    let path = std::str::from_utf8(line).map_err(|_| refuse("a path that is not UTF-8"))?;
    if path.chars().any(char::is_control) {
        return Err(refuse("a path with control characters"));
    }
    if !crate::home::is_normalised_absolute(path) {
        return Err(refuse("a path that is not absolute and normalised"));
    }
    Ok(path.to_owned())
}

/// Why [`write_capped`] stopped.
#[derive(Debug)]
enum Capped<E> {
    /// The stream failed.
    Source(E),
    /// The stream went past the cap; the chunk that crossed it was not written.
    Over,
    /// The host write failed.
    Write(io::Error),
}

/// Writes `stream` into `out`, refusing it at the first byte past `max_bytes`: the chunk that
/// crosses the cap is not written. Checked here as well as in the download, so the cap holds
/// whatever the layer below does. Returns the bytes written.
async fn write_capped<S, E>(
    mut stream: S,
    out: &mut impl Write,
    max_bytes: u64,
) -> Result<u64, Capped<E>>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    let mut written: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(Capped::Source)?;
        let len = u64::try_from(chunk.len()).unwrap_or(u64::MAX);
        if written.saturating_add(len) > max_bytes {
            return Err(Capped::Over);
        }
        out.write_all(&chunk).map_err(Capped::Write)?;
        written += len;
    }
    out.flush().map_err(Capped::Write)?;
    Ok(written)
}

/// A temp file beside the destination (same directory, so the rename is atomic), removed when
/// dropped unless renamed onto the destination.
struct TempFile {
    path: PathBuf,
    renamed: bool,
}

impl TempFile {
    fn beside(destination: &Path) -> Result<TempFile, Error> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = destination.file_name().ok_or_else(|| Error::Io {
            operation: FETCH,
            path: destination.to_path_buf(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "the destination names no file"),
        })?;
        let dir = destination.parent().unwrap_or(Path::new(""));
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.subsec_nanos());
        let unique = format!(
            ".{}.e2b-fetch-{}-{}-{nanos:08x}",
            name.to_string_lossy(),
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
        );
        Ok(TempFile {
            path: dir.join(unique),
            renamed: false,
        })
    }

    /// Creates the file; never opens one that exists (a link planted there is not followed).
    fn file(&self) -> Result<File, Error> {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&self.path)
            .map_err(|source| self.io_error(source))
    }

    fn io_error(&self, source: io::Error) -> Error {
        Error::Io {
            operation: FETCH,
            path: self.path.clone(),
            source,
        }
    }

    fn rename_onto(mut self, destination: &Path) -> Result<(), Error> {
        fs::rename(&self.path, destination).map_err(|source| Error::Io {
            operation: FETCH,
            path: destination.to_path_buf(),
            source,
        })?;
        self.renamed = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// One transfer counted as in flight, so a cleanup waits for it (L8); left when dropped.
struct InFlight(Arc<Inflight>, u64);

impl InFlight {
    fn enter(inflight: &Arc<Inflight>, path: &str) -> InFlight {
        let token = inflight.enter(format!("file delivery of {}", e2b_client::redact(path)));
        InFlight(Arc::clone(inflight), token)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.leave(self.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;

    fn chunks(sizes: &[usize]) -> impl Stream<Item = Result<Bytes, ()>> + Unpin {
        stream::iter(
            sizes
                .iter()
                .map(|size| Ok(Bytes::from(vec![b'x'; *size])))
                .collect::<Vec<_>>(),
        )
    }

    #[tokio::test]
    async fn the_cap_stops_the_stream_at_the_first_byte_past_it() {
        // contract: X8
        let mut out = Vec::new();
        let written = write_capped(chunks(&[40, 60]), &mut out, 100).await;
        assert_eq!(written.expect("exactly the cap passes"), 100);
        assert_eq!(out.len(), 100);
        let mut out = Vec::new();
        let refused = write_capped(chunks(&[40, 60, 1, 50]), &mut out, 100).await;
        assert!(matches!(refused, Err(Capped::Over)), "{refused:?}");
        // The chunk holding byte 101 was never written.
        assert_eq!(out.len(), 100);
        let mut out = Vec::new();
        let refused = write_capped(chunks(&[40, 61]), &mut out, 100).await;
        assert!(matches!(refused, Err(Capped::Over)), "{refused:?}");
        assert_eq!(out.len(), 40);
    }

    #[test]
    fn resolved_paths_are_checked_like_any_sandbox_answer() {
        // contract: X8
        assert_eq!(
            parse_resolved(b"/home/user/a b\n", "s").unwrap(),
            "/home/user/a b"
        );
        assert_eq!(parse_resolved(b"/\n", "s").unwrap(), "/");
        for bad in [
            &b"relative/x\n"[..],
            b"/home/../etc/passwd\n",
            b"/home//user\n",
            b"/home/user/\n",
            b"/home/user\nsecond\n",
            b"/home/\x1b[2Juser\n",
            b"/home/\xff\n",
            b"",
        ] {
            let error = parse_resolved(bad, "sbx").expect_err("refused");
            assert!(error.is_untrusted_answer(), "{bad:?}: {error}");
            assert!(error.to_string().contains("sbx"), "{error}");
        }
        let long = format!("/{}\n", "a".repeat(MAX_PATH_BYTES));
        assert!(parse_resolved(long.as_bytes(), "s").is_err());
    }

    #[test]
    fn a_dropped_temp_file_is_removed_and_a_renamed_one_is_kept() {
        // contract: X8
        let dir = tempfile::tempdir().unwrap();
        let destination = dir.path().join("out.bin");
        let temp = TempFile::beside(&destination).unwrap();
        temp.file().unwrap().write_all(b"partial").unwrap();
        assert!(
            temp.file().is_err(),
            "an existing temp file is never reopened"
        );
        drop(temp);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        let temp = TempFile::beside(&destination).unwrap();
        temp.file().unwrap().write_all(b"whole").unwrap();
        temp.rename_onto(&destination).unwrap();
        assert_eq!(fs::read(&destination).unwrap(), b"whole");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
