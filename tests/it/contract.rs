//! `docs/contract.md` stays true to the tests: every line has tests, and every test it names
//! exists in the file it names (a renamed or moved test fails here, not silently).

use std::collections::BTreeMap;
use std::path::Path;

/// One contract line: its id and the `(file, test)` pairs its "Tests:" list names.
struct Line {
    id: String,
    tests: Vec<(String, String)>,
}

/// Text in backticks, outside parentheses (which hold remarks, not test names).
fn quoted(text: &str) -> Vec<String> {
    let mut plain = String::new();
    let mut depth = 0usize;
    let mut in_quote = false;
    for c in text.chars() {
        match c {
            '`' => {
                in_quote = !in_quote;
                if depth == 0 {
                    plain.push(c);
                }
            }
            '(' if !in_quote => depth += 1,
            ')' if !in_quote => depth = depth.saturating_sub(1),
            _ if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    plain
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn is_test_file(token: &str) -> bool {
    (token.starts_with("crates/") || token.starts_with("tests/"))
        && (token.ends_with(".rs") || token.ends_with(".py"))
}

fn is_name(token: &str) -> bool {
    !token.is_empty()
        && token
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn lines(contract: &str) -> Vec<Line> {
    // Each line's "Tests:" list as one text (a remark in parentheses may span rows).
    let mut blocks: Vec<(String, String)> = Vec::new();
    let mut in_tests = false;
    for row in contract.lines() {
        if let Some(rest) = row.strip_prefix("- **") {
            let id = rest.split("**").next().unwrap_or_default().to_owned();
            blocks.push((id, String::new()));
            in_tests = false;
            continue;
        }
        if row.starts_with('#') {
            in_tests = false;
            continue;
        }
        if row.trim_start().starts_with("- Tests:") {
            in_tests = true;
        }
        if in_tests && let Some((_, text)) = blocks.last_mut() {
            text.push_str(row);
            text.push('\n');
        }
    }
    blocks
        .into_iter()
        .map(|(id, text)| {
            let mut tests = Vec::new();
            let mut file: Option<String> = None;
            for token in quoted(&text) {
                if is_test_file(&token) {
                    file = Some(token);
                } else if is_name(&token)
                    && let Some(file) = &file
                {
                    tests.push((file.clone(), token));
                }
            }
            Line { id, tests }
        })
        .collect()
}

#[test]
fn every_contract_line_names_tests_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let contract = std::fs::read_to_string(root.join("docs/contract.md")).expect("contract");
    let lines = lines(&contract);
    assert!(lines.len() >= 55, "{} lines parsed", lines.len());
    let mut sources: BTreeMap<String, String> = BTreeMap::new();
    let mut missing = Vec::new();
    let mut named = 0;
    for line in &lines {
        assert!(!line.tests.is_empty(), "{} names no test", line.id);
        for (file, name) in &line.tests {
            let source = sources
                .entry(file.clone())
                .or_insert_with(|| std::fs::read_to_string(root.join(file)).unwrap_or_default());
            let defined = [
                format!("fn {name}("),
                format!("fn {name}<"),
                format!("def {name}("),
            ]
            .iter()
            .any(|definition| source.contains(definition.as_str()));
            if !defined {
                missing.push(format!("{}: {file}: {name}", line.id));
            }
            named += 1;
        }
    }
    assert!(
        missing.is_empty(),
        "named but not defined:\n{}",
        missing.join("\n")
    );
    assert!(named >= 200, "only {named} test names parsed");
}
