//! Template builds: E2B's build API served by running a template's steps in a sandbox of
//! the server's own and filing that sandbox's files as a template (the state they keep
//! between requests is [`crate::builds`]').
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
//! - **The steps write to a layer of the build's own** ([`crate::root_layer`]): what a step
//!   writes outside the home, `/tmp` and the volumes (`WORKDIR /app`, a package install)
//!   lands in the build sandbox's root layer, never on the host, and the template keeps it
//!   with the home and `/tmp`; each sandbox of the template starts with a copy. A host
//!   without the namespaces a layer needs runs the steps with its system read-only
//!   instead: such a step fails, naming the step.
//! - **The start command** runs at the end of the build until the ready command passes,
//!   as on E2B. E2B then snapshots the memory, so every sandbox of the template starts
//!   with it running; e2b-local keeps files only, so it starts the start command again in
//!   each new sandbox of the template and answers the create once the ready command
//!   passes there too.
//!
//! Builds in progress and their logs live in memory ([`crate::builds`]); a finished build
//! is filed in the snapshot registry ([`crate::snapshots`]), which survives a restart, under
//! a UUID build id and its tags.

use std::sync::Arc;

use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::app::App;
use crate::builds::Builds;
use crate::reply::ApiError;
use crate::snapshots::{Snapshots, check_tags, parse_name};

mod run;

pub(crate) use run::start_in_sandbox;

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

fn build_not_found(build_id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("Build '{build_id}' not found"),
    )
}

/// `POST /v3/templates`: registers a build (`waiting`) under the name's template,
/// which a new alias gets a new id for.
pub(crate) fn request(
    snapshots: &Snapshots,
    builds: &Builds,
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
    let mut tags = check_tags(
        name.written_tag()
            .into_iter()
            .chain(body.tags.iter().map(String::as_str)),
    )?;
    if tags.is_empty() {
        tags.push("default".to_owned());
    }
    let alias = name.alias().to_owned();
    let template_id = match snapshots.alias_template(&alias) {
        Some((_, false)) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("Alias '{alias}' is already used"),
            ));
        }
        Some((id, true)) => id,
        // A build of the same new alias already requested shares its template id.
        None => builds
            .pending_template(&alias)
            .unwrap_or_else(crate::snapshots::new_template_id),
    };
    let job = builds.register(template_id.clone(), alias.clone(), tags.clone());
    Ok(json!({
        "templateID": template_id,
        "buildID": job.build_id,
        "public": false,
        "names": [format!("{}/{alias}", crate::snapshots::TEAM_SLUG)],
        "tags": tags,
        "aliases": [alias],
    }))
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
            .job(template_id, build_id)
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
    Builds::begin(&job)?;
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
    app: &App,
    template_id: &str,
    build_id: &str,
    offset: usize,
    limit: usize,
) -> Result<Value, ApiError> {
    if !crate::token::is_uuid(build_id) {
        return Err(ApiError::bad_request("Invalid build id"));
    }
    match app.builds.job(template_id, build_id) {
        Some(job) => Ok(Builds::status_json(&job, offset, limit)),
        None if app.snapshots.has_build(template_id, build_id) => {
            Ok(Builds::filed_status_json(template_id, build_id))
        }
        None => Err(build_not_found(build_id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> (tempfile::TempDir, Builds, Snapshots) {
        let dir = tempfile::tempdir().unwrap();
        let clock = crate::clock::Clock::system();
        let builds = Builds::open(dir.path(), clock.clone()).unwrap();
        let snapshots = Snapshots::open(dir.path(), clock).unwrap();
        (dir, builds, snapshots)
    }

    fn ask(builds: &Builds, snapshots: &Snapshots, body: Value) -> Result<Value, ApiError> {
        request(snapshots, builds, serde_json::from_value(body).unwrap())
    }

    #[test]
    fn a_request_names_its_template_and_tags_as_e2b_does() {
        let (_dir, builds, snapshots) = registry();
        let answer = ask(
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
        let again = ask(&builds, &snapshots, json!({"name": "my-tpl"})).unwrap();
        assert_eq!(again["templateID"], answer["templateID"]);
        assert_eq!(again["tags"], json!(["default"]));
        assert_ne!(again["buildID"], answer["buildID"]);
    }

    #[test]
    fn a_request_refuses_what_e2b_refuses() {
        let (_dir, builds, snapshots) = registry();
        let message = |body: Value| ask(&builds, &snapshots, body).unwrap_err().message;
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
}
