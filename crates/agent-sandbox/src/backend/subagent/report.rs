//! What came back of a child's work (R15), and the words the parent's model reads of it.

use super::StateBack;
use crate::subagent::Elsewhere;

/// One git work tree the child changed: its work is on a branch of that repository.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BranchBack {
    /// The work tree's top directory (absolute).
    pub repository: String,
    /// The branch holding the child's commits there.
    pub branch: String,
    /// How many commits the branch has beyond the fork's `HEAD` (0: nothing came back,
    /// no branch was made).
    pub commits: u64,
}

/// What came back of one child's work: what the parent's model is told.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BringBack {
    /// The child.
    pub child: String,
    /// The git work trees it changed, each with its branch.
    pub branches: Vec<BranchBack>,
    /// Files the child created or changed, now the parent's (absolute).
    pub written: Vec<String>,
    /// Files the child deleted, now deleted in the parent's sandbox (absolute).
    pub deleted: Vec<String>,
    /// Files both changed: the path (the parent's version stays), and where the child's
    /// version is, unless the child deleted it.
    pub conflicts: Vec<(String, Option<String>)>,
    /// The directories compared (absolute): the home, the working directory, the
    /// configured paths, the directories its commands ran in.
    pub compared: Vec<String>,
    /// Directories under them that one side could not enter (no permission to list or
    /// search them; absolute): not compared, each side keeps what is under them.
    pub unread: Vec<String>,
    /// What it changed outside them: named, not copied.
    pub elsewhere: Elsewhere,
    /// What it wrote under the Hermes home, now in the parent's sandbox (its state sync
    /// carries it to the host).
    pub state: StateBack,
}

impl BringBack {
    /// One paragraph for the parent's model: what came back and where, and what did not.
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
        if !self.unread.is_empty() {
            lines.push(format!(
                "Not compared, as they cannot be entered (no permission): {}; whatever the subagent changed under them did not come back.",
                self.unread.join(", ")
            ));
        }
        lines.extend(self.elsewhere.lines());
        lines.join("\n")
    }

    /// The lines about the work trees and the files.
    fn work_summary(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for branch in &self.branches {
            if branch.commits == 0 {
                lines.push(format!(
                    "Subagent {} changed nothing to commit in the git work tree {}: no branch was made.",
                    self.child, branch.repository
                ));
            } else {
                lines.push(format!(
                    "Subagent {}'s work in {} is on branch {} ({} commit(s), its uncommitted changes included); merge it to use it.",
                    self.child, branch.repository, branch.branch, branch.commits
                ));
            }
        }
        if self.written.is_empty() && self.deleted.is_empty() && self.conflicts.is_empty() {
            if self.branches.is_empty() {
                lines.push(format!(
                    "Subagent {} changed no file in {}.",
                    self.child,
                    self.compared_text()
                ));
            }
            return lines;
        }
        lines.push(format!(
            "Subagent {}'s file changes in {} were applied: {} written, {} deleted.",
            self.child,
            self.compared_text(),
            self.written.len(),
            self.deleted.len()
        ));
        for path in self.written.iter().take(50) {
            lines.push(format!("  written: {path}"));
        }
        if self.written.len() > 50 {
            lines.push(format!(
                "  ... and {} more written",
                self.written.len() - 50
            ));
        }
        for path in self.deleted.iter().take(50) {
            lines.push(format!("  deleted: {path}"));
        }
        if self.deleted.len() > 50 {
            lines.push(format!(
                "  ... and {} more deleted",
                self.deleted.len() - 50
            ));
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

    fn compared_text(&self) -> String {
        if self.compared.is_empty() {
            "its sandbox".to_owned()
        } else {
            self.compared.join(", ")
        }
    }
}
