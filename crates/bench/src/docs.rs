//! `agent-sandbox-bench write-docs <report.md> <page.md>`: writes the figures of a full
//! `scripts/bench` run into `docs/benchmarks.md`, between its two marker comments. The rest of
//! the page is written by hand and never touched.

use std::path::Path;

/// The marker that opens the generated section.
pub(crate) const BEGIN: &str = "<!-- bench-report:begin -->";
/// The marker that closes it.
pub(crate) const END: &str = "<!-- bench-report:end -->";

/// Why the page was not written.
type DocsError = Box<dyn std::error::Error + Send + Sync>;

/// The part of a `report.md` the page shows: the paragraph that names the machine, the
/// versions and the run, then the table (and the failed scenarios, if any were listed).
/// Refuses a smoke run's report, whose figures mean nothing, and a report without a table.
pub(crate) fn figures_from_report(report: &str) -> Result<String, DocsError> {
    let paragraphs: Vec<&str> = report.split("\n\n").map(str::trim).collect();
    let machine = paragraphs
        .iter()
        .find(|paragraph| paragraph.starts_with("Machine:"))
        .ok_or("the report has no `Machine:` paragraph")?;
    if machine.contains("smoke sizes") {
        return Err("the report is of a smoke run (`--smoke`): its figures mean nothing".into());
    }
    let table: Vec<&str> = report
        .lines()
        .filter(|line| line.starts_with('|'))
        .collect();
    if table.len() < 3 {
        return Err("the report has no table of figures".into());
    }
    let mut section = format!("{machine}\n\n{}\n", table.join("\n"));
    if let Some(failed) = paragraphs
        .iter()
        .position(|p| p.starts_with("Failed scenarios:"))
    {
        for paragraph in &paragraphs[failed..] {
            section.push('\n');
            section.push_str(paragraph);
            section.push('\n');
        }
    }
    Ok(section)
}

/// `page` with what lies between [`BEGIN`] and [`END`] replaced by `section`; the markers and
/// everything outside them stay as they were. Each marker must appear exactly once, on a line
/// of its own, `BEGIN` first.
pub(crate) fn replace_section(page: &str, section: &str) -> Result<String, DocsError> {
    let begin = marker_line(page, BEGIN)?;
    let end = marker_line(page, END)?;
    if end < begin {
        return Err(format!("{END} comes before {BEGIN}").into());
    }
    let head = &page[..begin + BEGIN.len()];
    let tail = &page[end..];
    let body = section.trim_matches('\n');
    Ok(format!("{head}\n{body}\n{tail}"))
}

/// The byte offset of `marker`, which must be on a line of its own and appear only once.
fn marker_line(page: &str, marker: &str) -> Result<usize, DocsError> {
    let mut found = page.match_indices(marker).map(|(at, _)| at);
    let at = found
        .next()
        .ok_or_else(|| format!("no {marker} in the page"))?;
    if found.next().is_some() {
        return Err(format!("{marker} appears more than once in the page").into());
    }
    let line_start = page[..at].rfind('\n').map_or(0, |newline| newline + 1);
    let line_end = page[at..]
        .find('\n')
        .map_or(page.len(), |newline| at + newline);
    if page[line_start..line_end].trim() != marker {
        return Err(format!("{marker} is not on a line of its own").into());
    }
    Ok(at)
}

/// Reads `report`, writes its figures into `page` (atomically, through a temporary file beside
/// it), and says what it did.
pub(crate) fn write_docs(report: &Path, page: &Path) -> Result<(), DocsError> {
    let report_text = std::fs::read_to_string(report)
        .map_err(|error| format!("reading {}: {error}", report.display()))?;
    let page_text = std::fs::read_to_string(page)
        .map_err(|error| format!("reading {}: {error}", page.display()))?;
    let section = figures_from_report(&report_text)
        .map_err(|error| format!("{}: {error}", report.display()))?;
    let updated = replace_section(&page_text, &section)
        .map_err(|error| format!("{}: {error}", page.display()))?;
    let dir = page
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut temp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut temp, updated.as_bytes())?;
    temp.persist(page)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str =
        "# Benchmarks: our crates against the official E2B Python SDK, on e2b-local

Machine: 2 cores (cpu), 7000 MiB, Linux 6.1.
Versions: rustc 1.89.0; Python 3.11; e2b SDK 2.63.0; e2b-local 0.1.0; commit abc1234;
release builds. 2026-12-01 22:00 UTC; full sizes; 420 s.

**Compare ratios, not absolute times**: the method.

| scenario | latency | metric | ours | peer | peer value | ratio ours/peer | target | |
|---|---|---|---|---|---|---|---|---|
| steady | 0 ms | requests/command (writer) | 1.00 | SDK held | 1.00 | 1.00× | = 1 | met |
";

    fn page(generated: &str) -> String {
        format!("# Benchmarks\n\nBy hand.\n\n## Figures\n\n{BEGIN}\n{generated}\n{END}\n\nAfter.\n")
    }

    #[test]
    fn the_section_between_the_markers_is_replaced_and_nothing_else() {
        let old = page("| old | table |\n|---|---|\n| 1 | 2 |");
        let updated = replace_section(&old, "new figures\n").unwrap();
        assert_eq!(updated, page("new figures"));
        // Writing the same figures again changes nothing.
        assert_eq!(replace_section(&updated, "new figures").unwrap(), updated);
    }

    #[test]
    fn an_empty_section_is_filled() {
        let empty = format!("text\n{BEGIN}\n{END}\n");
        assert_eq!(
            replace_section(&empty, "figures").unwrap(),
            format!("text\n{BEGIN}\nfigures\n{END}\n")
        );
    }

    #[test]
    fn a_page_without_sound_markers_is_refused() {
        for (bad, says) in [
            (
                "no markers at all\n".to_owned(),
                "no <!-- bench-report:begin -->",
            ),
            (format!("{BEGIN}\nx\n"), "no <!-- bench-report:end -->"),
            (format!("{END}\nx\n{BEGIN}\n"), "comes before"),
            (format!("{BEGIN}\n{BEGIN}\n{END}\n"), "more than once"),
            (format!("text {BEGIN}\n{END}\n"), "not on a line of its own"),
        ] {
            let error = replace_section(&bad, "figures").unwrap_err().to_string();
            assert!(error.contains(says), "{bad:?}: {error}");
        }
    }

    #[test]
    fn the_figures_are_the_machine_paragraph_and_the_table() {
        let figures = figures_from_report(REPORT).unwrap();
        assert!(figures.starts_with("Machine: 2 cores"), "{figures}");
        assert!(
            figures.contains(
                "release builds. 2026-12-01 22:00 UTC; full sizes; 420 s.\n\n| scenario |"
            )
        );
        assert!(figures.ends_with("| = 1 | met |\n"), "{figures}");
        assert!(
            !figures.contains("Compare ratios"),
            "the method is the page's own text"
        );
    }

    #[test]
    fn failed_scenarios_stay_with_the_figures() {
        let report = format!("{REPORT}\nFailed scenarios:\n\n- pull: no number\n");
        let figures = figures_from_report(&report).unwrap();
        assert!(
            figures.ends_with("Failed scenarios:\n\n- pull: no number\n"),
            "{figures}"
        );
    }

    #[test]
    fn a_smoke_report_or_one_without_a_table_is_refused() {
        let smoke = REPORT.replace("full sizes", "smoke sizes");
        assert!(
            figures_from_report(&smoke)
                .unwrap_err()
                .to_string()
                .contains("smoke run")
        );
        let tableless: String = REPORT
            .lines()
            .filter(|l| !l.starts_with('|'))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            figures_from_report(&tableless)
                .unwrap_err()
                .to_string()
                .contains("no table")
        );
        assert!(figures_from_report("# nothing\n").is_err());
    }

    #[test]
    fn the_checked_in_page_has_sound_markers() {
        let page = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/benchmarks.md"
        ))
        .unwrap();
        let same = replace_section(
            &page,
            &page[page.find(BEGIN).unwrap() + BEGIN.len()..page.find(END).unwrap()],
        )
        .unwrap();
        assert_eq!(same, page, "rewriting the current figures changes nothing");
    }

    #[test]
    fn write_docs_rewrites_the_page_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let report = dir.path().join("report.md");
        let doc = dir.path().join("benchmarks.md");
        std::fs::write(&report, REPORT).unwrap();
        std::fs::write(&doc, page("old")).unwrap();
        write_docs(&report, &doc).unwrap();
        let written = std::fs::read_to_string(&doc).unwrap();
        assert!(
            written.contains(&format!("{BEGIN}\nMachine: 2 cores")),
            "{written}"
        );
        assert!(
            written.ends_with(&format!("| = 1 | met |\n{END}\n\nAfter.\n")),
            "{written}"
        );
        assert!(!written.contains("old"));
    }
}
