//! Forking the scope's sandbox for delegated children (R15): one checkpoint of the parent
//! and one create per child (the branches of [`Backend::fork`], stamped with the child's
//! id), and the base each child's work is measured from: the parent's side (its file clock,
//! the git work trees under the roots and their `HEAD`, a manifest of the rest) read in the
//! parent's sandbox under its state lock just before the checkpoint, each child's (its
//! fork's file clock) in its fork before anything runs there.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use e2b_client::{Sandbox, SandboxId};
use sandbox_identity::{BRANCH_KEY, CheckpointReason, LeaseTracker};

use super::record::ForkRecord;
use super::{Base, ChildSandbox, WorkTree};
use crate::backend::{Backend, Inner, TRANSFER_WINDOW, bump};
use crate::config::{SandboxMode, Scope};
use crate::error::Error;
use crate::home::SandboxHome;
use crate::hooks::NoStateHooks;
use crate::subagent::{
    ChildChanges, ChildId, Manifest, NOT_BROUGHT_BACK, SUBAGENT_KEY, Stamp, roots, shell_quote,
    stamp_script,
};

/// Set on the attach-mode backend of a delegated child's fork, which this process made: the
/// parent's sandbox (such a fork is this process's own, so the fleet may pause it for the
/// limit like a writer's), the fork as its create answered (its first attach needs no
/// connect: the create's lease covers it) and its home (the parent's: the same template,
/// user and files, so no probe).
pub(in crate::backend) struct ForkOf {
    made: Mutex<Option<(Sandbox, LeaseTracker)>>,
    home: Option<SandboxHome>,
}

impl Inner {
    /// The fork as its create answered, for the first attach to `id` (taken: a later attach
    /// connects).
    pub(in crate::backend) fn made_fork(&self, id: &SandboxId) -> Option<(Sandbox, LeaseTracker)> {
        let fork = self.subagents.fork_of.get()?;
        let made = fork
            .made
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        (made.0.id() == id).then_some(made)
    }

    /// A fork's home: its parent's.
    pub(in crate::backend) fn fork_home(&self) -> Option<SandboxHome> {
        self.subagents.fork_of.get()?.home.clone()
    }
}

impl Backend {
    /// Forks the scope's sandbox for `children`, working in `dir` (an absolute path): one
    /// checkpoint (R6's fork: the parent's commands are waited for up to `wait`, never cut,
    /// R2) and one create per child, each within the account's limit and `max_running`
    /// (L14), stamped with `hermes.branch` (the parent) and `hermes.subagent` (the child).
    /// The parent's side of the base is read under its state lock while the forks are made;
    /// each child's base is read in its fork before anything runs there, and before the next
    /// fork is made. The outer error is the fork's; each entry is that child's sandbox or why
    /// it has none.
    pub fn fork_children(
        &self,
        children: &[ChildId],
        dir: &str,
        wait: Duration,
    ) -> Result<Vec<Result<ChildSandbox, Error>>, Error> {
        const OP: &str = "subagent fork";
        if !dir.starts_with('/') || dir.chars().any(char::is_control) {
            return Err(Error::InvalidConfig {
                reason: format!("a subagent's working directory must be absolute, not {dir:?}"),
            });
        }
        let inner = &*self.inner;
        // Before the checkpoint: what the child writes under the Hermes home is after it.
        let forked_at = inner.services.clock.wall();
        {
            let mut state = inner.lock_state(OP);
            let attached = inner.attach_to_change(&mut state, OP, wait)?;
            inner.top_up_lease(attached, TRANSFER_WINDOW)?;
            let parent = attached.id.clone();
            let home = attached.info.home.clone();
            // The parent's side of the base, in its own file system, read before the
            // checkpoint while no command of it runs (its state lock is held): a background
            // process's write between the two then counts as the parent's, never lost.
            let (roots, prune) = compared(
                &home.home,
                &attached.info.remote_hermes_home,
                dir,
                &inner.config.subagent_paths,
            );
            let script = base_script(&roots, &prune, dir);
            let parent_base = inner
                .script(&attached.sandbox, "subagent base", &script)
                .and_then(|answer| {
                    parse_parent_base(&answer).map_err(|reason| Error::UntrustedAnswer {
                        operation: "subagent base",
                        sandbox_id: parent.as_str().to_owned(),
                        reason,
                    })
                })?;
            let checkpoint = inner.take_checkpoint(attached, OP, CheckpointReason::Fork, None)?;
            drop(state);
            let base = ParentBase {
                roots,
                prune,
                ..parent_base
            };
            self.make_forks(
                children,
                dir,
                &parent,
                &checkpoint.snapshot_id,
                (home, forked_at),
                &base,
            )
        }
    }

    /// Makes each child's fork, attaches it, reads its side of the base and records it.
    fn make_forks(
        &self,
        children: &[ChildId],
        dir: &str,
        parent: &SandboxId,
        snapshot_id: &str,
        (home, forked_at): (SandboxHome, std::time::SystemTime),
        base: &ParentBase,
    ) -> Result<Vec<Result<ChildSandbox, Error>>, Error> {
        const OP: &str = "subagent fork";
        let inner = &*self.inner;
        let client = inner.client()?;
        let mut children_made = Vec::with_capacity(children.len());
        for child in children {
            let options = inner.create_options(
                snapshot_id,
                [
                    (BRANCH_KEY, parent.as_str()),
                    (SUBAGENT_KEY, child.as_str()),
                ],
            )?;
            // Each fork is a running sandbox like any other: it takes a slot under the
            // account's limit and `max_running` (L14), pausing the fleet's idlest other
            // sandbox (an earlier child's, between its tool calls) or waiting a bounded time,
            // never forever; the parent keeps its own slot. Each is attached before the next
            // is made, so the fleet knows it.
            let (mut lease, request) = inner.opening_lease();
            let made = inner
                .within_limit(OP, Some(parent), || {
                    bump(&inner.stats.creates);
                    inner
                        .block_on(client.create(options.clone()))
                        .map_err(|source| Error::e2b(OP, Some(parent.as_str()), source))
                })
                .and_then(|info| {
                    lease.confirm(&request);
                    let sandbox = client
                        .sandbox(info.envd_access())
                        .map_err(|source| Error::e2b(OP, Some(info.sandbox_id.as_str()), source))?;
                    let made = Some((sandbox, lease));
                    let backend =
                        self.fork_backend(child, &info.sandbox_id, made, Some(home.clone()))?;
                    let since = child_since(&backend, &info.sandbox_id);
                    Ok((child.clone(), info.sandbox_id, backend, since))
                });
            children_made.push(
                made.and_then(|made| record(made, dir, parent, base, forked_at, &inner.scope)),
            );
        }
        Ok(children_made)
    }

    /// A backend attached to a child's fork (attach mode: it never kills the fork), with no
    /// state hooks; `made` and `home` when this process just created it.
    pub(in crate::backend) fn fork_backend(
        &self,
        id: &ChildId,
        sandbox_id: &SandboxId,
        made: Option<(Sandbox, LeaseTracker)>,
        home: Option<SandboxHome>,
    ) -> Result<Arc<Backend>, Error> {
        let mut config = self.inner.config.clone();
        config.mode = SandboxMode::Attach {
            sandbox_id: sandbox_id.clone(),
        };
        let backend = Arc::new(Backend::new(
            config,
            Scope {
                task_id: format!("{}-subagent-{id}", self.inner.scope.task_id),
                ..self.inner.scope.clone()
            },
            self.inner.services.clone(),
            Arc::new(NoStateHooks),
        )?);
        // Before its first attach: from then on the fleet counts it and may pause it.
        let _ = backend.inner.subagents.fork_of.set(ForkOf {
            made: Mutex::new(made),
            home,
        });
        Ok(backend)
    }
}

/// The roots a child's work is compared in, and what under them is left out: the sandbox
/// user's home (less its caches and the Hermes home, whose state comes back on its own), the
/// working directory and the configured paths.
pub(super) fn compared(
    home: &str,
    hermes_home: &str,
    dir: &str,
    paths: &[String],
) -> (Vec<String>, Vec<String>) {
    let roots = roots(
        [home, dir]
            .into_iter()
            .chain(paths.iter().map(String::as_str)),
    );
    let mut prune: Vec<String> = NOT_BROUGHT_BACK
        .iter()
        .map(|cache| format!("{}/{cache}", home.trim_end_matches('/')))
        .collect();
    if hermes_home.starts_with('/') {
        prune.push(hermes_home.trim_end_matches('/').to_owned());
    }
    (roots, prune)
}

/// The parent's side of the base, as read at the fork.
pub(super) struct ParentBase {
    pub(super) roots: Vec<String>,
    pub(super) prune: Vec<String>,
    pub(super) trees: Vec<WorkTree>,
    pub(super) manifest: Manifest,
    pub(super) since: Stamp,
}

/// The parent's base script: a [`Stamp`] of its file clock, then each git work tree under
/// the roots or holding `dir` (`t\0<top>\0<HEAD>\0`; a repository without a commit is
/// left to the files), then `files\0` and the manifest of the roots without those trees.
fn base_script(roots: &[String], prune: &[String], dir: &str) -> String {
    let starts = crate::subagent::find_starts(roots);
    let pruned = crate::subagent::find_prunes(prune);
    // Bash: the trees' tops join the manifest's prunes (escaped for -path) as they are found.
    const SCRIPT: &str = r#"set -e; STAMP; cd /; set --
for r in STARTS; do [ -e "$r" ] && set -- "$@" "$r"; done
esc() { local s=$1; s=${s//\\/\\\\}; s=${s//\*/\\*}; s=${s//\?/\\?}; s=${s//\[/\\[}; printf '%s' "$s"; }
tops=(); seen=' '
tree() {
  local t=$1 h
  case "$seen" in *" $t "*) return 0;; esac
  h=$(git -C "/$t" rev-parse -q --verify HEAD 2>/dev/null) || return 0
  seen="$seen$t "; tops+=(-o -path "$(esc "$t")"); printf 't\0/%s\0%s\0' "$t" "$h"
}
if top=$(git -C DIR rev-parse --show-toplevel 2>/dev/null); then tree "${top#/}"; fi
if [ $# -gt 0 ]; then
  while IFS= read -r -d '' g; do tree "${g%/.git}"; done < <(find "$@" -xdev \( PRUNED \) -prune -o -name .git -print0 -prune)
fi
printf 'files\0'
[ $# -eq 0 ] || find "$@" -xdev \( PRUNED "${tops[@]}" -o -path 'tmp/hermes-subagent-*' \) -prune -o UNREAD -o \( -type f -printf 'f %s %T@ %C@ %m %p\0' \) -o \( -type l -printf 's %C@ %p\0%l\0' \) || true"#;
    crate::subagent::fill(
        SCRIPT,
        &[
            ("STAMP", &stamp_script()),
            ("STARTS", &starts),
            ("PRUNED", &pruned.join(" -o ")),
            ("DIR", &shell_quote(dir)),
            ("UNREAD", crate::subagent::UNREAD),
        ],
    )
}

/// Parses [`base_script`]'s answer.
fn parse_parent_base(output: &[u8]) -> Result<ParentBase, String> {
    let mut fields = output.split(|byte| *byte == 0);
    let since = fields
        .next()
        .and_then(|f| std::str::from_utf8(f).ok())
        .and_then(Stamp::parse)
        .ok_or_else(|| "the base does not start with the file clock's time".to_owned())?;
    let mut trees = Vec::new();
    loop {
        match fields.next() {
            Some(b"t") => {
                let top = fields.next().and_then(|f| std::str::from_utf8(f).ok());
                let head = fields.next().and_then(|f| std::str::from_utf8(f).ok());
                trees.push(WorkTree::checked(top, head)?);
            }
            Some(b"files") => break,
            _ => return Err("the base's work trees are not what git prints".to_owned()),
        }
    }
    let rest_at = output.len() - fields.map(|f| f.len() + 1).sum::<usize>().min(output.len());
    let manifest = Manifest::parse(&output[rest_at..])?;
    Ok(ParentBase {
        roots: Vec::new(),
        prune: Vec::new(),
        trees,
        manifest,
        since,
    })
}

/// A child's side of the base: its fork's file clock before anything ran there (attached
/// now, so the fleet knows it).
fn child_since(backend: &Backend, sandbox_id: &SandboxId) -> Result<Stamp, Error> {
    let output = backend.file_operation("subagent base", TRANSFER_WINDOW, |inner, sandbox| {
        inner.script(sandbox, "subagent base", &stamp_script())
    })?;
    std::str::from_utf8(&output)
        .ok()
        .map(|text| text.trim_end_matches('\0'))
        .and_then(Stamp::parse)
        .ok_or_else(|| Error::UntrustedAnswer {
            operation: "subagent base",
            sandbox_id: sandbox_id.as_str().to_owned(),
            reason: "the fork's file clock is not a time".to_owned(),
        })
}

/// A fork made and attached, and its file clock as read there.
type Made = (ChildId, SandboxId, Arc<Backend>, Result<Stamp, Error>);

/// The child's sandbox with both sides of its base, recorded on the host.
fn record(
    (id, sandbox_id, backend, since): Made,
    dir: &str,
    parent: &SandboxId,
    base: &ParentBase,
    forked_at: std::time::SystemTime,
    scope: &Scope,
) -> Result<ChildSandbox, Error> {
    let made = ChildSandbox {
        id,
        sandbox_id,
        dir: dir.to_owned(),
        parent: parent.clone(),
        forked_at,
        base: Base {
            roots: base.roots.clone(),
            prune: base.prune.clone(),
            trees: base.trees.clone(),
            parent: base.manifest.clone(),
            parent_since: base.since,
            child: ChildChanges::Since(since?),
            late: Vec::new(),
        },
        backend,
    };
    // What a crash's recovery needs: this host keeps it until the work is back.
    ForkRecord::of(&made, &scope.task_id).write(&scope.profile_home);
    Ok(made)
}
