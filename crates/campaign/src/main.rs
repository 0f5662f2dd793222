//! `campaign [--cycles N] [--seed S] [--dir D] [--hosts 1|2] [--hermes-python PATH
//! [--hermes-share F]] [--step-share F]`: the crash/fault campaign (run it through
//! `scripts/campaign`, which builds the binaries first).
//!
//! Randomized, seeded cycles of real `campaign-host` processes (each a persistent-mode
//! `Backend`) on one scope against an `e2b-local serve --state-dir` process. Each cycle
//! edits skills and memories on the host and in the sandbox (fresh rewrites, appends,
//! truncations and last-byte changes, drawn from the seed), starts one or two host
//! processes that attach, run commands and clean up, and injects faults drawn from the
//! seed: SIGKILL of a host process (at a random moment, or as a push or pull starts),
//! injected 5xx answers, dropped connections, streams cut mid-transfer, the sandbox
//! vanishing or paused, its lease expiring (the server's clock jumps), and e2b-local
//! killed and restarted on its state directory (refusing connections meanwhile). After
//! every cycle it checks: no version of a skills/memories file the user wrote is lost (each,
//! by its full bytes, is on the host, in a sandbox or in quarantine), nothing was written
//! outside the Hermes home, two processes never pushed at once, and no command ran without
//! this cycle's state; and after each kill of e2b-local, that no process of the killed server
//! outlived it.
//! The seed fixes every draw (the schedule); the timing of real processes is not fixed, so
//! a replay repeats the schedule, not every interleaving.
//!
//! Checkpoint steps (`--step-share`; see `steps`): a one-process cycle's host may also
//! checkpoint, roll back, or fork and adopt, with faults inside those steps (SIGKILL between
//! two requests of a rollback or an adoption, 5xx on the snapshot call, a sandbox vanishing
//! mid-fork); after such a cycle a fresh host's bring-up must leave exactly one adoptable
//! sandbox of the scope, and no state version may be lost across a rollback.
//!
//! With `--hosts 2` the processes stand in for two machines sharing the profile: each
//! process belongs to host 0 or 1 (its own coordination directory, hence host lock and host
//! id) with `writer_arbitration: sandbox` and a grant of [`TWO_HOST_TERM`]; faults then also
//! include SIGSTOP of a process past its term and SIGCONT after. "Never two writers" becomes:
//! processes of one host never push at once, the sandbox's writer record never goes back a
//! generation, and no write of an older generation lands after a newer one's (each push
//! uploads a marker naming its process; see `campaign::GenerationWatch`).
//!
//! With `--hermes-python` (a venv's Python holding Hermes and the hermes-e2b wheel) a share of
//! the host processes (`--hermes-share`, a third by default) are Hermes hosts instead:
//! `hermes_host.py`, a real Hermes whose terminal tool and `cleanup_vm` drive the plugin (its
//! push through Hermes' FileSyncManager, Hermes' own `sync_back` at teardown), speaking
//! `campaign-host`'s protocol, on the same scope (Hermes' task `default`). The checks hold
//! unchanged; the Hermes home may also hold what Hermes itself creates there, and the
//! temporary directory Hermes' own sync staging. One host only: the plugin has no setting for
//! a coordination directory of its own, so it cannot stand in for a second machine.
//!
//! Exits 1 with the seed on any violation.

#![allow(clippy::print_stdout, clippy::print_stderr)]

mod args;
mod checks;
mod cycle;
mod edits;
mod faults;
mod hosts;
mod inject;
mod server;
mod state;
mod step_plan;
mod steps;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use campaign::{EDIT_KINDS, Ledger, Side};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::faults::{FAULTS, Fault};
use crate::server::LocalServer;
use crate::state::Campaign;

/// The API key the host processes use; it must appear in no answer or error.
const API_KEY: &str = "campaign-local-key";
/// The files the user edits, relative to the Hermes home.
const FILES: [&str; 8] = [
    "skills/alpha/SKILL.md",
    "skills/beta/SKILL.md",
    "skills/beta/references/notes.md",
    "skills/gamma/SKILL.md",
    "memories/MEMORY.md",
    "memories/USER.md",
    "memories/projects/one.md",
    "memories/projects/two.md",
];
/// The writer grant in the two-host mode: short, so a stopped writer is taken over within a
/// cycle.
const TWO_HOST_TERM: Duration = Duration::from_secs(2);
/// How long sandbox-side edits wait for requests a killed host left running at e2b-local.
const QUIESCE_WAIT: Duration = Duration::from_secs(10);
/// The marker each push uploads in the two-host mode (see `campaign-host`).
const MARKER: &str = "skills/campaign/writer";
/// The file whose content names the cycle; every command prints it.
const EPOCH_FILE: &str = "skills/campaign/epoch";
/// The scope's task: Hermes' CLI keys its one persistent environment `default`, so every host
/// process uses that task and all of them share one scope, Rust and Hermes hosts alike.
const TASK: &str = "default";
/// The Hermes host program, run by `--hermes-python`.
const HERMES_HOST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/hermes_host.py");

type Error = Box<dyn std::error::Error>;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(0) => std::process::ExitCode::SUCCESS,
        Ok(_) => std::process::ExitCode::FAILURE,
        Err(error) => {
            eprintln!("campaign: {error}");
            std::process::ExitCode::from(2)
        }
    }
}

fn run() -> Result<usize, Error> {
    let args = args::parse_args()?;
    let bin_dir = std::env::current_exe()?
        .parent()
        .ok_or("no binary directory")?
        .to_path_buf();
    let temp;
    let root = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            dir.clone()
        }
        None => {
            temp =
                std::env::temp_dir().join(format!("campaign-{}-{}", std::process::id(), args.seed));
            std::fs::create_dir_all(&temp)?;
            temp.clone()
        }
    };
    let home = root.join("hermes-home");
    for dir in [
        "coordination-0",
        "coordination-1",
        "hermes-home/skills",
        "hermes-home/memories",
        "state",
        "logs",
        "host-home",
        "host-tmp",
        "host-cwd",
    ] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    let server = LocalServer::start(
        &bin_dir.join("e2b-local"),
        &root.join("state"),
        &root.join("logs").join("e2b-local.log"),
        0,
    )?;
    println!(
        "campaign: seed {}, {} cycles, {} host(s), e2b-local at {}, directory {}",
        args.seed,
        args.cycles,
        args.hosts,
        server.url(),
        root.display()
    );
    if let Some(python) = &args.hermes_python {
        println!(
            "campaign: Hermes hosts ({:.0}% of processes) run {HERMES_HOST} under {}",
            args.hermes_share * 100.0,
            python.display()
        );
        // The e2b-local URL is fixed for the run (restarts reuse the port).
        write_hermes_config(&home, &server.url())?;
    }
    let mut campaign = Campaign {
        rng: StdRng::seed_from_u64(args.seed),
        push_log: root.join("logs").join("push.log"),
        host_bin: bin_dir.join("campaign-host"),
        home,
        server,
        ledger: Ledger::default(),
        sandbox: None,
        injected: BTreeMap::new(),
        violations: Vec::new(),
        outside_baseline: BTreeSet::new(),
        edits: BTreeMap::new(),
        commands_ok: 0,
        commands_failed: 0,
        trace: Vec::new(),
        previous_trace: Vec::new(),
        cycle_start: Instant::now(),
        root: root.clone(),
        hosts: args.hosts,
        stopped: Vec::new(),
        generations: BTreeMap::new(),
        fenced: 0,
        machine_pids: Vec::new(),
        hermes_python: args.hermes_python.clone(),
        hermes_share: args.hermes_share,
        hermes_processes: 0,
        processes: 0,
        hermes_commands_ok: 0,
        hermes_commands_failed: 0,
        hermes_home_entries: BTreeSet::new(),
        // A generator of its own, so adding the steps left every other draw of a seed as it was.
        steps_rng: StdRng::seed_from_u64(args.seed ^ 0x636b_7074),
        step: None,
        step_stats: step_plan::StepStats::default(),
        step_share: args.step_share,
        cycle_no: 0,
        limit_until: None,
    };
    if let Some(python) = &args.hermes_python {
        campaign.hermes_home_entries = campaign.bootstrap_hermes(python)?;
    }
    campaign.outside_baseline = campaign.outside_home();
    let started = Instant::now();
    for cycle in 1..=args.cycles {
        let before = campaign.violations.len();
        campaign.cycle(cycle)?;
        for violation in &campaign.violations[before..] {
            println!("VIOLATION in cycle {cycle}: {violation}");
        }
        let violated = campaign.violations.len() > before;
        // CAMPAIGN_TRACE=1 prints every cycle's trace (for reading a mode's behaviour).
        if violated || std::env::var_os("CAMPAIGN_TRACE").is_some() {
            if violated {
                println!("  trace of the cycle before:");
                for line in &campaign.previous_trace {
                    println!("    {line}");
                }
            }
            println!("  trace of cycle {cycle}:");
            for line in &campaign.trace {
                println!("    {line}");
            }
        }
        if cycle % 50 == 0 {
            println!(
                "campaign: {cycle} cycles, {} violations, {:.0?}",
                campaign.violations.len(),
                started.elapsed()
            );
        }
    }
    println!(
        "campaign: {} cycles in {:.1?}, seed {}",
        args.cycles,
        started.elapsed(),
        args.seed
    );
    let stop = (args.hosts == 2).then_some(Fault::StopWriter);
    for fault in FAULTS.into_iter().chain(stop) {
        println!(
            "  {:<55} {}",
            fault.name(),
            campaign.injected.get(&fault).copied().unwrap_or(0)
        );
    }
    for kind in step_plan::STEP_FAULT_KINDS {
        println!(
            "  {:<55} {}",
            kind,
            campaign.step_stats.faults.get(kind).copied().unwrap_or(0)
        );
    }
    for kind in EDIT_KINDS {
        let made = |side| campaign.edits.get(&(side, kind)).copied().unwrap_or(0);
        println!(
            "  {:<55} {} host, {} sandbox",
            kind.name(),
            made(Side::Host),
            made(Side::Sandbox)
        );
    }
    println!(
        "  versions written: {}; commands: {} completed, {} refused or failed",
        campaign.ledger.written(),
        campaign.commands_ok,
        campaign.commands_failed
    );
    let done = |kind| {
        campaign
            .step_stats
            .done
            .get(kind)
            .copied()
            .unwrap_or_default()
    };
    let (checkpoints, rollbacks, forks, prunes) = (
        done("checkpoint"),
        done("rollback"),
        done("fork-adopt"),
        done("prune"),
    );
    println!(
        "  steps (done, refused or failed): checkpoint {}/{}, rollback {}/{}, fork+adopt {}/{}, \
         prune {}/{}; {} recovery bring-ups checked for one adoptable sandbox ({} with I5's plain \
         duplicate creates); {} rollbacks and adoptions checked for lost state",
        checkpoints.0,
        checkpoints.1,
        rollbacks.0,
        rollbacks.1,
        forks.0,
        forks.1,
        prunes.0,
        prunes.1,
        campaign.step_stats.recoveries,
        campaign.step_stats.tolerated_duplicates,
        campaign.step_stats.rollbacks_checked
    );
    if args.hermes_python.is_some() {
        println!(
            "  Hermes hosts: {} of {} host processes; their commands: {} completed, {} refused \
             or failed",
            campaign.hermes_processes,
            campaign.processes,
            campaign.hermes_commands_ok,
            campaign.hermes_commands_failed
        );
    }
    if args.hosts == 2 {
        let watches = campaign.generations.values();
        let (takeovers, unattributed) =
            watches.fold((0, 0), |(t, u), w| (t + w.takeovers, u + w.unattributed));
        println!(
            "  two hosts: {takeovers} hand-overs between hosts seen in the writer record, {} \
             commands fenced, \
             {unattributed} landed pushes not attributed to a generation",
            campaign.fenced
        );
    }
    // A campaign in which nothing works proves nothing: most cycles must get commands through
    // (each cycle runs at least one; faults refuse some).
    if args.cycles >= 10 && campaign.commands_ok < args.cycles / 4 {
        campaign.violations.push(format!(
            "only {} commands completed in {} cycles: the backend hardly worked",
            campaign.commands_ok, args.cycles
        ));
        println!(
            "VIOLATION: {}",
            campaign.violations[campaign.violations.len() - 1]
        );
    }
    let violations = campaign.violations.len();
    println!("  violations: {violations}");
    if violations > 0 {
        println!(
            "campaign: FAILED; replay the schedule with: scripts/campaign --seed {} --cycles {} \
             --hosts {} --step-share {}{}",
            args.seed,
            args.cycles,
            args.hosts,
            args.step_share,
            args.hermes_python
                .as_ref()
                .map(|python| format!(
                    " --hermes-python {} --hermes-share {}",
                    python.display(),
                    args.hermes_share
                ))
                .unwrap_or_default()
        );
    } else if args.dir.is_none() {
        drop(campaign);
        let _ = std::fs::remove_dir_all(&root);
    }
    Ok(violations)
}

/// The Hermes home's `.env` (the API key, where a Hermes user keeps it) and `config.yaml`
/// (JSON is YAML): the e2b backend, persistent, against e2b-local, with campaign-host's
/// settings (its `Config::new` lease, a 30 s command deadline).
fn write_hermes_config(home: &std::path::Path, url: &str) -> Result<(), Error> {
    std::fs::write(home.join(".env"), format!("E2B_API_KEY={API_KEY}\n"))?;
    let config = serde_json::json!({
        "terminal": {
            "backend": "e2b",
            "container_persistent": true,
            "timeout": 30,
        },
        "plugins": {
            "enabled": ["e2b"],
            "entries": {"e2b": {"settings": {
                "api_url": url,
                "sandbox_url": url,
                "lease_seconds": agent_sandbox::DEFAULT_LEASE.as_secs(),
            }}},
        },
    });
    std::fs::write(
        home.join("config.yaml"),
        serde_json::to_string_pretty(&config)?,
    )?;
    Ok(())
}
