//! Every call ends (contract O7): the watchdog gives up on a call at its deadline and names
//! what it waited for; what the call started after that is killed; a killed command whose end
//! never comes is given up after its kill grace. Stalls are e2b-local requests held
//! unanswered until the test releases them.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use agent_sandbox::{
    Backend, DiscardSink, Error, NoStateHooks, RunOptions, RunningCommand, STALLED_RETRY,
    SandboxMode,
};
use e2b_local::{FaultScope, HoldRule, Release};

use crate::support::{World, ok};

fn with_grace(world: &World, grace: Duration) -> Backend {
    let mut config = world.config(SandboxMode::Persistent);
    config.watchdog_grace = grace;
    Backend::new(
        config,
        world.scope("watchdog"),
        world.services(),
        Arc::new(NoStateHooks),
    )
    .expect("backend")
}

fn hold(world: &World, path: &str) {
    world.server().faults().hold_request(HoldRule {
        skip: 0,
        scope: FaultScope::Envd,
        path_prefix: Some(path.to_owned()),
    });
}

#[test]
fn a_start_that_outlives_its_deadline_ends_naming_what_held_it_and_its_command_is_killed() {
    // contract: O7
    let world = World::new();
    let backend = with_grace(&world, Duration::from_secs(1));
    ok(&backend, "true");
    let sandbox = backend.info().expect("attached").sandbox_id;
    hold(&world, "/process.Process/Start");
    let (late_tx, late_rx) = mpsc::channel::<RunningCommand>();
    let deadline = backend.call_deadline(Duration::from_secs(1));
    let started = Instant::now();
    let outcome = backend.within(
        "start command",
        deadline,
        |backend| {
            backend.run(
                "exec sleep 600 # o7-late",
                RunOptions::new(Duration::from_secs(600)),
                Box::new(DiscardSink),
            )
        },
        move |command| {
            command.kill();
            let _ = late_tx.send(command);
        },
    );
    let waited = started.elapsed();
    let Err(error) = outcome else {
        panic!("the held start must end the call")
    };
    assert!(error.is_stalled(), "{error}");
    let text = error.to_string();
    assert!(
        text.starts_with(&format!(
            "E2B start command stalled for sandbox {sandbox}: waited "
        )),
        "{text}"
    );
    assert!(text.contains("held by `start command`"), "{text}");
    assert!(waited >= Duration::from_secs(2), "{waited:?}");
    assert!(
        waited < Duration::from_secs(2) + STALLED_RETRY * 3,
        "{waited:?}"
    );

    // A second call while the first is still stuck waits only STALLED_RETRY, naming both.
    let started = Instant::now();
    let second = backend.within(
        "sync state",
        backend.call_deadline(Duration::from_secs(60)),
        Backend::sync_state,
        drop,
    );
    let second = second.expect_err("the scope is still held");
    assert!(second.is_stalled());
    assert!(
        started.elapsed() < STALLED_RETRY + Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(
        second.to_string().contains("an earlier `start command`"),
        "{second}"
    );

    // Answered now: the command starts, nobody waits for it, and it is killed.
    world.server().faults().release_hold(Release::Continue);
    let late = late_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the late start reached the handler");
    let exit = late.wait();
    assert!(
        exit.is_ok_and(|exit| exit.termination == agent_sandbox::Termination::Killed),
        "the late command was killed"
    );
    let left = ok(&backend, "pgrep -f 'o7-[l]ate' || echo none");
    assert_eq!(left.trim(), "none");
    // And the scope works again, at full budget.
    assert_eq!(ok(&backend, "echo after").trim(), "after");
}

#[test]
fn a_killed_command_whose_end_never_comes_is_given_up_after_its_kill_grace() {
    // contract: O7
    let world = World::new();
    let backend = world.persistent();
    let mut options = RunOptions::new(Duration::from_secs(600));
    options.kill_grace = Duration::from_secs(1);
    let command = backend
        .run("exec sleep 600", options, Box::new(DiscardSink))
        .expect("run");
    // The kill's first step (the group kill, a command of its own) is never answered, so
    // the command's end never comes.
    hold(&world, "/process.Process/Start");
    let started = Instant::now();
    command.kill();
    let result = command.wait();
    let waited = started.elapsed();
    let Err(error) = result else {
        panic!("an unanswered kill cannot end the command")
    };
    assert!(
        matches!(error.as_ref(), Error::CommandAbandoned { .. }),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("did not end within 1 s of being killed"),
        "{error}"
    );
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    world.server().faults().clear();
}
