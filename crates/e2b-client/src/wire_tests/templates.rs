//! Template builds and tags: the request sequence the official SDK makes, the upload `PUT`
//! (no API key, exact length, E2B's headers, no redirect), the poll-and-drain loop, and
//! E2B's errors.

use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;

use super::support::*;
use crate::template::{
    BuildCache, BuildInfo, BuildLogEntry, BuildOptions, BuildState, CopyOptions, CopyPlan,
    LogLevel, ReadyCmd, SymlinkMode, TemplateSpec, UploadMode, copy_hash,
};
use crate::*;

const TPL: &str = "abcd1234efgh5678ijkl";
const BUILD: &str = "5b2f5a0e-1111-4222-8333-444455556666";

fn requested_json() -> serde_json::Value {
    serde_json::json!({"templateID": TPL, "buildID": BUILD, "public": false,
        "names": ["team-slug/my-tpl"], "tags": ["v1", "stable"], "aliases": ["my-tpl"]})
}

fn entry(message: &str, step: &str) -> serde_json::Value {
    serde_json::json!({"timestamp": "2026-01-01T00:00:02.123456789Z", "level": "info",
        "message": message, "step": step})
}

fn status_json(state: &str, entries: &[serde_json::Value]) -> serde_json::Value {
    serde_json::json!({"templateID": TPL, "buildID": BUILD, "status": state, "logs": [],
        "logEntries": entries})
}

fn empty(status: u16) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = ::http::StatusCode::from_u16(status).expect("status");
    response
}

fn hash_of(dir: &std::path::Path, src: &str, dest: &str) -> String {
    copy_hash(
        dir,
        &CopyPlan {
            src: src.to_owned(),
            dest: dest.to_owned(),
            symlinks: SymlinkMode::Preserve,
            upload: UploadMode::WhenMissing,
            ignore: Vec::new(),
        },
    )
    .expect("hashed")
}

fn fast(mut options: BuildOptions) -> BuildOptions {
    options.poll_interval = Duration::from_millis(5);
    options
}

fn collect_logs() -> (
    Arc<Mutex<Vec<BuildLogEntry>>>,
    impl FnMut(BuildLogEntry) + Send,
) {
    let logs = Arc::new(Mutex::new(Vec::new()));
    let sink = logs.clone();
    (logs, move |entry| {
        sink.lock().expect("not poisoned").push(entry)
    })
}

/// Answers like E2B for one build: `status_replies` in turn for the status calls.
fn build_server(
    folder_hash: String,
    status_replies: Vec<serde_json::Value>,
) -> impl Fn(&Recorded, usize) -> Response + Send + Sync + 'static {
    let polls = AtomicUsize::new(0);
    move |request, _| {
        let host = request.header("host").unwrap_or_default().to_owned();
        let path = request.path_and_query.as_str();
        match request.method.as_str() {
            "POST" if path == "/v3/templates" => json(202, &requested_json()),
            "GET" if path.starts_with(&format!("/templates/{TPL}/files/")) => {
                // The folder is new; app.py is cached.
                let present = !path.ends_with(&folder_hash);
                json(
                    201,
                    &serde_json::json!({"present": present,
                        "url": format!("http://{host}/upload/{}", &path[path.len() - 8..]),
                        "headers": {"x-goog-meta-purpose": "template", "Content-Length": "1"}}),
                )
            }
            "PUT" => empty(200),
            "POST" if path == format!("/v2/templates/{TPL}/builds/{BUILD}") => empty(202),
            "GET" if path.contains("/status?") => {
                let index = polls.fetch_add(1, Ordering::SeqCst);
                let reply = status_replies
                    .get(index)
                    .or(status_replies.last())
                    .expect("a reply");
                json(200, reply)
            }
            _ => json(
                500,
                &serde_json::json!({"code": 500, "message": "unexpected"}),
            ),
        }
    }
}

#[tokio::test]
async fn a_build_makes_the_sdks_requests_and_follows_the_log_to_the_end() {
    let dir = crate::template::tests::fixture();
    let folder_hash = hash_of(dir.path(), "folder", "/home/user/folder");
    let app_hash = hash_of(dir.path(), "app.py", "/app/");
    // The captured sequence: waiting, building (2 entries), ready (1), then an empty page.
    let replies = vec![
        status_json("waiting", &[]),
        status_json(
            "building",
            &[
                entry("[base] FROM e2bdev/base", "base"),
                entry("\u{1b}[32m[builder 1/3] COPY\u{1b}[0m", "1"),
            ],
        ),
        status_json(
            "ready",
            &[entry("[finalize] Finalizing template build", "finalize")],
        ),
        status_json("ready", &[]),
    ];
    let server = TestServer::start(build_server(folder_hash.clone(), replies)).await;
    let client = client(&server.url);
    let mut mode = CopyOptions::new();
    mode.mode = Some(0o755);
    let spec = TemplateSpec::from_base_image()
        .with_file_context(dir.path())
        .copy("folder", "/home/user/folder", &CopyOptions::new())
        .expect("valid")
        .copy("app.py", "/app/", &mode)
        .expect("valid")
        .run_cmd_as("whoami", "root")
        .set_start_cmd("python -m http.server 8000", ReadyCmd::wait_for_port(8000));
    let mut options = fast(BuildOptions::new());
    options.tags = vec!["stable".to_owned()];
    let (logs, on_log) = collect_logs();
    let info = client
        .build_template(&spec, "my-tpl:v1", options, on_log)
        .await
        .expect("built");
    assert_eq!(info.template_id, TPL);
    assert_eq!(info.build_id, BUILD);
    assert_eq!(info.name, "my-tpl:v1");
    assert_eq!(info.tags, ["v1", "stable"]);

    let requests = server.requests();
    let seen: Vec<(&str, &str)> = requests
        .iter()
        .map(|r| (r.method.as_str(), r.path_and_query.as_str()))
        .collect();
    let files = |hash: &str| format!("/templates/{TPL}/files/{hash}");
    let status = |offset: u32| {
        format!("/templates/{TPL}/builds/{BUILD}/status?logsOffset={offset}&limit=100")
    };
    let upload = format!("/upload/{}", &folder_hash[56..]);
    let start = format!("/v2/templates/{TPL}/builds/{BUILD}");
    assert_eq!(
        seen,
        [
            ("POST", "/v3/templates"),
            ("GET", files(&folder_hash).as_str()),
            ("PUT", upload.as_str()),
            ("GET", files(&app_hash).as_str()),
            ("POST", start.as_str()),
            ("GET", status(0).as_str()),
            ("GET", status(0).as_str()),
            ("GET", status(2).as_str()),
            ("GET", status(3).as_str()),
        ]
    );

    // The request: the name as given, extra tags, no sizes (2.63 sends them only when set).
    let body: serde_json::Value = serde_json::from_slice(&requests[0].body).expect("json");
    assert_eq!(
        body,
        serde_json::json!({"name": "my-tpl:v1", "tags": ["stable"]})
    );
    assert_eq!(requests[0].header("content-type"), Some("application/json"));

    // The upload: no key, E2B's header, our exact length, a gzip'd tar of the folder.
    let put = &requests[2];
    assert_eq!(put.header("x-api-key"), None);
    assert_eq!(put.header("x-goog-meta-purpose"), Some("template"));
    assert_eq!(put.header("transfer-encoding"), None);
    assert_eq!(
        put.header("content-length"),
        Some(put.body.len().to_string().as_str())
    );
    assert_eq!(&put.body[..2], [0x1f, 0x8b]);
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&put.body[..]));
    let mut members = Vec::new();
    for member in archive.entries().expect("entries") {
        let mut member = member.expect("entry");
        let name = member.path().expect("path").to_string_lossy().into_owned();
        let mut content = String::new();
        member.read_to_string(&mut content).expect("read");
        members.push((name, content));
    }
    assert_eq!(
        members,
        [
            ("folder".to_owned(), String::new()),
            ("folder/symlink.txt".to_owned(), String::new()),
            ("folder/test.txt".to_owned(), "hello\n".to_owned()),
        ]
    );
    for request in requests.iter().filter(|r| r.method != "PUT") {
        assert_eq!(request.header("x-api-key"), Some(KEY), "{request:?}");
    }

    // The start: the captured body, with the hashes computed here.
    let body: serde_json::Value = serde_json::from_slice(&requests[4].body).expect("json");
    assert_eq!(
        body,
        serde_json::json!({"fromImage": "e2bdev/base", "force": false,
            "steps": [
                {"type": "COPY", "args": ["folder", "/home/user/folder", "", ""],
                 "filesHash": folder_hash, "force": false},
                {"type": "COPY", "args": ["app.py", "/app/", "", "0755"],
                 "filesHash": app_hash, "force": false},
                {"type": "RUN", "args": ["whoami", "root"], "force": false}],
            "startCmd": "python -m http.server 8000",
            "readyCmd": "[ -n \"$(ss -Htuln sport = :8000)\" ]"})
    );

    // Every server entry, in order, ANSI codes removed.
    let logs = logs.lock().expect("not poisoned");
    let messages: Vec<(&str, Option<&str>)> = logs
        .iter()
        .map(|e| (e.message.as_str(), e.step.as_deref()))
        .collect();
    assert_eq!(
        messages,
        [
            ("[base] FROM e2bdev/base", Some("base")),
            ("[builder 1/3] COPY", Some("1")),
            ("[finalize] Finalizing template build", Some("finalize")),
        ]
    );
    assert!(logs.iter().all(|e| e.level == LogLevel::Info));
    assert_eq!(logs[0].timestamp.nanosecond(), 123_456_789);
}

#[tokio::test]
async fn a_failed_build_carries_the_first_terminal_reason_and_step() {
    let dir = crate::template::tests::fixture();
    let mut failed = status_json(
        "error",
        &[
            serde_json::json!({"timestamp": "2026-01-01T00:00:03Z", "level": "error",
            "message": "bad user", "step": "3"}),
        ],
    );
    failed["reason"] = serde_json::json!({"message":
        "failed to run command 'whoami': command failed: unauthenticated: invalid username: 'root123'",
        "step": "3", "logEntries": null});
    let mut drained = status_json("error", &[]);
    drained["reason"] = serde_json::json!({"message": "a later reason", "step": "finalize"});
    let server = TestServer::start(build_server(
        "none".to_owned(),
        vec![status_json("building", &[]), failed, drained],
    ))
    .await;
    let client = client(&server.url);
    let spec = TemplateSpec::from_template("base")
        .with_file_context(dir.path())
        .run_cmd_as("whoami", "root123");
    let (logs, on_log) = collect_logs();
    let error = client
        .build_template(&spec, "broken", fast(BuildOptions::new()), on_log)
        .await
        .expect_err("failed");
    assert!(error.is_build_failed(), "{error:?}");
    assert_eq!(error.build_step(), Some("3"));
    assert_eq!(error.operation(), Some(Operation::BuildTemplate));
    assert_eq!(
        error.reason(),
        format!(
            "build {BUILD} of template {TPL} failed at step 3: failed to run command 'whoami': \
             command failed: unauthenticated: invalid username: 'root123'"
        )
    );
    assert!(!error.is_transient() && !error.is_invalid_request());
    assert_eq!(logs.lock().expect("not poisoned").len(), 1);
    assert_eq!(logs.lock().expect("not poisoned")[0].level, LogLevel::Error);
    // building (offset 0), error with one entry (offset 0), the drain (offset 1).
    let polls: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.path_and_query.contains("/status?"))
        .map(|r| r.path_and_query.clone())
        .collect();
    assert_eq!(polls.len(), 3);
    assert!(polls[2].ends_with("logsOffset=1&limit=100"), "{polls:?}");
    // No COPY: no files request; the template source is sent instead of an image.
    let start = server
        .requests()
        .into_iter()
        .find(|r| r.path_and_query.starts_with("/v2/"))
        .expect("started");
    let body: serde_json::Value = serde_json::from_slice(&start.body).expect("json");
    assert_eq!(
        body,
        serde_json::json!({"fromTemplate": "base", "force": false,
            "steps": [{"type": "RUN", "args": ["whoami", "root123"], "force": false}]})
    );

    // No reason at all: the SDK's words.
    let server = TestServer::start(build_server(
        "none".to_owned(),
        vec![status_json("error", &[])],
    ))
    .await;
    let error = client_for_url(&server.url)
        .build_template(&spec, "broken", fast(BuildOptions::new()), |_| {})
        .await
        .expect_err("failed");
    assert!(error.is_build_failed(), "{error:?}");
    assert_eq!(error.build_step(), None);
    assert!(error.reason().ends_with("failed: Build failed"), "{error}");
    // A terminal answer without entries needs no drain call.
    assert_eq!(
        server
            .requests()
            .iter()
            .filter(|r| r.path_and_query.contains("/status?"))
            .count(),
        1
    );
}

fn client_for_url(url: &str) -> Client {
    client(url)
}

#[tokio::test]
async fn a_forced_upload_is_sent_even_when_cached_and_sizes_go_in_the_request() {
    let dir = crate::template::tests::fixture();
    // Everything is "present": only the forced step uploads.
    let server = TestServer::start(build_server(
        "no-such-hash".to_owned(),
        vec![status_json("ready", &[])],
    ))
    .await;
    let client = client(&server.url);
    let mut forced = CopyOptions::new();
    forced.upload = UploadMode::Always;
    let spec = TemplateSpec::from_image("python:3.12")
        .with_file_context(dir.path())
        .copy("app.py", "/app/", &forced)
        .expect("valid")
        .copy("folder/*", "/f/", &CopyOptions::new())
        .expect("valid");
    let mut options = fast(BuildOptions::new());
    options.cpu_count = Some(4);
    options.memory_mb = Some(2048);
    options.min_free_disk_mb = Some(0);
    options.cache = BuildCache::Skip;
    let info = client
        .build_template_in_background(&spec, "team/py:v2", options)
        .await
        .expect("started");
    assert_eq!(info.build_id, BUILD);
    let requests = server.requests();
    let methods: Vec<&str> = requests.iter().map(|r| r.method.as_str()).collect();
    // In the background: no status call.
    assert_eq!(methods, ["POST", "GET", "PUT", "GET", "POST"]);
    let body: serde_json::Value = serde_json::from_slice(&requests[0].body).expect("json");
    assert_eq!(
        body,
        serde_json::json!({"name": "team/py:v2", "cpuCount": 4, "memoryMB": 2048,
            "minFreeDiskMb": 0})
    );
    let start: serde_json::Value = serde_json::from_slice(&requests[4].body).expect("json");
    assert_eq!(start["force"], true);
    assert_eq!(start["fromImage"], "python:3.12");
    assert_eq!(start["steps"][0]["force"], true);
    assert_eq!(start["steps"][0]["forceUpload"], true);
    assert_eq!(start["steps"][1]["force"], false);
    assert!(start["steps"][1].get("forceUpload").is_none());
    assert_eq!(
        start["steps"][1]["filesHash"],
        hash_of(dir.path(), "folder/*", "/f/")
    );
}

#[tokio::test]
async fn an_upload_is_one_put_that_follows_no_redirect() {
    let dir = crate::template::tests::fixture();
    let server = TestServer::start(|request, _| {
        let host = request.header("host").unwrap_or_default().to_owned();
        match (request.method.as_str(), request.path_and_query.as_str()) {
            ("POST", "/v3/templates") => json(202, &requested_json()),
            ("GET", path) if path.contains("/files/") => json(
                201,
                &serde_json::json!({"present": false,
                    "url": format!("http://{host}/bucket/sig-abc123/obj")}),
            ),
            ("PUT", path) => with_header(
                json(
                    307,
                    &serde_json::json!({"message": format!("moved http://{host}{path}")}),
                ),
                "location",
                "/elsewhere",
            ),
            _ => json(
                500,
                &serde_json::json!({"code": 500, "message": "unexpected"}),
            ),
        }
    })
    .await;
    let client = client(&server.url);
    let spec = TemplateSpec::from_base_image()
        .with_file_context(dir.path())
        .copy("app.py", "/app/", &CopyOptions::new())
        .expect("valid");
    let error = client
        .build_template_in_background(&spec, "tpl", BuildOptions::new())
        .await
        .expect_err("redirected");
    assert_eq!(error.operation(), Some(Operation::UploadTemplateFiles));
    assert_eq!(error.status(), Some(307));
    let paths: Vec<String> = server
        .requests()
        .iter()
        .map(|r| format!("{} {}", r.method, r.path_and_query))
        .collect();
    assert_eq!(paths.len(), 3, "{paths:?}");
    assert_eq!(paths[2], "PUT /bucket/sig-abc123/obj");
    // The signed URL is a credential: no error shows it.
    for shown in [error.to_string(), format!("{error:?}")] {
        assert!(!shown.contains("sig-abc123"), "{shown}");
    }
    assert!(server.requests()[2].header("x-api-key").is_none());
}

#[tokio::test]
async fn refusals_come_before_any_request_and_e2bs_errors_keep_their_class() {
    let dir = crate::template::tests::fixture();
    let server = TestServer::start(|request, _| {
        let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap_or_default();
        match body["name"].as_str() {
            Some("busy") => json(429, &serde_json::json!({"code": 429,
                "message": "you have reached the maximum number of concurrent template builds (2)"})),
            Some("taken") => json(409, &serde_json::json!({"code": 409,
                "message": "Alias 'taken' is already used"})),
            Some("odd") => json(200, &requested_json()),
            _ => json(400, &serde_json::json!({"code": 400, "message": "Name is required"})),
        }
    })
    .await;
    let client = client(&server.url);
    let spec = TemplateSpec::from_base_image().with_file_context(dir.path());

    let error = client
        .build_template_in_background(&spec, " ", BuildOptions::new())
        .await
        .expect_err("no name");
    assert!(error.is_invalid_request(), "{error:?}");
    let missing = spec
        .clone()
        .copy("nothing-here*", "/x", &CopyOptions::new())
        .expect("valid");
    let error = client
        .build_template_in_background(&missing, "tpl", BuildOptions::new())
        .await
        .expect_err("no files");
    assert!(error.is_invalid_request(), "{error:?}");
    assert!(error.reason().contains("No files found in"), "{error}");
    assert!(server.requests().is_empty());

    let error = client
        .build_template_in_background(&spec, "busy", BuildOptions::new())
        .await
        .expect_err("429");
    assert!(error.is_rate_limited(), "{error:?}");
    assert_eq!(error.operation(), Some(Operation::RequestBuild));
    assert!(
        error.reason().contains("concurrent template builds"),
        "{error}"
    );
    let error = client
        .build_template_in_background(&spec, "taken", BuildOptions::new())
        .await
        .expect_err("409");
    assert!(error.is_conflict(), "{error:?}");
    assert!(
        error.reason().ends_with("Alias 'taken' is already used"),
        "{error}"
    );
    // Another 2xx than the spec's is not success.
    let error = client
        .build_template_in_background(&spec, "odd", BuildOptions::new())
        .await
        .expect_err("200");
    assert!(matches!(error, Error::Protocol { .. }), "{error:?}");
    // None of them is retried.
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn status_tags_and_exists_use_the_sdks_routes() {
    let server = TestServer::start(|request, _| {
        match (request.method.as_str(), request.path_and_query.as_str()) {
            ("GET", path) if path.contains("/status?") => {
                let mut reply = status_json("building", &[entry("x", "1")]);
                reply["logEntries"][0]["step"] = serde_json::Value::Null;
                json(200, &reply)
            }
            ("POST", "/templates/tags") => json(
                201,
                &serde_json::json!({"tags": ["production"], "buildID": BUILD}),
            ),
            ("DELETE", "/templates/tags") => empty(204),
            ("GET", "/templates/team%2Fmy-tpl%3Av1/tags") => json(
                200,
                &serde_json::json!([{"tag": "default", "buildID": BUILD,
                    "createdAt": "2026-01-01T00:00:00Z"}]),
            ),
            ("GET", "/templates/aliases/team%2Fmissing%3Av1") => json(
                404,
                &serde_json::json!({"code": 404, "message": "template 'x' not found"}),
            ),
            ("GET", "/templates/aliases/theirs") => json(
                403,
                &serde_json::json!({"code": 403, "message": "You don't have access"}),
            ),
            ("GET", "/templates/aliases/mine") => json(
                200,
                &serde_json::json!({"templateID": TPL, "public": false}),
            ),
            _ => json(
                500,
                &serde_json::json!({"code": 500, "message": "unexpected"}),
            ),
        }
    })
    .await;
    let client = client(&server.url);
    let info = BuildInfo::for_build(TPL, BUILD);
    let status = client.build_status(&info, 7).await.expect("status");
    assert_eq!(status.state, BuildState::Building);
    assert!(!status.state.is_terminal());
    assert_eq!(status.log_entries[0].step, None);
    assert_eq!(status.reason, None);

    let assigned = client
        .assign_template_tags("my-tpl:v1", ["production"])
        .await
        .expect("assigned");
    assert_eq!(assigned.tags, ["production"]);
    assert_eq!(assigned.build_id, BUILD);
    client
        .remove_template_tags("my-tpl", vec!["production".to_owned()])
        .await
        .expect("removed");
    let tags = client
        .template_tags("team/my-tpl:v1")
        .await
        .expect("listed");
    assert_eq!(tags.len(), 1);
    assert_eq!(tags[0].tag, "default");
    assert_eq!(tags[0].created_at.unix_timestamp(), 1_767_225_600);
    assert!(
        !client
            .template_exists("team/missing:v1")
            .await
            .expect("404")
    );
    assert!(client.template_exists("theirs").await.expect("403"));
    assert!(client.template_exists("mine").await.expect("200"));

    let error = client
        .assign_template_tags("my-tpl", Vec::<String>::new())
        .await
        .expect_err("no tags");
    assert!(error.is_invalid_request(), "{error:?}");

    let requests = server.requests();
    assert_eq!(
        requests[0].path_and_query,
        format!("/templates/{TPL}/builds/{BUILD}/status?logsOffset=7&limit=100")
    );
    let assign: serde_json::Value = serde_json::from_slice(&requests[1].body).expect("json");
    assert_eq!(
        assign,
        serde_json::json!({"target": "my-tpl:v1", "tags": ["production"]})
    );
    assert_eq!(requests[2].method, "DELETE");
    assert_eq!(requests[2].header("content-type"), Some("application/json"));
    let remove: serde_json::Value = serde_json::from_slice(&requests[2].body).expect("json");
    assert_eq!(
        remove,
        serde_json::json!({"name": "my-tpl", "tags": ["production"]})
    );
    // The refused assignment sent nothing.
    assert_eq!(requests.len(), 7);
}

#[tokio::test]
async fn an_unknown_build_status_is_a_protocol_error() {
    let server = TestServer::start(|_, _| json(200, &status_json("paused", &[]))).await;
    let error = client(&server.url)
        .build_status(&BuildInfo::for_build(TPL, BUILD), 0)
        .await
        .expect_err("unknown state");
    assert!(matches!(error, Error::Protocol { .. }), "{error:?}");
    assert_eq!(error.operation(), Some(Operation::BuildStatus));
}

#[test]
fn the_default_poll_interval_is_the_sdks() {
    assert_eq!(
        BuildOptions::new().poll_interval,
        Duration::from_millis(200)
    );
    assert_eq!(BuildOptions::new().cache, BuildCache::Use);
}

#[tokio::test]
async fn registry_credentials_reach_the_build_start_and_no_error_text() {
    let server = TestServer::start(|request, _| {
        if request.path_and_query == "/v3/templates" {
            return json(202, &requested_json());
        }
        // A server that quotes the password back: the error must not carry it.
        let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap_or_default();
        let password = body["fromImageRegistry"]["password"].as_str().unwrap_or("");
        json(
            400,
            &serde_json::json!({"code": 400,
            "message": format!("cannot pull fromImageRegistry with {password} here")}),
        )
    })
    .await;
    let client = client(&server.url);
    let spec = TemplateSpec::from_private_image(
        "registry.example/app:1",
        crate::template::RegistryCredentials::Basic {
            username: "me".to_owned(),
            password: SecretValue::new("registry-pw-5e6f7a".to_owned()),
        },
    );
    let error = client
        .build_template_in_background(&spec, "tpl", BuildOptions::new())
        .await
        .expect_err("400");
    assert_eq!(error.operation(), Some(Operation::StartBuild));
    let start: serde_json::Value =
        serde_json::from_slice(&server.requests()[1].body).expect("json");
    assert_eq!(
        start["fromImageRegistry"],
        serde_json::json!({"type": "registry", "username": "me", "password": "registry-pw-5e6f7a"})
    );
    for text in [error.to_string(), format!("{error:?}")] {
        assert!(!text.contains("registry-pw-5e6f7a"), "{text}");
    }
    assert!(error.to_string().contains("fromImageRegistry"), "{error}");
}
