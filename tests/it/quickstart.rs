//! Runs `examples/quickstart.rs` end to end and checks what it prints, so the main job
//! cannot silently rot.

#[allow(dead_code)]
#[path = "../../examples/quickstart.rs"]
mod example;

#[test]
fn the_quickstart_streams_pauses_resumes_and_recovers_a_skill_after_a_restart() {
    // contract: L2, S5 — a persistent scope across two Backends is found again, resumed,
    // and a skill written only in the sandbox is recovered onto the host.
    let mut out = Vec::new();
    example::run(&mut out).expect("the quickstart runs");
    let text = String::from_utf8(out).expect("utf-8 output");

    // Part 1: streaming, files, pause and resume.
    for expected in [
        "] line 1",
        "] line 3",
        "[exit code 0]",
        "wrote 2 files:",
        "state after pause: Paused",
        "connect: resumed",
        "hello from the sandbox",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }

    // Part 2: the restart.
    let id = text
        .lines()
        .find_map(|line| line.strip_prefix("session 1: first use created sandbox "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no created sandbox in:\n{text}"))
        .to_owned();
    for expected in [
        "host has skills/quickstart/SKILL.md: false".to_owned(),
        format!("the lease has run out: {id} is Paused"),
        format!("session 2: attached to {id} (found by metadata, resumed)"),
        "session 2: bring-up recovered skills/quickstart/SKILL.md onto the host".to_owned(),
    ] {
        assert!(text.contains(&expected), "missing {expected:?} in:\n{text}");
    }
    // The recovered host file's contents are printed, then read in the sandbox again.
    let skill_lines = text
        .lines()
        .filter(|line| line.trim() == "# quickstart skill: written in the sandbox")
        .count();
    assert_eq!(skill_lines, 2, "{text}");
}
