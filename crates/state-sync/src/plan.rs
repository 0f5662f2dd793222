//! Upload and delete plans: plain data the caller sends with e2b-client.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use crate::Error;

/// The longest shell command [`UploadPlan::mkdir_commands`] and [`DeletePlan::commands`] render.
///
/// Linux refuses a single `execve` argument longer than 128 KiB (`MAX_ARG_STRLEN`), and the
/// caller passes the command as one `bash -c` argument, so longer lists are split.
pub const MAX_COMMAND_BYTES: usize = 96 * 1024;

/// One file of an upload: where it is read on the host and where it lands in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadPart {
    /// The host file to read. It may be a temporary copy Hermes made; nothing is inferred from it.
    pub host_path: PathBuf,
    /// The absolute destination path in the sandbox, exactly as Hermes gave it.
    pub remote_path: String,
}

/// One request's worth of files, plus the remote directories they need.
///
/// E2B's multi-file upload creates parent directories itself; [`UploadPlan::parent_dirs`] is
/// there for transports that do not (contract S4: every parent exists, and all files go in one
/// request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadPlan {
    parts: Vec<UploadPart>,
    parent_dirs: Vec<String>,
}

impl UploadPlan {
    /// Plans one upload from Hermes' `(host path, remote path)` pairs.
    ///
    /// Pairs repeated verbatim are sent once. Refused: a remote path that is not absolute and
    /// normalised, the same remote path for two different host files, and a remote path that is
    /// both a file and the parent of another file.
    pub fn new(files: Vec<(PathBuf, String)>) -> Result<Self, Error> {
        let mut parts: Vec<UploadPart> = Vec::with_capacity(files.len());
        let mut by_remote: HashMap<String, usize> = HashMap::with_capacity(files.len());
        for (host_path, remote_path) in files {
            check_remote_path("plan upload", &remote_path)?;
            if let Some(&index) = by_remote.get(&remote_path) {
                let first = &parts[index].host_path;
                if *first == host_path {
                    continue;
                }
                return Err(Error::DuplicateRemotePath {
                    path: remote_path,
                    first: first.clone(),
                    second: host_path,
                });
            }
            by_remote.insert(remote_path.clone(), parts.len());
            parts.push(UploadPart {
                host_path,
                remote_path,
            });
        }

        let mut parents = BTreeSet::new();
        for part in &parts {
            let mut ancestor = parent_of(&part.remote_path);
            // Every ancestor must not be a planned file; the immediate parent is what gets created.
            if let Some(parent) = ancestor {
                parents.insert(parent.to_owned());
            }
            while let Some(dir) = ancestor {
                if by_remote.contains_key(dir) {
                    return Err(Error::FileAndDirectory {
                        path: dir.to_owned(),
                    });
                }
                ancestor = parent_of(dir);
            }
        }
        Ok(Self {
            parts,
            parent_dirs: parents.into_iter().collect(),
        })
    }

    /// The files to send, in the order given, without repeats.
    pub fn parts(&self) -> &[UploadPart] {
        &self.parts
    }

    /// The distinct remote parent directories of the parts, sorted (`/` itself is never listed).
    pub fn parent_dirs(&self) -> &[String] {
        &self.parent_dirs
    }

    /// True when there is nothing to send (no request should be made).
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// `mkdir -p -- ...` commands creating [`UploadPlan::parent_dirs`], split so that none is
    /// longer than [`MAX_COMMAND_BYTES`]. Empty when there is nothing to create.
    pub fn mkdir_commands(&self) -> Vec<String> {
        chunked_commands("mkdir -p --", &self.parent_dirs)
    }
}

/// Remote paths to delete, as one idempotent operation.
///
/// Deleting a path that is already gone is not an error (`rm -f`), so a retried sync can send
/// the same plan again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletePlan {
    paths: Vec<String>,
}

impl DeletePlan {
    /// Plans deleting `paths` (absolute, normalised remote paths; repeats are dropped, order is
    /// sorted).
    pub fn new(paths: Vec<String>) -> Result<Self, Error> {
        let mut unique = BTreeSet::new();
        for path in paths {
            check_remote_path("plan delete", &path)?;
            unique.insert(path);
        }
        Ok(Self {
            paths: unique.into_iter().collect(),
        })
    }

    /// The paths to delete, sorted, without repeats.
    pub fn paths(&self) -> &[String] {
        &self.paths
    }

    /// True when there is nothing to delete.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// `rm -f -- ...` commands, each at most [`MAX_COMMAND_BYTES`] long. Running them twice is
    /// harmless. Empty when there is nothing to delete.
    pub fn commands(&self) -> Vec<String> {
        chunked_commands("rm -f --", &self.paths)
    }
}

/// Quotes `word` for a POSIX shell: single quotes, with each `'` written as `'\''`.
pub fn shell_quote(word: &str) -> String {
    let mut quoted = String::with_capacity(word.len() + 2);
    quoted.push('\'');
    for ch in word.chars() {
        if ch == '\'' {
            quoted.push_str("'\\''");
        } else {
            quoted.push(ch);
        }
    }
    quoted.push('\'');
    quoted
}

fn chunked_commands(program: &str, words: &[String]) -> Vec<String> {
    let mut commands = Vec::new();
    let mut current = String::new();
    for word in words {
        let quoted = shell_quote(word);
        if !current.is_empty() && current.len() + 1 + quoted.len() > MAX_COMMAND_BYTES {
            commands.push(std::mem::take(&mut current));
        }
        if current.is_empty() {
            current.push_str(program);
        }
        current.push(' ');
        current.push_str(&quoted);
    }
    if !current.is_empty() {
        commands.push(current);
    }
    commands
}

fn parent_of(path: &str) -> Option<&str> {
    let cut = path.rfind('/')?;
    if cut == 0 { None } else { Some(&path[..cut]) }
}

/// Checks that `path` is an absolute, normalised remote path that is not `/` itself.
pub(crate) fn check_remote_path(operation: &'static str, path: &str) -> Result<(), Error> {
    let refuse = |reason| {
        Err(Error::InvalidRemotePath {
            operation,
            path: path.to_owned(),
            reason,
        })
    };
    if !path.starts_with('/') {
        return refuse("not absolute");
    }
    if path.contains('\0') {
        return refuse("contains a NUL byte");
    }
    if path == "/" {
        return refuse("is the root directory");
    }
    for component in path[1..].split('/') {
        match component {
            "" => return refuse("has an empty component or a trailing slash"),
            "." => return refuse("has a `.` component"),
            ".." => return refuse("has a `..` component"),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(PathBuf, String)> {
        items
            .iter()
            .map(|(h, r)| (PathBuf::from(h), (*r).to_owned()))
            .collect()
    }

    // contract: S4
    #[test]
    fn upload_plan_lists_every_parent_once_and_keeps_one_request() {
        let plan = UploadPlan::new(pairs(&[
            ("/h/a", "/home/user/.hermes/skills/x/SKILL.md"),
            ("/h/b", "/home/user/.hermes/skills/x/notes/n.md"),
            ("/h/c", "/home/user/.hermes/.env.creds"),
            ("/h/a", "/home/user/.hermes/skills/x/SKILL.md"),
        ]))
        .expect("valid plan");
        assert_eq!(plan.parts().len(), 3);
        assert_eq!(
            plan.parent_dirs(),
            [
                "/home/user/.hermes",
                "/home/user/.hermes/skills/x",
                "/home/user/.hermes/skills/x/notes"
            ]
        );
        assert_eq!(plan.mkdir_commands().len(), 1);
        assert!(plan.mkdir_commands()[0].starts_with("mkdir -p -- '/home/user/.hermes'"));
    }

    #[test]
    fn upload_plan_refuses_two_host_files_for_one_remote_path() {
        let err =
            UploadPlan::new(pairs(&[("/h/a", "/r/x"), ("/h/b", "/r/x")])).expect_err("duplicate");
        assert!(matches!(err, Error::DuplicateRemotePath { ref path, .. } if path == "/r/x"));
        assert!(err.is_invalid_plan());
    }

    #[test]
    fn upload_plan_refuses_a_path_used_as_file_and_directory() {
        let err = UploadPlan::new(pairs(&[("/h/a", "/r/x"), ("/h/b", "/r/x/y/z")]))
            .expect_err("conflict");
        assert!(matches!(err, Error::FileAndDirectory { ref path } if path == "/r/x"));
    }

    #[test]
    fn remote_paths_must_be_absolute_and_normalised() {
        for bad in ["rel/x", "/", "/a//b", "/a/./b", "/a/../b", "/a/b/", "/a\0b"] {
            let err = UploadPlan::new(pairs(&[("/h", bad)])).expect_err(bad);
            assert!(
                matches!(
                    err,
                    Error::InvalidRemotePath {
                        operation: "plan upload",
                        ..
                    }
                ),
                "{bad}"
            );
            let err = DeletePlan::new(vec![bad.to_owned()]).expect_err(bad);
            assert!(
                matches!(
                    err,
                    Error::InvalidRemotePath {
                        operation: "plan delete",
                        ..
                    }
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn delete_plan_is_sorted_unique_and_quoted() {
        let plan =
            DeletePlan::new(vec!["/r/b".into(), "/r/it's".into(), "/r/b".into()]).expect("valid");
        assert_eq!(plan.paths(), ["/r/b", "/r/it's"]);
        assert_eq!(
            plan.commands(),
            vec!["rm -f -- '/r/b' '/r/it'\\''s'".to_owned()]
        );
        assert!(
            DeletePlan::new(Vec::new())
                .expect("empty")
                .commands()
                .is_empty()
        );
    }

    #[test]
    fn long_lists_split_into_bounded_commands() {
        let paths: Vec<String> = (0..5000)
            .map(|i| format!("/home/user/.hermes/skills/s{i:05}/SKILL.md"))
            .collect();
        let plan = DeletePlan::new(paths.clone()).expect("valid");
        let commands = plan.commands();
        assert!(commands.len() > 1);
        let mut seen = 0;
        for command in &commands {
            assert!(command.len() <= MAX_COMMAND_BYTES);
            assert!(command.starts_with("rm -f -- "));
            seen += command.matches("SKILL.md").count();
        }
        assert_eq!(seen, paths.len());
    }
}
