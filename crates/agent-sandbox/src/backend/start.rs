//! Starting a command: lease, gates and sync first, then the start request, retried once
//! after a reconnect when the sandbox was paused behind the backend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use e2b_client::{Sandbox, StartOptions};

use super::{Attached, Inner};
use crate::command::{Events, RunOptions, Shell};
use crate::config::CommandReads;
use crate::error::Error;

impl Inner {
    /// The lease first (so a paused sandbox is resumed and a vanished one detected before any
    /// state work), then the gates and the sync, then the lease again from the clock after
    /// the sync, then the start.
    pub(super) fn prepare_and_start(
        &self,
        attached: &mut Attached,
        command: &str,
        options: &RunOptions,
        stdin: e2b_client::ProcessStdin,
        reader: Reader,
    ) -> Result<(Events, u32), Error> {
        self.prepare(attached, options.deadline)?;
        let staged = match &options.stdin {
            Some(data) if !data.is_empty() => {
                Some(self.stage_stdin(&attached.sandbox, data.clone())?)
            }
            _ => None,
        };
        // Until the attach's home probe has answered, a command that names no directory (and
        // has none configured) starts in `$HOME` by itself: the probe and the start then
        // travel together (L13).
        let default_cwd = if attached.home_settled() {
            Some(attached.info.default_cwd.clone())
        } else {
            self.config.cwd.clone()
        };
        let mut start = match &staged {
            Some(path) => self.start_options(&redirect_stdin(path, command), options, default_cwd),
            None => self.start_options(command, options, default_cwd),
        };
        start.stdin = stdin;
        // The credentials' stand-ins, over anything the caller passed under those names: the
        // real value never reaches the sandbox (X16).
        for (name, stand_in) in &attached.stand_ins {
            start.envs.insert(name.clone(), stand_in.clone());
        }
        let started = match self.start(&attached.sandbox, start.clone(), reader) {
            Err(error) if error.is_sandbox_gone() => {
                // Paused behind our back while the known lease still covered it: connect
                // resumes it; a sandbox that is really gone fails the connect.
                attached.lease.forget();
                self.top_up_lease(attached, options.deadline)?;
                self.start(&attached.sandbox, start, reader)
            }
            other => other,
        };
        if let (Err(_), Some(path)) = (&started, &staged) {
            // Nothing opened (and unlinked) the staged stdin: remove it, best effort.
            if let Err(source) = self.block_on(attached.sandbox.remove(path)) {
                tracing::debug!(
                    sandbox_id = %attached.sandbox.id(),
                    "removing an unused staged stdin failed: {}",
                    crate::error::ErrorChain(&source)
                );
            }
        }
        started
    }

    /// Uploads a command's stdin to a fresh sandbox path (one request, whatever the size).
    fn stage_stdin(&self, sandbox: &Sandbox, data: Bytes) -> Result<String, Error> {
        let path = staged_stdin_path();
        self.block_on(sandbox.write_file(&path, data))
            .map(|_| path)
            .map_err(|source| {
                Error::e2b("stage command stdin", Some(sandbox.id().as_str()), source)
            })
    }

    /// `default_cwd`: where a command that names no directory starts; `None` while the home
    /// is still being asked, when the launcher moves to `$HOME` itself.
    fn start_options(
        &self,
        command: &str,
        options: &RunOptions,
        default_cwd: Option<String>,
    ) -> StartOptions {
        let shell = match options.shell {
            Shell::Login => "/bin/bash -l -c",
            Shell::Plain => "/bin/bash -c",
        };
        let (cwd, launcher) = match options.cwd.clone().or(default_cwd) {
            Some(cwd) => (cwd, group_launcher(shell)),
            // `/` always exists; envd's own default (the template's workdir) need not be home.
            None => (
                "/".to_owned(),
                format!("{START_IN_HOME}{}", group_launcher(shell)),
            ),
        };
        let mut start = StartOptions::exec(
            "/bin/bash".to_owned(),
            vec![
                "-c".to_owned(),
                launcher,
                "agent-sandbox".to_owned(),
                command.to_owned(),
            ],
        );
        start.cwd = Some(cwd);
        start.envs = options.env.clone();
        start
    }

    fn start(
        &self,
        sandbox: &Sandbox,
        options: StartOptions,
        reader: Reader,
    ) -> Result<(Events, u32), Error> {
        if reader == Reader::Thread
            && self.config.command_reads == CommandReads::OwnThread
            && sandbox.can_start_blocking()
        {
            // This thread sends the request and reads the answer on its own connection: no
            // thread hand-overs. One that could not even connect goes the async way, whose
            // retries cover a server that is restarting.
            match sandbox.start_blocking(options.clone()) {
                Err(error) if error.is_connect() => {}
                started => {
                    return started
                        .map(|stream| {
                            let pid = stream.pid();
                            (Events::Blocking(stream), pid)
                        })
                        .map_err(|source| {
                            Error::e2b("start command", Some(sandbox.id().as_str()), source)
                        });
                }
            }
        }
        // A task on the runtime, next to the connection's: the request, the response head and
        // the start event pass between tasks of one worker instead of waking this thread
        // (and the worker again) for each; this thread is woken once, with the result.
        let task = {
            let sandbox = sandbox.clone();
            self.services
                .runtime
                .spawn(async move { sandbox.start(options).await })
        };
        let started = match self.block_on(task) {
            Ok(started) => started,
            Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
            Err(_) => {
                return Err(Error::Io {
                    operation: "start command",
                    path: std::path::PathBuf::new(),
                    source: std::io::Error::other("the async runtime is shutting down"),
                });
            }
        };
        started
            .map(|stream| {
                let pid = stream.pid();
                (Events::Async(stream), pid)
            })
            .map_err(|source| Error::e2b("start command", Some(sandbox.id().as_str()), source))
    }
}

/// Who will read a started command's events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reader {
    /// An OS thread (a pump thread or the caller waiting): where the sandbox allows it, the
    /// command is started and read on that thread's own connection
    /// ([`Sandbox::start_blocking`]).
    Thread,
    /// A task on the runtime: always the async stream.
    Runtime,
}

/// Put before the launcher of a command started while the home probe is out: moves to
/// `$HOME`, which is what the probe reports (both read envd's environment of the sandbox
/// user), unless it is a home the host's check refuses (relative, not normalised, control
/// characters, over [`MAX_HOME_BYTES`](crate::home::MAX_HOME_BYTES) bytes), so the command does not run in a home the
/// attach then refuses; the host's check of the probe's answer stays the authority.
const START_IN_HOME: &str = "case $HOME in /) ;; */|*//*|*/./*|*/../*|*/.|*/..|*[[:cntrl:]]*) exit 126 ;; /*) ;; *) exit 126 ;; esac; \
     [ ${#HOME} -le 1024 ] && cd -- \"$HOME\" || exit 126; ";

/// The launcher every command starts under: it makes the command lead a process group of its
/// own (so a kill reaches what it started, contract L6), then execs the real shell with the
/// command as one argument (`$1`). envd starts commands inside its own group; `setsid` (which
/// execs in place when the caller does not lead a group) fixes that; e2b-local starts commands
/// the same way. Where the command leads its group already or `setsid` is missing, the shell
/// is exec'd as it is, and a kill falls back to the pid.
fn group_launcher(shell: &str) -> String {
    format!(
        "read -r _ _ _ _ group _ < /proc/$$/stat 2>/dev/null; \
         if [ -n \"$group\" ] && [ \"$group\" != \"$$\" ] && command -v setsid >/dev/null 2>&1; then \
         exec setsid {shell} \"$1\"; fi; exec {shell} \"$1\""
    )
}

/// Where a command's stdin is staged, relative to the sandbox user's home (envd resolves a
/// relative path there, and the command finds it as `$HOME/...`: no assumption about where
/// that home is, nor about how `/tmp` is mapped). Unique per process, command and moment
/// (several hosts may share a sandbox, so the host pid and the time join the counter).
fn staged_stdin_path() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let sequence = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    format!(".agent-stdin-{}-{sequence}-{nanos:x}", std::process::id())
}

/// The command with its stdin read from the staged file, which the shell unlinks before the
/// command runs (the open descriptor keeps the data): no copy outlives the command, and a
/// failure to open it fails the command instead of running it without its input.
fn redirect_stdin(path: &str, command: &str) -> String {
    // `path` comes from `staged_stdin_path`: no characters a shell would interpret.
    format!("exec 0< \"$HOME/{path}\" || exit $?\nrm -f -- \"$HOME/{path}\" || exit $?\n{command}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_paths_are_distinct_and_need_no_quoting() {
        let first = staged_stdin_path();
        let second = staged_stdin_path();
        assert_ne!(first, second);
        for path in [&first, &second] {
            assert!(path.starts_with(".agent-stdin-"), "{path}");
            assert!(
                path.chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-".contains(c)),
                "{path}"
            );
        }
    }

    /// The launcher, run by the host's bash outside any sandbox: the command it starts leads
    /// its own process group (the test process's children do not), under the same pid.
    #[test]
    fn the_launcher_makes_the_command_lead_its_group_under_the_same_pid() {
        for shell in ["/bin/bash -c", "/bin/bash -l -c"] {
            let output = std::process::Command::new("/bin/bash")
                .args([
                    "-c",
                    &group_launcher(shell),
                    "agent-sandbox",
                    "read -r _ _ _ _ group _ < /proc/$$/stat; echo \"$$ $group $1\"",
                ])
                .output()
                .expect("bash runs");
            assert!(output.status.success(), "{output:?}");
            let text = String::from_utf8(output.stdout).expect("utf-8");
            let fields: Vec<&str> = text.split_whitespace().collect();
            assert_eq!(
                fields.len(),
                2,
                "{text:?}: $1 must not leak into the command"
            );
            assert_eq!(
                fields[0], fields[1],
                "{shell}: pid {} leads group {}",
                fields[0], fields[1]
            );
        }
    }

    /// The sandbox-side check before a command started while the home probe is out, run by
    /// the host's bash: it starts in `$HOME` exactly when the host accepts that home (homes
    /// that exist here, so only the check can refuse them), and refuses the rest.
    #[test]
    fn the_start_in_home_check_agrees_with_the_hosts_check_of_the_probe() {
        assert!(START_IN_HOME.contains(&format!("-le {}", crate::home::MAX_HOME_BYTES)));
        let long = format!("/{}", "a".repeat(crate::home::MAX_HOME_BYTES));
        for home in [
            "/",
            "/tmp",
            "/tmp/",
            "/tmp//",
            "/tmp/.",
            "/tmp/..",
            "/tmp/../tmp",
            "/./tmp",
            "tmp",
            "./tmp",
            "",
            "/tm\x01p",
            long.as_str(),
        ] {
            let accepted =
                crate::home::SandboxHome::parse(format!("{home}\nuser\n").as_bytes(), "sbx")
                    .is_ok();
            let output = std::process::Command::new("/bin/bash")
                .args(["-c", &format!("{START_IN_HOME}pwd -P"), "agent-sandbox"])
                .env("HOME", home)
                .current_dir("/")
                .output()
                .expect("bash runs");
            if accepted {
                assert!(output.status.success(), "{home:?}: {output:?}");
                let canonical = std::fs::canonicalize(home).expect("exists");
                assert_eq!(
                    String::from_utf8_lossy(&output.stdout).trim_end(),
                    canonical.to_string_lossy(),
                    "{home:?}"
                );
            } else {
                assert_eq!(output.status.code(), Some(126), "{home:?}: {output:?}");
            }
        }
    }

    #[test]
    fn the_redirect_opens_then_unlinks_before_the_command() {
        let script = redirect_stdin(".agent-stdin-1-2-3", "cat > out");
        let lines: Vec<&str> = script.lines().collect();
        assert_eq!(
            lines,
            [
                "exec 0< \"$HOME/.agent-stdin-1-2-3\" || exit $?",
                "rm -f -- \"$HOME/.agent-stdin-1-2-3\" || exit $?",
                "cat > out"
            ]
        );
    }
}
