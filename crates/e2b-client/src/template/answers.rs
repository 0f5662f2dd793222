//! What a build takes and what E2B answers about builds and tags.

use std::sync::OnceLock;
use std::time::Duration;

use regex::Regex;
use serde::{Deserialize, Deserializer};

use crate::json;

/// Whether a build may reuse E2B's cached layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildCache {
    /// Unchanged layers are reused (the default).
    Use,
    /// Everything is rebuilt, the base layer included (the SDK's `skip_cache=True`).
    Skip,
}

/// How [`Client::build_template`](crate::Client::build_template) builds. Start from
/// [`BuildOptions::new`].
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// More tags for the build, besides a `:tag` in the name; none: only that one (or
    /// `default`).
    pub tags: Vec<String>,
    /// vCPUs of the template's sandboxes (1 or even, at most 32); `None`: E2B's (2).
    pub cpu_count: Option<u32>,
    /// Memory of the template's sandboxes in MiB (even, at least 128); `None`: E2B's (1024).
    pub memory_mb: Option<u32>,
    /// Free disk space the template keeps, in MiB (`0`: no growth); `None`: E2B's.
    pub min_free_disk_mb: Option<u32>,
    /// Cached layers.
    pub cache: BuildCache,
    /// How often the build's status is asked for while it runs (the SDK: 200 ms).
    pub poll_interval: Duration,
}

impl BuildOptions {
    /// No extra tags, E2B's sizes, cached layers reused, polled every 200 ms.
    pub fn new() -> BuildOptions {
        BuildOptions {
            tags: Vec::new(),
            cpu_count: None,
            memory_mb: None,
            min_free_disk_mb: None,
            cache: BuildCache::Use,
            poll_interval: Duration::from_millis(200),
        }
    }
}

impl Default for BuildOptions {
    fn default() -> BuildOptions {
        BuildOptions::new()
    }
}

/// A build E2B accepted: what [`Client::build_template`](crate::Client::build_template)
/// returns once it is ready, and what
/// [`Client::build_status`](crate::Client::build_status) asks about.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BuildInfo {
    /// The template's id (the same for every build of one name).
    pub template_id: String,
    /// This build's id (a UUID).
    pub build_id: String,
    /// The name as given to the build (`name[:tag]`).
    pub name: String,
    /// The tags E2B gave the build.
    pub tags: Vec<String>,
}

impl BuildInfo {
    /// A build known by its ids only (from an earlier run), to ask its status.
    pub fn for_build(template_id: impl Into<String>, build_id: impl Into<String>) -> BuildInfo {
        BuildInfo {
            template_id: template_id.into(),
            build_id: build_id.into(),
            name: String::new(),
            tags: Vec::new(),
        }
    }
}

/// Where a build is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum BuildState {
    /// Accepted, not started.
    Waiting,
    /// Running.
    Building,
    /// Done: the template can be used.
    Ready,
    /// Failed; [`BuildStatus::reason`] says why.
    Error,
}

impl BuildState {
    /// Whether the build is over (ready or failed).
    pub fn is_terminal(self) -> bool {
        matches!(self, BuildState::Ready | BuildState::Error)
    }
}

/// A build log entry's level, in increasing order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Internal detail.
    Debug,
    /// Progress and command output.
    Info,
    /// Warnings.
    Warn,
    /// Errors.
    Error,
}

/// One line of a build's log.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct BuildLogEntry {
    /// When it was written.
    #[serde(deserialize_with = "json::rfc3339")]
    pub timestamp: time::OffsetDateTime,
    /// Its level.
    pub level: LogLevel,
    /// The text, ANSI escape codes removed.
    #[serde(deserialize_with = "no_ansi")]
    pub message: String,
    /// The build phase it belongs to: `base`, the 1-based step number, `finalize`, ….
    #[serde(default)]
    pub step: Option<String>,
}

/// Why a build failed.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct BuildReason {
    /// E2B's message.
    pub message: String,
    /// The phase that failed: `base`, the 1-based step number, `finalize`, ….
    #[serde(default)]
    pub step: Option<String>,
    /// The failing phase's warnings and errors.
    #[serde(
        rename = "logEntries",
        default,
        deserialize_with = "json::null_default"
    )]
    pub log_entries: Vec<BuildLogEntry>,
}

/// One answer of [`Client::build_status`](crate::Client::build_status).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct BuildStatus {
    /// The template's id.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// The build's id.
    #[serde(rename = "buildID")]
    pub build_id: String,
    /// Where the build is.
    #[serde(rename = "status")]
    pub state: BuildState,
    /// The log entries from the asked offset on (at most 100).
    #[serde(
        rename = "logEntries",
        default,
        deserialize_with = "json::null_default"
    )]
    pub log_entries: Vec<BuildLogEntry>,
    /// Old-style log lines (E2B's first build system only).
    #[serde(default, deserialize_with = "json::null_default")]
    pub logs: Vec<String>,
    /// Why it failed, when E2B says.
    #[serde(default)]
    pub reason: Option<BuildReason>,
}

/// The answer of [`Client::assign_template_tags`](crate::Client::assign_template_tags).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct TagAssignment {
    /// The build the tags now point at.
    #[serde(rename = "buildID")]
    pub build_id: String,
    /// The tags as E2B keeps them (lower-cased, without duplicates).
    pub tags: Vec<String>,
}

/// One tag of a template, as [`Client::template_tags`](crate::Client::template_tags) lists it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct TemplateTag {
    /// The tag.
    pub tag: String,
    /// The build it points at.
    #[serde(rename = "buildID")]
    pub build_id: String,
    /// When it was assigned.
    #[serde(rename = "createdAt", deserialize_with = "json::rfc3339")]
    pub created_at: time::OffsetDateTime,
}

/// The answer of `POST /v3/templates`.
#[derive(Deserialize)]
pub(crate) struct RequestedBuild {
    #[serde(rename = "templateID")]
    pub(crate) template_id: String,
    #[serde(rename = "buildID")]
    pub(crate) build_id: String,
    #[serde(default, deserialize_with = "json::null_default")]
    pub(crate) tags: Vec<String>,
}

/// The answer of `GET /templates/{id}/files/{hash}`.
#[derive(Deserialize)]
pub(crate) struct FilesLink {
    pub(crate) present: bool,
    #[serde(default)]
    pub(crate) url: Option<String>,
    #[serde(default, deserialize_with = "json::null_default")]
    pub(crate) headers: std::collections::BTreeMap<String, String>,
}

/// The official SDK's ANSI escape pattern (chalk's `ansi-regex`).
fn ansi() -> &'static Regex {
    static ANSI: OnceLock<Regex> = OnceLock::new();
    ANSI.get_or_init(|| {
        let st = r"(?:\x{07}|\x{1B}\x{5C}|\x{9C})";
        let pattern = format!(
            r"[\x{{1B}}\x{{9B}}][\[\]()#;?]*(?:(?:(?:(?:;[-a-zA-Z\d/#&.:=?%@~_]+)*|[a-zA-Z\d]+(?:;[-a-zA-Z\d/#&.:=?%@~_]*)*)?{st})|(?:(?:\d{{1,4}}(?:;\d{{0,4}})*)?[\dA-PR-TZcf-nq-uy=><~]))"
        );
        Regex::new(&pattern).expect("the ANSI pattern compiles")
    })
}

/// Removes ANSI escape codes, as the SDK does for every log message.
pub(crate) fn strip_ansi(text: &str) -> String {
    ansi().replace_all(text, "").into_owned()
}

fn no_ansi<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    Ok(strip_ansi(&String::deserialize(deserializer)?))
}
