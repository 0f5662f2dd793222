//! What directories held, as `find` reports it ([`Manifest`]), the change-time [`Stamp`]
//! a side's changes are measured against, and the scripts that read them in a sandbox.
//! Everything a sandbox prints is checked before it is used.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::{find_prunes, find_starts, from_root, shell_quote};
use crate::subagent::MAX_MANIFEST_ENTRIES;

/// A file's change time (`ctime`) as `find` prints it, to the nanosecond: what a side's
/// changes are found by. Any write, `chmod`, rename or link sets it to the kernel's clock,
/// and nothing sets it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp {
    secs: u64,
    nanos: u32,
}

impl Stamp {
    /// Parses `<seconds>[.<fraction>]` (`find`'s `%C@` prints ten fraction digits; past the
    /// ninth they are dropped).
    pub fn parse(text: &str) -> Option<Stamp> {
        let (secs, fraction) = text.split_once('.').unwrap_or((text, ""));
        if secs.is_empty()
            || secs.len() > 19
            || !secs.bytes().all(|b| b.is_ascii_digit())
            || !fraction.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        let mut nanos: u32 = 0;
        for digit in fraction.bytes().chain(std::iter::repeat(b'0')).take(9) {
            nanos = nanos * 10 + u32::from(digit - b'0');
        }
        Some(Stamp {
            secs: secs.parse().ok()?,
            nanos,
        })
    }
}

impl fmt::Display for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:09}", self.secs, self.nanos)
    }
}

/// What one path held, as `find` reports it: a regular file's size, modification and
/// change times and mode (any write or `chmod` changes one of them), or a symbolic link's
/// target and change time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mark {
    /// A regular file.
    File {
        /// Its size in bytes.
        size: u64,
        /// Its modification time, as `find` prints it (seconds, fraction).
        modified: String,
        /// Its status change time, likewise.
        changed: String,
        /// Its permission bits, octal.
        mode: String,
    },
    /// A symbolic link.
    Link {
        /// Its target, unresolved.
        target: String,
        /// Its status change time; `None` in a record written before links had one.
        changed: Option<String>,
    },
}

impl Mark {
    /// Its change time, when it has one `find` printed.
    pub fn changed(&self) -> Option<Stamp> {
        match self {
            Mark::File { changed, .. } => Stamp::parse(changed),
            Mark::Link { changed, .. } => changed.as_deref().and_then(Stamp::parse),
        }
    }
}

/// What directories held, by path relative to where `find` started (`/` for the roots a
/// child's work is compared in: `home/user/notes.md`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    pub(super) entries: BTreeMap<String, Mark>,
    /// Directories the walk could not enter (no read or search permission): what is under
    /// them is unknown, not absent.
    pub(super) unread: BTreeSet<String>,
}

impl Manifest {
    /// The entries.
    pub fn entries(&self) -> &BTreeMap<String, Mark> {
        &self.entries
    }

    /// The directories the walk could not enter: what is under them is unknown.
    pub fn unread(&self) -> &BTreeSet<String> {
        &self.unread
    }

    /// Whether `path` lies under a directory the walk could not enter.
    pub fn hides(&self, path: &str) -> bool {
        !self.unread.is_empty()
            && path
                .match_indices('/')
                .any(|(at, _)| self.unread.contains(&path[..at]))
    }

    /// Parses the output of the crate's manifest script (`find -printf`), NUL-terminated records: `f <size> <mtime>
    /// <ctime> <mode> <path>` for regular files, `s <ctime> <path>` followed by a record with
    /// a symbolic link's target (and `l <path>` and its target, a link without its time, as
    /// older records hold them), `u <path>` for a directory that could not be entered.
    /// Refused, naming the record: a path that is absolute, empty,
    /// holds `..` or a control character, a field that is not what `find` prints, and more
    /// than [`MAX_MANIFEST_ENTRIES`].
    pub fn parse(output: &[u8]) -> Result<Manifest, String> {
        let mut entries = BTreeMap::new();
        let mut unread = BTreeSet::new();
        let mut records = output
            .split(|byte| *byte == 0)
            .filter(|record| !record.is_empty());
        let time_ok = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || b == b'.');
        while let Some(record) = records.next() {
            let text = std::str::from_utf8(record)
                .map_err(|_| "a manifest record is not UTF-8".to_owned())?;
            let mut target = |path: &str| -> Result<String, String> {
                let target = records
                    .next()
                    .ok_or_else(|| format!("link {path:?} without its target"))?;
                std::str::from_utf8(target)
                    .map(str::to_owned)
                    .map_err(|_| format!("link {path:?}: target is not UTF-8"))
            };
            if let Some(path) = text.strip_prefix("u ") {
                unread.insert(clean(path)?);
                continue;
            }
            let (path, mark) = if let Some(path) = text.strip_prefix("l ") {
                let target = target(path)?;
                (
                    path,
                    Mark::Link {
                        target,
                        changed: None,
                    },
                )
            } else if let Some(rest) = text.strip_prefix("s ") {
                let Some((changed, path)) = rest.split_once(' ') else {
                    return Err(format!("bad link record {text:?}"));
                };
                if !time_ok(changed) {
                    return Err(format!("bad link record {text:?}"));
                }
                let target = target(path)?;
                let changed = Some(changed.to_owned());
                (path, Mark::Link { target, changed })
            } else if let Some(rest) = text.strip_prefix("f ") {
                let mut fields = rest.splitn(5, ' ');
                let (Some(size), Some(modified), Some(changed), Some(mode), Some(path)) = (
                    fields.next(),
                    fields.next(),
                    fields.next(),
                    fields.next(),
                    fields.next(),
                ) else {
                    return Err(format!("bad file record {text:?}"));
                };
                let size = size.parse().map_err(|_| format!("bad size in {text:?}"))?;
                if !time_ok(modified)
                    || !time_ok(changed)
                    || mode.is_empty()
                    || !mode.bytes().all(|b| (b'0'..=b'7').contains(&b))
                {
                    return Err(format!("bad file record {text:?}"));
                }
                let mark = Mark::File {
                    size,
                    modified: modified.to_owned(),
                    changed: changed.to_owned(),
                    mode: mode.to_owned(),
                };
                (path, mark)
            } else {
                return Err(format!("unknown manifest record {text:?}"));
            };
            entries.insert(clean(path)?, mark);
            if entries.len() > MAX_MANIFEST_ENTRIES {
                return Err(format!(
                    "more than {MAX_MANIFEST_ENTRIES} files: too many to bring back one by one"
                ));
            }
        }
        Ok(Manifest { entries, unread })
    }

    /// The manifest as the crate's manifest script prints it: [`Manifest::parse`] reads it back.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (path, mark) in &self.entries {
            match mark {
                Mark::File {
                    size,
                    modified,
                    changed,
                    mode,
                } => out.extend_from_slice(
                    format!("f {size} {modified} {changed} {mode} {path}\0").as_bytes(),
                ),
                Mark::Link {
                    target,
                    changed: Some(changed),
                } => out.extend_from_slice(format!("s {changed} {path}\0{target}\0").as_bytes()),
                Mark::Link {
                    target,
                    changed: None,
                } => out.extend_from_slice(format!("l {path}\0{target}\0").as_bytes()),
            }
        }
        for dir in &self.unread {
            out.extend_from_slice(format!("u {dir}\0").as_bytes());
        }
        out
    }

    /// The same entries under `dir` (relative, as `find` prints it from `/`): what an older
    /// record's manifest of one directory is among manifests read from `/`.
    pub(crate) fn under(self, dir: &str) -> Manifest {
        let dir = from_root(dir);
        Manifest {
            entries: self
                .entries
                .into_iter()
                .map(|(path, mark)| (format!("{dir}/{path}"), mark))
                .collect(),
            unread: self
                .unread
                .into_iter()
                .map(|path| format!("{dir}/{path}"))
                .collect(),
        }
    }
}

/// Parses `sha256sum -z`'s output (`<64 hex>  <path>` records): each path's content digest.
/// Refused, naming the record, as [`Manifest::parse`] refuses.
pub fn parse_digests(output: &[u8]) -> Result<BTreeMap<String, String>, String> {
    let mut digests = BTreeMap::new();
    for record in output.split(|byte| *byte == 0).filter(|r| !r.is_empty()) {
        let text =
            std::str::from_utf8(record).map_err(|_| "a digest record is not UTF-8".to_owned())?;
        let digest = text
            .get(..64)
            .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()));
        let path = text
            .get(64..)
            .and_then(|rest| rest.strip_prefix("  ").or_else(|| rest.strip_prefix(" *")));
        match (digest, path) {
            (Some(digest), Some(path)) => {
                digests.insert(clean(path)?, digest.to_ascii_lowercase());
            }
            _ => return Err(format!("unknown digest record {text:?}")),
        }
    }
    Ok(digests)
}

/// A reported path without its `./`, checked.
pub(super) fn clean(path: &str) -> Result<String, String> {
    let path = path.strip_prefix("./").unwrap_or(path);
    check_path(path)?;
    Ok(path.to_owned())
}

/// A relative path that stays inside its directory.
fn check_path(path: &str) -> Result<(), String> {
    let bad = path.is_empty()
        || path.starts_with('/')
        || path.chars().any(char::is_control)
        || path
            .split('/')
            .any(|part| part.is_empty() || part == ".." || part == ".");
    if bad {
        Err(format!("path {path:?} is not a plain relative path"))
    } else {
        Ok(())
    }
}

/// A shell script printing a [`Stamp`] of the sandbox's file clock, and returning only once
/// that clock has moved past it: every change after the script has a later change time, and
/// every change before it an earlier or equal one. (A file's times come from the kernel's
/// coarse clock, a tick of a few milliseconds: waiting for its next tick makes "changed
/// since" exact.)
pub(crate) fn stamp_script() -> String {
    "m=$(mktemp /tmp/hermes-subagent-stamp.XXXXXX) || exit 3; \
     t=$(find \"$m\" -maxdepth 0 -printf %C@); \
     while touch \"$m\" && [ \"$(find \"$m\" -maxdepth 0 -printf %C@)\" = \"$t\" ]; do :; done; \
     rm -f -- \"$m\"; printf '%s\\0' \"$t\""
        .to_owned()
}

/// A shell script printing the manifest of `roots` (absolute; those missing are skipped)
/// from `/` (see [`Manifest::parse`]): regular files and symbolic links, not following
/// links, not crossing file systems, without what is under `prune` (absolute). One `find`,
/// whatever the number of files; nothing is read. A directory the walk cannot enter is
/// printed as such (a manifest silently missing part of a tree would read as the tree's
/// deletion); other errors (a file gone while it walks) leave the file out. With
/// `changed_since`, the paths changed after that stamp are also written, NUL-separated, to
/// the file `listed`, opened once (by `find`, or emptied when there is nothing to walk), so
/// that it may be a pipe.
pub(crate) fn manifest_script(
    roots: &[String],
    prune: &[String],
    listed: Option<(&str, Stamp)>,
) -> String {
    let starts = find_starts(roots);
    let mut pruned = find_prunes(prune);
    // The scratch files of a bring-back in progress.
    pruned.push("-path 'tmp/hermes-subagent-*'".to_owned());
    let (file_listed, link_listed) = match listed {
        Some((list, since)) => {
            let to = shell_quote(list);
            (
                format!(" \\( -newerct @{since} -fprint0 {to} \\)"),
                format!(" \\( -newerct @{since} -fprint0 {to} \\)"),
            )
        }
        None => (String::new(), String::new()),
    };
    // One output file for both: `-fprint0` opens it once per distinct name.
    format!(
        "cd / || exit 3; set --; for r in {starts}; do [ -e \"$r\" ] && set -- \"$@\" \"$r\"; done; \
         if [ $# -eq 0 ]; then {touch}:; else find \"$@\" -xdev \\( {pruned} \\) -prune -o \
         {UNREAD} -o \\( -type f -printf 'f %s %T@ %C@ %m %p\\0'{file_listed} \\) \
         -o \\( -type l -printf 's %C@ %p\\0%l\\0'{link_listed} \\) || true; fi",
        touch = listed.map_or(String::new(), |(list, _)| format!(
            ": > {}; ",
            shell_quote(list)
        )),
        pruned = pruned.join(" -o "),
    )
}

/// The `find` clause printing (`u <path>`) and not entering a directory this user cannot
/// list or search.
pub(crate) const UNREAD: &str =
    "\\( -type d \\( ! -readable -o ! -executable \\) -printf 'u %p\\0' -prune \\)";

/// A shell script printing the content digests (`sha256sum -z`) of the files the
/// NUL-separated list at `list` names (relative to `/`); a missing one is left out. The
/// list is removed.
pub(crate) fn digests_script(list: &str) -> String {
    format!(
        "trap \"rm -f -- {list}\" EXIT; cd / || exit 3; while IFS= read -r -d '' p; do \
           [ -f \"$p\" ] && [ ! -L \"$p\" ] && printf '%s\\0' \"$p\"; done < {list} | \
         xargs -0 -r sha256sum -z",
        list = shell_quote(list),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_parse_strictly() {
        // contract: R15
        let output = "f 12 1700000000.1234567890 1700000000.1234567890 755 home/u/bin/run\0\
                      f 0 1.0 1.0 644 ./a b.txt\0s 1700000001.5 home/u/link\0../target\0\
                      l ./old-link\0x\0";
        let parsed = Manifest::parse(output.as_bytes()).unwrap();
        assert_eq!(parsed.entries().len(), 4);
        let run = &parsed.entries()["home/u/bin/run"];
        assert_eq!(
            *run,
            Mark::File {
                size: 12,
                modified: "1700000000.1234567890".to_owned(),
                changed: "1700000000.1234567890".to_owned(),
                mode: "755".to_owned()
            }
        );
        assert_eq!(run.changed().unwrap().to_string(), "1700000000.123456789");
        assert_eq!(
            parsed.entries()["home/u/link"],
            Mark::Link {
                target: "../target".to_owned(),
                changed: Some("1700000001.5".to_owned())
            }
        );
        assert_eq!(parsed.entries()["old-link"].changed(), None);
        assert_eq!(Manifest::parse(&parsed.to_bytes()).unwrap(), parsed);
        for bad in [
            "f 1 1.0 1.0 644 ../escape\0",
            "f 1 1.0 1.0 644 /abs\0",
            "f 1 1.0 1.0 644 ./a/../b\0",
            "f x 1.0 1.0 644 ./a\0",
            "f 1 1.0 1.0 9z9 ./a\0",
            "f 1 1.0 ./a\0",
            "l ./dangling\0",
            "s x1 ./a\0b\0",
            "s 1.0\0",
            "what ./what\0",
        ] {
            assert!(Manifest::parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
        let digest = "ab".repeat(32);
        let parsed = parse_digests(format!("{digest}  ./a b\0").as_bytes()).unwrap();
        assert_eq!(parsed["a b"], digest);
        assert!(parse_digests(format!("{digest}  ../x\0").as_bytes()).is_err());
        assert!(parse_digests(b"short  ./x\0").is_err());
    }

    #[test]
    fn a_directory_the_walk_could_not_enter_hides_what_is_under_it() {
        // contract: R15
        let manifest =
            Manifest::parse(b"u home/user/locked\0f 1 1.5 1.5 644 home/user/a\0").unwrap();
        assert!(manifest.hides("home/user/locked/x"));
        assert!(manifest.hides("home/user/locked/deep/x"));
        assert!(!manifest.hides("home/user/locked"));
        assert!(!manifest.hides("home/user/lockedx/y"));
        assert!(!manifest.hides("home/user/a"));
        assert_eq!(Manifest::parse(&manifest.to_bytes()).unwrap(), manifest);
        assert_eq!(
            manifest.under("/srv").unread().iter().collect::<Vec<_>>(),
            ["srv/home/user/locked"]
        );
        assert!(Manifest::parse(b"u ../etc\0").is_err());
    }

    #[test]
    fn stamps_order_by_time_to_the_nanosecond() {
        let a = Stamp::parse("1700000000.1234567890").unwrap();
        let b = Stamp::parse("1700000000.123456790").unwrap();
        assert!(a < b);
        assert_eq!(Stamp::parse("5").unwrap().to_string(), "5.000000000");
        assert_eq!(Stamp::parse("5.5").unwrap(), Stamp::parse("5.500").unwrap());
        for bad in ["", ".5", "1.2.3", "-1", "1e9", "x"] {
            assert!(Stamp::parse(bad).is_none(), "{bad:?}");
        }
    }
}
