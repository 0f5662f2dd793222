//! The sandbox's real home: learned from the sandbox once per sandbox, never assumed.
//!
//! Commands' default working directory and the remote Hermes state root follow the home the
//! sandbox user really has (`/home/user` on E2B's own templates, anything on a custom one).
//! Learning it costs one small start request the first time this host attaches to a sandbox;
//! a persistent scope then keeps the answer per sandbox id beside its coordination files, so
//! a resume, a reader or a later session on the same host pays nothing. A sandbox's home cannot change under
//! the same id (the template and its user are fixed at creation), which is what makes the
//! cache sound. Whatever the sandbox prints is untrusted: it must be an absolute, normalised
//! path of bounded length without control characters, and the user a plain login name.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use e2b_client::{ProcessEvent, Sandbox, StartOptions};
use futures::StreamExt;

use crate::error::Error;

/// The operation errors about the home name.
pub(crate) const OPERATION: &str = "learn the sandbox home";

/// The longest home accepted (a real one is a few dozen bytes).
pub const MAX_HOME_BYTES: usize = 1024;
/// The longest user name accepted (Linux allows 32).
const MAX_USER_BYTES: usize = 64;
/// The most probe output read; anything longer is refused without reading further.
const MAX_PROBE_OUTPUT: usize = MAX_HOME_BYTES + MAX_USER_BYTES + 2;
/// How long the probe may run in the sandbox.
const PROBE_DEADLINE: Duration = Duration::from_secs(30);
/// Sandboxes remembered per scope's host files; the oldest are forgotten first (a forgotten
/// one costs one probe on its next attach).
const CACHE_ENTRIES: usize = 64;
/// The most of the cache file read.
const CACHE_MAX_BYTES: u64 = 256 * 1024;

/// The probe: the home and the user, one per line. A plain `sh` (no login profile that could
/// print to stdout), `$USER` where `id` is missing.
const PROBE: &str = r#"printf '%s\n%s\n' "$HOME" "$(id -un 2>/dev/null || printf %s "$USER")""#;

/// The sandbox user and its home, as the sandbox reported them (validated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxHome {
    /// `$HOME` of the sandbox's default user: absolute and normalised.
    pub home: String,
    /// That user's login name.
    pub user: String,
}

impl SandboxHome {
    /// Hermes' state root under this home (`<home>/.hermes`).
    pub fn hermes_home(&self) -> String {
        if self.home == "/" {
            "/.hermes".to_owned()
        } else {
            format!("{}/.hermes", self.home)
        }
    }

    /// Parses the probe's output (`<home>\n<user>\n`), refusing anything else.
    pub(crate) fn parse(output: &[u8], sandbox_id: &str) -> Result<SandboxHome, Error> {
        let refuse = |reason: String| Error::UntrustedAnswer {
            operation: OPERATION,
            sandbox_id: sandbox_id.to_owned(),
            reason,
        };
        let text = std::str::from_utf8(output)
            .map_err(|_| refuse("the sandbox reported a home that is not UTF-8".to_owned()))?;
        let lines: Vec<&str> = text
            .strip_suffix('\n')
            .unwrap_or(text)
            .split('\n')
            .collect();
        let [home, user] = lines[..] else {
            return Err(refuse(format!(
                "expected the home and the user on two lines, got {} lines",
                lines.len()
            )));
        };
        let found = SandboxHome {
            home: home.to_owned(),
            user: user.to_owned(),
        };
        found.check().map_err(refuse)?;
        Ok(found)
    }

    /// The rules an answer (or a cached one) must meet.
    fn check(&self) -> Result<(), String> {
        let home = &self.home;
        if home.len() > MAX_HOME_BYTES {
            return Err(format!(
                "the sandbox reported a home of {} bytes (at most {MAX_HOME_BYTES})",
                home.len()
            ));
        }
        if home.chars().any(char::is_control) {
            return Err("the sandbox reported a home with control characters".to_owned());
        }
        if !home.starts_with('/') {
            return Err(format!("the sandbox reported a relative home {home:?}"));
        }
        if !is_normalised_absolute(home) {
            return Err(format!(
                "the sandbox reported a home that is not normalised: {home:?}"
            ));
        }
        let user = &self.user;
        let plain = !user.is_empty()
            && user.len() <= MAX_USER_BYTES
            && !user.starts_with('-')
            && user
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-$".contains(c));
        if !plain {
            return Err(format!(
                "the sandbox reported a user name that is not a plain login name: {:?}",
                user.chars().take(MAX_USER_BYTES).collect::<String>()
            ));
        }
        Ok(())
    }
}

/// Whether `path` is absolute and normalised: `/`, or `/`-separated names with no empty,
/// `.` or `..` part and no trailing `/`. What any path a sandbox reports must be.
pub(crate) fn is_normalised_absolute(path: &str) -> bool {
    path == "/"
        || path.starts_with('/')
            && !path.ends_with('/')
            && path[1..]
                .split('/')
                .all(|part| !part.is_empty() && part != "." && part != "..")
}

/// Asks the sandbox for its home: one start request, output bounded.
pub(crate) async fn probe(sandbox: &Sandbox) -> Result<SandboxHome, Error> {
    let id = sandbox.id().as_str().to_owned();
    let mut options = StartOptions::exec(
        "/bin/sh".to_owned(),
        vec!["-c".to_owned(), PROBE.to_owned()],
    );
    options.timeout = Some(PROBE_DEADLINE);
    let mut stream = sandbox
        .start(options)
        .await
        .map_err(|source| Error::e2b(OPERATION, Some(&id), source))?;
    let mut stdout = Vec::new();
    while let Some(event) = stream.next().await {
        match event.map_err(|source| Error::e2b(OPERATION, Some(&id), source))? {
            ProcessEvent::Stdout(bytes) => {
                if stdout.len() + bytes.len() > MAX_PROBE_OUTPUT {
                    return Err(Error::UntrustedAnswer {
                        operation: OPERATION,
                        sandbox_id: id,
                        reason: format!(
                            "the home probe printed more than {MAX_PROBE_OUTPUT} bytes"
                        ),
                    });
                }
                stdout.extend_from_slice(&bytes);
            }
            ProcessEvent::End(end) if end.exit_code == 0 => {
                return SandboxHome::parse(&stdout, &id);
            }
            ProcessEvent::End(end) => {
                return Err(Error::SandboxCommand {
                    operation: OPERATION,
                    sandbox_id: id,
                    exit_code: end.exit_code,
                    stderr: String::new(),
                });
            }
            _ => {}
        }
    }
    Err(Error::UntrustedAnswer {
        operation: OPERATION,
        sandbox_id: id,
        reason: "the home probe ended without an exit status".to_owned(),
    })
}

/// One attachment's home: known (from this host's cache), or being asked by a probe that was
/// sent at attach and is waited for only by the first step that needs the answer (a push or
/// pull path, the attach's report, a command's start directory once it has been named), so
/// the probe's round trip overlaps whatever the bring-up sends meanwhile. Shared by the
/// backend's attachment and its transport.
pub(crate) struct HomeSlot {
    sandbox_id: String,
    runtime: tokio::runtime::Handle,
    cache: Option<HomeCache>,
    known: OnceLock<SandboxHome>,
    asking: Mutex<Asking>,
}

enum Asking {
    Probe(tokio::task::JoinHandle<Result<SandboxHome, Error>>),
    /// The probe failed: its text for every later asker, its error for the backend's settle.
    Failed(String, Option<Error>),
    Answered,
}

impl HomeSlot {
    /// A home this host already knows for the sandbox.
    pub(crate) fn known(
        sandbox_id: &str,
        runtime: tokio::runtime::Handle,
        home: SandboxHome,
    ) -> Arc<HomeSlot> {
        let slot = HomeSlot {
            sandbox_id: sandbox_id.to_owned(),
            runtime,
            cache: None,
            known: OnceLock::new(),
            asking: Mutex::new(Asking::Answered),
        };
        let _ = slot.known.set(home);
        Arc::new(slot)
    }

    /// Sends the probe now (one start request, on the runtime) and returns at once; the
    /// answer is cached in `cache` when it arrives valid.
    pub(crate) fn ask(
        sandbox: &Sandbox,
        runtime: tokio::runtime::Handle,
        cache: Option<HomeCache>,
    ) -> Arc<HomeSlot> {
        let task = {
            let sandbox = sandbox.clone();
            runtime.spawn(async move { probe(&sandbox).await })
        };
        Arc::new(HomeSlot {
            sandbox_id: sandbox.id().as_str().to_owned(),
            runtime,
            cache,
            known: OnceLock::new(),
            asking: Mutex::new(Asking::Probe(task)),
        })
    }

    /// The home, if it has been learned (without waiting).
    pub(crate) fn peek(&self) -> Option<&SandboxHome> {
        self.known.get()
    }

    /// The home, waiting for the probe if it is still out. Blocks the calling thread, which
    /// must not be driving async tasks. A failed probe fails every call, naming its cause.
    pub(crate) fn wait(&self) -> Result<&SandboxHome, Error> {
        self.answer().map_err(|text| self.refused(text))
    }

    /// As [`wait`](Self::wait), but a failed probe gives its own error (to the first such
    /// call; later ones get its text), so the caller that lets the attachment go reports the
    /// real cause whoever waited first.
    pub(crate) fn wait_for_cause(&self) -> Result<&SandboxHome, Error> {
        self.answer().map_err(|text| {
            let mut asking = self.asking.lock().unwrap_or_else(PoisonError::into_inner);
            match &mut *asking {
                Asking::Failed(_, cause) => cause.take(),
                _ => None,
            }
            .unwrap_or_else(|| self.refused(text))
        })
    }

    fn answer(&self) -> Result<&SandboxHome, String> {
        if let Some(home) = self.known.get() {
            return Ok(home);
        }
        let mut asking = self.asking.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(home) = self.known.get() {
            return Ok(home);
        }
        let answer = match std::mem::replace(&mut *asking, Asking::Answered) {
            Asking::Probe(task) => match self.runtime.block_on(task) {
                Ok(answer) => answer,
                Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
                Err(_) => Err(self.refused("the async runtime is shutting down".to_owned())),
            },
            Asking::Failed(text, cause) => {
                *asking = Asking::Failed(text.clone(), cause);
                return Err(text);
            }
            Asking::Answered => unreachable!("an answered slot holds its home"),
        };
        match answer {
            Ok(home) => {
                if let Some(cache) = &self.cache {
                    cache.put(&self.sandbox_id, &home);
                }
                Ok(self.known.get_or_init(|| home))
            }
            Err(error) => {
                let text = format!(
                    "the home probe failed: {}",
                    crate::error::ErrorChain(&error)
                );
                *asking = Asking::Failed(text.clone(), Some(error));
                Err(text)
            }
        }
    }

    fn refused(&self, reason: String) -> Error {
        Error::UntrustedAnswer {
            operation: OPERATION,
            sandbox_id: self.sandbox_id.clone(),
            reason,
        }
    }
}

/// Where Hermes' state lives in one attached sandbox: the configured root, else
/// `<home>/.hermes` once the home is known (waiting for it the first time).
pub(crate) struct RemoteHome {
    configured: Option<String>,
    slot: Arc<HomeSlot>,
    derived: OnceLock<String>,
}

impl RemoteHome {
    pub(crate) fn new(configured: Option<String>, slot: Arc<HomeSlot>) -> RemoteHome {
        RemoteHome {
            configured,
            slot,
            derived: OnceLock::new(),
        }
    }

    /// The state root, waiting for the home probe if it is needed and still out.
    pub(crate) fn get(&self) -> Result<&str, Error> {
        if let Some(root) = &self.configured {
            return Ok(root);
        }
        if let Some(root) = self.derived.get() {
            return Ok(root);
        }
        let home = self.slot.wait()?;
        Ok(self.derived.get_or_init(|| home.hermes_home()))
    }

    /// The state root if it is known without waiting (for debug output).
    pub(crate) fn peek(&self) -> Option<String> {
        self.configured
            .clone()
            .or_else(|| self.slot.peek().map(SandboxHome::hermes_home))
    }
}

/// Homes learned before, per sandbox id, in one small file of the scope's host directory
/// (`<profile>/cache/e2b/sandbox-homes`: `<id>\t<home>\t<user>` lines, newest last).
/// Best effort: a cache that cannot be read or written costs a probe, never an attach.
#[derive(Debug, Clone)]
pub(crate) struct HomeCache {
    path: PathBuf,
}

impl HomeCache {
    pub(crate) fn new(dir: &Path) -> HomeCache {
        HomeCache {
            path: dir.join("sandbox-homes"),
        }
    }

    /// The home recorded for `sandbox_id`, if any and still valid by today's rules.
    pub(crate) fn get(&self, sandbox_id: &str) -> Option<SandboxHome> {
        self.entries()
            .into_iter()
            .rev()
            .find(|(id, _)| id == sandbox_id)
            .map(|(_, home)| home)
    }

    /// Records `home` for `sandbox_id`, keeping the newest [`CACHE_ENTRIES`].
    pub(crate) fn put(&self, sandbox_id: &str, home: &SandboxHome) {
        if let Err(error) = self.write(sandbox_id, home) {
            tracing::debug!(sandbox_id, "E2B sandbox home not cached: {error}");
        }
    }

    fn entries(&self) -> Vec<(String, SandboxHome)> {
        let mut text = String::new();
        let read = fs::File::open(&self.path)
            .and_then(|file| file.take(CACHE_MAX_BYTES).read_to_string(&mut text));
        if read.is_err() {
            return Vec::new();
        }
        text.lines()
            .filter_map(|line| {
                let mut fields = line.split('\t');
                let (id, home, user) = (fields.next()?, fields.next()?, fields.next()?);
                let entry = SandboxHome {
                    home: home.to_owned(),
                    user: user.to_owned(),
                };
                // The file is the host's, but checked like an answer: a hand edit or a
                // torn write must not steer commands anywhere odd.
                (fields.next().is_none() && entry.check().is_ok()).then(|| (id.to_owned(), entry))
            })
            .collect()
    }

    fn write(&self, sandbox_id: &str, home: &SandboxHome) -> io::Result<()> {
        if sandbox_id.chars().any(|c| c.is_control() || c == '\t') {
            return Ok(());
        }
        let mut entries = self.entries();
        entries.retain(|(id, _)| id != sandbox_id);
        entries.push((sandbox_id.to_owned(), home.clone()));
        let skip = entries.len().saturating_sub(CACHE_ENTRIES);
        let mut text = String::new();
        for (id, entry) in &entries[skip..] {
            text.push_str(&format!("{id}\t{}\t{}\n", entry.home, entry.user));
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(dir)?;
        // Written aside and renamed: a concurrent reader sees the old file or the new one.
        // No fsync: after a crash a torn file only costs a probe (bad lines are ignored).
        // Unique per process and write: backends of several scopes share the directory.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let sequence = NEXT.fetch_add(1, Ordering::Relaxed);
        let temp = dir.join(format!(".sandbox-homes.{}.{sequence}", std::process::id()));
        fs::File::create(&temp)?.write_all(text.as_bytes())?;
        fs::rename(&temp, &self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SandboxHome, Error> {
        SandboxHome::parse(text.as_bytes(), "sbx1")
    }

    #[test]
    fn a_plain_answer_gives_the_home_and_user() {
        let home = parse("/home/agent\nagent\n").unwrap();
        assert_eq!(home.home, "/home/agent");
        assert_eq!(home.user, "agent");
        assert_eq!(home.hermes_home(), "/home/agent/.hermes");
        assert_eq!(parse("/\nroot\n").unwrap().hermes_home(), "/.hermes");
        assert_eq!(parse("/root\nroot").unwrap().home, "/root");
    }

    #[test]
    fn a_bad_answer_is_refused_naming_the_operation_and_the_sandbox() {
        let long = format!("/{}\nuser\n", "a".repeat(MAX_HOME_BYTES));
        for bad in [
            "home/user\nuser\n",
            "/home/user/\nuser\n",
            "/home//user\nuser\n",
            "/home/./user\nuser\n",
            "/home/../etc\nuser\n",
            "/home/us\0er\nuser\n",
            "/home/us\rer\nuser\n",
            "/home/user\n",
            "/home/user\nuser\nextra\n",
            "/home/user\n-rf\n",
            "/home/user\nus er\n",
            "\nuser\n",
            long.as_str(),
        ] {
            let error = parse(bad).expect_err(bad);
            assert!(error.is_untrusted_answer(), "{bad:?}: {error}");
            let text = error.to_string();
            assert!(
                text.contains("learn the sandbox home") && text.contains("sbx1"),
                "{text}"
            );
        }
        assert!(SandboxHome::parse(b"/home/\xff\nuser\n", "sbx1").is_err());
    }

    #[test]
    fn the_cache_remembers_per_sandbox_and_forgets_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let cache = HomeCache::new(dir.path());
        assert_eq!(cache.get("a"), None, "nothing is cached at first");
        let agent = parse("/home/agent\nagent\n").unwrap();
        let root = parse("/root\nroot\n").unwrap();
        cache.put("a", &agent);
        cache.put("b", &root);
        assert_eq!(cache.get("a"), Some(agent.clone()));
        assert_eq!(cache.get("b"), Some(root.clone()));
        cache.put("a", &root);
        assert_eq!(
            cache.get("a"),
            Some(root.clone()),
            "a new answer replaces the old"
        );
        for index in 0..CACHE_ENTRIES {
            cache.put(&format!("n{index}"), &agent);
        }
        assert_eq!(cache.get("a"), None, "the oldest entries are forgotten");
        assert_eq!(cache.get(&format!("n{}", CACHE_ENTRIES - 1)), Some(agent));
        let lines = fs::read_to_string(dir.path().join("sandbox-homes")).unwrap();
        assert_eq!(lines.lines().count(), CACHE_ENTRIES);
    }

    #[test]
    fn a_cached_entry_that_breaks_the_rules_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("sandbox-homes"),
            "a\trelative\tuser\nb\t/home/b\tuser\textra\nc\t/home/c\tuser\n",
        )
        .unwrap();
        let cache = HomeCache::new(dir.path());
        assert_eq!(cache.get("a"), None);
        assert_eq!(cache.get("b"), None);
        assert_eq!(cache.get("c").map(|h| h.home), Some("/home/c".to_owned()));
    }
}
