//! Git in a sandbox: what [`Git`](crate::Git) takes and answers, and the parsing of git's
//! machine-readable output. The commands themselves run in the sandbox (`sandbox/git.rs`).

use crate::secret::SecretValue;

/// A username and password (or token) for an HTTP(S) remote. The password never reaches a
/// command line, an environment, an error or a log: it is written to a credential file only
/// the sandbox's user can read, through a process's stdin, for the one command that needs it,
/// and the file is removed after.
#[derive(Clone, Debug)]
pub struct GitCredentials {
    /// The username (for a token, whatever the host expects: `x-access-token`, `oauth2`, …).
    pub username: String,
    /// The password or token.
    pub password: SecretValue,
}

/// How to clone. Start from [`CloneOptions::new`].
#[derive(Clone, Debug)]
pub struct CloneOptions {
    /// Check out this branch (and fetch only it).
    pub branch: Option<String>,
    /// A shallow clone of this many commits.
    pub depth: Option<u32>,
    /// Credentials for a private HTTP(S) remote.
    pub credentials: Option<GitCredentials>,
}

impl CloneOptions {
    /// The default branch, whole history, no credentials.
    pub fn new() -> CloneOptions {
        CloneOptions {
            branch: None,
            depth: None,
            credentials: None,
        }
    }
}

impl Default for CloneOptions {
    fn default() -> CloneOptions {
        CloneOptions::new()
    }
}

/// Which remote and branch a push or pull uses, and with what credentials. Start from
/// [`RemoteOptions::new`].
#[derive(Clone, Debug)]
pub struct RemoteOptions {
    /// The remote (`origin` when `None`).
    pub remote: Option<String>,
    /// The branch (git's default for the current branch when `None`).
    pub branch: Option<String>,
    /// Credentials for a private HTTP(S) remote.
    pub credentials: Option<GitCredentials>,
}

impl RemoteOptions {
    /// `origin`, git's default branch, no credentials.
    pub fn new() -> RemoteOptions {
        RemoteOptions {
            remote: None,
            branch: None,
            credentials: None,
        }
    }
}

impl Default for RemoteOptions {
    fn default() -> RemoteOptions {
        RemoteOptions::new()
    }
}

/// Who a commit is by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GitAuthor {
    /// `user.name`.
    pub name: String,
    /// `user.email`.
    pub email: String,
}

/// Whether a branch is deleted only when merged (`-d`) or regardless (`-D`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BranchDeletion {
    /// Refused by git when the branch is not merged.
    IfMerged,
    /// Deleted whatever it holds.
    Force,
}

/// `git reset`'s mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetMode {
    /// Moves the branch only.
    Soft,
    /// Also resets the index (git's default).
    Mixed,
    /// Also resets the working tree: uncommitted changes are lost.
    Hard,
}

impl ResetMode {
    pub(crate) fn flag(self) -> &'static str {
        match self {
            ResetMode::Soft => "--soft",
            ResetMode::Mixed => "--mixed",
            ResetMode::Hard => "--hard",
        }
    }
}

/// What `git restore` restores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreTarget {
    /// The working tree, from the index (git's default).
    WorkTree,
    /// The index (unstages), from `HEAD`.
    Staged,
    /// Both.
    Both,
}

/// Where a config value lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GitConfigScope {
    /// The repository at this path (`git -C <path> config`).
    Repository(String),
    /// The sandbox user's global config (`git config --global`).
    Global,
}

/// One changed path of `git status`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GitFileStatus {
    /// The path, relative to the repository.
    pub path: String,
    /// Its state in the index, as git's letter (`M`, `A`, `D`, `R`, `C`, `U`, `.` unchanged,
    /// `?` untracked).
    pub index: char,
    /// Its state in the working tree, the same letters.
    pub work_tree: char,
    /// For a rename or copy, where it came from.
    pub original_path: Option<String>,
}

/// `git status` of a repository.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GitStatus {
    /// The current branch; `None` when `HEAD` is detached.
    pub branch: Option<String>,
    /// The upstream branch, when one is set.
    pub upstream: Option<String>,
    /// Commits ahead of the upstream.
    pub ahead: u64,
    /// Commits behind the upstream.
    pub behind: u64,
    /// Every changed, untracked or conflicted path.
    pub files: Vec<GitFileStatus>,
}

impl GitStatus {
    /// Nothing to commit and nothing untracked.
    pub fn is_clean(&self) -> bool {
        self.files.is_empty()
    }

    /// Parses `git status --porcelain=v2 --branch -z`; lines it does not know are skipped.
    pub(crate) fn parse(output: &[u8]) -> GitStatus {
        let text = String::from_utf8_lossy(output);
        let mut records = text.split('\0');
        let mut status = GitStatus::default();
        while let Some(record) = records.next() {
            if let Some(header) = record.strip_prefix("# ") {
                let (key, value) = header.split_once(' ').unwrap_or((header, ""));
                match key {
                    "branch.head" if value != "(detached)" => {
                        status.branch = Some(value.to_owned());
                    }
                    "branch.upstream" => status.upstream = Some(value.to_owned()),
                    "branch.ab" => {
                        for part in value.split_whitespace() {
                            if let Some(n) = part.strip_prefix('+') {
                                status.ahead = n.parse().unwrap_or(0);
                            } else if let Some(n) = part.strip_prefix('-') {
                                status.behind = n.parse().unwrap_or(0);
                            }
                        }
                    }
                    _ => {}
                }
                continue;
            }
            let mut fields = record.splitn(2, ' ');
            let (Some(kind), Some(rest)) = (fields.next(), fields.next()) else {
                continue;
            };
            // Fields before the path: ordinary 7, rename/copy 8, unmerged 9.
            let (before_path, renamed) = match kind {
                "1" => (7, false),
                "2" => (8, true),
                "u" => (9, false),
                "?" => {
                    status.files.push(GitFileStatus {
                        path: rest.to_owned(),
                        index: '?',
                        work_tree: '?',
                        original_path: None,
                    });
                    continue;
                }
                _ => continue,
            };
            let parts: Vec<&str> = rest.splitn(before_path + 1, ' ').collect();
            let (Some(xy), Some(path)) = (parts.first(), parts.get(before_path)) else {
                continue;
            };
            let mut letters = xy.chars();
            let original_path = if renamed {
                records.next().map(str::to_owned)
            } else {
                None
            };
            status.files.push(GitFileStatus {
                path: (*path).to_owned(),
                index: letters.next().unwrap_or('.'),
                work_tree: letters.next().unwrap_or('.'),
                original_path,
            });
        }
        status
    }
}

/// The local branches of a repository.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GitBranches {
    /// The checked-out branch; `None` when `HEAD` is detached or the repository is empty.
    pub current: Option<String>,
    /// Every local branch, in git's order.
    pub local: Vec<String>,
}

impl GitBranches {
    /// Parses `git for-each-ref --format=%(HEAD)%(refname:short) refs/heads`.
    pub(crate) fn parse(output: &[u8]) -> GitBranches {
        let mut branches = GitBranches::default();
        for line in String::from_utf8_lossy(output).lines() {
            let (head, name) = line.split_at(line.len().min(1));
            if name.is_empty() {
                continue;
            }
            if head == "*" {
                branches.current = Some(name.to_owned());
            }
            branches.local.push(name.to_owned());
        }
        branches
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn porcelain_v2_status_gives_the_branch_its_distance_and_every_kind_of_change() {
        let output = b"# branch.oid 1234\0# branch.head main\0# branch.upstream origin/main\0\
# branch.ab +2 -1\0\
1 .M N... 100644 100644 100644 aaa bbb tracked file.txt\0\
1 A. N... 000000 100644 100644 000 ccc added.txt\0\
2 R. N... 100644 100644 100644 ddd ddd R100 new name.txt\0old name.txt\0\
u UU N... 100644 100644 100644 100644 e f g both.txt\0\
? untracked dir/x.txt\0";
        let status = GitStatus::parse(output);
        assert_eq!(status.branch.as_deref(), Some("main"));
        assert_eq!(status.upstream.as_deref(), Some("origin/main"));
        assert_eq!((status.ahead, status.behind), (2, 1));
        let summary: Vec<(&str, char, char, Option<&str>)> = status
            .files
            .iter()
            .map(|f| {
                (
                    f.path.as_str(),
                    f.index,
                    f.work_tree,
                    f.original_path.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("tracked file.txt", '.', 'M', None),
                ("added.txt", 'A', '.', None),
                ("new name.txt", 'R', '.', Some("old name.txt")),
                ("both.txt", 'U', 'U', None),
                ("untracked dir/x.txt", '?', '?', None),
            ]
        );
        assert!(!status.is_clean());
        let detached = GitStatus::parse(b"# branch.oid 1\0# branch.head (detached)\0");
        assert_eq!(detached.branch, None);
        assert!(detached.is_clean());
    }

    #[test]
    fn branches_name_the_current_one() {
        let branches = GitBranches::parse(b" feature\n*main\n other/x\n");
        assert_eq!(branches.current.as_deref(), Some("main"));
        assert_eq!(branches.local, ["feature", "main", "other/x"]);
    }
}
