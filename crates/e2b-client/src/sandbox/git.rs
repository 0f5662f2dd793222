//! Git in the sandbox: each helper runs `git` there (an argv, no shell), as the official
//! SDK's `sandbox.git` does, with credentials kept off every command line.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::Sandbox;
use crate::error::{Error, Operation};
use crate::git::{
    BranchDeletion, CloneOptions, GitAuthor, GitBranches, GitConfigScope, GitCredentials,
    GitStatus, RemoteOptions, ResetMode, RestoreTarget,
};
use crate::process::{ProcessStdin, StartOptions};

/// The most output a git helper keeps (status of a large tree, a clone's progress).
const OUTPUT_LIMIT: u64 = 16 << 20;

/// Names the credential files of this process apart.
static CREDENTIAL_FILES: AtomicU64 = AtomicU64::new(0);

/// Git in one sandbox; from [`Sandbox::git`]. Every path is the repository's directory in
/// the sandbox; a git that exits non-zero is [`Error::is_command_failed`] with the end of
/// its stderr, and a refused or missing login [`Error::is_git_auth_failure`].
#[derive(Clone, Debug)]
pub struct Git {
    sandbox: Sandbox,
}

impl Sandbox {
    /// Git helpers that run `git` in this sandbox (it must have git).
    ///
    /// ```no_run
    /// # async fn run(sandbox: &e2b_client::Sandbox) -> Result<(), e2b_client::Error> {
    /// use e2b_client::{CloneOptions, GitAuthor};
    /// let git = sandbox.git();
    /// let repo = "/home/user/cookbook";
    /// git.clone_repo("https://github.com/e2b-dev/e2b-cookbook", repo, CloneOptions::new())
    ///     .await?;
    /// sandbox.write_file("/home/user/cookbook/NOTES.md", "notes".into()).await?;
    /// git.add(repo, &["NOTES.md"]).await?;
    /// let author = GitAuthor { name: "Agent".into(), email: "agent@example.com".into() };
    /// git.commit(repo, "add notes", Some(&author)).await?;
    /// let status = git.status(repo).await?;
    /// println!("on {:?}, {} commit(s) ahead", status.branch, status.ahead);
    /// # Ok(()) }
    /// ```
    pub fn git(&self) -> Git {
        Git {
            sandbox: self.clone(),
        }
    }
}

impl Git {
    /// `git clone <url> <path>` (with `--branch`, `--single-branch` and `--depth` as asked).
    pub async fn clone_repo(
        &self,
        url: &str,
        path: &str,
        options: CloneOptions,
    ) -> Result<(), Error> {
        let mut args = vec!["clone".to_owned()];
        if let Some(branch) = &options.branch {
            args.extend([
                "--branch".to_owned(),
                branch.clone(),
                "--single-branch".to_owned(),
            ]);
        }
        if let Some(depth) = options.depth {
            args.extend(["--depth".to_owned(), depth.to_string()]);
        }
        args.extend(["--".to_owned(), url.to_owned(), path.to_owned()]);
        self.with_credentials(url, options.credentials.as_ref(), None, args)
            .await
            .map(drop)
    }

    /// `git init` (with `--initial-branch` when given).
    pub async fn init(&self, path: &str, initial_branch: Option<&str>) -> Result<(), Error> {
        let mut args = vec!["init".to_owned()];
        if let Some(branch) = initial_branch {
            args.push(format!("--initial-branch={branch}"));
        }
        args.extend(["--".to_owned(), path.to_owned()]);
        self.git(None, args).await.map(drop)
    }

    /// The branch, its distance from its upstream, and every changed path.
    pub async fn status(&self, path: &str) -> Result<GitStatus, Error> {
        let out = self
            .git(
                Some(path),
                strings(&["status", "--porcelain=v2", "--branch", "-z"]),
            )
            .await?;
        Ok(GitStatus::parse(&out))
    }

    /// The local branches and the current one.
    pub async fn branches(&self, path: &str) -> Result<GitBranches, Error> {
        let out = self
            .git(
                Some(path),
                strings(&[
                    "for-each-ref",
                    "--format=%(HEAD)%(refname:short)",
                    "refs/heads",
                ]),
            )
            .await?;
        Ok(GitBranches::parse(&out))
    }

    /// Creates a branch at `HEAD` and checks it out (`git checkout -b`).
    pub async fn create_branch(&self, path: &str, name: &str) -> Result<(), Error> {
        self.git(Some(path), strings(&["checkout", "-b", name]))
            .await
            .map(drop)
    }

    /// Checks a branch out.
    pub async fn checkout_branch(&self, path: &str, name: &str) -> Result<(), Error> {
        self.git(Some(path), strings(&["checkout", name, "--"]))
            .await
            .map(drop)
    }

    /// Deletes a branch.
    pub async fn delete_branch(
        &self,
        path: &str,
        name: &str,
        deletion: BranchDeletion,
    ) -> Result<(), Error> {
        let flag = match deletion {
            BranchDeletion::IfMerged => "-d",
            BranchDeletion::Force => "-D",
        };
        self.git(Some(path), strings(&["branch", flag, "--", name]))
            .await
            .map(drop)
    }

    /// Stages `files` (`git add -- <files>`), or every change when `files` is empty
    /// (`git add -A`).
    pub async fn add(&self, path: &str, files: &[&str]) -> Result<(), Error> {
        let mut args = vec!["add".to_owned()];
        if files.is_empty() {
            args.push("-A".to_owned());
        } else {
            args.push("--".to_owned());
            args.extend(files.iter().map(|f| (*f).to_owned()));
        }
        self.git(Some(path), args).await.map(drop)
    }

    /// Commits what is staged, by `author` when given (else the configured user).
    pub async fn commit(
        &self,
        path: &str,
        message: &str,
        author: Option<&GitAuthor>,
    ) -> Result<(), Error> {
        let mut args = Vec::new();
        if let Some(author) = author {
            args.extend([
                "-c".to_owned(),
                format!("user.name={}", author.name),
                "-c".to_owned(),
                format!("user.email={}", author.email),
            ]);
        }
        args.extend(["commit".to_owned(), "-m".to_owned(), message.to_owned()]);
        self.git(Some(path), args).await.map(drop)
    }

    /// `git reset <mode> [target]` (`HEAD` when `target` is `None`).
    pub async fn reset(
        &self,
        path: &str,
        mode: ResetMode,
        target: Option<&str>,
    ) -> Result<(), Error> {
        let mut args = strings(&["reset", mode.flag()]);
        if let Some(target) = target {
            args.push(target.to_owned());
        }
        args.push("--".to_owned());
        self.git(Some(path), args).await.map(drop)
    }

    /// `git restore` of `files` (every file when empty).
    pub async fn restore(
        &self,
        path: &str,
        files: &[&str],
        target: RestoreTarget,
    ) -> Result<(), Error> {
        let mut args = vec!["restore".to_owned()];
        match target {
            RestoreTarget::WorkTree => args.push("--worktree".to_owned()),
            RestoreTarget::Staged => args.push("--staged".to_owned()),
            RestoreTarget::Both => args.extend(strings(&["--staged", "--worktree"])),
        }
        args.push("--".to_owned());
        if files.is_empty() {
            args.push(".".to_owned());
        } else {
            args.extend(files.iter().map(|f| (*f).to_owned()));
        }
        self.git(Some(path), args).await.map(drop)
    }

    /// `git push` (setting the upstream), with credentials when given.
    pub async fn push(&self, path: &str, options: RemoteOptions) -> Result<(), Error> {
        let remote = options
            .remote
            .clone()
            .unwrap_or_else(|| "origin".to_owned());
        let mut args = strings(&["push", "--set-upstream", &remote]);
        args.extend(options.branch.clone());
        self.remote_command(path, &remote, options.credentials.as_ref(), args)
            .await
    }

    /// `git pull`, with credentials when given.
    pub async fn pull(&self, path: &str, options: RemoteOptions) -> Result<(), Error> {
        let remote = options
            .remote
            .clone()
            .unwrap_or_else(|| "origin".to_owned());
        let mut args = strings(&["pull", &remote]);
        args.extend(options.branch.clone());
        self.remote_command(path, &remote, options.credentials.as_ref(), args)
            .await
    }

    /// Adds a remote.
    pub async fn remote_add(&self, path: &str, name: &str, url: &str) -> Result<(), Error> {
        self.git(Some(path), strings(&["remote", "add", name, url]))
            .await
            .map(drop)
    }

    /// A remote's URL; `None` when there is no such remote.
    pub async fn remote_url(&self, path: &str, name: &str) -> Result<Option<String>, Error> {
        match self
            .git(Some(path), strings(&["remote", "get-url", name]))
            .await
        {
            Ok(out) => Ok(Some(String::from_utf8_lossy(&out).trim().to_owned())),
            Err(Error::CommandFailed { exit_code: 2, .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Sets a config value.
    pub async fn set_config(
        &self,
        scope: &GitConfigScope,
        key: &str,
        value: &str,
    ) -> Result<(), Error> {
        let (path, mut args) = config_args(scope);
        args.extend(["--".to_owned(), key.to_owned(), value.to_owned()]);
        self.git(path, args).await.map(drop)
    }

    /// A config value; `None` when it is not set.
    pub async fn get_config(
        &self,
        scope: &GitConfigScope,
        key: &str,
    ) -> Result<Option<String>, Error> {
        let (path, mut args) = config_args(scope);
        args.extend(["--get".to_owned(), "--".to_owned(), key.to_owned()]);
        match self.git(path, args).await {
            Ok(out) => Ok(Some(String::from_utf8_lossy(&out).trim_end().to_owned())),
            // git config exits 1 for a key that is not set.
            Err(Error::CommandFailed { exit_code: 1, .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// A push or pull: with credentials, for the remote's own URL.
    async fn remote_command(
        &self,
        path: &str,
        remote: &str,
        credentials: Option<&GitCredentials>,
        args: Vec<String>,
    ) -> Result<(), Error> {
        let url = match credentials {
            None => String::new(),
            Some(_) => self.remote_url(path, remote).await?.ok_or_else(|| {
                self.sandbox.ctx(Operation::Git).invalid_input(format!(
                    "the repository has no remote '{remote}' to authenticate to"
                ))
            })?,
        };
        self.with_credentials(&url, credentials, Some(path), args)
            .await
            .map(drop)
    }

    /// Runs git with `credentials` for `url` in a credential file of its own (written
    /// through stdin, readable by the sandbox's user only, removed after), or plainly.
    async fn with_credentials(
        &self,
        url: &str,
        credentials: Option<&GitCredentials>,
        path: Option<&str>,
        args: Vec<String>,
    ) -> Result<Bytes, Error> {
        let Some(credentials) = credentials else {
            return self.git(path, args).await;
        };
        let ctx = self
            .sandbox
            .ctx(Operation::Git)
            .with_secrets(vec![credentials.password.clone()]);
        let parsed = reqwest::Url::parse(url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
            .ok_or_else(|| {
                ctx.invalid_input("credentials are for an http(s) remote; this one is not")
            })?;
        let mut line = parsed.clone();
        line.set_path("");
        line.set_query(None);
        line.set_fragment(None);
        if line.set_username(&credentials.username).is_err()
            || line
                .set_password(Some(credentials.password.expose()))
                .is_err()
        {
            return Err(ctx.invalid_input("the remote's URL cannot carry credentials"));
        }
        let file = format!(
            "/tmp/.e2b-git-credentials-{}-{}",
            std::process::id(),
            CREDENTIAL_FILES.fetch_add(1, Ordering::Relaxed)
        );
        let mut entry = line.as_str().trim_end_matches('/').to_owned();
        entry.push('\n');
        self.write_private(&file, entry.into_bytes()).await?;
        let mut with_helper = strings(&[
            "-c",
            "credential.helper=",
            "-c",
            &format!("credential.helper=store --file={file}"),
        ]);
        with_helper.extend(args);
        let outcome = self.git_with(path, with_helper, &ctx).await;
        // Removed whatever happened; a failure here leaves a file only its user can read.
        let _ = self
            .sandbox
            .run(
                StartOptions::exec("rm".to_owned(), strings(&["-f", "--", &file])),
                1024,
            )
            .await;
        outcome
    }

    /// Writes `data` to a new file only the sandbox's user can read, through a process's
    /// stdin (so it is on no command line).
    async fn write_private(&self, file: &str, data: Vec<u8>) -> Result<(), Error> {
        let mut options = StartOptions::exec(
            "/bin/sh".to_owned(),
            strings(&["-c", "umask 077 && cat > \"$1\"", "sh", file]),
        );
        options.stdin = ProcessStdin::Open;
        let started = self.sandbox.start(options).await?;
        let pid = started.pid();
        self.sandbox.send_stdin(pid, &data).await?;
        self.sandbox.close_stdin(pid).await?;
        let out = started.collect_output(1024).await?;
        if out.end.exit_code != 0 {
            let ctx = self.sandbox.ctx(Operation::Git);
            return Err(ctx.command_failed(
                self.sandbox.id(),
                "write credentials",
                out.end.exit_code,
                &out.stderr,
            ));
        }
        Ok(())
    }

    async fn git(&self, path: Option<&str>, args: Vec<String>) -> Result<Bytes, Error> {
        let ctx = self.sandbox.ctx(Operation::Git);
        self.git_with(path, args, &ctx).await
    }

    /// Runs `git [-C path] <args>` with prompts off; its stdout, or the error.
    async fn git_with(
        &self,
        path: Option<&str>,
        args: Vec<String>,
        ctx: &crate::http::Ctx,
    ) -> Result<Bytes, Error> {
        let subcommand = args
            .iter()
            .scan(false, |skip, arg| {
                // `-c key=value` pairs come before the subcommand.
                let this = if *skip {
                    *skip = false;
                    None
                } else if arg == "-c" {
                    *skip = true;
                    None
                } else {
                    Some(arg.clone())
                };
                Some(this)
            })
            .flatten()
            .next()
            .unwrap_or_default();
        let mut argv = Vec::new();
        if let Some(path) = path {
            argv.extend(["-C".to_owned(), path.to_owned()]);
        }
        argv.extend(args);
        let mut options = StartOptions::exec("git".to_owned(), argv);
        options
            .envs
            .insert("GIT_TERMINAL_PROMPT".to_owned(), "0".to_owned());
        let out = self.sandbox.run(options, OUTPUT_LIMIT).await?;
        if out.end.exit_code == 0 {
            Ok(out.stdout)
        } else {
            Err(ctx.command_failed(
                self.sandbox.id(),
                &format!("git {subcommand}"),
                out.end.exit_code,
                &out.stderr,
            ))
        }
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn config_args(scope: &GitConfigScope) -> (Option<&str>, Vec<String>) {
    match scope {
        GitConfigScope::Repository(path) => (Some(path.as_str()), strings(&["config"])),
        GitConfigScope::Global => (None, strings(&["config", "--global"])),
    }
}
