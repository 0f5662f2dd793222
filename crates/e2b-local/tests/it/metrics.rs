//! `GET /sandboxes/{id}/metrics` and `GET /sandboxes/metrics`: E2B's `SandboxMetric`,
//! measured on the sandbox's own processes and files.

use serde_json::json;

use crate::support::{Api, manual_server, new_sandbox, t0};

#[tokio::test]
async fn metrics_measure_the_sandboxs_processes_and_files() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let other = new_sandbox(&api).await;

    // Nothing runs yet and the home is nearly empty.
    let idle = api.get(&format!("/sandboxes/{}/metrics", sandbox.id)).await;
    assert_eq!(idle.status, 200, "{}", idle.text);
    let idle = &idle.json[0];
    let now = t0()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(idle["timestampUnix"], now);
    assert_eq!(idle["cpuCount"], 2);
    assert_eq!(idle["cpuUsedPct"], 0.0);
    assert_eq!(idle["memUsed"], 0);
    assert_eq!(idle["memTotal"], 512 * 1024 * 1024);
    assert_eq!(idle["diskTotal"], 1024 * 1024 * 1024);
    assert!(idle["diskUsed"].as_u64().unwrap() < 1024 * 1024, "{idle}");

    // A busy loop and 8 MiB written: the sandbox's own use shows, the other's stays idle.
    let written = api
        .run(&sandbox, "head -c 8388608 /dev/urandom > ~/blob")
        .await;
    assert_eq!(written.end["exited"], true);
    let mut busy = api.start(&sandbox, "while :; do :; done", &[]).await;
    busy.next().await.unwrap();
    let loaded = api.get(&format!("/sandboxes/{}/metrics", sandbox.id)).await;
    let loaded = &loaded.json[0];
    assert!(loaded["cpuUsedPct"].as_f64().unwrap() > 5.0, "{loaded}");
    assert!(loaded["memUsed"].as_u64().unwrap() > 0, "{loaded}");
    assert!(
        loaded["diskUsed"].as_u64().unwrap() >= 8 * 1024 * 1024,
        "{loaded}"
    );
    let quiet = api.get(&format!("/sandboxes/{}/metrics", other.id)).await;
    assert_eq!(quiet.json[0]["cpuUsedPct"], 0.0, "{}", quiet.text);

    // Several at once: only running sandboxes, keyed by id.
    let many = api
        .get(&format!(
            "/sandboxes/metrics?sandbox_ids={},{},iunknown00000000000000",
            sandbox.id, other.id
        ))
        .await;
    assert_eq!(many.status, 200, "{}", many.text);
    let keys: Vec<&String> = many.json["sandboxes"].as_object().unwrap().keys().collect();
    let mut expected = vec![&sandbox.id, &other.id];
    expected.sort();
    assert_eq!(keys, expected);
    assert_eq!(api.get("/sandboxes/metrics").await.status, 400);

    // A window that excludes now, a paused sandbox, an unknown one.
    let past = api
        .get(&format!(
            "/sandboxes/{}/metrics?end={}",
            sandbox.id,
            now - 10
        ))
        .await;
    assert_eq!((past.status, past.json), (200, json!([])));
    let bad = api
        .get(&format!("/sandboxes/{}/metrics?start=soon", sandbox.id))
        .await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        api.post(&format!("/sandboxes/{}/pause", other.id), "{}")
            .await
            .status,
        204
    );
    let paused = api.get(&format!("/sandboxes/{}/metrics", other.id)).await;
    assert_eq!((paused.status, paused.json), (200, json!([])));
    let unknown = api.get("/sandboxes/iunknown00000000000000/metrics").await;
    assert_eq!(unknown.status, 404);
    drop(busy);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn envd_metrics_answer_envds_shape_for_the_sandbox() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let written = api
        .run(&sandbox, "head -c 4194304 /dev/urandom > ~/blob")
        .await;
    assert_eq!(written.end["exited"], true);
    let response = api
        .envd(&sandbox, reqwest::Method::GET, "/metrics")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let metrics: serde_json::Value =
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    let now = t0()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(metrics["ts"], now, "{metrics}");
    assert_eq!(metrics["cpu_count"], 2);
    assert_eq!(metrics["cpu_used_pct"], 0.0);
    assert_eq!(metrics["mem_total"], 512 * 1024 * 1024);
    assert_eq!(metrics["mem_total_mib"], 512);
    assert_eq!(metrics["mem_used_mib"], 0);
    assert_eq!(metrics["mem_cache"], 0);
    assert_eq!(metrics["disk_total"], 1024 * 1024 * 1024);
    assert!(
        metrics["disk_used"].as_u64().unwrap() >= 4 * 1024 * 1024,
        "{metrics}"
    );
    let posted = api
        .envd(&sandbox, reqwest::Method::POST, "/metrics")
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 405);
    server.shutdown().await.unwrap();
}
