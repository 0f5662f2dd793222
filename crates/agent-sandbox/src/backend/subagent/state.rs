//! What a child wrote under the Hermes home in its fork (skills, memories: the state roots
//! that sync to the host) comes back into the parent's sandbox with its work (R15), so the
//! parent's own state sync carries it to the host as it carries the parent's. No base of the
//! Hermes home is read at the fork (that would cost every child a manifest of it, used or
//! not); a file counts as the child's when its times are after the fork, less
//! [`STATE_MARGIN`] for the sandbox's clock against the host's. That errs one way only: a file
//! the child left alone may be taken for its write (then it is the parent's content already,
//! or the parent changed it too and the child's copy lands beside it), never a child's write
//! for an untouched file. Deletions do not come back: the host never loses a skill or a memory
//! to a child.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;

use super::super::{Backend, TRANSFER_WINDOW};
use super::{ChildSandbox, nul_list};
use crate::error::Error;
use crate::subagent::{CONFLICT_SUFFIX, parse_digests, shell_quote};

/// How far before the fork a file's time may lie and still count as the child's write.
pub(crate) const STATE_MARGIN: Duration = Duration::from_secs(120);

/// The Hermes home's directories whose files come back (those state sync carries).
const STATE_ROOTS: [&str; 2] = crate::RECOVERABLE_ROOTS;

/// What came back of a child's Hermes home: paths relative to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateBack {
    /// Files the child wrote that the parent had left alone: now the parent's.
    pub written: Vec<String>,
    /// Files both changed: the parent's stays, the child's is at the second path.
    pub beside: Vec<(String, String)>,
}

impl Backend {
    /// Brings the child's new and changed files under the Hermes home's state roots into
    /// the parent's sandbox (see the module's doc).
    pub(super) fn bring_back_state(&self, child: &ChildSandbox) -> Result<StateBack, Error> {
        let Some(home) = self.info().map(|info| info.remote_hermes_home) else {
            return Ok(StateBack::default());
        };
        if !home.starts_with('/') {
            return Ok(StateBack::default());
        }
        let since = child
            .forked_at
            .checked_sub(STATE_MARGIN)
            .unwrap_or(UNIX_EPOCH)
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        let newer = format!("\\( -newermt @{since} -o -newerct @{since} \\)");
        let roots: Vec<String> = STATE_ROOTS.iter().map(|root| shell_quote(root)).collect();
        let theirs_script = format!(
            "cd -- {home} 2>/dev/null || exit 0; for r in {roots}; do [ -d \"$r\" ] && \
             find \"$r\" -xdev -type f {newer} -print0; done | xargs -0 -r sha256sum -z",
            home = shell_quote(&home),
            roots = roots.join(" "),
        );
        let untrusted = |sandbox: &str| {
            let sandbox = sandbox.to_owned();
            move |reason| Error::UntrustedAnswer {
                operation: "subagent state",
                sandbox_id: sandbox.clone(),
                reason,
            }
        };
        let theirs =
            child
                .backend
                .file_operation("subagent state", TRANSFER_WINDOW, |inner, sandbox| {
                    inner.script(sandbox, "subagent state", &theirs_script)
                })?;
        let theirs = parse_digests(&theirs).map_err(untrusted(child.sandbox_id.as_str()))?;
        let theirs: BTreeMap<String, String> = theirs
            .into_iter()
            .filter(|(path, _)| {
                STATE_ROOTS
                    .iter()
                    .any(|root| path.starts_with(&format!("{root}/")))
            })
            .collect();
        if theirs.is_empty() {
            return Ok(StateBack::default());
        }
        // The parent's copies: their digests, and which of them changed since the fork.
        let list = format!("/tmp/hermes-subagent-{}.state", child.id);
        let ours_script = format!(
            "trap \"rm -f -- {list}\" EXIT; cd -- {home} 2>/dev/null || exit 0; \
             while IFS= read -r -d '' p; do [ -f \"$p\" ] && [ ! -L \"$p\" ] || continue; \
               if [ -n \"$(find \"$p\" -maxdepth 0 {newer})\" ]; then printf 'new\\0'; else printf 'old\\0'; fi; \
               sha256sum -z -- \"$p\"; done < {list}",
            list = shell_quote(&list),
            home = shell_quote(&home),
        );
        let paths = nul_list(theirs.keys().map(String::as_str));
        let ours = self.file_operation("subagent state", TRANSFER_WINDOW, |inner, sandbox| {
            inner.upload_all(
                sandbox,
                "subagent state",
                vec![(list.clone(), paths.clone())],
            )?;
            inner.script(sandbox, "subagent state", &ours_script)
        })?;
        let ours = parse_flagged(&ours).map_err(untrusted(child.parent.as_str()))?;
        let mut back = StateBack::default();
        for (path, digest) in &theirs {
            match ours.get(path) {
                Some((same, _)) if same == digest => {}
                Some((_, true)) => back
                    .beside
                    .push((path.clone(), format!("{path}{CONFLICT_SUFFIX}{}", child.id))),
                Some((_, false)) | None => back.written.push(path.clone()),
            }
        }
        if back.written.is_empty() && back.beside.is_empty() {
            return Ok(back);
        }
        let carried: Vec<(String, String)> = back
            .written
            .iter()
            .map(|path| (path.clone(), path.clone()))
            .chain(back.beside.iter().cloned())
            .collect();
        let child_id = child.sandbox_id.as_str().to_owned();
        let files: Vec<(String, Bytes)> =
            child
                .backend
                .file_operation("subagent state", TRANSFER_WINDOW, |inner, sandbox| {
                    carried
                        .iter()
                        .map(|(from, to)| {
                            let data = inner
                                .block_on(
                                    sandbox.read_file(
                                        &format!("{home}/{from}"),
                                        inner.config.state_cap,
                                    ),
                                )
                                .map_err(|source| {
                                    Error::e2b("subagent state download", Some(&child_id), source)
                                })?;
                            Ok((format!("{home}/{to}"), data))
                        })
                        .collect()
                })?;
        self.file_operation("subagent state", TRANSFER_WINDOW, |inner, sandbox| {
            inner.upload_all(sandbox, "subagent state", files.clone())
        })?;
        Ok(back)
    }
}

/// Parses the parent's answer: per path, `new` or `old` (changed since the fork or not),
/// then `sha256sum -z`'s record.
fn parse_flagged(output: &[u8]) -> Result<BTreeMap<String, (String, bool)>, String> {
    let mut found = BTreeMap::new();
    let mut records = output.split(|b| *b == 0).filter(|r| !r.is_empty());
    while let Some(flag) = records.next() {
        let recent = match flag {
            b"new" => true,
            b"old" => false,
            _ => return Err("a state record's flag is neither new nor old".to_owned()),
        };
        let record = records
            .next()
            .ok_or_else(|| "a state flag without its digest".to_owned())?;
        let mut record = record.to_vec();
        record.push(0);
        let digests = parse_digests(&record)?;
        let Some((path, digest)) = digests.into_iter().next() else {
            return Err("a state flag without its digest".to_owned());
        };
        found.insert(path, (digest, recent));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parents_answer_parses_strictly() {
        let digest = "a".repeat(64);
        let answer = format!("new\0{digest}  skills/x/SKILL.md\0old\0{digest}  memories/m.md\0");
        let parsed = parse_flagged(answer.as_bytes()).unwrap();
        assert_eq!(parsed["skills/x/SKILL.md"], (digest.clone(), true));
        assert_eq!(parsed["memories/m.md"], (digest.clone(), false));
        assert!(parse_flagged(b"maybe\0").is_err());
        assert!(parse_flagged(b"new\0").is_err());
        assert!(parse_flagged(format!("new\0{digest}  ../x\0").as_bytes()).is_err());
    }
}
