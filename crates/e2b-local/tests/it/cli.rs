//! The `e2b-local serve` binary: URL lines on stdout, clean exits.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn url_lines(child: &mut std::process::Child) -> (String, String) {
    let stdout = child.stdout.take().expect("stdout piped");
    let mut lines = BufReader::new(stdout).lines();
    let api = lines.next().expect("first line").expect("utf-8");
    let sandbox = lines.next().expect("second line").expect("utf-8");
    (api, sandbox)
}

#[tokio::test]
async fn serve_prints_urls_and_exits_on_stdin_eof() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_e2b-local"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--exit-on-stdin-eof",
            "--api-key",
            "k1",
            "--max-running",
            "1",
        ])
        .arg("--state-dir")
        .arg(dir.path())
        .args(["--template", "python"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("binary starts");
    let (api, sandbox) = url_lines(&mut child);
    let url = api
        .strip_prefix("E2B_API_URL=")
        .expect("API line")
        .to_owned();
    assert_eq!(sandbox, format!("E2B_SANDBOX_URL={url}"));
    assert!(url.starts_with("http://127.0.0.1:"));

    let http = reqwest::Client::new();
    let created = http
        .post(format!("{url}/v2/sandboxes"))
        .header("x-api-key", "k1")
        .body(r#"{"templateID":"python"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
    // contract: L14 (`--max-running` is E2B's concurrency limit)
    let over_the_limit = http
        .post(format!("{url}/v2/sandboxes"))
        .header("x-api-key", "k1")
        .body(r#"{"templateID":"python"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(over_the_limit.status().as_u16(), 429);
    let wrong_key = http
        .get(format!("{url}/v2/sandboxes"))
        .header("x-api-key", "other")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_key.status().as_u16(), 401);

    drop(child.stdin.take()); // EOF
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
    // The sandbox record stays in the state directory.
    assert_eq!(
        std::fs::read_dir(dir.path().join("sandboxes"))
            .unwrap()
            .count(),
        1
    );
}

#[tokio::test]
async fn serve_stops_cleanly_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_e2b-local"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("binary starts");
    let (api, _) = url_lines(&mut child);
    let url = api.strip_prefix("E2B_API_URL=").unwrap().to_owned();
    assert_eq!(
        reqwest::get(format!("{url}/health"))
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: kill has no memory-safety preconditions; pid is our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn the_readme_flag_table_is_one_table_naming_every_serve_flag() {
    // The flags `serve --help` prints, each in the README's table, which is one table (no
    // paragraph breaking it in two) in the order the help gives them.
    let help = Command::new(env!("CARGO_BIN_EXE_e2b-local"))
        .args(["serve", "--help"])
        .output()
        .expect("e2b-local serve --help");
    let help = String::from_utf8(help.stdout).expect("utf-8 help");
    let flags: Vec<&str> = help
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("--"))
        .map(|rest| rest.split([' ', '<']).next().unwrap_or(rest))
        .filter(|flag| *flag != "help")
        .collect();
    assert!(flags.len() >= 10, "parsed the help: {flags:?}");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("the crate README");
    let start = readme
        .find("| flag | meaning |")
        .expect("the flag table's header");
    let table: Vec<&str> = readme[start..]
        .lines()
        .take_while(|line| line.starts_with('|'))
        .collect();
    let listed: Vec<&str> = table
        .iter()
        .skip(2)
        .flat_map(|row| row.split('`').nth(1).unwrap_or("").split_whitespace())
        .filter_map(|word| word.strip_prefix("--"))
        .collect();
    assert_eq!(
        listed, flags,
        "the README's flag table against `serve --help`"
    );
}
