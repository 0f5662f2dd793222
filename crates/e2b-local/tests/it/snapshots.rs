//! Snapshots and forks: `POST /sandboxes/{id}/snapshots`, `GET /snapshots`,
//! `DELETE /templates/{id}`, create from a snapshot, `POST /sandboxes/{id}/fork`, and the
//! fault knobs that target them.

use std::time::Duration;

use e2b_local::{Clock, FailRule, FaultScope, Server, ServerConfig};
use serde_json::{Value, json};

use crate::support::{Api, Sandbox, manual_server, new_sandbox, t0};

fn encode(segment: &str) -> String {
    segment.replace('/', "%2F").replace(':', "%3A")
}

async fn snapshot(api: &Api, id: &str, body: Value) -> Value {
    let reply = api
        .post(&format!("/sandboxes/{id}/snapshots"), &body.to_string())
        .await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    reply.json
}

/// Creates a sandbox from `template` and returns it with its create answer.
async fn create_from(api: &Api, template: &str) -> (Sandbox, Value) {
    let reply = api
        .post(
            "/v2/sandboxes",
            &json!({"templateID": template, "timeout": 300}).to_string(),
        )
        .await;
    assert_eq!(reply.status, 201, "{template}: {}", reply.text);
    let sandbox = Sandbox {
        id: reply.json["sandboxID"].as_str().unwrap().to_owned(),
        token: reply.json["envdAccessToken"].as_str().map(str::to_owned),
    };
    (sandbox, reply.json)
}

async fn read(api: &Api, sandbox: &Sandbox, path: &str) -> String {
    let (status, body) = api.download(sandbox, path).await;
    assert_eq!(status, 200, "{path}");
    String::from_utf8(body.to_vec()).unwrap()
}

async fn write(api: &Api, sandbox: &Sandbox, path: &str, data: &str) {
    assert_eq!(api.upload(sandbox, path, data.as_bytes()).await.status, 200);
}

fn ids(page: &Value) -> Vec<String> {
    page.as_array()
        .unwrap()
        .iter()
        .map(|s| s["snapshotID"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_snapshot_keeps_the_files_and_sandboxes_from_it_start_with_them_independently() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let source = new_sandbox(&api).await;
    write(&api, &source, "app/data.txt", "before").await;
    write(&api, &source, "/tmp/scratch.txt", "tmp too").await;
    let before = api.get(&format!("/sandboxes/{}", source.id)).await.json;

    let info = snapshot(&api, &source.id, json!({})).await;
    let snapshot_id = info["snapshotID"].as_str().unwrap().to_owned();
    let template_id = snapshot_id.strip_suffix(":default").expect("<id>:default");
    assert_eq!(info["names"], json!([]));
    // The source keeps its id, state and lease.
    let after = api.get(&format!("/sandboxes/{}", source.id)).await.json;
    assert_eq!(
        (&after["state"], &after["endAt"]),
        (&before["state"], &before["endAt"])
    );

    let (copy, created) = create_from(&api, &snapshot_id).await;
    assert_eq!(created["templateID"], template_id);
    assert_eq!(
        created["alias"],
        Value::Null,
        "an unnamed snapshot has no alias"
    );
    assert_eq!(read(&api, &copy, "/home/user/app/data.txt").await, "before");
    assert_eq!(read(&api, &copy, "/tmp/scratch.txt").await, "tmp too");
    let listed = api.get(&format!("/sandboxes/{}", copy.id)).await.json;
    assert_eq!(listed["templateID"], template_id);

    // Copy, source and the snapshot are independent of each other.
    write(&api, &copy, "app/data.txt", "changed in the copy").await;
    write(&api, &source, "app/data.txt", "changed in the source").await;
    assert_eq!(
        read(&api, &source, "/home/user/app/data.txt").await,
        "changed in the source"
    );
    let (second, _) = create_from(&api, template_id).await;
    assert_eq!(
        read(&api, &second, "/home/user/app/data.txt").await,
        "before"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn named_snapshots_answer_every_name_form_and_a_second_one_replaces_the_content() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let source = new_sandbox(&api).await;
    write(&api, &source, "v.txt", "one").await;
    let info = snapshot(&api, &source.id, json!({"name": " Before-Upgrade "})).await;
    assert_eq!(
        info,
        json!({"snapshotID": "local/before-upgrade:default", "names": ["local/before-upgrade:default"]})
    );
    let (first, created) = create_from(&api, "before-upgrade").await;
    assert_eq!(created["alias"], "before-upgrade");
    let template_id = created["templateID"].as_str().unwrap().to_owned();
    for form in [
        "before-upgrade:default",
        "local/before-upgrade",
        "local/before-upgrade:default",
        "LOCAL/Before-Upgrade:DEFAULT",
        template_id.as_str(),
        &format!("{template_id}:default"),
    ] {
        let (sandbox, created) = create_from(&api, form).await;
        assert_eq!(created["templateID"], template_id, "{form}");
        assert_eq!(read(&api, &sandbox, "v.txt").await, "one", "{form}");
    }
    assert_eq!(read(&api, &first, "v.txt").await, "one");

    // The same name again: a new build of the same template, same id.
    write(&api, &source, "v.txt", "two").await;
    let again = snapshot(&api, &source.id, json!({"name": "before-upgrade"})).await;
    assert_eq!(again["snapshotID"], "local/before-upgrade:default");
    let (newer, created) = create_from(&api, "local/before-upgrade:default").await;
    assert_eq!(created["templateID"], template_id);
    assert_eq!(read(&api, &newer, "v.txt").await, "two");

    // Another tag is another build of the same template.
    write(&api, &source, "v.txt", "three").await;
    let tagged = snapshot(&api, &source.id, json!({"name": "before-upgrade:v2"})).await;
    assert_eq!(
        tagged,
        json!({"snapshotID": "local/before-upgrade:v2", "names": ["local/before-upgrade:v2"]})
    );
    let (v2, created) = create_from(&api, "before-upgrade:v2").await;
    assert_eq!(created["templateID"], template_id);
    assert_eq!(read(&api, &v2, "v.txt").await, "three");
    let (default, _) = create_from(&api, "before-upgrade").await;
    assert_eq!(read(&api, &default, "v.txt").await, "two");

    // A bare built-in name stays the built-in; the snapshot of that name is local/base.
    snapshot(&api, &source.id, json!({"name": "base"})).await;
    let (builtin, created) = create_from(&api, "base").await;
    assert_eq!(created["templateID"], "base");
    assert_eq!(api.download(&builtin, "v.txt").await.0, 404);
    let (named_base, _) = create_from(&api, "local/base").await;
    assert_eq!(read(&api, &named_base, "v.txt").await, "three");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn invalid_names_answer_400_with_e2bs_text_and_unknown_sources_404() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let source = new_sandbox(&api).await;
    for (name, message) in [
        ("Bad Name", "Invalid name: invalid template ID: Bad Name"),
        ("snap:v/1", "Invalid name: invalid tag: v/1"),
        (
            "other/snap",
            "namespace 'other' must match your team 'local'",
        ),
    ] {
        let reply = api
            .post(
                &format!("/sandboxes/{}/snapshots", source.id),
                &json!({"name": name}).to_string(),
            )
            .await;
        assert_eq!(
            (reply.status, reply.json),
            (400, json!({"code": 400, "message": message})),
            "{name}"
        );
    }
    let missing = api
        .post("/sandboxes/inosuchsandbox00000000/snapshots", "{}")
        .await;
    assert_eq!(missing.status, 404);
    // E2B snapshots only running sandboxes; a paused one is not found.
    assert_eq!(
        api.post(&format!("/sandboxes/{}/pause", source.id), "{}")
            .await
            .status,
        204
    );
    let paused = api
        .post(&format!("/sandboxes/{}/snapshots", source.id), "{}")
        .await;
    assert_eq!(paused.status, 404, "{}", paused.text);
    assert_eq!(api.get("/snapshots").await.json, json!([]));
    let unknown = api
        .post(
            "/v2/sandboxes",
            &json!({"templateID": "local/nothing:default"}).to_string(),
        )
        .await;
    assert_eq!(unknown.status, 404);
    server.shutdown().await.unwrap();
}

async fn ticks(api: &Api, sandbox: &Sandbox) -> Option<u64> {
    let (status, body) = api.download(sandbox, "/tmp/ticks").await;
    if status != 200 {
        return None;
    }
    String::from_utf8_lossy(&body).trim().parse().ok()
}

#[tokio::test]
async fn a_snapshot_does_not_kill_running_commands_and_continues_them() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let source = new_sandbox(&api).await;
    // A command that counts in a file: it is stopped for the copy, and must count on after.
    let _running = api
        .start(
            &source,
            "i=0; while :; do i=$((i+1)); echo $i > /tmp/ticks; sleep 0.05; done",
            &[],
        )
        .await;
    let before = api.rpc(&source, "process.Process/List", json!({})).await;
    let pid = before.listed_pids()[0];
    snapshot(&api, &source.id, json!({})).await;
    let listed = api.rpc(&source, "process.Process/List", json!({})).await;
    assert_eq!(listed.listed_pids(), [pid], "the command was not killed");
    // Polls for progress (state that settles), bounded; a command left stopped never counts on.
    let first = ticks(&api, &source).await;
    let counted_on = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let now = ticks(&api, &source).await;
            if now.is_some() && now > first {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        counted_on.is_ok(),
        "the command did not run on after the snapshot"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn snapshots_list_newest_first_by_sandbox_and_name_in_pages() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let a = new_sandbox(&api).await;
    let b = new_sandbox(&api).await;
    let a1 = snapshot(&api, &a.id, json!({})).await;
    let a2 = snapshot(&api, &a.id, json!({"name": "alpha"})).await;
    let b1 = snapshot(&api, &b.id, json!({"name": "beta"})).await;
    let a3 = snapshot(&api, &a.id, json!({"name": "alpha:v1"})).await;
    let id = |v: &Value| v["snapshotID"].as_str().unwrap().to_owned();

    let all = api.get("/snapshots").await;
    assert_eq!(all.status, 200);
    assert_eq!(ids(&all.json), [id(&a3), id(&b1), id(&a2), id(&a1)]);
    assert!(all.headers.get("x-next-token").is_none());

    // Pages of two, following X-Next-Token.
    let mut seen = Vec::new();
    let mut path = "/snapshots?limit=2".to_owned();
    loop {
        let page = api.get(&path).await;
        assert!(page.json.as_array().unwrap().len() <= 2);
        seen.extend(ids(&page.json));
        match page.headers.get("x-next-token") {
            Some(token) => {
                path = format!("/snapshots?limit=2&nextToken={}", token.to_str().unwrap());
            }
            None => break,
        }
    }
    assert_eq!(seen, ids(&all.json));

    let by_a = api.get(&format!("/snapshots?sandboxID={}", a.id)).await;
    assert_eq!(ids(&by_a.json), [id(&a3), id(&a2), id(&a1)]);
    let by_name = api.get("/snapshots?name=alpha").await;
    assert_eq!(ids(&by_name.json), [id(&a3), id(&a2)]);
    let by_tag = api.get("/snapshots?name=local%2Falpha%3Av1").await;
    assert_eq!(ids(&by_tag.json), [id(&a3)]);
    let by_both = api
        .get(&format!("/snapshots?name=beta&sandboxID={}", a.id))
        .await;
    assert_eq!(by_both.json, json!([]));
    assert_eq!(
        api.get("/snapshots?name=nothing-here").await.json,
        json!([])
    );
    assert_eq!(api.get("/snapshots?limit=0").await.status, 400);
    assert_eq!(api.get("/snapshots?nextToken=bm9wZQ").await.status, 400);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn delete_takes_every_form_the_sdk_sends_and_then_answers_404() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let source = new_sandbox(&api).await;
    let unnamed = snapshot(&api, &source.id, json!({})).await;
    let named = snapshot(&api, &source.id, json!({"name": "gone-soon"})).await;
    snapshot(&api, &source.id, json!({"name": "gone-soon:v1"})).await;
    for reference in [
        unnamed["snapshotID"].as_str().unwrap(),
        named["snapshotID"].as_str().unwrap(),
    ] {
        let path = format!("/templates/{}", encode(reference));
        assert_eq!(api.delete(&path).await.status, 204, "{reference}");
        let again = api.delete(&path).await;
        assert_eq!(again.status, 404, "{reference}: {}", again.text);
    }
    // Deleting one tag kept the other; deleting by bare name takes the whole template.
    assert_eq!(
        ids(&api.get("/snapshots").await.json),
        ["local/gone-soon:v1"]
    );
    let reply = api
        .post(
            "/v2/sandboxes",
            &json!({"templateID": named["snapshotID"]}).to_string(),
        )
        .await;
    assert_eq!(reply.status, 404, "a deleted snapshot creates nothing");
    assert_eq!(api.delete("/templates/gone-soon").await.status, 204);
    assert_eq!(api.get("/snapshots").await.json, json!([]));
    let files = server.state_dir().join("snapshots");
    let left: Vec<_> = std::fs::read_dir(&files)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|name| name != ".staging")
        .collect();
    assert!(
        left.is_empty(),
        "deleted snapshots leave no files: {left:?}"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn snapshots_outlive_their_sandbox_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::loopback();
    config.state_dir = Some(dir.path().to_path_buf());
    config.clock = Clock::manual(t0());
    let server = Server::start(config.clone()).await.unwrap();
    let api = Api::new(&server);
    let source = new_sandbox(&api).await;
    write(&api, &source, "kept.txt", "still here").await;
    let info = snapshot(&api, &source.id, json!({"name": "keeper"})).await;
    assert_eq!(
        api.delete(&format!("/sandboxes/{}", source.id))
            .await
            .status,
        204
    );
    server.shutdown().await.unwrap();

    let server = Server::start(config).await.unwrap();
    let api = Api::new(&server);
    assert_eq!(
        ids(&api.get("/snapshots").await.json),
        [info["snapshotID"].as_str().unwrap()]
    );
    let (copy, _) = create_from(&api, "keeper").await;
    assert_eq!(read(&api, &copy, "kept.txt").await, "still here");
    // A snapshot after the restart is listed after (newer than) the old one.
    let newer = snapshot(&api, &copy.id, json!({})).await;
    assert_eq!(
        ids(&api.get("/snapshots").await.json)[0],
        newer["snapshotID"].as_str().unwrap()
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn fork_gives_count_independent_sandboxes_with_the_sources_files_metadata_and_env() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let (id, token) = api
        .create(
            json!({"templateID": "base", "timeout": 300, "metadata": {"scope": "s1"},
            "envVars": {"FROM_SOURCE": "yes"}, "autoPause": true}),
        )
        .await;
    let source = Sandbox { id, token };
    write(&api, &source, "state.txt", "before fork").await;
    let before = api.get(&format!("/sandboxes/{}", source.id)).await.json;

    let reply = api
        .post(
            &format!("/sandboxes/{}/fork", source.id),
            r#"{"timeout": 60, "count": 3}"#,
        )
        .await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    let entries = reply.json.as_array().unwrap().clone();
    assert_eq!(entries.len(), 3);
    let mut forks = Vec::new();
    for entry in &entries {
        let sandbox = &entry["sandbox"];
        assert!(entry.get("error").is_none(), "{entry}");
        forks.push(Sandbox {
            id: sandbox["sandboxID"].as_str().unwrap().to_owned(),
            token: sandbox["envdAccessToken"].as_str().map(str::to_owned),
        });
    }
    let mut distinct: Vec<&str> = forks.iter().map(|f| f.id.as_str()).collect();
    distinct.push(&source.id);
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "new ids, none the source's");
    let after = api.get(&format!("/sandboxes/{}", source.id)).await.json;
    assert_eq!(
        (&after["state"], &after["endAt"]),
        (&before["state"], &before["endAt"])
    );
    for fork in &forks {
        let detail = api.get(&format!("/sandboxes/{}", fork.id)).await.json;
        assert_eq!(detail["metadata"], json!({"scope": "s1"}));
        assert_eq!(detail["templateID"], "base");
        assert_eq!(detail["lifecycle"]["onTimeout"], "pause");
        assert_eq!(read(&api, fork, "state.txt").await, "before fork");
        let env = api.run(fork, "echo -n $FROM_SOURCE").await;
        assert_eq!(env.stdout, b"yes");
    }
    write(&api, &forks[0], "state.txt", "fork 0").await;
    assert_eq!(read(&api, &forks[1], "state.txt").await, "before fork");
    assert_eq!(read(&api, &source, "state.txt").await, "before fork");
    // No listed snapshot is left behind by a fork.
    assert_eq!(api.get("/snapshots").await.json, json!([]));

    for (body, status) in [
        (r#"{"count": 0}"#, 400),
        (r#"{"count": 101}"#, 400),
        (r#"{"timeout": -1}"#, 400),
    ] {
        let reply = api
            .post(&format!("/sandboxes/{}/fork", source.id), body)
            .await;
        assert_eq!(reply.status, status, "{body}: {}", reply.text);
    }
    let default = api
        .post(&format!("/sandboxes/{}/fork", source.id), "")
        .await;
    assert_eq!(
        default.json.as_array().map(Vec::len),
        Some(1),
        "count defaults to 1"
    );
    let missing = api
        .post("/sandboxes/inosuchsandbox00000000/fork", "{}")
        .await;
    assert_eq!(missing.status, 404);
    api.post(&format!("/sandboxes/{}/pause", source.id), "{}")
        .await;
    let paused = api
        .post(&format!("/sandboxes/{}/fork", source.id), "{}")
        .await;
    assert_eq!(
        (paused.status, paused.json["message"].as_str().unwrap()),
        (
            409,
            format!(
                "Sandbox '{}' is paused and cannot be forked; resume it first",
                source.id
            )
            .as_str()
        )
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn fault_knobs_fail_single_forks_vanish_the_source_and_fail_the_snapshot_route() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let source = new_sandbox(&api).await;
    write(&api, &source, "f.txt", "x").await;
    let counts_before = server.requests();

    server.faults().fail_fork_starts(1, 503);
    let reply = api
        .post(&format!("/sandboxes/{}/fork", source.id), r#"{"count": 3}"#)
        .await;
    assert_eq!(reply.status, 201);
    let entries = reply.json.as_array().unwrap();
    assert_eq!(
        entries[0],
        json!({"error": {"code": 503, "message": "injected fault"}})
    );
    assert!(entries[1]["sandbox"]["sandboxID"].is_string());
    assert!(entries[2]["sandbox"]["sandboxID"].is_string());

    server.faults().vanish_next_fork_sources(1);
    let reply = api
        .post(&format!("/sandboxes/{}/fork", source.id), r#"{"count": 2}"#)
        .await;
    assert_eq!(reply.status, 201);
    for entry in reply.json.as_array().unwrap() {
        let fork = Sandbox {
            id: entry["sandbox"]["sandboxID"].as_str().unwrap().to_owned(),
            token: entry["sandbox"]["envdAccessToken"]
                .as_str()
                .map(str::to_owned),
        };
        assert_eq!(read(&api, &fork, "f.txt").await, "x");
    }
    assert_eq!(
        api.get(&format!("/sandboxes/{}", source.id)).await.status,
        404
    );
    let gone = api
        .post(&format!("/sandboxes/{}/fork", source.id), "{}")
        .await;
    assert_eq!(gone.status, 404);

    let other = new_sandbox(&api).await;
    let mut rule = FailRule::new(1, 500);
    rule.scope = FaultScope::Rest;
    rule.path_prefix = Some(format!("/sandboxes/{}/snapshots", other.id));
    server.faults().fail_next(rule);
    let failed = api
        .post(&format!("/sandboxes/{}/snapshots", other.id), "{}")
        .await;
    assert_eq!(failed.status, 500);
    assert_eq!(
        api.get("/snapshots").await.json,
        json!([]),
        "nothing was taken"
    );
    let info = snapshot(&api, &other.id, json!({})).await;
    assert_eq!(
        api.delete(&format!(
            "/templates/{}",
            encode(info["snapshotID"].as_str().unwrap())
        ))
        .await
        .status,
        204
    );

    let counts = server.requests().since(&counts_before);
    assert_eq!(
        (
            counts.get("fork"),
            counts.get("snapshot"),
            counts.get("list snapshots"),
            counts.get("delete template")
        ),
        (3, 2, 1, 1)
    );
    server.shutdown().await.unwrap();
}
