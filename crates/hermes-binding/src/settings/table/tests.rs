//! The surfaces that name settings outside Rust, checked against the table: the shim's
//! `plugin.yaml` (read by Hermes before any native code runs) and the README.

use super::*;

fn crate_file(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The setting a line of a `config_schema` section belongs to (the last `  key:` above it).
fn schema_key_at(lines: &[&str], index: usize) -> String {
    lines[..=index.min(lines.len().saturating_sub(1))]
        .iter()
        .rev()
        .find_map(|line| {
            let key = line.strip_prefix("  ")?.strip_suffix(':')?;
            (!key.starts_with(' ')).then(|| key.to_owned())
        })
        .unwrap_or_else(|| "config_schema".to_owned())
}

/// Keys in `expected` order that `found` lacks, and keys `found` has beyond `expected`.
fn missing_and_extra(expected: &[&str], found: &[String]) -> (Vec<String>, Vec<String>) {
    let missing = expected
        .iter()
        .filter(|key| !found.iter().any(|found| found == *key))
        .map(|key| (*key).to_owned())
        .collect();
    let extra = found
        .iter()
        .filter(|key| !expected.contains(&key.as_str()))
        .cloned()
        .collect();
    (missing, extra)
}

fn table_keys() -> Vec<&'static str> {
    SETTINGS.iter().map(|setting| setting.key).collect()
}

#[test]
fn plugin_yaml_config_schema_is_the_table() {
    let manifest = crate_file("plugin/plugin.yaml");
    let start = manifest
        .find("\nconfig_schema:\n")
        .expect("plugin.yaml has a config_schema section")
        + 1;
    let committed = &manifest[start..];
    let expected = plugin_yaml_config_schema();
    if committed == expected {
        return;
    }
    // Name what differs before showing the whole section to paste.
    let committed_lines: Vec<&str> = committed.lines().collect();
    let expected_lines: Vec<&str> = expected.lines().collect();
    let keys = |lines: &[&str]| -> Vec<String> {
        lines
            .iter()
            .filter_map(|line| line.strip_prefix("  ")?.strip_suffix(':'))
            .filter(|key| !key.starts_with(' '))
            .map(str::to_owned)
            .collect()
    };
    let (missing, extra) = missing_and_extra(&table_keys(), &keys(&committed_lines));
    let first = committed_lines
        .iter()
        .zip(&expected_lines)
        .position(|(found, wanted)| found != wanted)
        .unwrap_or(committed_lines.len().min(expected_lines.len()));
    panic!(
        "plugin/plugin.yaml's config_schema differs from the settings table (settings/table.rs): \
         missing {missing:?}, extra {extra:?}; first difference under {:?}: found {:?}, \
         expected {:?}.\nThe section the table gives (from `config_schema:` to the end of \
         the file):\n{expected}",
        schema_key_at(&expected_lines, first),
        committed_lines.get(first),
        expected_lines.get(first),
    );
}

/// The README's `## Settings` section.
fn readme_settings_section() -> String {
    let readme = crate_file("README.md");
    let start = readme
        .find("\n## Settings\n")
        .expect("README has ## Settings");
    let rest = &readme[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |end| end + 3);
    rest[..end].to_owned()
}

#[test]
fn readme_settings_table_is_the_table() {
    // Rows are `| `key` | type | default | meaning |`; the meaning is free prose.
    let section = readme_settings_section();
    let rows: Vec<Vec<String>> = section
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            line.trim_matches('|')
                .splitn(4, '|')
                .map(|cell| cell.trim().to_owned())
                .collect()
        })
        .collect();
    let keys: Vec<String> = rows
        .iter()
        .map(|row| row[0].trim_matches('`').to_owned())
        .collect();
    let (missing, extra) = missing_and_extra(&table_keys(), &keys);
    assert!(
        missing.is_empty() && extra.is_empty(),
        "README's settings table: missing {missing:?}, extra {extra:?}"
    );
    assert_eq!(
        keys,
        table_keys(),
        "README's settings table: the table's order"
    );
    let mut wrong = Vec::new();
    for (setting, row) in SETTINGS.iter().zip(&rows) {
        let (kind, default) = (setting.kind.readme_type(), setting.readme_default());
        if row.get(1) != Some(&kind) {
            wrong.push(format!(
                "{}: type {:?}, expected {kind:?}",
                setting.key,
                row.get(1)
            ));
        }
        if row.get(2) != Some(&default) {
            wrong.push(format!(
                "{}: default {:?}, expected {default:?}",
                setting.key,
                row.get(2)
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "README's settings table:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn readme_yaml_example_names_every_setting_and_shows_fixed_defaults() {
    // The example under `settings:` shows every key in the table's order; where a key has a
    // fixed default, the value shown is that default.
    let section = readme_settings_section();
    let block = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("README's settings section has a yaml example");
    let entries: Vec<(String, String)> = block
        .lines()
        .skip_while(|line| line.trim() != "settings:")
        .skip(1)
        .filter_map(|line| {
            let entry = line.strip_prefix("        ")?;
            // A key the example shows commented out (it needs the user's own value).
            let entry = entry.strip_prefix("# ").unwrap_or(entry);
            if entry.starts_with(' ') {
                return None; // a nested value (metadata's mapping)
            }
            let (key, value) = entry.split_once(':')?;
            let value = value.split(" #").next().unwrap_or("").trim();
            Some((key.to_owned(), value.to_owned()))
        })
        .collect();
    let keys: Vec<String> = entries.iter().map(|(key, _)| key.clone()).collect();
    let (missing, extra) = missing_and_extra(&table_keys(), &keys);
    assert!(
        missing.is_empty() && extra.is_empty(),
        "README's yaml example: missing {missing:?}, extra {extra:?}"
    );
    assert_eq!(
        keys,
        table_keys(),
        "README's yaml example: the table's order"
    );
    for (setting, (_, value)) in SETTINGS.iter().zip(&entries) {
        if let Some(default) = setting.fixed_default() {
            assert_eq!(
                value,
                &default.render(),
                "README's yaml example shows {} other than its default",
                setting.key
            );
        }
    }
}

#[test]
fn yaml_scalars_quote_only_where_yaml_would_misread() {
    assert_eq!(yaml_scalar("base"), "base");
    assert_eq!(yaml_scalar("false puts it behind"), "false puts it behind");
    assert_eq!(yaml_scalar("a: b"), "\"a: b\"");
    assert_eq!(yaml_scalar("true"), "\"true\"");
    assert_eq!(yaml_scalar("30"), "\"30\"");
    assert_eq!(yaml_scalar("say \"hi\": now"), "\"say \\\"hi\\\": now\"");
}
