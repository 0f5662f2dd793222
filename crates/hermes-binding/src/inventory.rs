//! The `Inventory` class: agent-sandbox's inventory (list, remove, pull, live check) as plain
//! Python values for `hermes e2b`. Conversion only; every decision is agent-sandbox's.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use agent_sandbox::{
    Activity, ApiKeySource, EgressOutcome, Force, HostScope, Inventory, Listing, Loss,
    PausedSelection, Progress, ProgressObserver, Refusal, RemovalOutcome, RemovalTarget,
    SandboxEntry, Services, Verdict, WriterHolder,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::{Error, with_hint, without_time_words};
use crate::native::{PySettings, python_key_resolver};
use crate::runtime;
use crate::settings::{Persistence, idle_lifetime};

/// A profile's sandboxes and the actions on them (`hermes e2b`).
#[pyclass(name = "Inventory", module = "hermes_e2b._native", frozen)]
#[derive(Debug)]
pub struct PyInventory {
    pub(crate) inventory: Inventory,
    /// The Hermes home: errors name its files (a missing key, its `.env`).
    pub(crate) profile_home: PathBuf,
}

fn seconds_since_epoch(time: SystemTime) -> f64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn host_dict<'py>(py: Python<'py>, host: &HostScope) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("task_id", host.task_id.clone())?;
    let (writer, pid, detail) = match &host.writer {
        WriterHolder::Held { pid } => ("held", *pid, None),
        WriterHolder::Free => ("free", None, None),
        WriterHolder::Unknown(why) => ("unknown", None, Some(why.clone())),
        _ => ("unknown", None, None),
    };
    dict.set_item("writer", writer)?;
    dict.set_item("writer_pid", pid)?;
    dict.set_item("writer_detail", detail.map(|d| agent_sandbox::redact(&d)))?;
    dict.set_item("dirty", host.dirty.clone())?;
    dict.set_item("prepared_for", host.prepared_for.clone())?;
    let clean = |line: &Option<String>| line.as_deref().map(without_time_words);
    dict.set_item("last_pull", clean(&host.last_pull))?;
    dict.set_item("last_recovery", clean(&host.last_recovery))?;
    Ok(dict)
}

fn entry_dict<'py>(py: Python<'py>, entry: &SandboxEntry) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("sandbox_id", &entry.sandbox_id)?;
    dict.set_item("state", entry.state.as_str())?;
    dict.set_item("template", agent_sandbox::redact(&entry.template))?;
    dict.set_item("restored_from", entry.restored_from.clone())?;
    dict.set_item("mode", entry.mode.as_str())?;
    dict.set_item("scope", &entry.scope)?;
    dict.set_item("owner", entry.owner.as_str())?;
    dict.set_item("posture", entry.posture.clone())?;
    dict.set_item("started_at", seconds_since_epoch(entry.started_at))?;
    dict.set_item("lease_left_seconds", entry.lease_left.map(|d| d.as_secs()))?;
    dict.set_item("duplicate_of", entry.duplicate_of.clone())?;
    dict.set_item(
        "subagent",
        entry.subagent.as_ref().map(|(child, _)| child.clone()),
    )?;
    dict.set_item(
        "subagent_of",
        entry.subagent.as_ref().map(|(_, parent)| parent.clone()),
    )?;
    dict.set_item("subagent_recoverable", entry.subagent_recoverable)?;
    dict.set_item("subagent_held", &entry.subagent_held)?;
    dict.set_item("egress_stamp", entry.egress_stamp.clone())?;
    dict.set_item("egress_known", entry.egress_known())?;
    let usage = &entry.usage;
    dict.set_item("last_used_at", usage.last_used.map(seconds_since_epoch))?;
    dict.set_item("last_used_source", usage.source.map(|s| s.as_str()))?;
    let (idle, running_since) = match usage.activity {
        Activity::Idle(idle) => (Some(idle.as_secs()), None),
        Activity::RunningCommand { since } => (None, Some(seconds_since_epoch(since))),
        _ => (None, None),
    };
    dict.set_item("idle_seconds", idle)?;
    dict.set_item("running_command", running_since.is_some())?;
    dict.set_item("running_since", running_since)?;
    dict.set_item("paused_at", usage.paused_at.map(seconds_since_epoch))?;
    match &entry.host {
        Some(host) => dict.set_item("host", host_dict(py, host)?)?,
        None => dict.set_item("host", py.None())?,
    }
    Ok(dict)
}

/// Hands each report to the Python callable; a failing callable loses its bar, never the
/// transfer.
fn python_progress(callable: Py<PyAny>) -> ProgressObserver {
    ProgressObserver::new(move |report: &Progress| {
        Python::try_attach(|py| {
            let args = (
                report.operation,
                report.unit.as_str(),
                report.done,
                report.total,
                report.finished,
            );
            if let Err(error) = callable.call1(py, args) {
                tracing::debug!("E2B progress callback failed: {error}");
            }
        });
    })
}

/// What `rm` acts on: `kind` is "ids" (with `ids`), "paused" or "duplicates";
/// `older_than` (a duration such as `2h`, `1d12h`, `90m`) and `tasks` narrow "paused" only.
fn target(
    kind: &str,
    ids: Vec<String>,
    older_than: Option<&str>,
    tasks: Vec<String>,
) -> Result<RemovalTarget, Error> {
    let invalid = |reason: String| Error::InvalidArgument {
        operation: "remove sandboxes",
        reason,
    };
    if kind != "paused" && (older_than.is_some() || !tasks.is_empty()) {
        return Err(invalid(
            "--older-than and --task select among paused sandboxes (--paused)".to_owned(),
        ));
    }
    match kind {
        "ids" if !ids.is_empty() => Ok(RemovalTarget::Ids(ids)),
        "paused" => {
            let unused_for = older_than.map(parse_age).transpose().map_err(invalid)?;
            Ok(RemovalTarget::Paused(PausedSelection::new(
                unused_for, tasks,
            )))
        }
        "duplicates" => Ok(RemovalTarget::Duplicates),
        other => Err(invalid(format!(
            "name sandbox ids, paused or duplicates (got {other:?})"
        ))),
    }
}

/// A duration as an operator writes it: whole numbers with units `d`, `h`, `m` or `s`, in
/// any combination (`2h`, `1d12h`, `90m`, `45s`), above zero.
fn parse_age(text: &str) -> Result<std::time::Duration, String> {
    let wrong = || {
        format!(
            "--older-than {text:?} is not a duration: write e.g. 30m, 2h, 1d or 1d12h (units d, h, m, s)"
        )
    };
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in text.trim().chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit: u64 = match c {
            'd' => 86_400,
            'h' => 3_600,
            'm' => 60,
            's' => 1,
            _ => return Err(wrong()),
        };
        let amount: u64 = digits.parse().map_err(|_| wrong())?;
        total = amount
            .checked_mul(unit)
            .and_then(|part| total.checked_add(part))
            .ok_or_else(wrong)?;
        digits.clear();
    }
    if !digits.is_empty() || total == 0 {
        return Err(wrong());
    }
    Ok(std::time::Duration::from_secs(total))
}

fn force(yes: bool) -> Force {
    if yes { Force::Yes } else { Force::No }
}

#[pymethods]
impl PyInventory {
    /// The inventory of the profile at `profile_home`; contacts nothing until called.
    /// `key_resolver()` returns the profile's API key or None. `progress`, when given, is
    /// called as `progress(operation, unit, done, total, finished)` while transfers and
    /// creations run (`total` None while unknown), from the thread running them.
    #[new]
    #[pyo3(signature = (settings, *, profile_home, lifetime_seconds, key_resolver, host_only, progress = None, credential_resolver = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        settings: &PySettings,
        profile_home: PathBuf,
        lifetime_seconds: Option<u64>,
        key_resolver: Py<PyAny>,
        host_only: Vec<PathBuf>,
        progress: Option<Py<PyAny>>,
        credential_resolver: Option<Py<PyAny>>,
    ) -> PyResult<PyInventory> {
        let mut config = settings.settings.to_config(
            ApiKeySource::Resolver(python_key_resolver(key_resolver)),
            Persistence::Persistent,
            idle_lifetime(lifetime_seconds),
        );
        config.host_only = host_only;
        config.credentials = settings
            .settings
            .credentials_with(
                crate::native::python_credential_values(credential_resolver),
                crate::native::credential_source(&profile_home),
            )
            .map_err(|error| error.in_config_file(crate::error::config_file(&profile_home)))?;
        let mut services = Services::new(runtime::handle()?);
        services.progress = progress.map(python_progress);
        Ok(PyInventory {
            inventory: Inventory::new(config, profile_home.clone(), services)
                .with_idle_lifetime(idle_lifetime(lifetime_seconds)),
            profile_home,
        })
    }

    /// The configured credentials: a list of dicts (name, hosts, header, has_value). Never a
    /// value: `has_value` only says whether the profile resolves one now.
    fn credentials<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let credentials = self.inventory.credentials();
        credentials
            .list()
            .iter()
            .map(|credential| {
                let dict = PyDict::new(py);
                dict.set_item("name", credential.name())?;
                dict.set_item("hosts", credential.hosts().to_vec())?;
                dict.set_item("header", credential.header())?;
                dict.set_item("has_value", credentials.has_value(credential.name()))?;
                Ok(dict)
            })
            .collect()
    }

    /// The credential headers E2B holds for `sandbox_id` (one request): a dict of `headers`
    /// (host to header names) and `values_in_rules` (hosts whose headers hold a value, not
    /// an E2B Secrets placeholder). Never a value, though E2B's detail returns them.
    fn sandbox_credential_headers<'py>(
        &self,
        py: Python<'py>,
        sandbox_id: String,
    ) -> PyResult<Bound<'py, PyDict>> {
        let inventory = self.inventory.clone();
        let held = py
            .detach(move || inventory.sandbox_credential_headers(&sandbox_id))
            .map_err(|error| PyErr::from(Error::in_profile(error, &self.profile_home)))?;
        let dict = PyDict::new(py);
        dict.set_item("headers", held.headers)?;
        dict.set_item("values_in_rules", held.values_in_rules)?;
        Ok(dict)
    }

    /// Where the credentials' values are kept (X22), as E2B reports it now (one request
    /// unless `credential_store: rules`): a dict of `store` (`secrets` or `rules`), `summary`,
    /// `why` (None for Secrets) and `secrets` (name, variable, updated_at as RFC 3339,
    /// version). Never a value.
    fn credential_store<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let inventory = self.inventory.clone();
        let report = py
            .detach(move || inventory.credential_store())
            .map_err(|error| PyErr::from(Error::in_profile(error, &self.profile_home)))?;
        let dict = PyDict::new(py);
        dict.set_item("store", report.in_force.as_str())?;
        dict.set_item("summary", report.in_force.summary())?;
        let why = match &report.in_force {
            agent_sandbox::StoreInForce::Rules { why } => Some(why.clone()),
            _ => None,
        };
        dict.set_item("why", why)?;
        let secrets = report
            .secrets
            .iter()
            .map(|secret| {
                let entry = PyDict::new(py);
                entry.set_item("name", &secret.name)?;
                entry.set_item("variable", &secret.variable)?;
                entry.set_item("updated_at", &secret.updated_at)?;
                entry.set_item("version", secret.version)?;
                Ok(entry)
            })
            .collect::<PyResult<Vec<_>>>()?;
        dict.set_item("secrets", secrets)?;
        Ok(dict)
    }

    /// The settings' egress policy as E2B must hold it: a dict of allow_out, deny_out
    /// (with `allow_internet_access = false`'s deny of every destination), digest, summary.
    fn egress_policy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let policy = self.inventory.egress_policy();
        let dict = PyDict::new(py);
        dict.set_item("allow_out", policy.allow_out().to_vec())?;
        dict.set_item("deny_out", policy.deny_out().to_vec())?;
        dict.set_item("digest", policy.digest())?;
        dict.set_item("summary", policy.summary())?;
        Ok(dict)
    }

    /// Puts the settings' egress policy in force on this profile's running sandboxes whose
    /// rules differ (one request each; paused ones get it when resumed). One dict per
    /// sandbox: the entry's keys plus outcome ("in_force", "updated", "at_resume", "failed")
    /// and detail.
    fn apply_egress<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let inventory = self.inventory.clone();
        let applied = py
            .detach(move || inventory.apply_egress(SystemTime::now()))
            .map_err(|error| Error::in_profile(error, &self.profile_home))?;
        applied
            .iter()
            .map(|item| {
                let dict = entry_dict(py, &item.entry)?;
                let (outcome, detail) = match &item.outcome {
                    EgressOutcome::InForce => ("in_force", None),
                    EgressOutcome::Updated => ("updated", None),
                    EgressOutcome::AtResume => ("at_resume", None),
                    EgressOutcome::Failed(why) => ("failed", Some(agent_sandbox::redact(why))),
                    _ => ("failed", Some("unknown outcome".to_owned())),
                };
                dict.set_item("outcome", outcome)?;
                dict.set_item("detail", detail)?;
                Ok(dict)
            })
            .collect()
    }

    /// The egress rules E2B reports for `sandbox_id` (one request): a dict of allow_out,
    /// deny_out, summary and digest; None when E2B reports none.
    fn sandbox_rules<'py>(
        &self,
        py: Python<'py>,
        sandbox_id: String,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let inventory = self.inventory.clone();
        let rules = py
            .detach(move || inventory.sandbox_rules(&sandbox_id))
            .map_err(|error| Error::in_profile(error, &self.profile_home))?;
        rules
            .map(|policy| {
                let dict = PyDict::new(py);
                dict.set_item("allow_out", policy.allow_out().to_vec())?;
                dict.set_item("deny_out", policy.deny_out().to_vec())?;
                dict.set_item("summary", policy.summary())?;
                dict.set_item("digest", policy.digest())?;
                Ok(dict)
            })
            .transpose()
    }

    /// One dict per sandbox, newest first (`by_last_use`: the most recently used first):
    /// `which` is "profile" (this profile's) or "all". Besides what E2B and this host record,
    /// each has last_used_at (epoch seconds or None), last_used_source ("host": this host's
    /// record of its last command; "lease": estimated from E2B's lease end), idle_seconds
    /// (None while a command runs or when unknown), running_command, running_since and
    /// paused_at.
    #[pyo3(signature = (which, *, by_last_use = false))]
    fn list<'py>(
        &self,
        py: Python<'py>,
        which: &str,
        by_last_use: bool,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let which = match which {
            "profile" => Listing::ThisProfile,
            "all" => Listing::AllProfiles,
            other => {
                return Err(Error::InvalidArgument {
                    operation: "list sandboxes",
                    reason: format!("which must be \"profile\" or \"all\", not {other:?}"),
                }
                .into());
            }
        };
        let inventory = self.inventory.clone();
        let entries = py
            .detach(move || {
                if by_last_use {
                    inventory.list_by_last_use(which, SystemTime::now())
                } else {
                    inventory.list(which, SystemTime::now())
                }
            })
            .map_err(|error| Error::in_profile(error, &self.profile_home))?;
        entries.iter().map(|entry| entry_dict(py, entry)).collect()
    }

    /// What removing would do, touching nothing: `target` is "ids" (with `ids`), "paused"
    /// or "duplicates"; `older_than` (e.g. "2h") and `tasks` narrow "paused" to those unused
    /// that long and of those tasks. Each dict: sandbox_id, action ("kill", "already_gone",
    /// "refuse"), detail (what is lost, or why refused), entry.
    #[pyo3(signature = (target, ids, *, force, older_than = None, tasks = Vec::new()))]
    fn plan_removal<'py>(
        &self,
        py: Python<'py>,
        target: &str,
        ids: Vec<String>,
        force: bool,
        older_than: Option<String>,
        tasks: Vec<String>,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let target = self::target(target, ids, older_than.as_deref(), tasks)?;
        let inventory = self.inventory.clone();
        let force = self::force(force);
        let plan = py
            .detach(move || inventory.plan_removal(&target, force, SystemTime::now()))
            .map_err(|error| Error::in_profile(error, &self.profile_home))?;
        plan.iter()
            .map(|item| {
                let dict = PyDict::new(py);
                dict.set_item("sandbox_id", &item.sandbox_id)?;
                let (action, detail) = match &item.verdict {
                    Verdict::Kill { loses } => ("kill", Some(loss_text(loses))),
                    Verdict::AlreadyGone => ("already_gone", None),
                    Verdict::Refused(refusal) => ("refuse", Some(refusal_text(refusal))),
                    _ => ("refuse", None),
                };
                dict.set_item("action", action)?;
                dict.set_item("detail", detail)?;
                match &item.entry {
                    Some(entry) => dict.set_item("entry", entry_dict(py, entry)?)?,
                    None => dict.set_item("entry", py.None())?,
                }
                Ok(dict)
            })
            .collect()
    }

    /// Plans again (the listing may have changed since the confirmation) and carries the
    /// plan out; the arguments are [`plan_removal`](Self::plan_removal)'s. Each dict:
    /// sandbox_id, outcome ("killed", "already_gone", "refused", "failed"), detail.
    #[pyo3(signature = (target, ids, *, force, older_than = None, tasks = Vec::new()))]
    fn remove<'py>(
        &self,
        py: Python<'py>,
        target: &str,
        ids: Vec<String>,
        force: bool,
        older_than: Option<String>,
        tasks: Vec<String>,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let target = self::target(target, ids, older_than.as_deref(), tasks)?;
        let inventory = self.inventory.clone();
        let force = self::force(force);
        let removed = py
            .detach(move || {
                let plan = inventory.plan_removal(&target, force, SystemTime::now())?;
                inventory.remove(&plan)
            })
            .map_err(|error| Error::in_profile(error, &self.profile_home))?;
        removed
            .iter()
            .map(|item| {
                let dict = PyDict::new(py);
                dict.set_item("sandbox_id", &item.sandbox_id)?;
                let (outcome, detail) = match &item.outcome {
                    RemovalOutcome::Killed => ("killed", None),
                    RemovalOutcome::AlreadyGone => ("already_gone", None),
                    RemovalOutcome::Refused(refusal) => ("refused", Some(refusal_text(refusal))),
                    RemovalOutcome::Failed(text) => ("failed", Some(without_time_words(text))),
                    _ => ("failed", None),
                };
                dict.set_item("outcome", outcome)?;
                dict.set_item("detail", detail)?;
                Ok(dict)
            })
            .collect()
    }

    /// Resume recovery from the scope `task_id`'s sandbox into the profile home now; returns
    /// the counts (restored, unchanged, quarantined, skipped).
    fn pull<'py>(&self, py: Python<'py>, task_id: String) -> PyResult<Bound<'py, PyDict>> {
        let inventory = self.inventory.clone();
        let summary = py
            .detach(move || inventory.pull(&task_id))
            .map_err(|error| Error::in_profile(error, &self.profile_home))?;
        let dict = PyDict::new(py);
        dict.set_item("restored", summary.restored)?;
        dict.set_item("unchanged", summary.unchanged)?;
        dict.set_item("quarantined", summary.quarantined)?;
        dict.set_item("skipped", summary.skipped)?;
        Ok(dict)
    }

    /// None when this host can lock the profile's coordination files, else what is missing.
    fn host_locking(&self, py: Python<'_>) -> Option<String> {
        let inventory = self.inventory.clone();
        py.detach(move || inventory.host_locking())
            .err()
            .map(|text| agent_sandbox::redact(&text))
    }

    /// One cheap authenticated request that creates nothing, bounded by a short deadline
    /// (`agent_sandbox::ACCESS_CHECK_DEADLINE`): a dict with ok, kind ("ok", "key_refused",
    /// "unreachable", "tls", "deadline", "configuration" or "other"), api_url, running
    /// (None when unknown), seconds, and error (the message with its hint; never the key).
    fn check_access<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let inventory = self.inventory.clone();
        let result = py.detach(move || inventory.check_access());
        let dict = PyDict::new(py);
        match result {
            Ok(access) => {
                dict.set_item("ok", true)?;
                dict.set_item("kind", "ok")?;
                dict.set_item("api_url", access.api_url)?;
                dict.set_item("running", access.running)?;
                dict.set_item("seconds", access.elapsed.as_secs_f64())?;
                dict.set_item("error", py.None())?;
            }
            Err(error) => {
                let kind = if error.is_key_refused() {
                    "key_refused"
                } else if error.is_tls() {
                    "tls"
                } else if error.is_unreachable() {
                    "unreachable"
                } else if error.deadline().is_some() {
                    "deadline"
                } else if matches!(
                    error,
                    agent_sandbox::Error::InvalidConfig { .. }
                        | agent_sandbox::Error::MissingApiKey
                ) {
                    "configuration"
                } else {
                    "other"
                };
                dict.set_item("ok", false)?;
                dict.set_item("kind", kind)?;
                dict.set_item("api_url", error.endpoint().map(str::to_owned))?;
                dict.set_item("running", py.None())?;
                dict.set_item("seconds", py.None())?;
                dict.set_item(
                    "error",
                    Error::in_profile(error, &self.profile_home).message(),
                )?;
            }
        }
        Ok(dict)
    }

    /// The live round trip (create a probe sandbox, check its template has what the backend
    /// needs, kill it): one dict per step with step, seconds, ok, error.
    fn live_check<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let inventory = self.inventory.clone();
        let steps = py.detach(move || inventory.live_check());
        steps
            .iter()
            .map(|step| {
                let dict = PyDict::new(py);
                dict.set_item("step", step.step)?;
                dict.set_item("seconds", step.elapsed.as_secs_f64())?;
                dict.set_item("ok", step.result.is_ok())?;
                // A step an E2B failure stopped ends with the same hint as everywhere (O5).
                let error = step.result.as_ref().err().map(|text| {
                    let reason = without_time_words(text);
                    match step.error.as_deref().and_then(crate::error::hint) {
                        Some(hint) => with_hint(&reason, &without_time_words(&hint)),
                        None => reason,
                    }
                });
                dict.set_item("error", error)?;
                Ok(dict)
            })
            .collect()
    }
}

/// A refusal in the plugin's words: why (agent-sandbox's text), then what a `hermes e2b`
/// user does about it.
fn refusal_text(refusal: &Refusal) -> String {
    match refusal {
        Refusal::OtherProfile => {
            format!("{refusal}; remove it with that profile's `hermes e2b rm`")
        }
        Refusal::UnknownOwner => format!("{refusal}; add --force if it is yours"),
        Refusal::LiveWriter { .. } => format!("{refusal}; end it first, or add --force"),
        _ => refusal.to_string(),
    }
}

/// What a kill loses, in the plugin's words: the state is Hermes', and `hermes e2b pull`
/// keeps it.
fn loss_text(loss: &Loss) -> String {
    match loss {
        Loss::Duplicate { newest } => format!(
            "its files and processes (a duplicate: sessions use {newest}; Hermes state written only here is lost)"
        ),
        Loss::UnpulledState { last_pull } => {
            let pulled = last_pull
                .as_ref()
                .map(|line| format!("last pull {line}"))
                .unwrap_or_else(|| "no pull recorded on this host".to_owned());
            format!(
                "its files and processes, including Hermes state not yet pulled ({pulled}; `hermes e2b pull` first keeps skills and memories)"
            )
        }
        Loss::PulledState { last_pull } => format!(
            "its files and processes (its Hermes state was pulled back after its last use: {last_pull})"
        ),
        _ => loss.to_string(),
    }
}

/// Brings back the work of a child whose process died mid-child (`hermes e2b pull --subagent`):
/// the fork `fork`, by this host's record of it; the same dict as `Child.bring_back`.
#[pyfunction]
pub(crate) fn pull_subagent<'py>(
    py: Python<'py>,
    inventory: &PyInventory,
    fork: String,
) -> PyResult<Bound<'py, PyDict>> {
    let store = inventory.inventory.clone();
    let report = py
        .detach(move || store.pull_subagent(&fork))
        .map_err(|error| PyErr::from(Error::in_profile(error, &inventory.profile_home)))?;
    crate::native::report_dict(py, &report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_than_reads_an_operators_durations_and_refuses_the_rest() {
        // contract: I8 — `hermes e2b rm --paused --older-than DURATION`.
        let secs = |text: &str| parse_age(text).map(|d| d.as_secs());
        assert_eq!(secs("45s"), Ok(45));
        assert_eq!(secs("90m"), Ok(5_400));
        assert_eq!(secs("2h"), Ok(7_200));
        assert_eq!(secs("1d12h"), Ok(129_600));
        assert_eq!(secs(" 1h30m "), Ok(5_400));
        for wrong in [
            "",
            "0h",
            "2",
            "h",
            "2x",
            "1.5h",
            "-2h",
            "99999999999999999999d",
        ] {
            let error = parse_age(wrong).unwrap_err();
            assert!(
                error.contains("--older-than") && error.contains("1d12h"),
                "{wrong}: {error}"
            );
        }
        assert!(target("ids", vec!["i1".to_owned()], Some("2h"), Vec::new()).is_err());
        assert!(target("duplicates", Vec::new(), None, vec!["t".to_owned()]).is_err());
        assert_eq!(
            target("paused", Vec::new(), Some("2h"), vec!["t".to_owned()]).ok(),
            Some(RemovalTarget::Paused(PausedSelection::new(
                Some(std::time::Duration::from_secs(7_200)),
                vec!["t".to_owned()]
            )))
        );
    }

    #[test]
    fn refusals_and_losses_carry_the_plugin_commands_and_the_core_says_none() {
        // contract: I8 — the plugin's words; agent-sandbox's own text names no Hermes command.
        let cases = [
            (
                refusal_text(&Refusal::OtherProfile),
                Refusal::OtherProfile.to_string(),
                "that profile's `hermes e2b rm`",
            ),
            (
                refusal_text(&Refusal::UnknownOwner),
                Refusal::UnknownOwner.to_string(),
                "add --force if it is yours",
            ),
            (
                refusal_text(&Refusal::LiveWriter { pid: Some(7) }),
                Refusal::LiveWriter { pid: Some(7) }.to_string(),
                "(pid 7) holds its writer role; end it first, or add --force",
            ),
            (
                loss_text(&Loss::UnpulledState { last_pull: None }),
                Loss::UnpulledState { last_pull: None }.to_string(),
                "(no pull recorded on this host; `hermes e2b pull` first keeps skills and memories)",
            ),
            (
                loss_text(&Loss::Duplicate {
                    newest: "i2".to_owned(),
                }),
                Loss::Duplicate {
                    newest: "i2".to_owned(),
                }
                .to_string(),
                "sessions use i2; Hermes state written only here is lost",
            ),
        ];
        for (ours, core, wanted) in cases {
            assert!(ours.contains(wanted), "{ours}");
            assert!(
                !core.contains("hermes") && !core.contains("Hermes"),
                "{core}"
            );
            assert!(!core.contains("--force"), "{core}");
        }
    }
}
