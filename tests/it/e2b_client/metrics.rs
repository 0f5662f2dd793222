//! Sandbox metrics from e2b-local, measured on the sandbox's own files.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_report_the_sandboxs_own_use() {
    let server = server().await;
    let client = client(&server);
    let (info, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    sh(&sandbox, "head -c 2097152 /dev/urandom > ~/blob").await;
    let metrics = client
        .metrics(&info.sandbox_id, None, None)
        .await
        .expect("metrics");
    assert_eq!(metrics.len(), 1);
    assert_eq!(metrics[0].cpu_count, 2);
    assert!(metrics[0].disk_used >= 2 * 1024 * 1024, "{metrics:?}");
    assert_eq!(metrics[0].mem_total, 512 * 1024 * 1024);
    client.kill(&info.sandbox_id).await.expect("killed");
    let error = client
        .metrics(&info.sandbox_id, None, None)
        .await
        .expect_err("gone");
    assert!(error.is_sandbox_gone(), "{error:?}");
    server.shutdown().await.expect("shutdown");
}
