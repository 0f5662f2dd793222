//! What of the profile's Hermes home never goes into a sandbox, whatever Hermes' sync list
//! holds (contract X7). The README's privacy section is checked against this table.
//!
//! Hermes decides what it offers to upload (`iter_sync_files`: skills, registered credential
//! files, its cache directories); a skill or `terminal.credential_files` can register any
//! file under the home, `.env` included. This table is the plugin's last word on the host
//! side of every upload.

use std::path::{Component, Path, PathBuf};

/// How an entry matches a path relative to the profile's Hermes home.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// Exactly this file at the home's top level.
    File,
    /// This top-level file and every file whose name starts with it (`state.db-wal`, ...).
    FilePrefix,
    /// Everything under this directory.
    Dir,
}

/// One entry of [`NEVER_UPLOADED`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeverUploaded {
    /// Relative to the profile's Hermes home; directories end with `/`.
    pub path: &'static str,
    /// How `path` matches.
    pub matches: Match,
    /// What it holds, as the README and the warning say it.
    pub holds: &'static str,
}

/// Files of the profile's Hermes home that the plugin never uploads.
pub const NEVER_UPLOADED: [NeverUploaded; 8] = [
    NeverUploaded {
        path: ".env",
        matches: Match::File,
        holds: "the profile's secrets, the E2B API key among them",
    },
    NeverUploaded {
        path: "auth.json",
        matches: Match::File,
        holds: "model provider logins",
    },
    NeverUploaded {
        path: "config.yaml",
        matches: Match::File,
        holds: "the profile's configuration",
    },
    NeverUploaded {
        path: "state.db",
        matches: Match::FilePrefix,
        holds: "sessions and their history",
    },
    NeverUploaded {
        path: "sessions/",
        matches: Match::Dir,
        holds: "session transcripts",
    },
    NeverUploaded {
        path: "logs/",
        matches: Match::Dir,
        holds: "Hermes' and this plugin's logs",
    },
    NeverUploaded {
        path: "cache/e2b/",
        matches: Match::Dir,
        holds: "this plugin's own records (leases, push bases)",
    },
    NeverUploaded {
        path: "cache/e2b-recovered/",
        matches: Match::Dir,
        holds: "files quarantined from earlier sandboxes",
    },
];

/// The entry that keeps `host_path` on the host, if any. Both paths are resolved first, so a
/// symlink elsewhere pointing at `.env` is caught by what it points at.
pub fn never_uploaded(home: &Path, host_path: &Path) -> Option<&'static NeverUploaded> {
    let home = resolved(home);
    let file = resolved(host_path);
    never_uploaded_relative(file.strip_prefix(&home).ok()?)
}

/// The entry that keeps a file at `remote_path` out of the sandbox, judged by where it would
/// land under the sandbox's Hermes home: Hermes may hand over a staged copy whose host path
/// says nothing, but its destination does.
pub fn never_uploaded_remote(
    remote_home: &str,
    remote_path: &str,
) -> Option<&'static NeverUploaded> {
    let relative = remote_path.strip_prefix(remote_home.trim_end_matches('/'))?;
    let relative = relative.strip_prefix('/')?;
    // Normalise `a/./b` and `a//b` the way the sandbox's filesystem would read them; `..`
    // is judged as written (it can only leave the home, where nothing is kept).
    let normal: PathBuf = Path::new(relative)
        .components()
        .filter(|part| !matches!(part, Component::CurDir))
        .collect();
    never_uploaded_relative(&normal)
}

fn never_uploaded_relative(relative: &Path) -> Option<&'static NeverUploaded> {
    let mut parts = relative.components();
    let first = match parts.next()? {
        Component::Normal(name) => name.to_str()?,
        _ => return None,
    };
    let top_level = parts.next().is_none();
    NEVER_UPLOADED.iter().find(|entry| match entry.matches {
        Match::File => top_level && first == entry.path,
        Match::FilePrefix => top_level && first.starts_with(entry.path),
        Match::Dir => {
            let dir = Path::new(entry.path.trim_end_matches('/'));
            relative.starts_with(dir) && relative != dir
        }
    })
}

fn resolved(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_entry_keeps_its_files_and_nothing_else() {
        // contract: X7
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        let kept = [
            ".env",
            "auth.json",
            "config.yaml",
            "state.db",
            "state.db-wal",
            "sessions/s1.json",
            "logs/agent.log",
            "cache/e2b/lease",
            "cache/e2b-recovered/x/skills/a.md",
        ];
        let uploaded = [
            "skills/a/SKILL.md",
            "skills/.env",
            "cache/documents/d.txt",
            "memories/MEMORY.md",
            "notes/config.yaml",
            "cache/e2b-other/x",
            "sessions",
        ];
        for rel in kept.iter().chain(uploaded.iter()) {
            let path = h.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            if !path.exists() {
                std::fs::write(&path, b"x").unwrap();
            }
        }
        for rel in kept {
            assert!(never_uploaded(h, &h.join(rel)).is_some(), "{rel} must stay");
        }
        for rel in uploaded {
            assert_eq!(never_uploaded(h, &h.join(rel)), None, "{rel} may go");
        }
        let elsewhere = tempfile::tempdir().unwrap();
        assert_eq!(never_uploaded(h, &elsewhere.path().join(".env")), None);
    }

    /// The root README's text between `<!-- privacy:NAME -->` and its closing marker.
    fn readme_block(name: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
        let readme = std::fs::read_to_string(path).expect("the root README");
        let open = format!("<!-- privacy:{name} -->");
        let close = format!("<!-- /privacy:{name} -->");
        let start = readme.find(&open).expect("opening marker") + open.len();
        let end = readme[start..].find(&close).expect("closing marker") + start;
        readme[start..end].to_owned()
    }

    #[test]
    fn the_readme_lists_exactly_this_table() {
        // contract: X7 — "What leaves your machine" is this table, line by line.
        let listed: Vec<String> = readme_block("never")
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| line.trim().to_owned())
            .collect();
        let table: Vec<String> = NEVER_UPLOADED
            .iter()
            .map(|entry| format!("- `{}`: {}", entry.path, entry.holds))
            .collect();
        assert_eq!(listed, table);
    }

    #[test]
    fn the_readme_names_exactly_the_roots_that_come_back() {
        let listed: Vec<String> = readme_block("back")
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|root| root.trim_end_matches('/').to_owned())
            .collect();
        assert_eq!(listed, agent_sandbox::RECOVERABLE_ROOTS);
    }

    #[test]
    fn a_staged_copy_is_judged_by_where_it_lands() {
        // contract: X7
        let home = "/home/user/.hermes";
        for kept in [".env", "./.env", "sessions//a", "logs/x/y", "state.db-shm"] {
            let remote = format!("{home}/{kept}");
            assert!(never_uploaded_remote(home, &remote).is_some(), "{remote}");
        }
        for sent in ["skills/.env", "cache/documents/.env", "memories/MEMORY.md"] {
            let remote = format!("{home}/{sent}");
            assert_eq!(never_uploaded_remote(home, &remote), None, "{remote}");
        }
        assert_eq!(never_uploaded_remote(home, "/home/user/.env"), None);
        assert_eq!(never_uploaded_remote(home, "/home/user/.hermes.env"), None);
    }

    #[test]
    fn a_link_to_a_kept_file_is_kept() {
        // contract: X7
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        std::fs::write(h.join(".env"), b"E2B_API_KEY=x").unwrap();
        std::fs::create_dir_all(h.join("skills/s")).unwrap();
        std::os::unix::fs::symlink(h.join(".env"), h.join("skills/s/creds")).unwrap();
        let outside = tempfile::tempdir().unwrap();
        let link = outside.path().join("creds");
        std::os::unix::fs::symlink(h.join(".env"), &link).unwrap();
        assert_eq!(
            never_uploaded(h, &h.join("skills/s/creds")).unwrap().path,
            ".env"
        );
        assert_eq!(never_uploaded(h, &link).unwrap().path, ".env");
    }
}
