//! What came back of a child's work (R15), and the words the parent's model reads of it.

use super::StateBack;

/// What came back of one child's work: what the parent's model is told.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BringBack {
    /// The child.
    pub child: String,
    /// The branch holding its commits, in the parent's repository (git work trees).
    pub branch: Option<String>,
    /// How many commits the branch has beyond the fork's `HEAD`.
    pub commits: u64,
    /// Files the child created or changed, now the parent's (relative to the directory).
    pub written: Vec<String>,
    /// Files the child deleted, now deleted in the parent's directory.
    pub deleted: Vec<String>,
    /// Files both changed: the path (the parent's version stays), and where the child's
    /// version is, unless the child deleted it.
    pub conflicts: Vec<(String, Option<String>)>,
    /// What it wrote under the Hermes home, now in the parent's sandbox (its state sync
    /// carries it to the host).
    pub state: StateBack,
}

impl BringBack {
    /// One paragraph for the parent's model: what came back and where.
    pub fn summary(&self) -> String {
        let mut lines = self.work_summary();
        for path in &self.state.written {
            lines.push(format!(
                "  Hermes home: {path} (reaches this profile's host at its next state sync)"
            ));
        }
        for (path, beside) in &self.state.beside {
            lines.push(format!(
                "  Hermes home: {path} was changed here too; kept this version, the subagent's is at {beside}"
            ));
        }
        lines.join("\n")
    }

    /// The lines about the working directory.
    fn work_summary(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(branch) = &self.branch {
            if self.commits == 0 {
                lines.push(format!(
                    "Subagent {} changed nothing in the git work tree: no branch was made.",
                    self.child
                ));
            } else {
                lines.push(format!(
                    "Subagent {}'s work is on branch {branch} ({} commit(s), its uncommitted changes included); merge it to use it.",
                    self.child, self.commits
                ));
            }
            return lines;
        }
        if self.written.is_empty() && self.deleted.is_empty() && self.conflicts.is_empty() {
            return vec![format!(
                "Subagent {} changed no file in its working directory.",
                self.child
            )];
        }
        lines.push(format!(
            "Subagent {}'s file changes were applied: {} written, {} deleted.",
            self.child,
            self.written.len(),
            self.deleted.len()
        ));
        for path in self.written.iter().take(50) {
            lines.push(format!("  written: {path}"));
        }
        for path in self.deleted.iter().take(50) {
            lines.push(format!("  deleted: {path}"));
        }
        for (path, beside) in &self.conflicts {
            match beside {
                Some(beside) => lines.push(format!(
                    "  conflict: {path} was changed here too; kept this version, the subagent's is at {beside}"
                )),
                None => lines.push(format!(
                    "  conflict: {path} was changed here and deleted by the subagent; kept this version"
                )),
            }
        }
        lines
    }
}
