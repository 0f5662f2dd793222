//! Directory watches: a stream and a polled watcher report real events from e2b-local.

use agent_sandbox_examples::e2b_client::{FsEvent, FsEventKind, WatchDepth, WatchOptions};

use super::*;

fn event(name: &str, kind: FsEventKind) -> (String, FsEventKind) {
    (name.to_owned(), kind)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_stream_and_poll_real_events() {
    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    sh(&sandbox, "mkdir -p ~/w/sub").await;

    let mut stream = sandbox
        .watch_dir("/home/user/w", WatchOptions::new(WatchDepth::Recursive))
        .await
        .expect("watching");
    sh(&sandbox, "cd ~/w && echo a > sub/f && mv sub/f g && rm g").await;
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let FsEvent { name, kind, .. } = stream.next().await.expect("open").expect("event");
        seen.push((name, kind));
    }
    assert_eq!(
        seen,
        [
            event("sub/f", FsEventKind::Create),
            event("sub/f", FsEventKind::Write),
            event("sub/f", FsEventKind::Rename),
            event("g", FsEventKind::Create),
            event("g", FsEventKind::Remove),
        ]
    );
    drop(stream);

    let watcher = sandbox
        .create_watcher("/home/user/w", WatchDepth::Direct)
        .await
        .expect("watcher");
    sh(&sandbox, "chmod 700 ~/w/sub").await;
    let mut polled = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while polled.is_empty() && tokio::time::Instant::now() < deadline {
        polled.extend(sandbox.watcher_events(&watcher).await.expect("events"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        polled
            .into_iter()
            .map(|e| (e.name, e.kind))
            .collect::<Vec<_>>(),
        [event("sub", FsEventKind::Chmod)]
    );
    sandbox.remove_watcher(&watcher).await.expect("removed");
    let error = sandbox.watcher_events(&watcher).await.expect_err("removed");
    assert!(error.is_not_found(), "{error:?}");
    let error = sandbox
        .watch_dir("/home/user/missing", WatchOptions::new(WatchDepth::Direct))
        .await
        .expect_err("missing");
    assert!(error.is_not_found(), "{error:?}");
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_with_entries_carries_each_events_entry_where_there_is_one() {
    use agent_sandbox_examples::e2b_client::{EventEntries, FileType};

    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    sh(&sandbox, "mkdir -p ~/e").await;
    let mut options = WatchOptions::new(WatchDepth::Direct);
    options.entries = EventEntries::Included;
    let mut stream = sandbox
        .watch_dir("/home/user/e", options)
        .await
        .expect("watching");
    // The entry is the file as it is when the event is sent, so the file is
    // removed only after its creation has been seen: removed in the same
    // command, it may be gone before the create event is sent.
    sh(&sandbox, "cd ~/e && printf 12345 > f").await;
    let created = stream.next().await.expect("open").expect("event");
    assert_eq!(created.kind, FsEventKind::Create);
    let entry = created.entry.as_ref().expect("the created file's entry");
    assert_eq!(
        (entry.name.as_str(), entry.path.as_str(), &entry.kind),
        ("f", "/home/user/e/f", &FileType::File)
    );
    sh(&sandbox, "rm ~/e/f").await;
    let removed = loop {
        let event = stream.next().await.expect("open").expect("event");
        if event.kind != FsEventKind::Write {
            break event;
        }
    };
    assert_eq!(removed.kind, FsEventKind::Remove);
    assert!(removed.entry.is_none(), "{removed:?}");
}
