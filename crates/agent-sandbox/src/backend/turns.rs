//! Turn-level file checkpoints (contract R9, R10): the cheap tier under E2B snapshots. A tar
//! of one working directory kept inside the sandbox under `<home>/.hermes-e2b/turns/<n>`,
//! the newest `keep` of them. Each operation is one process start in the sandbox (no E2B
//! control-plane request, nothing on the host); the Hermes state directory and the store
//! itself are never captured or touched by a restore, so a restore never rolls back what the
//! agent learned (the same promise as R8).

use std::time::{Duration, SystemTime};

use e2b_client::StartOptions;

use super::{Attached, Backend, bump};
use crate::error::{CheckpointRefusal, Error};

/// Where the store lives, under the sandbox user's home.
pub const TURN_STORE: &str = ".hermes-e2b/turns";

/// The most turn checkpoints a store keeps (each is a full tar of its directory).
pub const MAX_TURN_KEEP: usize = 100;

/// The output a turn script may print before it is refused (listings are one line each).
const TURN_OUTPUT_LIMIT: u64 = 256 * 1024;

/// One turn checkpoint, as the sandbox describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TurnCheckpoint {
    /// Its number in the store (grows by one per checkpoint; restore takes it).
    pub number: u64,
    /// When it was taken (the sandbox's clock, to the millisecond).
    pub taken_at: SystemTime,
    /// The directory it captured.
    pub directory: String,
    /// What the caller said it was for (e.g. `turn 3: before write_file`).
    pub label: String,
    /// Entries captured (files, directories and links).
    pub entries: u64,
    /// Size of the archive in bytes.
    pub bytes: u64,
}

/// What to capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnRequest {
    /// The absolute directory to capture (usually the session's working directory).
    pub directory: String,
    /// A one-line label; tabs and new lines become spaces.
    pub label: String,
    /// How many turn checkpoints the store keeps after this one (1..=[`MAX_TURN_KEEP`]).
    pub keep: usize,
}

/// What a turn restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TurnRestore {
    /// The checkpoint restored.
    pub restored: TurnCheckpoint,
    /// The checkpoint of the directory as it was just before: restore it to undo.
    pub undo: TurnCheckpoint,
}

/// The store's shell functions. `$1` is the store, `$2` the keep count; the rest per action.
/// Each checkpoint is written to `.new` and renamed, so a crash leaves no half checkpoint.
const SCRIPT: &str = r#"
set -eu
store=$1; keep=$2; state=$3; action=$4; shift 4
root=${store%/turns}
mkdir -p "$store"
describe() { cat "$store/$1/meta"; }
inside() { case $1 in "$2"/*) return 0 ;; esac; return 1; }
take() { # dir label; sets $taken
  local dir=$1 label=$2 excl=() last n entries bytes
  [ -d "$dir" ] || { echo "no directory $dir" >&2; exit 3; }
  if inside "$dir/" "$root" || inside "$dir/" "$state"; then echo "$dir is inside the store or the Hermes state" >&2; exit 3; fi
  for p in "$state" "$root"; do inside "$p" "$dir" && excl+=("--exclude=./${p#"$dir"/}"); done
  last=$(ls "$store" | grep -E '^[0-9]+$' | sort -n | tail -n 1 || true)
  n=$(( ${last:-0} + 1 ))
  rm -rf "$store/.new"; mkdir "$store/.new"
  entries=$(tar -C "$dir" "${excl[@]}" -cvf "$store/.new/files.tar" . | wc -l)
  bytes=$(stat -c %s "$store/.new/files.tar")
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$n" "$(date +%s%3N)" "$entries" "$bytes" "$dir" "$label" > "$store/.new/meta"
  mv "$store/.new" "$store/$n"
  ls "$store" | grep -E '^[0-9]+$' | sort -n | head -n "-$keep" | while read -r old; do rm -rf "$store/$old"; done
  taken=$n
}
case $action in
  take) take "$1" "$2"; describe "$taken" ;;
  list) ls "$store" | grep -E '^[0-9]+$' | sort -rn | while read -r n; do describe "$n"; done ;;
  restore) # number label
    src=$1
    [ -f "$store/$src/meta" ] || { echo "no turn checkpoint $src" >&2; exit 4; }
    dir=$(cut -f5 "$store/$src/meta")
    keep=$(( keep + 1 ))
    take "$dir" "$2"
    undo=$taken
    prune=(-path "$root"); spare=()
    for p in "$state" "$root"; do prune+=(-o -path "$p"); spare+=(! -path "$p" ! -path "$p/*"); done
    find "$dir" -mindepth 1 \( "${prune[@]}" \) -prune -o ! -type d -exec rm -f {} +
    find "$dir" -mindepth 1 -depth -type d -empty "${spare[@]}" -delete
    mkdir -p "$root" "$state"
    tar -C "$dir" -xpf "$store/$src/files.tar"
    describe "$src"; describe "$undo" ;;
esac
"#;

impl Backend {
    /// Captures `request.directory` as the store's next turn checkpoint and drops the oldest
    /// beyond `request.keep` (R9): one process start in the sandbox, no E2B request. The
    /// Hermes state directory and the store are left out. Attaches first if needed; only
    /// the scope's writer (or an ephemeral owner) may.
    pub fn turn_checkpoint(&self, request: TurnRequest) -> Result<TurnCheckpoint, Error> {
        const OP: &str = "turn checkpoint";
        if !(1..=MAX_TURN_KEEP).contains(&request.keep) {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "a turn store keeps 1 to {MAX_TURN_KEEP} checkpoints, not {}",
                    request.keep
                ),
            });
        }
        let inner = &*self.inner;
        let mut state = inner.lock_state("turn checkpoint");
        let attached = inner.ensure_attached(&mut state, OP)?;
        inner.may_change_scope(attached, OP)?;
        let directory = absolute(&request.directory, attached, OP)?;
        let args = vec![
            request.keep.to_string(),
            "take".to_owned(),
            directory,
            one_line(&request.label),
        ];
        let lines = inner.turn_script(attached, OP, args)?;
        lines.first().cloned().ok_or_else(|| garbled(attached, OP))
    }

    /// The store's turn checkpoints, newest first (one process start; attaches if needed,
    /// any role may list).
    pub fn turn_checkpoints(&self) -> Result<Vec<TurnCheckpoint>, Error> {
        const OP: &str = "list turn checkpoints";
        let inner = &*self.inner;
        let mut state = inner.lock_state("list turn checkpoints");
        let attached = inner.ensure_attached(&mut state, OP)?;
        inner.turn_script(attached, OP, vec!["1".to_owned(), "list".to_owned()])
    }

    /// Puts turn checkpoint `number`'s directory back as it was (R10): first a new turn
    /// checkpoint of the directory as it is (the undo point), then everything in it but the
    /// Hermes state directory and the store is removed and the archive extracted. One process
    /// start, after the scope's running commands ended (waiting up to `wait`). The store keeps
    /// `keep` checkpoints besides the undo point.
    pub fn restore_turn(
        &self,
        number: u64,
        keep: usize,
        wait: Duration,
    ) -> Result<TurnRestore, Error> {
        const OP: &str = "restore turn checkpoint";
        let inner = &*self.inner;
        let mut state = inner.lock_state("restore turn checkpoint");
        let attached = inner.attach_to_change(&mut state, OP, wait)?;
        let args = vec![
            keep.clamp(1, MAX_TURN_KEEP).to_string(),
            "restore".to_owned(),
            number.to_string(),
            format!("before restoring turn checkpoint {number}"),
        ];
        let mut lines = inner
            .turn_script(attached, OP, args)
            .map_err(|error| match error {
                Error::SandboxCommand { exit_code: 4, .. } => Error::CheckpointRefused {
                    operation: OP,
                    sandbox_id: Some(attached.id.as_str().to_owned()),
                    reason: CheckpointRefusal::NoCheckpoint {
                        target: format!("turn checkpoint {number}"),
                    },
                },
                other => other,
            })?
            .into_iter();
        match (lines.next(), lines.next()) {
            (Some(restored), Some(undo)) => Ok(TurnRestore { restored, undo }),
            _ => Err(garbled(attached, OP)),
        }
    }
}

impl super::Inner {
    /// Runs the store script with `args` after the store path; parses its lines.
    fn turn_script(
        &self,
        attached: &Attached,
        operation: &'static str,
        args: Vec<String>,
    ) -> Result<Vec<TurnCheckpoint>, Error> {
        let store = format!(
            "{}/{TURN_STORE}",
            attached.info.home.home.trim_end_matches('/')
        );
        // keep, then the state directory, then the action and its arguments.
        let mut args = args.into_iter();
        let mut argv = vec![
            "-c".to_owned(),
            SCRIPT.to_owned(),
            "hermes-e2b-turns".to_owned(),
            store,
        ];
        argv.extend(args.next());
        argv.push(
            attached
                .info
                .remote_hermes_home
                .trim_end_matches('/')
                .to_owned(),
        );
        argv.extend(args);
        let options = StartOptions::exec("/bin/bash".to_owned(), argv);
        bump(&self.stats.commands);
        let output = self.block_on(super::replace::run_checked(
            attached,
            options,
            TURN_OUTPUT_LIMIT,
            operation,
            operation,
        ))?;
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|line| parse(line).ok_or_else(|| garbled(attached, operation)))
            .collect()
    }
}

/// The directory as an absolute path (a relative one is taken from the home).
fn absolute(
    directory: &str,
    attached: &Attached,
    operation: &'static str,
) -> Result<String, Error> {
    let home = attached.info.home.home.trim_end_matches('/');
    let path = match directory.trim() {
        "" | "~" => home.to_owned(),
        dir if dir.starts_with('/') => dir.trim_end_matches('/').to_owned(),
        dir => format!("{home}/{}", dir.trim_start_matches("~/")),
    };
    if path.is_empty() || path.split('/').any(|part| part == "..") {
        return Err(Error::InvalidConfig {
            reason: format!(
                "E2B {operation} refused for {}: {directory:?} is the root directory or has `..`",
                attached.id.as_str()
            ),
        });
    }
    Ok(path)
}

fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(200)
        .collect()
}

fn garbled(attached: &Attached, operation: &'static str) -> Error {
    Error::SandboxCommand {
        operation,
        sandbox_id: attached.id.as_str().to_owned(),
        exit_code: 0,
        stderr: "the turn store printed an unreadable description".to_owned(),
    }
}

/// One `meta` line: number, epoch ms, entries, bytes, directory, label (tab-separated).
fn parse(line: &str) -> Option<TurnCheckpoint> {
    let mut fields = line.splitn(6, '\t');
    let number = fields.next()?.parse().ok()?;
    let millis: u64 = fields.next()?.parse().ok()?;
    let entries = fields.next()?.trim().parse().ok()?;
    let bytes = fields.next()?.parse().ok()?;
    let directory = fields.next()?.to_owned();
    let label = fields.next().unwrap_or_default().to_owned();
    Some(TurnCheckpoint {
        number,
        taken_at: SystemTime::UNIX_EPOCH + Duration::from_millis(millis),
        directory,
        label,
        entries,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn meta_lines_parse_and_garbage_does_not() {
        let turn = parse("3\t1764648858123\t 12\t10240\t/home/user\tturn 2: before patch").unwrap();
        assert_eq!(turn.number, 3);
        assert_eq!(turn.entries, 12);
        assert_eq!(turn.label, "turn 2: before patch");
        assert!(parse("x\t1\t1\t1\t/d\tl").is_none());
        assert!(parse("3\t1").is_none());
    }
}
