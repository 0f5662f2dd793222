//! What a child changed outside the roots ([`ELSEWHERE`]): not copied (system files,
//! scratch space, installed packages do not belong in the parent's sandbox unasked), but
//! named, so that the parent's model can redo it or ask for it.

use std::collections::BTreeMap;

use super::manifest::clean;
use super::{Stamp, find_prunes, find_starts, is_within};

/// Where a child's changes outside the roots are looked for (those that exist): scratch
/// space, the usual places of software and services, other users' homes, and the package
/// database's status (a package installed or removed with `apt` changes
/// `/var/lib/dpkg/status`). The rest of `/usr` and `/var` is the system's and is not
/// searched.
pub const ELSEWHERE: [&str; 15] = [
    "/tmp",
    "/var/tmp",
    "/home",
    "/root",
    "/opt",
    "/srv",
    "/mnt",
    "/media",
    "/workspace",
    "/data",
    "/app",
    "/usr/local",
    "/etc",
    "/var/lib/dpkg/status",
    "/var/www",
];

/// The most changed paths read back; past it the report says "at least".
const SCAN_LIMIT: usize = 20_000;

/// The most paths named one by one; the rest are counted by directory.
const SHOWN: usize = 50;

/// A shell script printing, NUL-separated, the paths under [`ELSEWHERE`] (less `roots`, and
/// less Hermes' and this crate's own files in `/tmp`) that changed after `since` in this
/// sandbox: `f <path>` for files and links, `d <path>`
/// for directories (an entry created, deleted or renamed in them), at most [`SCAN_LIMIT`].
/// What cannot be read is skipped; the script never fails.
pub(crate) fn elsewhere_script(roots: &[String], since: Stamp) -> String {
    let starts = find_starts(ELSEWHERE);
    let mut pruned = find_prunes(roots);
    // Hermes' own session files (its shell snapshot, cwd file, staged stdin) and this
    // crate's scratch files: no work of the child's.
    pruned.push("-path 'tmp/hermes-*' -o -path 'tmp/.hermes-*'".to_owned());
    format!(
        "cd / || exit 0; set --; for d in {starts}; do [ -e \"$d\" ] && set -- \"$@\" \"$d\"; done; \
         [ $# -eq 0 ] || find \"$@\" -xdev \\( {pruned} \\) -prune -o -newerct @{since} \
         \\( \\( -type d -printf 'd %p\\0' \\) -o -printf 'f %p\\0' \\) 2>/dev/null \
         | head -z -n {limit}; true",
        pruned = pruned.join(" -o "),
        limit = SCAN_LIMIT + 1,
    )
}

/// What a child changed outside the roots, as the parent's model is told it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Elsewhere {
    /// Files and links created or changed (absolute), the first 50 in order.
    pub paths: Vec<String>,
    /// Directories in which entries were deleted or renamed, none of their changed entries
    /// being listed (absolute).
    pub directories: Vec<String>,
    /// How many files and links changed in all, by directory two levels deep (`/usr/local`,
    /// `/tmp`), when more than 50 did.
    pub counts: Vec<(String, u64)>,
    /// How many files and links changed in all.
    pub total: u64,
    /// Whether the search stopped at its limit (then `total` is a lower bound).
    pub truncated: bool,
}

impl Elsewhere {
    /// Parses the output of the crate's search script (`find -printf`); a record that is not what `find` prints (an
    /// absolute path outside [`ELSEWHERE`], a `..`, a control character) is refused. A
    /// directory holding one of `roots` is not named (its entries change with mounts, as
    /// `/home` does around a home).
    pub fn parse(output: &[u8], roots: &[String]) -> Result<Elsewhere, String> {
        let mut files = Vec::new();
        let mut dirs = Vec::new();
        let records: Vec<&[u8]> = output
            .split(|byte| *byte == 0)
            .filter(|record| !record.is_empty())
            .collect();
        let truncated = records.len() > SCAN_LIMIT;
        for record in records.into_iter().take(SCAN_LIMIT) {
            let text = std::str::from_utf8(record)
                .map_err(|_| "a changed path is not UTF-8".to_owned())?;
            let (kind, path) = text
                .split_once(' ')
                .ok_or_else(|| format!("bad changed-path record {text:?}"))?;
            let path = format!("/{}", clean(path)?);
            if !ELSEWHERE.iter().any(|dir| is_within(&path, dir)) {
                return Err(format!("{path:?} is not where changes were looked for"));
            }
            match kind {
                "f" => files.push(path),
                "d" => dirs.push(path),
                _ => return Err(format!("bad changed-path record {text:?}")),
            }
        }
        files.sort_unstable();
        dirs.sort_unstable();
        let directories = dirs
            .into_iter()
            .filter(|dir| !files.iter().any(|file| is_within(file, dir)))
            .filter(|dir| !roots.iter().any(|root| is_within(root, dir)))
            .collect();
        let total = files.len() as u64;
        let counts = if files.len() > SHOWN {
            let mut by_dir: BTreeMap<String, u64> = BTreeMap::new();
            for file in &files {
                // "/usr/local/lib/x": its directory's parts are "", "usr", "local", "lib".
                let parts: Vec<&str> = file.split('/').collect();
                let in_dir = &parts[..parts.len() - 1];
                let dir = in_dir[..in_dir.len().min(3)].join("/");
                *by_dir.entry(dir).or_default() += 1;
            }
            by_dir.into_iter().collect()
        } else {
            Vec::new()
        };
        files.truncate(SHOWN);
        Ok(Elsewhere {
            paths: files,
            directories,
            counts,
            total,
            truncated,
        })
    }

    /// Whether the child changed nothing there.
    pub fn is_empty(&self) -> bool {
        self.total == 0 && self.directories.is_empty()
    }

    /// The lines the parent's model reads.
    pub fn lines(&self) -> Vec<String> {
        if self.is_empty() {
            return Vec::new();
        }
        let mut lines = vec![format!(
            "  Not brought back (changed outside the home and the working directories; redo it or ask the subagent's output for it): {}{} file(s)",
            if self.truncated { "at least " } else { "" },
            self.total
        )];
        for path in &self.paths {
            lines.push(format!("    {path}"));
        }
        for (dir, count) in &self.counts {
            lines.push(format!("    {count} under {dir}"));
        }
        for dir in &self.directories {
            lines.push(format!("    {dir}/: entries deleted or renamed"));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_elsewhere_are_named_and_counted_and_checked() {
        // contract: R15
        let output = b"f tmp/scratch.txt\0d tmp\0f usr/local/bin/tool\0d var/tmp/gone\0d home\0";
        let found = Elsewhere::parse(output, &["/home/user".to_owned()]).unwrap();
        assert_eq!(found.paths, ["/tmp/scratch.txt", "/usr/local/bin/tool"]);
        // /tmp changed because scratch.txt was created there; /var/tmp/gone lost an entry;
        // /home holds a root.
        assert_eq!(found.directories, ["/var/tmp/gone"]);
        assert_eq!(found.total, 2);
        assert!(found.counts.is_empty());
        let text = found.lines().join("\n");
        assert!(
            text.contains("/usr/local/bin/tool") && text.contains("2 file(s)"),
            "{text}"
        );

        let many: Vec<u8> = (0..60)
            .flat_map(|i| format!("f usr/local/lib/x{i}\0").into_bytes())
            .chain(b"f tmp/a\0".iter().copied())
            .collect();
        let found = Elsewhere::parse(&many, &[]).unwrap();
        assert_eq!(found.total, 61);
        assert_eq!(found.paths.len(), SHOWN);
        assert_eq!(
            found.counts,
            [("/tmp".to_owned(), 1), ("/usr/local".to_owned(), 60)]
        );
        for bad in [
            &b"f home2/x\0"[..],
            b"f ../etc\0",
            b"x tmp/a\0",
            b"f tmp/a\nb\0",
            b"ftmp\0",
        ] {
            assert!(Elsewhere::parse(bad, &[]).is_err(), "{bad:?}");
        }
        assert!(Elsewhere::parse(b"", &[]).unwrap().is_empty());
    }
}
