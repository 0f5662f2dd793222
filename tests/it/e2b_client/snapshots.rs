//! Snapshots and forks: e2b-client's calls against e2b-local's routes, end to end.

use agent_sandbox_examples::e2b_client::{DeleteOutcome, ForkOptions, Operation, SnapshotQuery};

use super::*;

async fn read(sandbox: &Sandbox, path: &str) -> String {
    let bytes = sandbox.read_file(path, 1 << 20).await.expect("read");
    String::from_utf8(bytes.to_vec()).expect("utf-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_list_create_from_and_delete_round_trip() {
    let server = server().await;
    let client = client(&server);
    let (info, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let id = info.sandbox_id.clone();
    sandbox
        .write_file("/home/user/ws/a.txt", Bytes::from_static(b"checkpointed"))
        .await
        .expect("write");

    let unnamed = client.create_snapshot(&id, None).await.expect("snapshot");
    assert!(unnamed.snapshot_id.ends_with(":default") && unnamed.names.is_empty());
    let named = client
        .create_snapshot(&id, Some("before-change"))
        .await
        .expect("named snapshot");
    assert_eq!(named.snapshot_id, "local/before-change:default");
    assert_eq!(named.names, ["local/before-change:default"]);

    // Paged one at a time, newest first, by sandbox and by name.
    let mut query = SnapshotQuery::all();
    query.sandbox_id = Some(id.clone());
    query.limit = Some(1);
    let listed: Vec<_> = client
        .list_snapshots(query)
        .try_collect()
        .await
        .expect("list");
    assert_eq!(listed, [named.clone(), unnamed.clone()]);
    let mut by_name = SnapshotQuery::all();
    by_name.name = Some("before-change".to_owned());
    let found: Vec<_> = client
        .list_snapshots(by_name)
        .try_collect()
        .await
        .expect("list by name");
    assert_eq!(found, std::slice::from_ref(&named));

    // A sandbox from the snapshot has its files; changing it leaves the source alone.
    let restored = client
        .create(CreateOptions::new(named.snapshot_id.clone()))
        .await
        .expect("create from snapshot");
    assert_eq!(restored.alias.as_deref(), Some("before-change"));
    let restored_sandbox = client.sandbox(restored.envd_access()).expect("envd");
    assert_eq!(
        read(&restored_sandbox, "/home/user/ws/a.txt").await,
        "checkpointed"
    );
    restored_sandbox
        .write_file("/home/user/ws/a.txt", Bytes::from_static(b"changed"))
        .await
        .expect("write");
    assert_eq!(read(&sandbox, "/home/user/ws/a.txt").await, "checkpointed");

    for snapshot in [&named, &unnamed] {
        assert_eq!(
            client
                .delete_snapshot(&snapshot.snapshot_id)
                .await
                .expect("delete"),
            DeleteOutcome::Deleted
        );
        assert_eq!(
            client
                .delete_snapshot(&snapshot.snapshot_id)
                .await
                .expect("again"),
            DeleteOutcome::NotFound
        );
    }
    let error = client
        .create(CreateOptions::new(named.snapshot_id.clone()))
        .await
        .expect_err("deleted");
    assert!(error.is_template_missing(), "{error:?}");
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_results_are_independent_and_faults_surface_typed() {
    let server = server().await;
    let client = client(&server);
    let (info, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let id = info.sandbox_id.clone();
    sandbox
        .write_file("/home/user/state.txt", Bytes::from_static(b"before fork"))
        .await
        .expect("write");

    server.faults().fail_fork_starts(1, 429);
    let results = client
        .fork(
            &id,
            ForkOptions {
                count: 2,
                timeout: Duration::from_secs(120),
            },
        )
        .await
        .expect("fork");
    assert_eq!(results.len(), 2);
    let refused = results[0].as_ref().expect_err("the injected failure");
    assert!(refused.is_rate_limited(), "{refused:?}");
    assert_eq!(refused.operation(), Some(Operation::StartFork));
    assert_eq!(refused.sandbox_id(), Some(&id));
    let fork = results[1].as_ref().expect("the other fork started");
    assert_ne!(fork.sandbox_id, id);
    let fork_sandbox = client.sandbox(fork.envd_access()).expect("envd");
    assert_eq!(
        read(&fork_sandbox, "/home/user/state.txt").await,
        "before fork"
    );

    // A 5xx on the snapshot route is not retried: the snapshot might have been taken.
    let before = server.requests();
    server.faults().fail_next(FailRule {
        count: 1,
        status: 503,
        scope: FaultScope::Rest,
        path_prefix: Some(format!("/sandboxes/{id}/snapshots")),
        retry_after_secs: None,
        should_retry: None,
        message: None,
    });
    let error = client.create_snapshot(&id, None).await.expect_err("503");
    assert!(error.is_transient() && error.operation() == Some(Operation::CreateSnapshot));
    assert_eq!(server.requests().since(&before).get("snapshot"), 1);

    // The source vanishing: a fork of it is "sandbox gone", naming it.
    server.faults().vanish_sandbox(id.as_str()).expect("vanish");
    let gone = client
        .fork(
            &id,
            ForkOptions {
                count: 1,
                timeout: Duration::from_secs(60),
            },
        )
        .await
        .expect_err("gone");
    assert!(
        gone.is_sandbox_gone() && gone.sandbox_id() == Some(&id),
        "{gone:?}"
    );
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_exists_answers_for_public_templates_and_named_snapshots() {
    let server = server().await;
    let client = client(&server);
    let (info, _) = create(&client, OnTimeout::Kill, 600).await;
    assert!(client.template_exists("base").await.expect("asked"));
    assert!(
        client
            .template_exists("code-interpreter-v1")
            .await
            .expect("asked")
    );
    assert!(!client.template_exists("no such/name").await.expect("asked"));
    assert!(!client.template_exists("kept-state").await.expect("asked"));
    client
        .create_snapshot(&info.sandbox_id, Some("kept-state"))
        .await
        .expect("snapshot");
    assert!(client.template_exists("kept-state").await.expect("asked"));
    let error = client.template_exists("").await.expect_err("empty");
    assert!(error.is_invalid_request(), "{error}");
}
