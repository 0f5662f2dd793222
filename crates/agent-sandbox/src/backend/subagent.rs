//! Delegated children in forks of the scope's sandbox (R15): the child's sandbox (made by
//! `fork.rs`'s [`Backend::fork_children`], asked for through `batch.rs`), and the bring-back
//! into the parent's sandbox under the parent's state lock, so no command of the parent runs
//! while it lands (the child's one script and its answer in `answer.rs`; its archive cut to
//! the plan in `archive.rs`; its Hermes home's part in `state.rs`; the host's record of each
//! fork in `record.rs`; the words in `report.rs`).

use std::collections::BTreeMap;

use bytes::Bytes;
use e2b_client::{Sandbox, SandboxId, StartOptions};

mod answer;
mod archive;
mod batch;
mod fork;
pub(crate) mod record;
mod report;
mod state;
use super::{Backend, Inner, TRANSFER_WINDOW};
use crate::error::Error;
use crate::subagent::{
    ChildChanges, ChildId, Manifest, Plan, Sides, Stamp, digests_script, is_within,
    manifest_script, may_be_root, parse_digests, shell_quote,
};
use answer::{ChildAnswer, child_script};
use archive::{archive_digests, repack};
pub(in crate::backend) use batch::Subagents;
use record::ForkRecord;
pub use report::{BranchBack, BringBack};
pub use state::StateBack;

/// The most a script's answer may print (a manifest of [`crate::subagent::MAX_MANIFEST_ENTRIES`]
/// paths fits).
const ANSWER_LIMIT: u64 = 64 << 20;

/// The most directories outside the roots a child's commands may add to them (each one it
/// ran a command in).
const MAX_LATE_ROOTS: usize = 64;

/// What [`Backend::fork_children`] made for one child: its sandbox, a backend to run its
/// commands there, and what its work is measured from.
pub struct ChildSandbox {
    /// The child.
    pub id: ChildId,
    /// Its fork.
    pub sandbox_id: SandboxId,
    /// The working directory, the same path in the parent's sandbox and the fork.
    pub dir: String,
    /// The parent's sandbox when it was forked.
    pub parent: SandboxId,
    /// When it was forked (the host's wall clock): what the child wrote under the Hermes
    /// home is found by it.
    pub forked_at: std::time::SystemTime,
    pub(super) base: Base,
    backend: std::sync::Arc<Backend>,
}

impl std::fmt::Debug for ChildSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildSandbox")
            .field("id", &self.id)
            .field("sandbox_id", &self.sandbox_id)
            .field("dir", &self.dir)
            .field("parent", &self.parent)
            .field("roots", &self.base.roots)
            .field("work_trees", &self.base.trees.len())
            .finish_non_exhaustive()
    }
}

impl ChildSandbox {
    /// A backend whose commands and file operations run in the child's fork (attach mode:
    /// it never kills the fork; [`Backend::end_child`] does).
    pub fn backend(&self) -> &std::sync::Arc<Backend> {
        &self.backend
    }

    /// Whether the working directory is in a git work tree (its work there comes back as a
    /// branch).
    pub fn is_git(&self) -> bool {
        self.base
            .trees
            .iter()
            .any(|tree| is_within(&self.dir, &tree.top))
    }

    /// The directories whose changes come back as files (absolute): the sandbox user's home,
    /// the working directory and the configured paths, as read at the fork.
    pub fn roots(&self) -> &[String] {
        &self.base.roots
    }
}

/// A git work tree at the fork: what comes back of it is a branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct WorkTree {
    /// Its top directory (absolute).
    pub(super) top: String,
    /// Its `HEAD` at the fork.
    pub(super) head: String,
}

impl WorkTree {
    /// A work tree as a sandbox reported it, checked.
    pub(super) fn checked(top: Option<&str>, head: Option<&str>) -> Result<WorkTree, String> {
        match (top, head) {
            (Some(top), Some(head))
                if top.starts_with('/')
                    && !top.chars().any(char::is_control)
                    && !top.split('/').any(|part| part == "..")
                    && (head.len() == 40 || head.len() == 64)
                    && head.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                Ok(WorkTree {
                    top: top.to_owned(),
                    head: head.to_owned(),
                })
            }
            _ => Err("a git work tree's top or HEAD is not what git prints".to_owned()),
        }
    }
}

/// What the child's work is measured from.
#[derive(Clone, Debug)]
pub(super) struct Base {
    /// The roots read at the fork (absolute).
    pub(super) roots: Vec<String>,
    /// What under them never comes back: the caches, the Hermes home (absolute).
    pub(super) prune: Vec<String>,
    /// The git work trees at the fork: they come back as branches, and are left out of the
    /// manifests.
    pub(super) trees: Vec<WorkTree>,
    /// The parent's manifest of the roots at the fork.
    pub(super) parent: Manifest,
    /// The parent's file clock at the fork.
    pub(super) parent_since: Stamp,
    /// How the child's changes are found.
    pub(super) child: ChildChanges,
    /// Directories outside the roots the child's commands ran in (recorded for a crash's
    /// recovery; the live child's backend knows its own).
    pub(super) late: Vec<String>,
}

impl Backend {
    /// Brings back the work of a child whose process died before it came back (the fork
    /// `record` names, made from this backend's sandbox), then kills its fork: what
    /// `hermes e2b pull --subagent` does.
    pub(crate) fn recover_child(&self, record: ForkRecord) -> Result<BringBack, Error> {
        let backend = self.fork_backend(&record.child, &record.fork, None, None)?;
        let child = ChildSandbox {
            id: record.child,
            sandbox_id: record.fork,
            dir: record.dir,
            parent: record.parent,
            forked_at: record.forked_at,
            base: record.base,
            backend,
        };
        let report = self.bring_back(&child)?;
        self.end_child(child)?;
        Ok(report)
    }

    /// Records that a command of this backend ran in `dir`: on a delegated child's fork, a
    /// directory outside the roots its work is compared in becomes one of them (R15), and
    /// the host's record of the fork says so (a crash's recovery compares it too).
    pub fn worked_in(&self, dir: &str) {
        let inner = &*self.inner;
        if inner.subagents.fork_of.get().is_none() || !may_be_root(dir) {
            return;
        }
        let mut late = inner
            .subagents
            .worked_in
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if late.contains(dir) || late.len() >= MAX_LATE_ROOTS {
            return;
        }
        late.insert(dir.to_owned());
        if let crate::config::SandboxMode::Attach { sandbox_id } = &inner.config.mode {
            ForkRecord::add_late(&inner.scope.profile_home, sandbox_id, dir);
        }
    }

    /// Brings `child`'s work back into the scope's sandbox (R15):
    ///
    /// - each git work tree it changed, as the branch `hermes-subagent/<id>` in that
    ///   repository (its commits, and one more of what it left uncommitted; the parent's
    ///   work tree and checked-out branch untouched);
    /// - every other file it created, changed or deleted under the roots (the home less its
    ///   caches, the working directory, the configured paths, the directories its commands
    ///   ran in), by [`Plan`]: applied where the parent left the file as it was at the fork,
    ///   else the child's version beside the parent's;
    /// - its skills and memories under the Hermes home;
    /// - and what it changed elsewhere ([`crate::ELSEWHERE`]) named, not copied.
    ///
    /// Runs under the scope's state lock, like a file operation, so no parent command runs
    /// meanwhile.
    pub fn bring_back(&self, child: &ChildSandbox) -> Result<BringBack, Error> {
        let base = &child.base;
        let late = self.late_roots(child);
        let mut report = self.bring_back_work(child, &late)?;
        let mut branches = Vec::new();
        for (tree, changed) in base.trees.iter().zip(&report.changed_trees) {
            if *changed {
                branches.push(self.bring_back_branch(child, tree)?);
            }
        }
        report.back.branches = branches;
        report.back.state = self.bring_back_state(child)?;
        Ok(report.back)
    }

    /// The directories outside the roots the child's commands ran in (none under another or
    /// under a root).
    fn late_roots(&self, child: &ChildSandbox) -> Vec<String> {
        let seen = child
            .backend
            .inner
            .subagents
            .worked_in
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let dirs = crate::subagent::roots(
            seen.iter()
                .chain(&child.base.late)
                .map(String::as_str)
                .chain(child.base.roots.iter().map(String::as_str)),
        );
        dirs.into_iter()
            .filter(|dir| !child.base.roots.contains(dir))
            .filter(|dir| {
                !child
                    .base
                    .trees
                    .iter()
                    .any(|tree| is_within(dir, &tree.top))
            })
            .collect()
    }

    fn bring_back_branch(
        &self,
        child: &ChildSandbox,
        tree: &WorkTree,
    ) -> Result<BranchBack, Error> {
        let branch = child.id.branch();
        let bundle = format!("/tmp/hermes-subagent-{}.bundle", child.id);
        let script = format!(
            "set -e; cd -- {top}; git checkout -q -B {branch}; git add -A; \
             if ! git diff --cached --quiet; then \
               git -c user.name=hermes-subagent -c user.email=hermes-subagent@e2b.invalid \
                 commit -q --no-verify -m {message}; fi; \
             n=$(git rev-list --count HEAD ^{head}); printf '%s' \"$n\"; \
             if [ \"$n\" -gt 0 ]; then git bundle create {bundle} {head}..{branch} 2>/dev/null; fi",
            top = shell_quote(&tree.top),
            branch = shell_quote(&branch),
            head = shell_quote(&tree.head),
            bundle = shell_quote(&bundle),
            message = shell_quote(&format!(
                "hermes-subagent {}: work left uncommitted",
                child.id
            )),
        );
        let child_id = child.sandbox_id.as_str().to_owned();
        let (commits, data) = child.backend.file_operation(
            "subagent commit",
            TRANSFER_WINDOW,
            |inner, sandbox| {
                let out = inner.script(sandbox, "subagent commit", &script)?;
                let commits: u64 = std::str::from_utf8(&out)
                    .ok()
                    .and_then(|text| text.trim().parse().ok())
                    .ok_or_else(|| Error::UntrustedAnswer {
                        operation: "subagent commit",
                        sandbox_id: child_id.clone(),
                        reason: "the commit count is not a number".to_owned(),
                    })?;
                if commits == 0 {
                    return Ok((0, Bytes::new()));
                }
                let data = inner
                    .block_on(sandbox.read_file(&bundle, inner.config.state_cap))
                    .map_err(|source| {
                        Error::e2b("subagent bundle download", Some(&child_id), source)
                    })?;
                Ok((commits, data))
            },
        )?;
        let back = BranchBack {
            repository: tree.top.clone(),
            branch: branch.clone(),
            commits,
        };
        if commits == 0 {
            return Ok(back);
        }
        let fetch = format!(
            "set -e; cd -- {top}; git fetch -q {bundle} +{branch}:{branch}; rm -f {bundle}",
            top = shell_quote(&tree.top),
            bundle = shell_quote(&bundle),
            branch = shell_quote(&branch),
        );
        self.file_operation("subagent branch", TRANSFER_WINDOW, |inner, sandbox| {
            inner.upload(sandbox, "subagent branch", &bundle, data.clone())?;
            inner.script(sandbox, "subagent branch", &fetch).map(drop)
        })?;
        Ok(back)
    }

    /// The files: both sides' manifests at once (the child's with its changed files packed
    /// in the same answer, and what it changed elsewhere), the plan, and one upload and
    /// script in the parent.
    fn bring_back_work(&self, child: &ChildSandbox, late: &[String]) -> Result<Work, Error> {
        let base = &child.base;
        let mut roots: Vec<String> = base.roots.iter().chain(late).cloned().collect();
        roots.sort_unstable();
        let mut prune = base.prune.clone();
        prune.extend(base.trees.iter().map(|tree| tree.top.clone()));
        let stem = format!("/tmp/hermes-subagent-{}", child.id);
        let since = match &base.child {
            ChildChanges::Since(since) => Some(*since),
            ChildChanges::Listed(_) => None,
        };
        let theirs_script = child_script(&stem, &roots, &prune, &base.trees, since);
        let ours_script = manifest_script(&roots, &prune, None);
        let untrusted = |sandbox: &SandboxId| {
            let sandbox = sandbox.as_str().to_owned();
            move |reason| Error::UntrustedAnswer {
                operation: "subagent manifest",
                sandbox_id: sandbox.clone(),
                reason,
            }
        };
        // The two sandboxes are read at once: two file systems, two state locks.
        let (theirs, ours) = std::thread::scope(|scope| {
            let theirs = scope.spawn(|| {
                child.backend.file_operation(
                    "subagent manifest",
                    TRANSFER_WINDOW,
                    |inner, sandbox| {
                        inner.script_capped(
                            sandbox,
                            "subagent manifest",
                            &theirs_script,
                            inner.config.state_cap,
                        )
                    },
                )
            });
            let ours =
                self.file_operation("subagent manifest", TRANSFER_WINDOW, |inner, sandbox| {
                    inner.script(sandbox, "subagent manifest", &ours_script)
                });
            (
                theirs
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                ours,
            )
        });
        let theirs = ChildAnswer::parse(&theirs?, base.trees.len(), &roots)
            .map_err(untrusted(&child.sandbox_id))?;
        let ours = Manifest::parse(&ours?).map_err(untrusted(&child.parent))?;
        let sides = Sides {
            based: &base.roots,
            parent_base: &base.parent,
            parent_since: base.parent_since,
            parent: &ours,
            child: &theirs.manifest,
            child_changes: &base.child,
        };
        let mut plan = Plan::new(&sides);
        if !plan.undecided.is_empty() {
            // Both changed these: their content decides. The child's versions are in the
            // archive already.
            let child_digests = archive_digests(&theirs.archive, &plan.undecided)
                .map_err(untrusted(&child.sandbox_id))?;
            let list = format!("{stem}.undecided");
            let paths = nul_list(plan.undecided.iter().map(String::as_str));
            let digests = digests_script(&list);
            let answer =
                self.file_operation("subagent compare", TRANSFER_WINDOW, |inner, sandbox| {
                    inner.upload(sandbox, "subagent compare", &list, paths.clone())?;
                    inner.script(sandbox, "subagent compare", &digests)
                })?;
            let parent_digests = parse_digests(&answer).map_err(untrusted(&child.parent))?;
            plan.settle(&parent_digests, &child_digests, &theirs.manifest);
        }
        let absolute = |path: &String| format!("/{path}");
        let back = BringBack {
            child: child.id.to_string(),
            written: plan.write.iter().map(absolute).collect(),
            deleted: plan.delete.iter().map(absolute).collect(),
            conflicts: plan
                .conflicts
                .iter()
                .map(|c| {
                    let beside =
                        (!c.deleted_by_child).then(|| child.id.beside(&format!("/{}", c.path)));
                    (format!("/{}", c.path), beside)
                })
                .collect(),
            compared: roots.clone(),
            unread: theirs
                .manifest
                .unread()
                .union(ours.unread())
                .map(absolute)
                .collect(),
            elsewhere: theirs.elsewhere,
            ..BringBack::default()
        };
        let work = Work {
            back,
            changed_trees: theirs.trees,
        };
        if plan.is_empty() {
            return Ok(work);
        }
        self.apply(child, &stem, &plan, theirs.archive)?;
        Ok(work)
    }

    /// Applies `plan` in the scope's sandbox from the child's `archive`: repacked on the
    /// host with exactly the planned paths (the conflicting files under their names beside
    /// the parent's, so they never touch its paths), then one upload and one `tar -x`, with
    /// the deletions, whatever the number of files.
    fn apply(
        &self,
        child: &ChildSandbox,
        stem: &str,
        plan: &Plan,
        archive: Bytes,
    ) -> Result<(), Error> {
        let beside: BTreeMap<&str, String> = plan
            .conflicts
            .iter()
            .filter(|c| !c.deleted_by_child)
            .map(|c| (c.path.as_str(), child.id.beside(&c.path)))
            .collect();
        let repacked =
            repack(&archive, &plan.write, &beside).map_err(|reason| Error::UntrustedAnswer {
                operation: "subagent pack",
                sandbox_id: child.sandbox_id.as_str().to_owned(),
                reason,
            })?;
        let quoted = shell_quote(stem);
        let mut uploads = Vec::new();
        let mut steps = vec!["cd / || exit 3".to_owned()];
        if let Some(repacked) = repacked {
            uploads.push((format!("{stem}.tar"), Bytes::from(repacked)));
            // Written now (`-m`), as git checks files out: a build in the parent sees the
            // child's files newer than what it built from the older ones.
            steps.push(format!("tar -xmf {quoted}.tar"));
        }
        if !plan.delete.is_empty() {
            uploads.push((
                format!("{stem}.delete"),
                nul_list(plan.delete.iter().map(String::as_str)),
            ));
            steps.push(format!("xargs -0 -r rm -f -- < {quoted}.delete"));
        }
        if uploads.is_empty() {
            return Ok(());
        }
        let script = format!(
            "set -e; trap 'rm -f {quoted}.tar {quoted}.delete' EXIT; {}",
            steps.join("; ")
        );
        self.file_operation("subagent apply", TRANSFER_WINDOW, |inner, sandbox| {
            inner.upload_all(sandbox, "subagent apply", uploads.clone())?;
            inner.script(sandbox, "subagent apply", &script).map(drop)
        })
    }

    /// Keeps a child's fork running after its work came back, for `what` (a process the
    /// child handed off to its parent, which runs there): the host's record of the fork goes
    /// (its work is back) and a note says what holds it, which the inventory shows (`hermes
    /// e2b list`) until [`Backend::end_child`] kills it.
    pub fn hold_child(&self, child: &ChildSandbox, what: &str) {
        let home = &self.inner.scope.profile_home;
        record::write_held(home, &child.sandbox_id, what);
        ForkRecord::remove(home, &child.sandbox_id);
    }

    /// Kills a child's fork once its work is back (or given up on).
    pub fn end_child(&self, child: ChildSandbox) -> Result<(), Error> {
        let inner = &*self.inner;
        let client = inner.client()?;
        let (_, failed) = inner.kill_all(&client, std::slice::from_ref(&child.sandbox_id));
        match failed.into_iter().next() {
            None => {
                ForkRecord::remove(&inner.scope.profile_home, &child.sandbox_id);
                record::remove_held(&inner.scope.profile_home, &child.sandbox_id);
                Ok(())
            }
            Some((id, why)) => Err(Error::InvalidConfig {
                reason: format!("the subagent fork {id} was not killed: {why}"),
            }),
        }
    }
}

impl Backend {
    /// Pauses a child's fork once its work is back and keeps it (`subagent_forks: keep`): a
    /// checkpoint of the child's whole sandbox, listed as the child's, resumable; its record
    /// goes (the work is back, nothing is left to recover).
    pub fn keep_child(&self, child: ChildSandbox) -> Result<(), Error> {
        let inner = &*self.inner;
        let client = inner.client()?;
        inner
            .block_on(client.pause(&child.sandbox_id))
            .map_err(|source| {
                Error::e2b("subagent keep", Some(child.sandbox_id.as_str()), source)
            })?;
        ForkRecord::remove(&inner.scope.profile_home, &child.sandbox_id);
        Ok(())
    }
}

/// What the file part of a bring-back found: the report so far, and which work trees the
/// child changed (in [`Base::trees`]'s order).
struct Work {
    back: BringBack,
    changed_trees: Vec<bool>,
}

impl Inner {
    /// Runs `script` with `bash -c` in `sandbox` (no login shell: no profile is read, as for
    /// the session's own commands) and returns its standard output; a failure (not exit 0) is
    /// an error naming `operation`, the sandbox and the script's stderr.
    pub(in crate::backend) fn script(
        &self,
        sandbox: &Sandbox,
        operation: &'static str,
        script: &str,
    ) -> Result<Bytes, Error> {
        self.script_capped(sandbox, operation, script, ANSWER_LIMIT)
    }

    /// [`Self::script`] whose output may be up to `limit` bytes.
    pub(in crate::backend) fn script_capped(
        &self,
        sandbox: &Sandbox,
        operation: &'static str,
        script: &str,
        limit: u64,
    ) -> Result<Bytes, Error> {
        let id = sandbox.id().as_str().to_owned();
        let output = self
            .block_on(sandbox.run(
                StartOptions::exec(
                    "/bin/bash".to_owned(),
                    vec!["-c".to_owned(), script.to_owned()],
                ),
                limit,
            ))
            .map_err(|source| Error::e2b(operation, Some(&id), source))?;
        if output.end.exit_code != 0 {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(Error::SandboxCommand {
                operation,
                sandbox_id: id,
                exit_code: output.end.exit_code,
                stderr: stderr.trim().chars().take(2000).collect(),
            });
        }
        Ok(output.stdout)
    }

    fn upload(
        &self,
        sandbox: &Sandbox,
        operation: &'static str,
        path: &str,
        data: Bytes,
    ) -> Result<(), Error> {
        self.upload_all(sandbox, operation, vec![(path.to_owned(), data)])
    }

    /// Several files in one request.
    fn upload_all(
        &self,
        sandbox: &Sandbox,
        operation: &'static str,
        files: Vec<(String, Bytes)>,
    ) -> Result<(), Error> {
        let id = sandbox.id().as_str().to_owned();
        let files = files
            .into_iter()
            .map(|(path, data)| e2b_client::UploadFile::bytes(path, data))
            .collect();
        self.block_on(sandbox.write_files(files))
            .map(drop)
            .map_err(|source| Error::e2b(operation, Some(&id), source))
    }
}

/// NUL-terminated paths, as `read -d ''` and `tar --null -T` take them.
fn nul_list<'a>(paths: impl IntoIterator<Item = &'a str>) -> Bytes {
    let mut out = Vec::new();
    for path in paths {
        out.extend_from_slice(path.as_bytes());
        out.push(0);
    }
    Bytes::from(out)
}
