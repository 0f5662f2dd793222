//! The scripts a live process runs in the sandbox, built as text here and run by `bash -c`.
//!
//! A live process is one process envd starts with its stdin open, running a bash script
//! (the **runner**) in a private directory (`$HOME/.cache/agent-sandbox/live/<id>`): it holds
//! the directory's lock while it lives, runs the command in the foreground with that stdin
//! (so `SendInput` to the runner's pid reaches the command) and its output (stdout and
//! stderr, or a terminal's) appended to `log`, and writes the exit code to `exit`. Its
//! environment carries `AGENT_SANDBOX_LIVE=<id>`, inherited by what the command starts, so a
//! kill finds it all.
//!
//! Beside it runs a **follower**: `tail` of `log` from a byte offset until the runner ends,
//! then a report of how the command ended. The runner starts the first one itself (its output
//! is the runner's stream); after the host's stream is cut (a pause, a dropped connection, a
//! stream that ended before its report), [`follower`] starts another from the offset the
//! host had reached, so no byte is lost or repeated, and stops the one before.
//!
//! The host reads a follower's stdout as the output and its stderr as control lines
//! ([`Control`]). Nothing here trusts the sandbox: the host parses those lines strictly.

use std::fmt::Write as _;

use crate::subagent::shell_quote;

/// Where live processes keep their files, relative to the sandbox user's home.
pub(crate) const LIVE_DIR: &str = ".cache/agent-sandbox/live";

/// The environment variable every process a live command starts inherits (unless it clears
/// its environment): `AGENT_SANDBOX_LIVE=<id>`.
pub const LIVE_TAG: &str = "AGENT_SANDBOX_LIVE";

/// A terminal's size in character cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TerminalSize {
    /// Rows (`tput lines`).
    pub rows: u16,
    /// Columns (`tput cols`).
    pub cols: u16,
}

/// How the command's shell starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LiveShell {
    /// `bash -c`.
    Plain,
    /// `bash -lc`: the profile is read, as for a terminal.
    Login,
}

/// What the command runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Io {
    /// Pipes: stdin from the host, stdout and stderr into the log.
    Pipes,
    /// A terminal of this size (util-linux `script`), its input from the host.
    Terminal(TerminalSize),
}

/// `$d`, the live directory of `id`, as a shell assignment.
fn dir_line(id: &str) -> String {
    format!(
        "d=\"$HOME\"/{}; base=\"$HOME\"/{}\n",
        shell_quote(&format!("{LIVE_DIR}/{id}")),
        shell_quote(LIVE_DIR)
    )
}

/// The lines every follower ends with: how the command ended, as the files tell it.
const REPORT: &str = "report() {\n\
    if [ -f \"$d/exit\" ]; then printf 'exit %s\\n' \"$(head -c 16 \"$d/exit\")\" >&2; \
    else echo killed >&2; fi\n\
}\n";

/// Whether the command still holds its lock: `flock` where the template has it, else the pid.
const ALIVE: &str = "alive() {\n\
    if command -v flock >/dev/null 2>&1; then ! flock -n \"$d/lock\" true 2>/dev/null; \
    else kill -0 \"$p\" 2>/dev/null; fi\n\
}\n";

/// The command line the wrapper runs, its output going to the log.
fn command_line(command: &str, shell: LiveShell, io: Io) -> String {
    let bash = match shell {
        LiveShell::Plain => "bash -c",
        LiveShell::Login => "bash -lc",
    };
    match io {
        Io::Pipes => format!("{bash} {}", shell_quote(command)),
        Io::Terminal(size) => {
            // `script` runs the command on a terminal of its own: the size is set on that
            // terminal (its input here is a pipe, not a terminal it could copy a size from),
            // the session goes to script's stdout (the log), the typescript file nowhere.
            let inner = format!(
                "stty rows {} cols {} 2>/dev/null; exec {bash} {}",
                size.rows,
                size.cols,
                shell_quote(command)
            );
            format!("script -qfec {} /dev/null", shell_quote(&inner))
        }
    }
}

/// The runner of a new live process `id` (see the module docs). `finished`: directories of
/// earlier live processes whose end the host has seen, removed first; directories left by a
/// crash (lock free, log untouched for a day) go too.
///
/// The command runs in the foreground: a command a non-interactive shell starts with `&`
/// ignores `SIGINT` for good, and a command on pipes must take Ctrl-C as it does at a prompt.
/// The runner itself catches `SIGINT` (a caught signal is reset for the command it starts),
/// so an interrupt ends the command, not the runner, and its exit code is written; where the
/// runner was started with `SIGINT` ignored (which bash cannot undo), coreutils' `env
/// --default-signal` gives the command the default back.
pub(crate) fn runner(
    id: &str,
    command: &str,
    shell: LiveShell,
    io: Io,
    finished: &[String],
) -> String {
    let mut script = String::from("set -u\n");
    script.push_str(&dir_line(id));
    let _ = writeln!(script, "export {LIVE_TAG}={}", shell_quote(id));
    for done in finished {
        let _ = writeln!(script, "rm -rf -- \"$base\"/{}", shell_quote(done));
    }
    script.push_str(
        "if [ -d \"$base\" ]; then\n\
         for x in \"$base\"/*/; do x=${x%/}; [ -d \"$x\" ] || continue\n\
         if [ -n \"$(find \"$x/log\" -maxdepth 0 -mmin +1440 2>/dev/null)\" ] && \
         { ! command -v flock >/dev/null 2>&1 || flock -n \"$x/lock\" true 2>/dev/null; }; then rm -rf -- \"$x\"; fi\n\
         done\nfi\n",
    );
    script.push_str(
        "(umask 077 && mkdir -p -- \"$d\" && : > \"$d/log\") || { echo 'failed to make the live directory' >&2; exit 125; }\n\
         exec 9>\"$d/lock\" || exit 125\n\
         if command -v flock >/dev/null 2>&1; then flock -n 9 || exit 125; fi\n\
         head -c 64 /proc/sys/kernel/random/boot_id > \"$d/boot\" 2>/dev/null\n\
         echo \"$$\" > \"$d/pid\"\n\
         p=$$\n\
         printf 'pid %s\\n' \"$$\" >&2\n",
    );
    script.push_str(REPORT);
    script.push_str(
        "{ tail -c +1 --pid=\"$p\" -s 0.1 -f -- \"$d/log\" </dev/null & echo \"$!\" > \"$d/follower\"; wait \"$!\"; report; } 9>&- &\n\
         trap : INT\n\
         dfl=; env --default-signal=INT,QUIT true 2>/dev/null && dfl='env --default-signal=INT,QUIT'\n",
    );
    let _ = write!(
        script,
        "$dfl {line} >> \"$d/log\" 2>&1 9>&-\n\
         rc=$?\n\
         printf '%s\\n' \"$rc\" > \"$d/exit.tmp\" && mv -f -- \"$d/exit.tmp\" \"$d/exit\"\n\
         exit \"$rc\"\n",
        line = command_line(command, shell, io)
    );
    script
}

/// A follower of live process `id` from byte `offset` of its output (see the module docs):
/// it reports the pids, stops the follower before it, then follows until the command ends and
/// reports how. A sandbox that restarted since (its boot id changed) or lost the directory is
/// reported as such after what is left of the log.
pub(crate) fn follower(id: &str, offset: u64) -> String {
    let from = offset + 1;
    let mut script = String::from("set -u\n");
    script.push_str(&dir_line(id));
    script.push_str(REPORT);
    script.push_str(ALIVE);
    let _ = write!(
        script,
        "[ -d \"$d\" ] && [ -f \"$d/pid\" ] || {{ echo 'lost gone' >&2; exit 0; }}\n\
         p=$(head -c 16 \"$d/pid\")\n\
         printf 'pid %s\\n' \"$p\" >&2\n\
         if [ \"$(head -c 64 /proc/sys/kernel/random/boot_id 2>/dev/null)\" != \"$(head -c 64 \"$d/boot\" 2>/dev/null)\" ]; then\n\
         tail -c +{from} -- \"$d/log\"; echo 'lost reboot' >&2; exit 0; fi\n\
         if ! alive; then tail -c +{from} -- \"$d/log\"; report; exit 0; fi\n\
         old=$(head -c 16 \"$d/follower\" 2>/dev/null)\n\
         [ -n \"$old\" ] && kill \"$old\" 2>/dev/null\n\
         tail -c +{from} --pid=\"$p\" -s 0.1 -f -- \"$d/log\" </dev/null &\n\
         echo \"$!\" > \"$d/follower\"\n\
         wait \"$!\"\n\
         report\n"
    );
    script
}

/// A signal the host sends a live command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LiveSignal {
    /// `SIGINT` to the command's process group (what Ctrl-C does to a command on pipes).
    Interrupt,
    /// `SIGTERM` to its process group and to every process carrying its tag.
    Terminate,
    /// `SIGKILL` to its process group and to every process carrying its tag: the command and
    /// what it started, whatever group or session they moved to.
    Kill,
}

/// The command that delivers `signal` to live process `id` (run like any command).
pub(crate) fn signal(id: &str, signal: LiveSignal) -> String {
    let (name, tagged) = match signal {
        LiveSignal::Interrupt => ("INT", false),
        LiveSignal::Terminate => ("TERM", true),
        LiveSignal::Kill => ("KILL", true),
    };
    let mut script = dir_line(id);
    let _ = writeln!(
        script,
        "p=$(head -c 16 \"$d/pid\" 2>/dev/null) || exit 0\n\
         case $p in ''|*[!0-9]*) exit 0 ;; esac\n\
         kill -{name} -- -\"$p\" 2>/dev/null || kill -{name} \"$p\" 2>/dev/null"
    );
    if tagged {
        let _ = writeln!(
            script,
            "for e in /proc/[0-9]*/environ; do\n\
             if grep -qzx -- {} \"$e\" 2>/dev/null; then q=${{e#/proc/}}; kill -{name} \"${{q%/environ}}\" 2>/dev/null; fi\n\
             done",
            shell_quote(&format!("{LIVE_TAG}={id}"))
        );
    }
    script.push_str("exit 0\n");
    script
}

/// One control line a follower wrote on its stderr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Control {
    /// The runner's pid: the process envd knows, whose stdin is the command's and whose
    /// process group the command leads with it.
    Pid(u32),
    /// The command exited with this code.
    Exit(i32),
    /// The command ended without writing its exit code (a signal killed it).
    Killed,
    /// The sandbox restarted since the command started (a pause without memory).
    LostReboot,
    /// The live directory is gone (another sandbox, or removed).
    LostGone,
}

impl Control {
    /// Parses one line strictly; anything else (a tool's own complaint on stderr) is `None`.
    pub(crate) fn parse(line: &str) -> Option<Control> {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let number = || rest.parse::<u32>().ok().filter(|n| *n > 0);
        match word {
            "pid" => number().map(Control::Pid),
            "exit" => rest.parse::<i32>().ok().map(Control::Exit),
            "killed" if rest.is_empty() => Some(Control::Killed),
            "lost" if rest == "reboot" => Some(Control::LostReboot),
            "lost" if rest == "gone" => Some(Control::LostGone),
            _ => None,
        }
    }
}

/// Whether `id` may name a live directory: letters, digits, `_` and `-`, at most 64.
pub(crate) fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests;
