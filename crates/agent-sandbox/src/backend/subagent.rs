//! Delegated children in forks of the scope's sandbox (R15): the child's sandbox (made by
//! `fork.rs`'s [`Backend::fork_children`], asked for through `batch.rs`), and the bring-back
//! into the parent's sandbox under the parent's state lock, so no command of the parent runs
//! while it lands (its Hermes home's part in `state.rs`; the host's record of each fork in
//! `record.rs`; the words in `report.rs`).

use bytes::Bytes;
use e2b_client::{Sandbox, SandboxId, StartOptions};

mod batch;
mod fork;
pub(crate) mod record;
mod report;
mod state;
use super::{Backend, Inner, TRANSFER_WINDOW};
use crate::error::Error;
use crate::subagent::{
    ChildId, Manifest, Plan, digests_script, manifest_script, parse_digests, shell_quote,
};
pub(in crate::backend) use batch::Subagents;
use record::ForkRecord;
pub use report::BringBack;
pub use state::StateBack;

/// The most a script's answer may print (a manifest of [`crate::subagent::MAX_MANIFEST_ENTRIES`]
/// paths fits).
const ANSWER_LIMIT: u64 = 64 << 20;

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
            .field("git", &matches!(self.base, Base::Git { .. }))
            .finish_non_exhaustive()
    }
}

impl ChildSandbox {
    /// A backend whose commands and file operations run in the child's fork (attach mode:
    /// it never kills the fork; [`Backend::end_child`] does).
    pub fn backend(&self) -> &std::sync::Arc<Backend> {
        &self.backend
    }

    /// Whether the working directory is in a git work tree (the work comes back as a
    /// branch).
    pub fn is_git(&self) -> bool {
        matches!(self.base, Base::Git { .. })
    }
}

/// What the child's work is measured from.
#[derive(Clone, Debug)]
pub(super) enum Base {
    /// The work tree's top and its `HEAD` at the fork.
    Git { top: String, head: String },
    /// The directory's files at the fork, as the fork's file system and the parent's report
    /// them.
    Files { child: Manifest, parent: Manifest },
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

    /// Brings `child`'s work back into the scope's sandbox: in a git work tree its commits,
    /// and one more of what it left uncommitted, as the branch `hermes-subagent/<id>` (the
    /// parent's work tree and checked-out branch untouched); elsewhere its file changes, by
    /// [`Plan`]: applied where the parent left the file as it was at the fork, else the
    /// child's version beside the parent's. Runs under the scope's state lock, like a file
    /// operation, so no parent command runs meanwhile.
    pub fn bring_back(&self, child: &ChildSandbox) -> Result<BringBack, Error> {
        let mut report = match &child.base {
            Base::Git { top, head } => self.bring_back_branch(child, top, head),
            Base::Files {
                child: base,
                parent,
            } => self.bring_back_files(child, base, parent),
        }?;
        report.state = self.bring_back_state(child)?;
        Ok(report)
    }

    fn bring_back_branch(
        &self,
        child: &ChildSandbox,
        top: &str,
        head: &str,
    ) -> Result<BringBack, Error> {
        let branch = child.id.branch();
        let bundle = format!("/tmp/hermes-subagent-{}.bundle", child.id);
        let script = format!(
            "set -e; cd -- {top}; git checkout -q -B {branch}; git add -A; \
             if ! git diff --cached --quiet; then \
               git -c user.name=hermes-subagent -c user.email=hermes-subagent@e2b.invalid \
                 commit -q --no-verify -m {message}; fi; \
             n=$(git rev-list --count HEAD ^{head}); printf '%s' \"$n\"; \
             if [ \"$n\" -gt 0 ]; then git bundle create {bundle} {head}..{branch} 2>/dev/null; fi",
            top = shell_quote(top),
            branch = shell_quote(&branch),
            head = shell_quote(head),
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
        let mut report = BringBack {
            child: child.id.to_string(),
            branch: Some(branch.clone()),
            commits,
            ..BringBack::default()
        };
        if commits == 0 {
            return Ok(report);
        }
        let fetch = format!(
            "set -e; cd -- {top}; git fetch -q {bundle} +{branch}:{branch}; rm -f {bundle}",
            top = shell_quote(top),
            bundle = shell_quote(&bundle),
            branch = shell_quote(&branch),
        );
        self.file_operation("subagent branch", TRANSFER_WINDOW, |inner, sandbox| {
            inner.upload(sandbox, "subagent branch", &bundle, data.clone())?;
            inner.script(sandbox, "subagent branch", &fetch).map(drop)
        })?;
        report.commits = commits;
        Ok(report)
    }

    fn bring_back_files(
        &self,
        child: &ChildSandbox,
        child_base: &Manifest,
        parent_base: &Manifest,
    ) -> Result<BringBack, Error> {
        let script = manifest_script(&child.dir);
        let untrusted = |sandbox: &SandboxId| {
            let sandbox = sandbox.as_str().to_owned();
            move |reason| Error::UntrustedAnswer {
                operation: "subagent manifest",
                sandbox_id: sandbox.clone(),
                reason,
            }
        };
        // The two sandboxes are read at once: two file systems, two state locks.
        let manifest_of = |backend: &Backend| {
            backend.file_operation("subagent manifest", TRANSFER_WINDOW, |inner, sandbox| {
                inner.script(sandbox, "subagent manifest", &script)
            })
        };
        let (theirs, ours) = std::thread::scope(|scope| {
            let theirs = scope.spawn(|| manifest_of(&child.backend));
            let ours = manifest_of(self);
            (
                theirs
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                ours,
            )
        });
        let theirs = Manifest::parse(&theirs?).map_err(untrusted(&child.sandbox_id))?;
        let ours = Manifest::parse(&ours?).map_err(untrusted(&child.parent))?;
        let mut plan = Plan::new(child_base, &theirs, parent_base, &ours);
        if !plan.undecided.is_empty() {
            // Both changed these: their content decides.
            let list = format!("/tmp/hermes-subagent-{}.undecided", child.id);
            let paths = nul_list(plan.undecided.iter().map(String::as_str));
            let digests = digests_script(&child.dir, &list);
            let read = |backend: &Backend, sandbox_id: &SandboxId| {
                let answer = backend.file_operation(
                    "subagent compare",
                    TRANSFER_WINDOW,
                    |inner, sandbox| {
                        inner.upload(sandbox, "subagent compare", &list, paths.clone())?;
                        inner.script(sandbox, "subagent compare", &digests)
                    },
                )?;
                parse_digests(&answer).map_err(untrusted(sandbox_id))
            };
            let child_digests = read(&child.backend, &child.sandbox_id)?;
            let parent_digests = read(self, &child.parent)?;
            plan.settle(&parent_digests, &child_digests, &theirs);
        }
        let mut report = BringBack {
            child: child.id.to_string(),
            written: plan.write.clone(),
            deleted: plan.delete.clone(),
            conflicts: plan
                .conflicts
                .iter()
                .map(|c| {
                    let beside = (!c.deleted_by_child).then(|| child.id.beside(&c.path));
                    (c.path.clone(), beside)
                })
                .collect(),
            ..BringBack::default()
        };
        if plan.is_empty() {
            return Ok(report);
        }
        let stem = format!("/tmp/hermes-subagent-{}", child.id);
        // One archive: what the parent takes as it is under its own paths, and the conflicting
        // files under `aside`, to land beside the parent's; a constant number of processes
        // and requests whatever the number of files.
        let beside: Vec<&str> = plan
            .conflicts
            .iter()
            .filter(|c| !c.deleted_by_child)
            .map(|c| c.path.as_str())
            .collect();
        let quoted = shell_quote(&stem);
        // The conflicting files' top directory in the archive: a name no child's file has.
        let aside = format!(".hermes-subagent-{}.beside", child.id);
        let mut lists = vec![(
            format!("{stem}.write"),
            nul_list(plan.write.iter().map(String::as_str)),
        )];
        // The archive comes back as the script's output: nothing is written to the fork's
        // disk, and no download follows.
        let mut pack = format!("set -e; cd -- {dir}; ", dir = shell_quote(&child.dir));
        if beside.is_empty() {
            pack.push_str(&format!("tar -cf - --null -T {quoted}.write"));
        } else {
            lists.push((format!("{stem}.beside"), nul_list(beside.iter().copied())));
            pack.push_str(&format!(
                "tar -cf {quoted}.tar --null -T {quoted}.write; \
                 tar -rf {quoted}.tar --null --transform 's,^,{aside}/,' -T {quoted}.beside; \
                 cat {quoted}.tar; rm -f {quoted}.tar"
            ));
        }
        pack.push_str(&format!("; rm -f {quoted}.write {quoted}.beside"));
        let archive =
            child
                .backend
                .file_operation("subagent pack", TRANSFER_WINDOW, |inner, sandbox| {
                    inner.upload_all(sandbox, "subagent pack", lists.clone())?;
                    inner.script_capped(sandbox, "subagent pack", &pack, inner.config.state_cap)
                })?;
        let mut uploads = vec![(format!("{stem}.tar"), archive)];
        // Unpacked in place once (each file is written once): the conflicting files, under
        // `aside` in the archive, are left out there and unpacked aside, so they never touch
        // the parent's paths.
        let mut apply = format!(
            "set -e; cd -- {dir}; tar -xf {quoted}.tar",
            dir = shell_quote(&child.dir)
        );
        if !beside.is_empty() {
            uploads.push((format!("{stem}.beside"), nul_list(beside.iter().copied())));
            apply.push_str(&format!(
                " --anchored --exclude={aside}; rm -rf {quoted}.besides; mkdir -p {quoted}.besides; \
                 tar -xf {quoted}.tar -C {quoted}.besides -- {aside}; \
                 while IFS= read -r -d '' p; do mkdir -p \"$(dirname -- \"$p\")\"; \
                 mv -- {quoted}.besides/{aside}/\"$p\" \"$p\"{suffix}; done < {quoted}.beside",
                aside = shell_quote(&aside),
                suffix = shell_quote(&format!("{}{}", crate::subagent::CONFLICT_SUFFIX, child.id)),
            ));
        }
        if !plan.delete.is_empty() {
            uploads.push((
                format!("{stem}.delete"),
                nul_list(plan.delete.iter().map(String::as_str)),
            ));
            apply.push_str(&format!("; xargs -0 -r rm -f -- < {quoted}.delete"));
        }
        apply.push_str(&format!(
            "; rm -rf {quoted}.besides {quoted}.tar {quoted}.beside {quoted}.delete"
        ));
        self.file_operation("subagent apply", TRANSFER_WINDOW, |inner, sandbox| {
            inner.upload_all(sandbox, "subagent apply", uploads.clone())?;
            inner.script(sandbox, "subagent apply", &apply).map(drop)
        })?;
        report.child = child.id.to_string();
        Ok(report)
    }

    /// Kills a child's fork once its work is back (or given up on).
    pub fn end_child(&self, child: ChildSandbox) -> Result<(), Error> {
        let inner = &*self.inner;
        let client = inner.client()?;
        let (_, failed) = inner.kill_all(&client, std::slice::from_ref(&child.sandbox_id));
        match failed.into_iter().next() {
            None => {
                ForkRecord::remove(&inner.scope.profile_home, &child.sandbox_id);
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

impl Inner {
    /// Runs `script` with `bash -c` in `sandbox` (no login shell: no profile is read, as for
    /// the session's own commands) and returns its standard output; a failure (not exit 0) is
    /// an error naming `operation`, the sandbox and the script's stderr.
    fn script(
        &self,
        sandbox: &Sandbox,
        operation: &'static str,
        script: &str,
    ) -> Result<Bytes, Error> {
        self.script_capped(sandbox, operation, script, ANSWER_LIMIT)
    }

    /// [`Self::script`] whose output may be up to `limit` bytes.
    fn script_capped(
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
