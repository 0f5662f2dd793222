//! `GET /sandboxes/{id}/metrics` and `GET /sandboxes/metrics`: E2B's `SandboxMetric`,
//! measured on the sandbox's own processes (every process carrying its `E2B_SANDBOX_ID`)
//! and files (its home and tmp), at the moment of the request.
//!
//! E2B samples every few seconds and keeps a history; e2b-local measures once per request
//! (one entry, stamped with the injected clock's now, when that falls in `start..=end`).
//! CPU use is measured over a short window; page cache cannot be told apart per sandbox on
//! a shared host and is reported as 0.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::app::App;
use crate::clock::{nanos, rfc3339};
use crate::parse::query_pairs;
use crate::reply::{ApiError, json_response};
use crate::store::{SbState, parse_sandbox_id};

/// The sizes every sandbox reports (as in its `SandboxDetail`).
pub(crate) const CPU_COUNT: u32 = 2;
pub(crate) const MEMORY_MB: u64 = 512;
pub(crate) const DISK_SIZE_MB: u64 = 1024;

/// How long CPU use is measured for.
const CPU_WINDOW: Duration = Duration::from_millis(200);

/// Files counted for disk use at most (a guard against huge trees).
const MAX_DISK_ENTRIES: usize = 1_000_000;

/// Sandboxes one `GET /sandboxes/metrics` may name (the spec's `maxItems`).
const MAX_IDS: usize = 100;

/// Serves the metrics routes; `None` for any other path.
pub(crate) async fn route(
    app: &Arc<App>,
    method: &Method,
    segments: &[&str],
    query: &str,
) -> Option<Response> {
    let answer = match segments {
        ["sandboxes", "metrics"] if method == Method::GET => many(app, query).await,
        ["sandboxes", id, "metrics"] if method == Method::GET => one(app, id, query).await,
        ["sandboxes", "metrics"] | ["sandboxes", _, "metrics"] => Ok(
            crate::reply::method_not_allowed("Method not allowed", "GET"),
        ),
        _ => return None,
    };
    Some(answer.unwrap_or_else(IntoResponse::into_response))
}

fn unix_param(pairs: &[(String, String)], name: &str) -> Result<Option<u64>, ApiError> {
    match pairs.iter().find(|(k, _)| k == name) {
        None => Ok(None),
        Some((_, v)) => v.parse::<u64>().map(Some).map_err(|_| {
            ApiError::bad_request(format!("Invalid {name}: must be a non-negative integer"))
        }),
    }
}

async fn one(app: &Arc<App>, raw_id: &str, query: &str) -> Result<Response, ApiError> {
    let id = parse_sandbox_id(raw_id)?;
    let pairs = query_pairs(query);
    let start = unix_param(&pairs, "start")?;
    let end = unix_param(&pairs, "end")?;
    let record = app.store.get(&id)?;
    let now = nanos(app.clock.now()) / 1_000_000_000;
    let in_range = start.is_none_or(|s| s <= now) && end.is_none_or(|e| now <= e);
    // A paused sandbox has no processes, and no history is kept: nothing to report.
    if record.state != SbState::Running || !in_range {
        return Ok(json_response(StatusCode::OK, &json!([])));
    }
    let sample = measure(app, &id).await;
    Ok(json_response(StatusCode::OK, &json!([sample])))
}

async fn many(app: &Arc<App>, query: &str) -> Result<Response, ApiError> {
    let pairs = query_pairs(query);
    let Some((_, raw)) = pairs.iter().find(|(k, _)| k == "sandbox_ids") else {
        return Err(ApiError::bad_request("sandbox_ids is required"));
    };
    let mut ids: Vec<String> = raw
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    ids.sort();
    ids.dedup();
    if ids.len() > MAX_IDS {
        return Err(ApiError::bad_request(format!(
            "at most {MAX_IDS} sandbox ids may be given"
        )));
    }
    let mut sandboxes = serde_json::Map::new();
    for raw_id in ids {
        let id = parse_sandbox_id(&raw_id)?;
        // Only running sandboxes are reported; unknown ones are left out.
        if app.store.running(&id).is_some() {
            sandboxes.insert(id.clone(), measure(app, &id).await);
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"sandboxes": Value::Object(sandboxes)}),
    ))
}

/// One `SandboxMetric` for the sandbox `id`, measured now.
async fn measure(app: &Arc<App>, id: &str) -> Value {
    let first = cpu_ticks(id.to_owned()).await;
    tokio::time::sleep(CPU_WINDOW).await;
    let second = cpu_ticks(id.to_owned()).await;
    // Processes present at both ends only: one that ended took its ticks with it.
    let used: u64 = second
        .iter()
        .filter_map(|(pid, (ticks, _))| Some(ticks.saturating_sub(first.get(pid)?.0)))
        .sum();
    let mem_used: u64 = second.values().map(|(_, rss)| rss).sum();
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .unwrap_or(100)
        .max(1);
    #[allow(clippy::cast_precision_loss)] // tick counts and sizes are far below 2^52
    let cpu_pct = {
        let seconds = used as f64 / hz as f64;
        (seconds / CPU_WINDOW.as_secs_f64() / f64::from(CPU_COUNT) * 100.0).min(100.0)
    };
    let disk_used = match app.store.running(id) {
        Some(sandbox) => {
            let (home, tmp) = (sandbox.home.clone(), sandbox.tmp.clone());
            tokio::task::spawn_blocking(move || disk_usage(&home) + disk_usage(&tmp))
                .await
                .unwrap_or(0)
        }
        None => 0,
    };
    let now = nanos(app.clock.now());
    json!({
        "timestamp": rfc3339(now),
        "timestampUnix": now / 1_000_000_000,
        "cpuCount": CPU_COUNT,
        "cpuUsedPct": (cpu_pct * 100.0).round() / 100.0,
        "memUsed": mem_used,
        "memTotal": MEMORY_MB * 1024 * 1024,
        "memCache": 0,
        "diskUsed": disk_used,
        "diskTotal": DISK_SIZE_MB * 1024 * 1024,
    })
}

/// envd's own `GET /metrics` (envd.yaml `Metrics`): the same measurement, in envd's
/// snake_case shape with a Unix-seconds `ts` and MiB figures.
pub(crate) async fn envd(app: &Arc<App>, id: &str) -> Value {
    let metric = measure(app, id).await;
    let number = |key: &str| metric[key].as_u64().unwrap_or(0);
    json!({
        "ts": number("timestampUnix"),
        "cpu_count": number("cpuCount"),
        "cpu_used_pct": metric["cpuUsedPct"],
        "mem_total": number("memTotal"),
        "mem_used": number("memUsed"),
        "mem_cache": number("memCache"),
        "mem_total_mib": number("memTotal") / (1024 * 1024),
        "mem_used_mib": number("memUsed") / (1024 * 1024),
        "disk_used": number("diskUsed"),
        "disk_total": number("diskTotal"),
    })
}

/// CPU ticks (user + system) and resident bytes of each process of the sandbox, by host pid.
async fn cpu_ticks(id: String) -> HashMap<u32, (u64, u64)> {
    tokio::task::spawn_blocking(move || {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        crate::process_table::sandbox_pids(&id)
            .into_iter()
            .filter_map(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                // Fields after the command name, which may hold spaces: utime and stime
                // are the 14th and 15th fields of the whole line.
                let rest = &stat[stat.rfind(')')? + 2..];
                let fields: Vec<&str> = rest.split_whitespace().collect();
                let ticks =
                    fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
                let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
                let resident: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
                Some((pid, (ticks, resident * page)))
            })
            .collect()
    })
    .await
    .unwrap_or_default()
}

/// Bytes allocated to the files under `root` (symlinks not followed).
fn disk_usage(root: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut seen = 0usize;
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > MAX_DISK_ENTRIES {
                return total;
            }
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            total += meta.blocks() * 512;
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    total
}
