//! Template builds: E2B's build API served by running a template's steps in a sandbox of
//! the server's own and filing that sandbox's files as a template.
//!
//! The routes are E2B's ([`crate::rest`] dispatches them here): `POST /v3/templates`
//! registers a build under a name and tags (`waiting`); `GET /templates/{id}/files/{hash}`
//! answers whether a COPY step's archive is here and where to upload it (a URL on this
//! server, with a token instead of the API key, as E2B's signed storage URLs are);
//! `POST /v2/templates/{id}/builds/{build}` starts the steps; the status route gives the
//! build's state and its log entries from an offset, as the SDKs poll it.
//!
//! What a build is here, and how it differs from E2B's:
//! - **No images.** e2b-local pulls nothing: `fromImage` (any image) starts from the host's
//!   system, as the built-in template `base` does, and the log says so; `fromTemplate`
//!   starts from a built-in template, a snapshot or another built template (its files and
//!   its user, working directory, variables and start command).
//! - **The steps run in a sandbox** created for the build (not listed), in the same
//!   isolation as every sandbox's commands: `RUN` as the step's or the current user
//!   (`user` by default, as E2B's builds since template version 2.1), in the working
//!   directory, with the variables set so far; `COPY` unpacks the uploaded archive in the
//!   sandbox and moves or merges it into place with E2B's ownership and mode rules;
//!   `ENV` values are expanded by the sandbox's shell; `WORKDIR` is made when missing;
//!   `USER` takes `user` or `root`, the two users e2b-local's sandboxes have.
//! - **The host's system is read-only to the steps** (with a mount namespace): a step
//!   that installs outside the home, `/tmp` and the volumes fails, naming the step,
//!   instead of changing the machine e2b-local runs on. A template keeps what its steps
//!   write to the home and `/tmp`.
//! - **The start command** runs at the end of the build until the ready command passes,
//!   as on E2B. E2B then snapshots the memory, so every sandbox of the template starts
//!   with it running; e2b-local keeps files only, so it starts the start command again in
//!   each new sandbox of the template and answers the create once the ready command
//!   passes there too.
//!
//! Builds in progress and their logs live in memory; a finished build is filed in the
//! snapshot registry ([`crate::snapshots`]), which survives a restart, under a UUID build
//! id and its tags.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::app::App;
use crate::clock::{Clock, nanos, rfc3339};
use crate::reply::ApiError;
use crate::snapshots::{Snapshots, check_tag, parse_name};
use crate::token::EnvdToken;

mod run;

pub(crate) use run::start_in_sandbox;

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
struct Failure {
    message: String,
    step: Option<String>,
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
    template_id: String,
    alias: String,
    build_id: String,
    tags: Vec<String>,
    clock: Clock,
    progress: Mutex<Progress>,
}

impl Job {
    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends a log line of `step` (`None` for the build as a whole).
    fn log(&self, level: &'static str, step: Option<&str>, message: impl Into<String>) {
        let entry = LogEntry {
            at: nanos(self.clock.now()),
            level,
            message: message.into(),
            step: step.map(str::to_owned),
        };
        self.lock().entries.push(entry);
    }

    fn finish(&self, outcome: Result<(), Failure>) {
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

/// `POST /v3/templates`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RequestBody {
    name: Option<String>,
    /// Deprecated: the name when `name` is absent.
    alias: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    cpu_count: Option<i64>,
    #[serde(rename = "memoryMB")]
    memory_mb: Option<i64>,
}

/// `POST /v2/templates/{id}/builds/{build}`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StartBody {
    from_image: Option<String>,
    from_template: Option<String>,
    #[serde(default)]
    steps: Vec<Step>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
}

/// One step as the SDKs send it (unknown keys such as `forceUpload` are ignored).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Step {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    files_hash: Option<String>,
}

fn is_files_hash(hash: &str) -> bool {
    hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn build_not_found(build_id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("Build '{build_id}' not found"),
    )
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

    /// `POST /v3/templates`: registers a build (`waiting`) under the name's template,
    /// which a new alias gets a new id for.
    pub(crate) fn request(
        &self,
        snapshots: &Snapshots,
        body: RequestBody,
    ) -> Result<Value, ApiError> {
        let raw = body
            .name
            .or(body.alias)
            .filter(|name| !name.trim().is_empty())
            .ok_or_else(|| ApiError::bad_request("Name is required"))?;
        let name = parse_name(&raw)?;
        if let Some(cpu) = body.cpu_count {
            if cpu < 1 {
                return Err(ApiError::bad_request("CPU count must be at least 1"));
            }
            if cpu > 32 {
                return Err(ApiError::bad_request("CPU count must be at most 32"));
            }
            if cpu != 1 && cpu % 2 != 0 {
                return Err(ApiError::bad_request(
                    "CPU count must be 1 or an even number",
                ));
            }
        }
        if let Some(memory) = body.memory_mb {
            if memory < 128 {
                return Err(ApiError::bad_request("Memory must be at least 128 MiB"));
            }
            if memory % 2 != 0 {
                return Err(ApiError::bad_request("Memory must be divisible by 2"));
            }
        }
        let mut tags: Vec<String> = Vec::new();
        for tag in name
            .written_tag()
            .into_iter()
            .chain(body.tags.iter().map(String::as_str))
        {
            let tag = check_tag(tag)?;
            if !tags.contains(&tag) {
                tags.push(tag);
            }
        }
        if tags.is_empty() {
            tags.push("default".to_owned());
        }
        let alias = name.alias().to_owned();
        let mut jobs = self.jobs();
        let template_id = match snapshots.alias_template(&alias) {
            Some((_, false)) => {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    format!("Alias '{alias}' is already used"),
                ));
            }
            Some((id, true)) => id,
            // A build of the same new alias already requested shares its template id.
            None => jobs
                .values()
                .find(|job| job.alias == alias)
                .map_or_else(crate::snapshots::new_template_id, |job| {
                    job.template_id.clone()
                }),
        };
        let job = Arc::new(Job {
            template_id: template_id.clone(),
            alias: alias.clone(),
            build_id: crate::token::new_uuid(),
            tags: tags.clone(),
            clock: self.clock.clone(),
            progress: Mutex::new(Progress {
                status: Status::Waiting,
                entries: Vec::new(),
                failure: None,
            }),
        });
        if jobs.len() >= RETAINED {
            jobs.retain(|_, job| !matches!(job.lock().status, Status::Ready | Status::Error));
        }
        jobs.insert(job.build_id.clone(), Arc::clone(&job));
        Ok(json!({
            "templateID": template_id,
            "buildID": job.build_id,
            "public": false,
            "names": [format!("{}/{alias}", crate::snapshots::TEAM_SLUG)],
            "tags": tags,
            "aliases": [alias],
        }))
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

    /// `POST /v2/templates/{id}/builds/{build}`: starts a waiting build's steps.
    pub(crate) fn start(
        app: &Arc<App>,
        template_id: &str,
        build_id: &str,
        body: StartBody,
    ) -> Result<(), ApiError> {
        if !crate::token::is_uuid(build_id) {
            return Err(ApiError::bad_request(format!(
                "Invalid build ID: {build_id}"
            )));
        }
        let job = app
            .builds
            .jobs()
            .get(build_id)
            .filter(|job| job.template_id == template_id)
            .cloned()
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("Error when getting template: build '{build_id}' of template '{template_id}' not found"),
                )
            })?;
        let source = match (body.from_image, body.from_template) {
            (Some(image), None) => run::Source::Image(image),
            (None, Some(template)) => run::Source::Template(template),
            _ => {
                return Err(ApiError::bad_request(
                    "exactly one of fromImage and fromTemplate must be set",
                ));
            }
        };
        {
            let mut progress = job.lock();
            if progress.status != Status::Waiting {
                return Err(ApiError::bad_request("build is not in waiting state"));
            }
            progress.status = Status::Building;
        }
        let plan = run::Plan {
            source,
            steps: body.steps,
            start_cmd: body.start_cmd.filter(|c| !c.trim().is_empty()),
            ready_cmd: body.ready_cmd.filter(|c| !c.trim().is_empty()),
        };
        let app = Arc::clone(app);
        tokio::spawn(async move {
            let outcome = run::build(&app, &job, plan).await;
            if let Err(failure) = &outcome {
                job.log("error", failure.step.as_deref(), failure.message.clone());
            }
            job.finish(outcome);
        });
        Ok(())
    }

    /// `GET /templates/{id}/builds/{build}/status`: the state and up to `limit` log
    /// entries from `offset`, in order.
    pub(crate) fn status(
        &self,
        snapshots: &Snapshots,
        template_id: &str,
        build_id: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Value, ApiError> {
        if !crate::token::is_uuid(build_id) {
            return Err(ApiError::bad_request("Invalid build id"));
        }
        let job = self
            .jobs()
            .get(build_id)
            .filter(|job| job.template_id == template_id)
            .cloned();
        let Some(job) = job else {
            // Filed before a restart: ready, its logs gone with the process.
            if snapshots.has_build(template_id, build_id) {
                return Ok(json!({
                    "templateID": template_id,
                    "buildID": build_id,
                    "status": Status::Ready.as_str(),
                    "logs": [],
                    "logEntries": [],
                }));
            }
            return Err(build_not_found(build_id));
        };
        let progress = job.lock();
        let window: Vec<&LogEntry> = progress
            .entries
            .iter()
            .skip(offset)
            .take(limit.min(100))
            .collect();
        let mut answer = json!({
            "templateID": template_id,
            "buildID": build_id,
            "status": progress.status.as_str(),
            "logs": [],
            "logEntries": window.iter().map(|entry| entry.json()).collect::<Vec<_>>(),
        });
        // Omitted rather than null: the SDK reads a present reason as an object.
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
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builds() -> (tempfile::TempDir, Builds, Snapshots) {
        let dir = tempfile::tempdir().unwrap();
        let clock = Clock::system();
        let builds = Builds::open(dir.path(), clock.clone()).unwrap();
        let snapshots = Snapshots::open(dir.path(), clock).unwrap();
        (dir, builds, snapshots)
    }

    fn request(builds: &Builds, snapshots: &Snapshots, body: Value) -> Result<Value, ApiError> {
        builds.request(snapshots, serde_json::from_value(body).unwrap())
    }

    #[test]
    fn a_request_names_its_template_and_tags_as_e2b_does() {
        let (_dir, builds, snapshots) = builds();
        let answer = request(
            &builds,
            &snapshots,
            json!({"name": "My-Tpl:V1", "tags": ["stable", "v1"]}),
        )
        .unwrap();
        assert_eq!(answer["aliases"], json!(["my-tpl"]));
        assert_eq!(answer["names"], json!(["local/my-tpl"]));
        assert_eq!(answer["tags"], json!(["v1", "stable"]));
        assert!(crate::token::is_uuid(answer["buildID"].as_str().unwrap()));
        // A second build of the same alias goes under the same template.
        let again = request(&builds, &snapshots, json!({"name": "my-tpl"})).unwrap();
        assert_eq!(again["templateID"], answer["templateID"]);
        assert_eq!(again["tags"], json!(["default"]));
        assert_ne!(again["buildID"], answer["buildID"]);
    }

    #[test]
    fn a_request_refuses_what_e2b_refuses() {
        let (_dir, builds, snapshots) = builds();
        let message = |body: Value| request(&builds, &snapshots, body).unwrap_err().message;
        assert_eq!(message(json!({})), "Name is required");
        assert_eq!(
            message(json!({"name": "bad name"})),
            "Invalid name: invalid template ID: bad name"
        );
        assert_eq!(
            message(json!({"name": "tpl:"})),
            "Invalid name: invalid tag: "
        );
        assert_eq!(
            message(json!({"name": "tpl", "tags": [":x"]})),
            "Invalid tag: invalid tag ':x': invalid tag: :x"
        );
        let uuid = crate::token::new_uuid();
        assert_eq!(
            message(json!({"name": "tpl", "tags": [uuid]})),
            format!("Invalid tag: invalid tag '{uuid}': tag cannot be a UUID")
        );
        assert_eq!(
            message(json!({"name": "tpl", "cpuCount": 3})),
            "CPU count must be 1 or an even number"
        );
        assert_eq!(
            message(json!({"name": "tpl", "memoryMB": 64})),
            "Memory must be at least 128 MiB"
        );
    }

    #[test]
    fn status_pages_the_log_from_an_offset_and_omits_a_missing_reason() {
        let (_dir, builds, snapshots) = builds();
        let answer = request(&builds, &snapshots, json!({"name": "tpl"})).unwrap();
        let (template_id, build_id) = (
            answer["templateID"].as_str().unwrap(),
            answer["buildID"].as_str().unwrap(),
        );
        let job = builds.jobs().get(build_id).cloned().unwrap();
        for n in 0..3 {
            job.log("info", Some("1"), format!("line {n}"));
        }
        let status = builds
            .status(&snapshots, template_id, build_id, 1, 100)
            .unwrap();
        assert_eq!(status["status"], "waiting");
        assert_eq!(status["logs"], json!([]));
        assert_eq!(status["logEntries"].as_array().unwrap().len(), 2);
        assert_eq!(status["logEntries"][0]["message"], "line 1");
        assert!(status.get("reason").is_none());
        job.log("error", Some("1"), "it broke");
        job.finish(Err(Failure {
            message: "it broke".into(),
            step: Some("1".into()),
        }));
        let status = builds
            .status(&snapshots, template_id, build_id, 0, 100)
            .unwrap();
        assert_eq!(status["status"], "error");
        assert_eq!(status["reason"]["message"], "it broke");
        assert_eq!(status["reason"]["step"], "1");
        assert_eq!(status["reason"]["logEntries"].as_array().unwrap().len(), 1);
        let past_end = builds
            .status(&snapshots, template_id, build_id, 4, 100)
            .unwrap();
        assert_eq!(past_end["logEntries"], json!([]));
        let unknown = crate::token::new_uuid();
        assert_eq!(
            builds
                .status(&snapshots, template_id, &unknown, 0, 100)
                .unwrap_err()
                .status,
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn finished_builds_are_forgotten_past_the_retained_count_never_running_ones() {
        let (_dir, builds, snapshots) = builds();
        let running = request(&builds, &snapshots, json!({"name": "running"})).unwrap();
        let running = running["buildID"].as_str().unwrap().to_owned();
        for n in 1..RETAINED {
            let answer = request(&builds, &snapshots, json!({"name": format!("t{n}")})).unwrap();
            let job = builds
                .jobs()
                .get(answer["buildID"].as_str().unwrap())
                .cloned()
                .unwrap();
            job.finish(Ok(()));
        }
        assert_eq!(builds.jobs().len(), RETAINED);
        request(&builds, &snapshots, json!({"name": "next"})).unwrap();
        let jobs = builds.jobs();
        assert_eq!(jobs.len(), 2, "the finished ones went");
        assert!(jobs.contains_key(&running), "a build not finished stays");
    }

    #[test]
    fn upload_links_carry_a_token_and_check_the_hash() {
        let (_dir, builds, _snapshots) = builds();
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
