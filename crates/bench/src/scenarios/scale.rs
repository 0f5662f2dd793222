//! The scale scenario: `scopes` persistent scopes in one process, each a `Backend` of its own
//! task id attached with one command and then left idle; then every scope active at once.

use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

use super::*;

/// What the process holds at one moment, from `/proc/self`.
#[derive(Debug, Clone, Copy)]
struct Held {
    rss_kib: u64,
    threads: u64,
    fds: u64,
}

impl Held {
    fn now() -> Result<Held, BenchError> {
        Ok(Held {
            rss_kib: crate::memory::status_kib("VmRSS").ok_or("no VmRSS in /proc/self/status")?,
            threads: entries("/proc/self/task")?,
            fds: entries("/proc/self/fd")?,
        })
    }

    fn insert(self, figures: &mut Map<String, Value>, prefix: &str) {
        figures.insert(format!("{prefix}_rss_kib"), self.rss_kib.into());
        figures.insert(format!("{prefix}_threads"), self.threads.into());
        figures.insert(format!("{prefix}_fds"), self.fds.into());
    }
}

fn entries(dir: &str) -> Result<u64, BenchError> {
    // The descriptor of the listing itself is counted too, as it is in every measurement.
    Ok(std::fs::read_dir(dir)?.count() as u64)
}

/// `scopes` persistent backends on one runtime (as one Hermes process holds one per session),
/// each with its own task id and one `true` to attach it; the figures of the process before
/// any scope (the N=0 baseline) and once they are all idle go into the result. The measured
/// part is `rounds` commands per scope, at most `workers` at once and never two on one scope
/// (a session runs one command at a time), each timed.
pub(super) fn scale(params: &Value, protocol: &mut Protocol) -> Result<(), BenchError> {
    let scopes = param_u64(params, "scopes")? as usize;
    let rounds = param_u64(params, "rounds")? as usize;
    let workers = (param_u64(params, "workers")? as usize).clamp(1, scopes.max(1));
    let settle = Duration::from_millis(param_u64(params, "settle_ms")?);
    let runtime = runtime()?;
    let home = tempfile::tempdir()?;
    // The runtime's workers start on first use: one task on each before the baseline, so
    // the baseline is a process ready to serve scopes, not one that has not started yet.
    runtime.block_on(async {
        let warm: Vec<_> = (0..4).map(|_| tokio::spawn(async {})).collect();
        for task in warm {
            let _ = task.await;
        }
    });
    let baseline = Held::now()?;
    let attach_started = Instant::now();
    let mut backends = Vec::with_capacity(scopes);
    // `"part": "client"`: each scope is only what a `Backend` builds for itself to reach E2B,
    // an `e2b_client::Client` (its own connection pool), on one shared sandbox; the
    // difference from the whole `Backend` is the rest of the scope's cost.
    let clients_only = params.get("part").and_then(Value::as_str) == Some("client");
    let mut clients = Vec::new();
    if clients_only {
        let shared = {
            let client = e2b_client::Client::new(e2b_client::Config::from_env(ApiKey::new(env(
                "E2B_API_KEY",
            )?)))?;
            let mut options = e2b_client::CreateOptions::new("base".to_owned());
            options.timeout = Some(Duration::from_secs(900));
            runtime.block_on(client.create(options))?
        };
        for _ in 0..scopes {
            let config = e2b_client::Config::from_env(ApiKey::new(env("E2B_API_KEY")?));
            let sandbox = e2b_client::Client::new(config)?.sandbox(shared.envd_access())?;
            run_client(&runtime, &sandbox)?;
            clients.push(sandbox);
        }
    }
    // One `Services` cloned for every scope, as one process holds them (its clones share
    // whatever the process shares among its backends).
    let services = Services::new(runtime.handle().clone());
    for index in (0..scopes).filter(|_| !clients_only) {
        let mut config = Config::new(ApiKeySource::Key(ApiKey::new(env("E2B_API_KEY")?)));
        config.endpoints = Endpoints::single(env("E2B_API_URL")?);
        config.mode = SandboxMode::Persistent;
        let scope = Scope {
            profile_home: home.path().to_path_buf(),
            task_id: format!("scale-{index}"),
        };
        let backend = Backend::new(config, scope, services.clone(), Arc::new(NoStateHooks))?;
        run_to_end(&backend, "true", COMMAND_DEADLINE)?;
        backends.push(backend);
    }
    let attach_wall = attach_started.elapsed();
    // Idle: nothing in flight. What the attach phase started and then let go (a command's
    // pump thread, connections closed by the server) is given time to go, so what remains
    // is what an idle scope holds.
    std::thread::sleep(settle);
    let idle = Held::now()?;

    let mark = protocol.ready()?;
    let jobs = scopes * rounds;
    let next = AtomicU64::new(0);
    let latencies = Mutex::new(Vec::with_capacity(jobs));
    let errors = Mutex::new(Vec::new());
    let peak = Mutex::new(idle);
    let stop = AtomicBool::new(false);
    let cpu_started = crate::memory::cpu_seconds();
    let started = Instant::now();
    let sampler_cpu = std::thread::scope(|threads| {
        // Peak threads and descriptors while the commands run, sampled (RSS's peak is the
        // kernel's VmHWM, read at the end). The sampler's own CPU time is the measurement's,
        // not the client's: it returns it, and it is taken out of the process's below.
        let sampler = threads.spawn(|| {
            let cpu_started = crate::memory::thread_cpu_seconds();
            while !stop.load(Ordering::Acquire) {
                if let Ok(now) = Held::now() {
                    let mut peak = peak.lock().unwrap_or_else(|e| e.into_inner());
                    peak.threads = peak.threads.max(now.threads);
                    peak.fds = peak.fds.max(now.fds);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            crate::memory::thread_cpu_seconds() - cpu_started
        });
        let workers: Vec<_> = (0..workers)
            .map(|_| {
                threads.spawn(|| {
                    loop {
                        // Consecutive jobs are consecutive scopes, and `workers` ≤ `scopes`:
                        // two jobs in flight never share a scope.
                        let job = next.fetch_add(1, Ordering::Relaxed) as usize;
                        if job >= jobs {
                            break;
                        }
                        let began = Instant::now();
                        let ran = match clients.get(job % scopes) {
                            Some(sandbox) => run_client(&runtime, sandbox),
                            None => run_to_end(&backends[job % scopes], "true", COMMAND_DEADLINE),
                        };
                        match ran {
                            Ok(()) => latencies
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(began.elapsed().as_secs_f64()),
                            Err(error) => errors
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(error.to_string()),
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            let _ = worker.join();
        }
        stop.store(true, Ordering::Release);
        sampler.join().unwrap_or(0.0)
    });
    let wall = started.elapsed();
    // The sampler ran entirely inside this window (started after `cpu_started`, joined
    // before this read), so all of its CPU time is inside `cpu` and is taken out whole.
    let cpu = crate::memory::cpu_seconds() - cpu_started - sampler_cpu;
    // Idle again: what the active phase left behind (a scope that holds more after its
    // commands than before them keeps something per command or per lease top-up).
    std::thread::sleep(settle);
    let after = Held::now()?;
    let mut latencies = latencies.into_inner().unwrap_or_else(|e| e.into_inner());
    let errors = errors.into_inner().unwrap_or_else(|e| e.into_inner());
    let peak = peak.into_inner().unwrap_or_else(|e| e.into_inner());
    latencies.sort_by(f64::total_cmp);
    let quantile = |q: f64| -> Value {
        if latencies.is_empty() {
            return Value::Null;
        }
        let index = ((latencies.len() - 1) as f64 * q).round() as usize;
        Value::from(latencies[index])
    };
    let mut figures = Map::new();
    figures.insert("scopes".into(), scopes.into());
    figures.insert(
        "part".into(),
        if clients_only { "client" } else { "backend" }.into(),
    );
    figures.insert("workers".into(), workers.into());
    figures.insert("ops".into(), jobs.into());
    figures.insert("completed".into(), latencies.len().into());
    figures.insert("errors".into(), errors.len().into());
    figures.insert(
        "first_errors".into(),
        json!(errors.iter().take(3).collect::<Vec<_>>()),
    );
    let mean = if latencies.is_empty() {
        Value::Null
    } else {
        Value::from(latencies.iter().sum::<f64>() / latencies.len() as f64)
    };
    figures.insert("mean_s".into(), mean);
    figures.insert("p50_s".into(), quantile(0.50));
    figures.insert("p99_s".into(), quantile(0.99));
    figures.insert("wall_s".into(), seconds(wall));
    // The client's own cost: what this process spent on the CPU while the commands ran
    // (e2b-local is another process), less the 20 ms sampler's own thread time (its reads
    // of /proc are the measurement's), which is reported beside it.
    figures.insert("cpu_s".into(), cpu.into());
    figures.insert("sampler_cpu_s".into(), sampler_cpu.into());
    figures.insert("attach_s".into(), seconds(attach_wall));
    baseline.insert(&mut figures, "base");
    idle.insert(&mut figures, "idle");
    after.insert(&mut figures, "after");
    figures.insert("peak_threads".into(), peak.threads.into());
    figures.insert("peak_fds".into(), peak.fds.into());
    protocol.result(&mark, figures)?;
    // Released here, left to their leases; the orchestrator kills the sandboxes.
    for backend in &backends {
        backend.finalize();
    }
    Ok(())
}

/// `true` through a bare e2b-client sandbox handle; fails on a non-zero exit.
fn run_client(
    runtime: &tokio::runtime::Runtime,
    sandbox: &e2b_client::Sandbox,
) -> Result<(), BenchError> {
    let options = e2b_client::StartOptions::shell("true".to_owned());
    let output = runtime.block_on(sandbox.run(options, 1024))?;
    if output.end.exit_code != 0 {
        return Err(format!("`true` exited with {}", output.end.exit_code).into());
    }
    Ok(())
}
