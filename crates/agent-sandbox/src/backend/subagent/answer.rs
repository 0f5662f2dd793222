//! The child's side of a bring-back: its one script (which work trees it changed, the
//! manifest of the roots, what it changed elsewhere, and a tar of what it changed) and its
//! answer, checked before anything of it is used.

use bytes::Bytes;

use super::WorkTree;
use crate::subagent::{
    Elsewhere, Manifest, Stamp, elsewhere_script, fill, manifest_script, shell_quote,
};

/// The child's bring-back script: which work trees it changed (`1` or `0` each: anything
/// under the tree changed after `since`; without a stamp, each counts as changed), the
/// manifest of `roots`, what it changed elsewhere (searched meanwhile), each as
/// `<name> <length>\n<bytes>`, then a tar of every file and link it changed under the roots
/// (without a stamp, all of them), packed from `/` as the walk finds them (the walk's list is
/// a pipe into `tar`). One process, one answer.
pub(super) fn child_script(
    stem: &str,
    roots: &[String],
    prune: &[String],
    trees: &[WorkTree],
    since: Option<Stamp>,
) -> String {
    let quoted = shell_quote(stem);
    let mut checks = String::new();
    for tree in trees {
        let top = shell_quote(&tree.top);
        match since {
            Some(since) => checks.push_str(&format!(
                "if [ -d {top} ] && [ -n \"$(find {top} -xdev -newerct @{since} -print -quit 2>/dev/null)\" ]; \
                 then printf 1; else printf 0; fi; "
            )),
            None => checks.push_str("printf 1; "),
        }
    }
    let list = format!("{stem}.list");
    let manifest = match since {
        Some(since) => manifest_script(roots, prune, Some((&list, since))),
        // Every file counts as changed: all of them are packed.
        None => manifest_script(
            roots,
            prune,
            Some((&list, Stamp::parse("0").expect("zero"))),
        ),
    };
    let elsewhere = since.map_or_else(|| "true".to_owned(), |since| elsewhere_script(roots, since));
    fill(
        "set -e; S=STEM; \
         trap 'rm -f \"$S\".trees \"$S\".files \"$S\".elsewhere \"$S\".list \"$S\".tar' EXIT; \
         ( ELSEWHERE ) > \"$S\".elsewhere & elsewhere=$!; \
         { CHECKS:; } > \"$S\".trees; rm -f \"$S\".list; mkfifo -m 600 \"$S\".list; \
         ( cd / && exec tar -cf \"$S\".tar --null --no-recursion -T \"$S\".list ) & packer=$!; \
         ( MANIFEST ) > \"$S\".files; wait \"$packer\" || [ $? -eq 1 ]; wait \"$elsewhere\"; \
         for n in trees files elsewhere; do printf '%s %s\\n' \"$n\" \"$(stat -c %s \"$S.$n\")\"; cat \"$S.$n\"; done; \
         cat \"$S\".tar",
        &[
            ("STEM", &quoted),
            ("CHECKS", &checks),
            ("MANIFEST", &manifest),
            ("ELSEWHERE", &elsewhere),
        ],
    )
}

/// The child's answer to [`child_script`], checked.
pub(super) struct ChildAnswer {
    pub(super) trees: Vec<bool>,
    pub(super) manifest: Manifest,
    pub(super) elsewhere: Elsewhere,
    pub(super) archive: Bytes,
}

impl ChildAnswer {
    pub(super) fn parse(
        answer: &Bytes,
        trees: usize,
        roots: &[String],
    ) -> Result<ChildAnswer, String> {
        let mut rest = answer.clone();
        let mut section = |name: &str| -> Result<Bytes, String> {
            let line_end = rest
                .iter()
                .position(|b| *b == b'\n')
                .ok_or_else(|| format!("the answer has no {name} section"))?;
            let header = std::str::from_utf8(&rest[..line_end])
                .map_err(|_| format!("the {name} section's header is not UTF-8"))?;
            let length: usize = header
                .strip_prefix(name)
                .and_then(|length| length.strip_prefix(' '))
                .and_then(|length| length.parse().ok())
                .ok_or_else(|| format!("a {name} section was expected, not {header:?}"))?;
            let body_end = line_end + 1 + length;
            if body_end > rest.len() {
                return Err(format!("the {name} section is cut short"));
            }
            let body = rest.slice(line_end + 1..body_end);
            rest = rest.slice(body_end..);
            Ok(body)
        };
        let flags = section("trees")?;
        if flags.len() != trees || !flags.iter().all(|b| matches!(b, b'0' | b'1')) {
            return Err("the work trees' answer is not one 0 or 1 per tree".to_owned());
        }
        let manifest = Manifest::parse(&section("files")?)?;
        let elsewhere = Elsewhere::parse(&section("elsewhere")?, roots)?;
        Ok(ChildAnswer {
            trees: flags.iter().map(|b| *b == b'1').collect(),
            manifest,
            elsewhere,
            archive: rest,
        })
    }
}
