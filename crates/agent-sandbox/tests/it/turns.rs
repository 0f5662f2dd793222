//! Turn-level file checkpoints against e2b-local (contract R9, R10).
#![allow(clippy::print_stdout)] // The turn-checkpoint cost test prints its figures.

use std::time::{Duration, Instant};

use agent_sandbox::{RoleKind, TurnRequest};

use crate::support::{World, ok};

const HOME: &str = "/home/user";

fn turn(directory: &str, label: &str, keep: usize) -> TurnRequest {
    TurnRequest {
        directory: directory.to_owned(),
        label: label.to_owned(),
        keep,
    }
}

// contract: R9
#[test]
fn a_turn_checkpoint_is_one_command_bounded_in_count_and_leaves_hermes_state_out() {
    let world = World::new();
    let backend = world.persistent();
    backend.attach().expect("attach");
    ok(
        &backend,
        "mkdir -p ~/work ~/.hermes/memories && printf v1 > ~/work/app.txt && printf m > ~/.hermes/memories/MEMORY.md",
    );
    let before = world.server().requests();
    let stats = backend.stats();
    let first = backend
        .turn_checkpoint(turn("~", "turn 1: before write_file", 2))
        .expect("turn checkpoint");
    let spent = world.server().requests().since(&before);
    // One process start in the sandbox; no control-plane request at all.
    assert_eq!(spent.total(), 1, "{spent:?}");
    assert_eq!(backend.stats().commands, stats.commands + 1);
    assert_eq!(backend.stats().snapshots, stats.snapshots);
    assert_eq!(first.number, 1);
    assert_eq!(first.directory, HOME);
    assert_eq!(first.label, "turn 1: before write_file");
    assert!(first.bytes > 0 && first.entries >= 3, "{first:?}");
    let archived = ok(&backend, "tar -tf ~/.hermes-e2b/turns/1/files.tar");
    assert!(archived.contains("./work/app.txt"), "{archived}");
    assert!(
        !archived.contains(".hermes/") && !archived.contains(".hermes-e2b"),
        "the state directory and the store stay out: {archived}"
    );
    for n in 2..=4 {
        backend
            .turn_checkpoint(turn(HOME, &format!("turn {n}"), 2))
            .expect("turn checkpoint");
    }
    let listed = backend.turn_checkpoints().expect("list");
    let numbers: Vec<u64> = listed.iter().map(|t| t.number).collect();
    assert_eq!(numbers, [4, 3], "keep 2, newest first");
    assert_eq!(listed[0].label, "turn 4");
}

// contract: R1, R9
#[test]
fn only_the_writer_takes_or_restores_turn_checkpoints() {
    let world = World::new();
    let writer = world.persistent();
    writer.attach().expect("writer");
    let reader = world.persistent();
    assert_eq!(reader.attach().expect("reader").role, RoleKind::Reader);
    let refused = reader
        .turn_checkpoint(turn(HOME, "reader", 3))
        .expect_err("reader refused");
    assert!(refused.is_checkpoint_refused(), "{refused}");
    let refused = reader
        .restore_turn(1, 3, Duration::ZERO)
        .expect_err("reader refused");
    assert!(refused.is_checkpoint_refused(), "{refused}");
}

// contract: R10
#[test]
fn a_turn_restore_puts_the_directory_back_keeps_hermes_state_and_can_be_undone() {
    let world = World::new();
    let backend = world.persistent();
    backend.attach().expect("attach");
    ok(
        &backend,
        "mkdir -p ~/work/src && printf good > ~/work/src/app.txt && printf keep > ~/work/notes",
    );
    let good = backend
        .turn_checkpoint(turn("~/work", "turn 1", 5))
        .expect("checkpoint");
    // The turn breaks the workspace, and the agent learns something meanwhile.
    ok(
        &backend,
        "rm -rf ~/work/src && printf bad > ~/work/notes && printf new > ~/work/created && \
         mkdir -p ~/.hermes/memories && printf learned > ~/.hermes/memories/MEMORY.md",
    );
    let missing = backend
        .restore_turn(99, 5, Duration::ZERO)
        .expect_err("no such turn");
    assert!(
        missing.is_checkpoint_refused() && missing.to_string().contains("turn checkpoint 99"),
        "{missing}"
    );
    let before = world.server().requests();
    let restored = backend
        .restore_turn(good.number, 5, Duration::ZERO)
        .expect("restore");
    let spent = world.server().requests().since(&before);
    assert_eq!(spent.total(), 1, "{spent:?}");
    assert_eq!(restored.restored.number, good.number);
    assert_eq!(
        ok(
            &backend,
            "cat ~/work/src/app.txt ~/work/notes; ls ~/work; cat ~/.hermes/memories/MEMORY.md"
        )
        .trim(),
        "goodkeepnotes\nsrc\nlearned"
    );
    // The undo point holds the broken state: restoring it brings that back.
    backend
        .restore_turn(restored.undo.number, 5, Duration::ZERO)
        .expect("undo");
    assert_eq!(
        ok(&backend, "ls ~/work; cat ~/work/notes").trim(),
        "created\nnotes\nbad"
    );
}

/// The cost on a 10,000-file workspace (figures printed, not asserted: the machine is shared).
#[test]
fn turn_checkpoint_cost_on_a_ten_thousand_file_workspace() {
    let world = World::new();
    let backend = world.persistent();
    backend.attach().expect("attach");
    ok(
        &backend,
        "mkdir -p ~/big && cd ~/big && for d in $(seq 1 100); do mkdir d$d; \
         for f in $(seq 1 100); do printf 'file %s %s\\n' $d $f > d$d/f$f.txt; done; done",
    );
    let started = Instant::now();
    let taken = backend
        .turn_checkpoint(turn("~/big", "cost", 3))
        .expect("checkpoint");
    let take = started.elapsed();
    ok(&backend, "rm -rf ~/big/d1 ~/big/d2");
    let started = Instant::now();
    backend
        .restore_turn(taken.number, 3, Duration::ZERO)
        .expect("restore");
    let restore = started.elapsed();
    assert_eq!(ok(&backend, "find ~/big -type f | wc -l").trim(), "10000");
    println!(
        "turn checkpoint of 10,000 files: {} entries, {} KiB archive, take {:.0} ms, restore {:.0} ms (1 request each)",
        taken.entries,
        taken.bytes / 1024,
        take.as_secs_f64() * 1000.0,
        restore.as_secs_f64() * 1000.0
    );
}
