//! Git helpers: git run in an e2b-local sandbox, and credentials for an HTTP remote that go
//! through a private file, never a command line, an error or a leftover file.

use std::sync::{Arc, Mutex};

use agent_sandbox_examples::e2b_client::{
    BranchDeletion, CloneOptions, GitAuthor, GitConfigScope, GitCredentials, RemoteOptions,
    ResetMode, RestoreTarget, SecretValue,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_is_made_changed_committed_branched_and_inspected() {
    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let git = sandbox.git();
    let repo = "/home/user/repo";
    git.init(repo, Some("main")).await.expect("init");
    let scope = GitConfigScope::Repository(repo.to_owned());
    git.set_config(&scope, "user.name", "Repo User")
        .await
        .expect("set");
    assert_eq!(
        git.get_config(&scope, "user.name").await.expect("get"),
        Some("Repo User".to_owned())
    );
    assert_eq!(
        git.get_config(&scope, "user.nothing").await.expect("get"),
        None
    );
    git.set_config(&GitConfigScope::Global, "user.email", "global@example.com")
        .await
        .expect("global");

    sandbox
        .write_file("/home/user/repo/a file.txt", Bytes::from_static(b"one\n"))
        .await
        .expect("written");
    let status = git.status(repo).await.expect("status");
    assert_eq!(status.branch.as_deref(), Some("main"));
    assert_eq!(
        status
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.index))
            .collect::<Vec<_>>(),
        [("a file.txt", '?')]
    );
    git.add(repo, &[]).await.expect("add");
    let author = GitAuthor {
        name: "Agent".to_owned(),
        email: "agent@example.com".to_owned(),
    };
    git.commit(repo, "first", Some(&author))
        .await
        .expect("commit");
    assert!(git.status(repo).await.expect("status").is_clean());
    assert_eq!(
        sh(&sandbox, "git -C ~/repo log -1 --format='%an <%ae> %s'").await,
        "Agent <agent@example.com> first\n"
    );

    git.create_branch(repo, "feature").await.expect("branch");
    let branches = git.branches(repo).await.expect("branches");
    assert_eq!(branches.current.as_deref(), Some("feature"));
    assert_eq!(branches.local, ["feature", "main"]);
    sandbox
        .write_file("/home/user/repo/a file.txt", Bytes::from_static(b"two\n"))
        .await
        .expect("written");
    git.add(repo, &["a file.txt"]).await.expect("add");
    let staged = git.status(repo).await.expect("status");
    assert_eq!(
        (staged.files[0].index, staged.files[0].work_tree),
        ('M', '.')
    );
    git.restore(repo, &["a file.txt"], RestoreTarget::Both)
        .await
        .expect("restore");
    assert!(git.status(repo).await.expect("status").is_clean());
    sandbox
        .write_file("/home/user/repo/b.txt", Bytes::from_static(b"b\n"))
        .await
        .expect("written");
    git.add(repo, &["b.txt"]).await.expect("add");
    git.commit(repo, "second", None)
        .await
        .expect("commit by the configured user");
    git.reset(repo, ResetMode::Hard, Some("HEAD~1"))
        .await
        .expect("reset");
    assert!(
        !sandbox
            .exists("/home/user/repo/b.txt")
            .await
            .expect("asked")
    );
    git.checkout_branch(repo, "main").await.expect("checkout");
    git.delete_branch(repo, "feature", BranchDeletion::Force)
        .await
        .expect("deleted");
    assert_eq!(git.branches(repo).await.expect("branches").local, ["main"]);

    git.remote_add(repo, "origin", "https://git.example/repo.git")
        .await
        .expect("remote");
    assert_eq!(
        git.remote_url(repo, "origin").await.expect("url"),
        Some("https://git.example/repo.git".to_owned())
    );
    assert_eq!(git.remote_url(repo, "upstream").await.expect("url"), None);
    let error = git
        .checkout_branch(repo, "no-such-branch")
        .await
        .expect_err("no branch");
    assert!(error.is_command_failed(), "{error}");
    assert!(error.to_string().contains("git checkout"), "{error}");
}

/// An HTTP "git server" that asks for Basic credentials and records what it was given; it
/// answers a request carrying them only once the test adds a permit to `gate`, and tells
/// `heard` when it has one.
async fn recording_remote(
    gate: Arc<tokio::sync::Semaphore>,
    heard: Arc<tokio::sync::Notify>,
) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bound");
    let port = listener.local_addr().expect("addr").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let recorded = Arc::clone(&recorded);
            let gate = Arc::clone(&gate);
            let heard = Arc::clone(&heard);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match socket.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let auth = head
                    .lines()
                    .find_map(|line| {
                        line.strip_prefix("Authorization: ")
                            .or_else(|| line.strip_prefix("authorization: "))
                    })
                    .map(str::to_owned);
                let answer = match auth {
                    None => {
                        "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"git\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    }
                    Some(auth) => {
                        recorded.lock().expect("not poisoned").push(auth);
                        heard.notify_one();
                        if let Ok(permit) = gate.acquire().await {
                            permit.forget();
                        }
                        "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    }
                };
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    (port, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_reach_the_remote_and_nothing_else() {
    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let heard = Arc::new(tokio::sync::Notify::new());
    let (port, seen) = recording_remote(Arc::clone(&gate), Arc::clone(&heard)).await;
    let git = sandbox.git();
    let password = "pa$$ word-token-7781";
    let credentials = || GitCredentials {
        username: "agent".to_owned(),
        password: SecretValue::new(password.to_owned()),
    };
    let url = format!("http://127.0.0.1:{port}/team/repo.git");

    // Without credentials git does not prompt: the refusal says why.
    let error = git
        .clone_repo(&url, "/home/user/plain", CloneOptions::new())
        .await
        .expect_err("refused");
    assert!(error.is_git_auth_failure(), "{error}");

    let mut options = CloneOptions::new();
    options.credentials = Some(credentials());
    let cloning = {
        let git = git.clone();
        let url = url.clone();
        tokio::spawn(async move { git.clone_repo(&url, "/home/user/private", options).await })
    };
    // While the remote holds the authenticated request, nothing the sandbox lists of its
    // processes (their arguments and environments) carries the password.
    heard.notified().await;
    let listed = sandbox.list_processes().await.expect("listed");
    assert!(
        listed
            .iter()
            .any(|p| p.config.args.iter().any(|a| a == "clone")),
        "{listed:?}"
    );
    let shown = format!("{listed:?}");
    assert!(!shown.contains(password), "{shown}");
    gate.add_permits(1);
    let error = cloning
        .await
        .expect("joined")
        .expect_err("the remote refuses after reading them");
    assert!(!error.to_string().contains(password), "{error}");
    let sent = seen.lock().expect("not poisoned").clone();
    let expected = format!(
        "Basic {}",
        base64_of(format!("agent:{password}").as_bytes())
    );
    assert!(sent.contains(&expected), "{sent:?}");

    // A push authenticates to the remote's own URL the same way.
    git.init("/home/user/pushed", Some("main"))
        .await
        .expect("init");
    git.remote_add("/home/user/pushed", "origin", &url)
        .await
        .expect("remote");
    sandbox
        .write_file("/home/user/pushed/x", Bytes::from_static(b"x"))
        .await
        .expect("written");
    git.add("/home/user/pushed", &[]).await.expect("add");
    let author = GitAuthor {
        name: "Agent".to_owned(),
        email: "agent@example.com".to_owned(),
    };
    git.commit("/home/user/pushed", "to push", Some(&author))
        .await
        .expect("commit");
    gate.add_permits(1);
    let mut push = RemoteOptions::new();
    push.credentials = Some(credentials());
    push.branch = Some("main".to_owned());
    let error = git
        .push("/home/user/pushed", push)
        .await
        .expect_err("the remote refuses");
    assert!(error.is_command_failed(), "{error}");
    assert!(!error.to_string().contains(password), "{error}");
    assert_eq!(
        seen.lock()
            .expect("not poisoned")
            .iter()
            .filter(|auth| **auth == expected)
            .count(),
        2
    );
    // No credential file is left, and the remote URL kept no credentials.
    assert_eq!(
        sh(&sandbox, "ls -a /tmp | grep -c e2b-git-credentials || true").await,
        "0\n"
    );
    assert_eq!(
        git.remote_url("/home/user/pushed", "origin")
            .await
            .expect("url"),
        Some(url.clone())
    );
}

fn base64_of(bytes: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(TABLE[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}
