//! Volumes through e2b-client against e2b-local (contract L21): the control plane, the
//! content API with the volume's token, and a volume mounted into sandboxes at create.

use agent_sandbox_examples::e2b_client::{
    DeleteOutcome, ForkOptions, VolumeCreate, VolumeEntryOptions, VolumeEntryType, VolumeMetadata,
};

use super::*;

fn volume_client(server: &Server) -> Client {
    let mut config = config_for(server, "e2b_integration_key_0123456789");
    config.volume_api_url = Some(server.url());
    Client::new(config).expect("valid config")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_is_made_found_written_read_and_deleted() {
    let server = server().await;
    let client = volume_client(&server);

    let volume = client.create_volume("work").await.expect("created");
    assert_eq!(volume.name(), "work");
    let err = client.create_volume("work").await.expect_err("taken");
    assert!(err.is_invalid_request(), "{err}");
    let err = client.create_volume("bad name").await.expect_err("refused");
    assert!(
        matches!(err, Error::InvalidInput { .. }),
        "refused before sending: {err}"
    );
    let listed = client.list_volumes().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].volume_id, volume.volume_id());

    let force = VolumeEntryOptions::new(VolumeCreate::Force);
    let strict = VolumeEntryOptions::new(VolumeCreate::Strict);
    let dir = volume.make_dir("/a/b", &force).await.expect("mkdir -p");
    assert_eq!(
        (dir.name.as_str(), dir.kind),
        ("b", VolumeEntryType::Directory)
    );
    let err = volume
        .make_dir("/x/y", &strict)
        .await
        .expect_err("no parent");
    assert!(err.is_not_found(), "{err}");
    let err = volume.make_dir("/a", &strict).await.expect_err("exists");
    assert!(err.is_conflict(), "{err}");

    let payload = Bytes::from((0..200_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
    let written = volume
        .write("/a/b/data.bin", payload.clone(), &strict)
        .await
        .expect("written");
    assert_eq!(written.size, payload.len() as u64);
    assert_eq!(written.mode, 0o666);
    let err = volume
        .write("/a/b/data.bin", Bytes::from_static(b"other"), &strict)
        .await
        .expect_err("kept");
    assert!(err.is_conflict(), "{err}");
    assert_eq!(
        volume.read("/a/b/data.bin", 1 << 20).await.expect("read"),
        payload
    );
    let err = volume.read("/a/b/data.bin", 10).await.expect_err("capped");
    assert!(err.is_limit_exceeded(), "{err}");
    let chunks = futures::stream::iter(vec![
        Ok(Bytes::from_static(b"streamed ")),
        Ok(Bytes::from_static(b"in chunks")),
    ]);
    volume
        .write_stream("/deep/new/s.txt", chunks, &force)
        .await
        .expect("streamed");
    assert_eq!(
        volume.read("/deep/new/s.txt", 100).await.expect("read"),
        "streamed in chunks"
    );

    let entries = volume.list("/", Some(3)).await.expect("list");
    let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/a",
            "/a/b",
            "/a/b/data.bin",
            "/deep",
            "/deep/new",
            "/deep/new/s.txt"
        ]
    );
    let shallow = volume.list("/", None).await.expect("list");
    assert_eq!(shallow.len(), 2);

    let changed = volume
        .update_metadata(
            "/a/b/data.bin",
            &VolumeMetadata {
                uid: None,
                gid: None,
                mode: Some(0o600),
            },
        )
        .await
        .expect("chmod");
    assert_eq!(changed.mode, 0o600);

    // `..` stops at the volume's root.
    assert!(!volume.exists("/../../etc/passwd").await.expect("exists"));
    assert!(volume.exists("/a/b/data.bin").await.expect("exists"));
    let err = volume.remove("/").await.expect_err("root");
    assert!(err.is_invalid_request(), "{err}");
    volume.remove("/a").await.expect("removed");
    assert!(!volume.exists("/a/b/data.bin").await.expect("exists"));
    let err = volume.remove("/a").await.expect_err("gone");
    assert!(err.is_not_found(), "{err}");

    // connect finds it by id with the same token.
    let again = client
        .connect_volume(volume.volume_id())
        .await
        .expect("connect");
    assert_eq!(again.token().expose(), volume.token().expose());
    assert_eq!(
        client
            .delete_volume(volume.volume_id())
            .await
            .expect("delete"),
        DeleteOutcome::Deleted
    );
    assert_eq!(
        client
            .delete_volume(volume.volume_id())
            .await
            .expect("delete"),
        DeleteOutcome::NotFound
    );
    let err = again.stat("/").await.expect_err("deleted");
    assert!(err.is_not_found(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_token_never_appears_in_an_error_or_debug_output() {
    let server = server().await;
    let client = volume_client(&server);
    let volume = client.create_volume("quiet").await.expect("created");
    let token = volume.token().expose().to_owned();
    assert!(!format!("{volume:?}").contains(&token));
    let err = volume.read("/missing", 10).await.expect_err("missing");
    assert!(!err.to_string().contains(&token), "{err}");
    assert!(!format!("{err:?}").contains(&token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_share_a_mounted_volume_and_it_outlives_them() {
    let server = server().await;
    let client = volume_client(&server);
    let volume = client.create_volume("shared").await.expect("created");
    volume
        .write(
            "/seed.txt",
            Bytes::from_static(b"seeded"),
            &VolumeEntryOptions::new(VolumeCreate::Strict),
        )
        .await
        .expect("seed");

    let mut options = CreateOptions::new("base".to_owned());
    options.timeout = Some(Duration::from_secs(120));
    options.volume_mounts = vec![volume.mount_at("/home/user/shared")];
    let info = client.create(options.clone()).await.expect("created");
    let detail = client.get(&info.sandbox_id).await.expect("get");
    assert_eq!(
        detail.volume_mounts,
        vec![volume.mount_at("/home/user/shared")]
    );
    let first = client.sandbox(info.envd_access()).expect("envd");
    assert_eq!(sh(&first, "cat ~/shared/seed.txt").await, "seeded");
    sh(&first, "echo from-first > ~/shared/out.txt").await;
    assert_eq!(
        client.kill(&info.sandbox_id).await.expect("kill"),
        KillOutcome::Killed
    );
    assert_eq!(
        volume.read("/out.txt", 100).await.expect("outlives"),
        "from-first\n"
    );

    let (second_info, second) = {
        let info = client.create(options).await.expect("second");
        let sandbox = client.sandbox(info.envd_access()).expect("envd");
        (info, sandbox)
    };
    assert_eq!(sh(&second, "cat ~/shared/out.txt").await, "from-first\n");
    // A fork mounts what its source mounts: the same files, not a copy.
    let forks = client
        .fork(
            &second_info.sandbox_id,
            ForkOptions {
                count: 1,
                timeout: Duration::from_secs(120),
            },
        )
        .await
        .expect("fork");
    let fork_info = forks[0].as_ref().expect("the fork started");
    let fork = client.sandbox(fork_info.envd_access()).expect("envd");
    sh(&fork, "echo from-fork > ~/shared/fork.txt").await;
    assert_eq!(sh(&second, "cat ~/shared/fork.txt").await, "from-fork\n");
    assert_eq!(
        client
            .get(&fork_info.sandbox_id)
            .await
            .expect("get")
            .volume_mounts,
        vec![volume.mount_at("/home/user/shared")]
    );
    // The files API sees the volume at the mount too.
    let read = second
        .read_file("/home/user/shared/seed.txt", 100)
        .await
        .expect("read through envd");
    assert_eq!(read, "seeded");
}
