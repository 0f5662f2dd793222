//! Forking the scope's sandbox for delegated children (R15): one checkpoint of the parent
//! and one create per child (the branches of [`Backend::fork`], stamped with the child's
//! id), and the base each child's work is measured from: the parent's side read in the
//! parent's sandbox under its state lock while the forks are made, each child's read in its
//! fork before anything runs there.

use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::Duration;

use e2b_client::{Sandbox, SandboxId};
use sandbox_identity::{BRANCH_KEY, CheckpointReason, LeaseTracker};

use super::record::ForkRecord;
use super::{Base, ChildSandbox};
use crate::backend::{Backend, Inner, TRANSFER_WINDOW, bump};
use crate::config::{SandboxMode, Scope};
use crate::error::Error;
use crate::home::SandboxHome;
use crate::hooks::NoStateHooks;
use crate::subagent::{ChildId, Manifest, SUBAGENT_KEY, manifest_script, shell_quote};

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

/// A fork made and attached, and its base as read there.
type Made = (ChildId, SandboxId, Arc<Backend>, Result<Base, Error>);

/// Each child's sandbox or why it has none, and the forks made but not recorded (the
/// parent's side of the base failed).
type Forks = (Vec<Result<ChildSandbox, Error>>, Vec<SandboxId>);

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
        let script = format!(
            "cd -- {dir} || exit 3; if git rev-parse --show-toplevel >/dev/null 2>&1; \
             then printf 'git\\0'; else printf 'files\\0'; {manifest}; fi",
            dir = shell_quote(dir),
            manifest = manifest_script(dir),
        );
        // Before the checkpoint: what the child writes under the Hermes home is after it.
        let forked_at = inner.services.clock.wall();
        std::thread::scope(|scope| {
            let mut state = inner.lock_state(OP);
            let attached = inner.attach_to_change(&mut state, OP, wait)?;
            inner.top_up_lease(attached, TRANSFER_WINDOW)?;
            let checkpoint = inner.take_checkpoint(attached, OP, CheckpointReason::Fork, None)?;
            let parent = attached.id.clone();
            let home = attached.info.home.clone();
            // The parent's side of the base, in its own file system, while no command of it
            // runs (its state lock is held until it is read): what the forks start from. The
            // forks are made meanwhile; each waits for it to be recorded.
            let (send, parent_base) = mpsc::channel::<Option<Option<Manifest>>>();
            let forks = {
                let parent = parent.clone();
                scope.spawn(move || {
                    self.make_forks(
                        children,
                        dir,
                        &parent,
                        &checkpoint.snapshot_id,
                        (home, forked_at),
                        parent_base,
                    )
                })
            };
            let answer = inner
                .script(&attached.sandbox, "subagent base", &script)
                .and_then(|answer| match answer.strip_prefix(b"files\0") {
                    Some(manifest) => Manifest::parse(manifest).map(Some).map_err(|reason| {
                        Error::UntrustedAnswer {
                            operation: "subagent base",
                            sandbox_id: parent.as_str().to_owned(),
                            reason,
                        }
                    }),
                    None => Ok(None),
                });
            drop(state);
            let _ = send.send(answer.as_ref().ok().cloned());
            let (made, unrecorded) = forks
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
            if let Err(error) = answer {
                // No fork outlives a fork that failed: those made are killed.
                let client = inner.client()?;
                let _ = inner.kill_all(&client, &unrecorded);
                return Err(error);
            }
            Ok(made)
        })
    }

    /// Makes each child's fork, attaches it and reads its base, then records it once the
    /// parent's side of the base (from `parent_base`) is known. Stops making forks when the
    /// parent's side failed (`None`).
    fn make_forks(
        &self,
        children: &[ChildId],
        dir: &str,
        parent: &SandboxId,
        snapshot_id: &str,
        (home, forked_at): (SandboxHome, std::time::SystemTime),
        parent_base: mpsc::Receiver<Option<Option<Manifest>>>,
    ) -> Result<Forks, Error> {
        const OP: &str = "subagent fork";
        let inner = &*self.inner;
        let client = inner.client()?;
        let mut parent_base = Some(parent_base);
        let mut known: Option<Option<Manifest>> = None;
        let mut children_made = Vec::with_capacity(children.len());
        let mut unrecorded = Vec::new();
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
                    let base = child_base(&backend, &info.sandbox_id, dir);
                    Ok((child.clone(), info.sandbox_id, backend, base))
                });
            if let Some(receiver) = parent_base.take() {
                // Blocks until the parent's side is read (once); `None` when it failed.
                known = receiver.recv().ok().flatten();
            }
            let Some(parent_base) = &known else {
                // The parent's side failed: the caller kills what was made.
                if let Ok((_, sandbox_id, _, _)) = made {
                    unrecorded.push(sandbox_id);
                }
                break;
            };
            children_made.push(
                made.and_then(|made| {
                    record(made, dir, parent, parent_base, forked_at, &inner.scope)
                }),
            );
        }
        Ok((children_made, unrecorded))
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

/// A child's base, read in its fork (attached now, so the fleet knows it).
fn child_base(backend: &Backend, sandbox_id: &SandboxId, dir: &str) -> Result<Base, Error> {
    let script = format!(
        "cd -- {dir} || exit 3; \
         if top=$(git rev-parse --show-toplevel 2>/dev/null) && head=$(git rev-parse HEAD 2>/dev/null); \
         then printf 'git\\0%s\\0%s\\0' \"$top\" \"$head\"; \
         else printf 'files\\0'; {manifest}; fi",
        dir = shell_quote(dir),
        manifest = manifest_script(dir),
    );
    let output = backend.file_operation("subagent base", TRANSFER_WINDOW, |inner, sandbox| {
        inner.script(sandbox, "subagent base", &script)
    })?;
    parse_base(&output).map_err(|reason| Error::UntrustedAnswer {
        operation: "subagent base",
        sandbox_id: sandbox_id.as_str().to_owned(),
        reason,
    })
}

/// The child's sandbox with both sides of its base, recorded on the host.
fn record(
    (id, sandbox_id, backend, base): Made,
    dir: &str,
    parent: &SandboxId,
    parent_base: &Option<Manifest>,
    forked_at: std::time::SystemTime,
    scope: &Scope,
) -> Result<ChildSandbox, Error> {
    let mut base = base?;
    match (&mut base, parent_base) {
        (Base::Files { parent, .. }, Some(known)) => *parent = known.clone(),
        (Base::Git { .. }, None) => {}
        _ => {
            return Err(Error::UntrustedAnswer {
                operation: "subagent base",
                sandbox_id: sandbox_id.as_str().to_owned(),
                reason:
                    "the fork and its parent disagree on whether the directory is a git work tree"
                        .to_owned(),
            });
        }
    }
    let made = ChildSandbox {
        id,
        sandbox_id,
        dir: dir.to_owned(),
        parent: parent.clone(),
        forked_at,
        base,
        backend,
    };
    // What a crash's recovery needs: this host keeps it until the work is back.
    ForkRecord::of(&made, &scope.task_id).write(&scope.profile_home);
    Ok(made)
}

/// The base script's answer: `git\0<top>\0<head>\0` or `files\0` and a manifest.
fn parse_base(output: &[u8]) -> Result<Base, String> {
    if let Some(rest) = output.strip_prefix(b"git\0") {
        let mut fields = rest.split(|byte| *byte == 0);
        let top = fields.next().and_then(|f| std::str::from_utf8(f).ok());
        let head = fields.next().and_then(|f| std::str::from_utf8(f).ok());
        return match (top, head) {
            (Some(top), Some(head))
                if top.starts_with('/')
                    && !top.chars().any(char::is_control)
                    && (head.len() == 40 || head.len() == 64)
                    && head.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                Ok(Base::Git {
                    top: top.to_owned(),
                    head: head.to_owned(),
                })
            }
            _ => Err("the git work tree's top or HEAD is not what git prints".to_owned()),
        };
    }
    match output.strip_prefix(b"files\0") {
        Some(manifest) => Manifest::parse(manifest).map(|child| Base::Files {
            child,
            parent: Manifest::default(),
        }),
        None => Err("the base answer is neither git nor files".to_owned()),
    }
}
