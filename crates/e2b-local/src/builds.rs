//! Template builds' state: the archives COPY steps uploaded (on disk, by hash) and the
//! builds requested, with their status and log (in memory), as E2B's build API reports them.
//! What a build does, and how it differs from E2B's, is [`crate::builder`]'s; a finished
//! build's user, working directory, variables and start command ([`BuildConfig`]) are filed
//! with its files by [`crate::snapshots`], and a sandbox of it keeps its [`RunDefaults`]
//! ([`crate::store`]).

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::clock::{Clock, nanos, rfc3339};
use crate::reply::ApiError;
use crate::token::EnvdToken;

/// Finished builds whose status (and log) stays asked for; older ones are forgotten (a
/// filed build's status is then `ready` without its log).
const RETAINED: usize = 256;

/// The admin path segment uploads go to (`/_e2b_local/template-files/{hash}`).
pub(crate) const UPLOAD_ROUTE: &str = "template-files";

/// The user and working directory a request that names none gets, in a sandbox of a
/// built template (the build's last `USER` and `WORKDIR`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunDefaults {
    /// `user` or `root`.
    pub(crate) user: String,
    /// `None`: the user's home.
    pub(crate) workdir: Option<String>,
}

/// What a built template gives the sandboxes made from it, besides its files.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BuildConfig {
    pub(crate) defaults: RunDefaults,
    /// The variables the steps set (a template built from this one inherits them).
    #[serde(default)]
    pub(crate) envs: BTreeMap<String, String>,
    pub(crate) start_cmd: Option<String>,
    pub(crate) ready_cmd: Option<String>,
}

/// Where a build is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Waiting,
    Building,
    Ready,
    Error,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Waiting => "waiting",
            Status::Building => "building",
            Status::Ready => "ready",
            Status::Error => "error",
        }
    }
}

/// One line of a build's log.
#[derive(Clone, Debug)]
struct LogEntry {
    /// Unix nanoseconds.
    at: u64,
    level: &'static str,
    message: String,
    /// `base`, a 1-based step number, or `finalize`.
    step: Option<String>,
}

impl LogEntry {
    fn json(&self) -> Value {
        let mut value = json!({
            "timestamp": rfc3339(self.at),
            "level": self.level,
            "message": self.message,
        });
        if let Some(step) = &self.step {
            value["step"] = json!(step);
        }
        value
    }
}

/// Why a build failed: the message and the step it failed in.
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    pub(crate) message: String,
    /// `base`, a 1-based step number, or `finalize`.
    pub(crate) step: Option<String>,
}

#[derive(Debug)]
struct Progress {
    status: Status,
    entries: Vec<LogEntry>,
    failure: Option<Failure>,
}

/// A requested build, from its request to its end.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) template_id: String,
    pub(crate) alias: String,
    pub(crate) build_id: String,
    /// Every tag that points at the build once it is filed.
    pub(crate) tags: Vec<String>,
    clock: Clock,
    progress: Mutex<Progress>,
}

impl Job {
    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends a log line of `step` (`None` for the build as a whole).
    pub(crate) fn log(&self, level: &'static str, step: Option<&str>, message: impl Into<String>) {
        let entry = LogEntry {
            at: nanos(self.clock.now()),
            level,
            message: message.into(),
            step: step.map(str::to_owned),
        };
        self.lock().entries.push(entry);
    }

    /// Ends the build: `ready`, or `error` with its reason.
    pub(crate) fn finish(&self, outcome: Result<(), Failure>) {
        let mut progress = self.lock();
        match outcome {
            Ok(()) => progress.status = Status::Ready,
            Err(failure) => {
                progress.status = Status::Error;
                progress.failure = Some(failure);
            }
        }
    }
}

/// The build API's state: uploaded archives (on disk, by hash) and builds (in memory).
#[derive(Debug)]
pub(crate) struct Builds {
    /// `<state_dir>/template-files/`: one archive per files hash.
    files: PathBuf,
    /// This server's URL (upload links name it), once it listens.
    url: OnceLock<String>,
    /// Stands in for the API key on upload links, which clients send without one.
    upload_token: EnvdToken,
    jobs: Mutex<HashMap<String, Arc<Job>>>,
    clock: Clock,
}

fn is_files_hash(hash: &str) -> bool {
    hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Builds {
    /// Opens (or creates) `<state_dir>/template-files`; uploads a crash cut off go.
    pub(crate) fn open(state_dir: &Path, clock: Clock) -> io::Result<Builds> {
        let files = state_dir.join("template-files");
        fs::create_dir_all(&files)?;
        for entry in fs::read_dir(&files)? {
            let path = entry?.path();
            if path.extension().is_some_and(|ext| ext == "part") {
                let _ = fs::remove_file(&path);
            }
        }
        Ok(Builds {
            files,
            url: OnceLock::new(),
            upload_token: EnvdToken::generate(),
            jobs: Mutex::new(HashMap::new()),
            clock,
        })
    }

    /// Names this server's URL, once it listens (upload links point at it).
    pub(crate) fn set_url(&self, url: String) {
        let _ = self.url.set(url);
    }

    fn jobs(&self) -> MutexGuard<'_, HashMap<String, Arc<Job>>> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The archive of a files hash.
    fn archive(&self, hash: &str) -> PathBuf {
        self.files.join(format!("{hash}.tar"))
    }

    /// Registers a requested build (`waiting`) of `alias` under `template_id` with its tags.
    pub(crate) fn register(
        &self,
        template_id: String,
        alias: String,
        tags: Vec<String>,
    ) -> Arc<Job> {
        let job = Arc::new(Job {
            template_id,
            alias,
            build_id: crate::token::new_uuid(),
            tags,
            clock: self.clock.clone(),
            progress: Mutex::new(Progress {
                status: Status::Waiting,
                entries: Vec::new(),
                failure: None,
            }),
        });
        let mut jobs = self.jobs();
        if jobs.len() >= RETAINED {
            jobs.retain(|_, job| !matches!(job.lock().status, Status::Ready | Status::Error));
        }
        jobs.insert(job.build_id.clone(), Arc::clone(&job));
        job
    }

    /// The template id a build of `alias` not yet filed was given, so that a second one
    /// shares it.
    pub(crate) fn pending_template(&self, alias: &str) -> Option<String> {
        self.jobs()
            .values()
            .find(|job| job.alias == alias)
            .map(|job| job.template_id.clone())
    }

    /// A requested build of `template_id`, while it is remembered.
    pub(crate) fn job(&self, template_id: &str, build_id: &str) -> Option<Arc<Job>> {
        self.jobs()
            .get(build_id)
            .filter(|job| job.template_id == template_id)
            .cloned()
    }

    /// Marks a waiting build as building; refused for one already started.
    pub(crate) fn begin(job: &Job) -> Result<(), ApiError> {
        let mut progress = job.lock();
        if progress.status != Status::Waiting {
            return Err(ApiError::bad_request("build is not in waiting state"));
        }
        progress.status = Status::Building;
        Ok(())
    }

    /// The status answer of a build: its state and up to `limit` (at most 100) log entries
    /// from `offset`, in order; a `reason` only when it failed (the SDKs read a present
    /// `reason` as an object, so it is left out rather than null).
    pub(crate) fn status_json(job: &Job, offset: usize, limit: usize) -> Value {
        let progress = job.lock();
        let window: Vec<&LogEntry> = progress
            .entries
            .iter()
            .skip(offset)
            .take(limit.min(100))
            .collect();
        let mut answer = json!({
            "templateID": job.template_id,
            "buildID": job.build_id,
            "status": progress.status.as_str(),
            "logs": [],
            "logEntries": window.iter().map(|entry| entry.json()).collect::<Vec<_>>(),
        });
        if let Some(failure) = &progress.failure {
            let mut reason = json!({"message": failure.message});
            if let Some(step) = &failure.step {
                reason["step"] = json!(step);
                reason["logEntries"] = window
                    .iter()
                    .filter(|e| {
                        e.step.as_ref() == Some(step) && matches!(e.level, "warn" | "error")
                    })
                    .map(|entry| entry.json())
                    .collect();
            }
            answer["reason"] = reason;
        }
        answer
    }

    /// The answer for a build filed before a restart: ready, its log gone with the process.
    pub(crate) fn filed_status_json(template_id: &str, build_id: &str) -> Value {
        json!({
            "templateID": template_id,
            "buildID": build_id,
            "status": Status::Ready.as_str(),
            "logs": [],
            "logEntries": [],
        })
    }

    /// `GET /templates/{id}/files/{hash}`: whether the archive is here, and the upload
    /// link (always given, so a forced upload can replace it).
    pub(crate) fn file_link(&self, template_id: &str, hash: &str) -> Result<Value, ApiError> {
        if !is_files_hash(hash) {
            return Err(ApiError::bad_request("Invalid files hash"));
        }
        let url = self.url.get().map_or("http://127.0.0.1", String::as_str);
        Ok(json!({
            "present": self.archive(hash).is_file(),
            "url": format!(
                "{url}/_e2b_local/{UPLOAD_ROUTE}/{hash}?template={template_id}&token={}",
                self.upload_token.expose()
            ),
        }))
    }

    /// Whether an upload link's token is this server's.
    pub(crate) fn upload_allowed(&self, token: Option<&str>) -> bool {
        token.is_some_and(|token| crate::token::constant_time_eq(token, self.upload_token.expose()))
    }

    /// Where an upload of `hash` is written first, and where it goes once whole.
    pub(crate) fn upload_paths(&self, hash: &str) -> Result<(PathBuf, PathBuf), ApiError> {
        if !is_files_hash(hash) {
            return Err(ApiError::bad_request("Invalid files hash"));
        }
        let part = self
            .files
            .join(format!("{hash}.{}.part", crate::token::new_uuid()));
        Ok((part, self.archive(hash)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builds() -> (tempfile::TempDir, Builds) {
        let dir = tempfile::tempdir().unwrap();
        let builds = Builds::open(dir.path(), Clock::system()).unwrap();
        (dir, builds)
    }

    #[test]
    fn status_pages_the_log_from_an_offset_and_omits_a_missing_reason() {
        let (_dir, builds) = builds();
        let job = builds.register("tpl".into(), "tpl".into(), vec!["default".into()]);
        for n in 0..3 {
            job.log("info", Some("1"), format!("line {n}"));
        }
        let status = Builds::status_json(&job, 1, 100);
        assert_eq!(status["status"], "waiting");
        assert_eq!(status["logs"], json!([]));
        assert_eq!(status["logEntries"].as_array().unwrap().len(), 2);
        assert_eq!(status["logEntries"][0]["message"], "line 1");
        assert!(status.get("reason").is_none());
        Builds::begin(&job).unwrap();
        assert!(Builds::begin(&job).is_err(), "only a waiting build starts");
        job.log("error", Some("1"), "it broke");
        job.finish(Err(Failure {
            message: "it broke".into(),
            step: Some("1".into()),
        }));
        let status = Builds::status_json(&job, 0, 100);
        assert_eq!(status["status"], "error");
        assert_eq!(status["reason"]["message"], "it broke");
        assert_eq!(status["reason"]["step"], "1");
        assert_eq!(status["reason"]["logEntries"].as_array().unwrap().len(), 1);
        let past_end = Builds::status_json(&job, 4, 100);
        assert_eq!(past_end["logEntries"], json!([]));
        assert!(builds.job("other-template", &job.build_id).is_none());
        assert!(builds.job("tpl", &job.build_id).is_some());
    }

    #[test]
    fn finished_builds_are_forgotten_past_the_retained_count_never_running_ones() {
        let (_dir, builds) = builds();
        let running = builds.register("r".into(), "running".into(), Vec::new());
        for n in 1..RETAINED {
            builds
                .register(format!("t{n}"), format!("t{n}"), Vec::new())
                .finish(Ok(()));
        }
        assert_eq!(builds.jobs().len(), RETAINED);
        builds.register("n".into(), "next".into(), Vec::new());
        let jobs = builds.jobs();
        assert_eq!(jobs.len(), 2, "the finished ones went");
        assert!(
            jobs.contains_key(&running.build_id),
            "a build not finished stays"
        );
    }

    #[test]
    fn upload_links_carry_a_token_and_check_the_hash() {
        let (_dir, builds) = builds();
        builds.set_url("http://127.0.0.1:9".into());
        let hash = "a".repeat(64);
        let link = builds.file_link("tpl", &hash).unwrap();
        assert_eq!(link["present"], false);
        let url = link["url"].as_str().unwrap();
        let token = url.rsplit_once("token=").unwrap().1;
        assert!(builds.upload_allowed(Some(token)));
        assert!(!builds.upload_allowed(Some("other")));
        assert!(!builds.upload_allowed(None));
        assert!(builds.file_link("tpl", "../../etc/passwd").is_err());
        assert!(builds.upload_paths("ABC").is_err());
    }
}
