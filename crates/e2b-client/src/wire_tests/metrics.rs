//! Sandbox metrics: the route, the window and how the answer is read.

use std::time::{Duration, SystemTime};

use super::support::*;
use crate::*;

#[tokio::test]
async fn metrics_sends_the_window_and_reads_e2b_fields() {
    let server = TestServer::start(|request, _| {
        if request.path_and_query.starts_with(&format!("/sandboxes/{SANDBOX}/metrics")) {
            json(
                200,
                &serde_json::json!([{"timestamp": "2026-01-01T00:00:00Z", "timestampUnix": 1_767_225_600,
                    "cpuCount": 2, "cpuUsedPct": 12.5, "memUsed": "1048576", "memTotal": 536_870_912,
                    "memCache": 0, "diskUsed": 4096, "diskTotal": 1_073_741_824}]),
            )
        } else {
            json(
                404,
                &serde_json::json!({"code": 404, "message": "Sandbox \"x\" doesn't exist or you don't have access to it"}),
            )
        }
    })
    .await;
    let client = client(&server.url);
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
    let end = SystemTime::UNIX_EPOCH + Duration::from_secs(200);
    let metrics = client
        .metrics(&sandbox_id(), Some(start), Some(end))
        .await
        .expect("metrics");
    assert_eq!(metrics.len(), 1);
    let metric = &metrics[0];
    assert_eq!(metric.timestamp_unix, 1_767_225_600);
    assert_eq!(metric.cpu_count, 2);
    assert!((metric.cpu_used_pct - 12.5).abs() < f64::EPSILON);
    assert_eq!(metric.mem_used, 1_048_576);
    assert_eq!(metric.disk_total, 1_073_741_824);
    let request = &server.requests()[0];
    assert_eq!(
        request.path_and_query,
        format!("/sandboxes/{SANDBOX}/metrics?start=100&end=200")
    );
    assert_eq!(request.header("x-api-key"), Some(KEY));

    let unknown = SandboxId::parse("iunknown0000000000000".to_owned()).expect("valid");
    let error = client
        .metrics(&unknown, None, None)
        .await
        .expect_err("unknown");
    assert!(error.is_sandbox_gone(), "{error:?}");
    assert!(error.to_string().contains("get sandbox metrics"), "{error}");
    assert_eq!(
        server.requests()[1].path_and_query,
        "/sandboxes/iunknown0000000000000/metrics"
    );
}
