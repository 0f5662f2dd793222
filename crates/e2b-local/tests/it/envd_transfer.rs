//! `/files` as envd serves it beyond plain bytes: gzip both ways, `user.e2b.*` metadata,
//! symlink entries, signed URLs with expiry; and `process.Process/StreamInput`.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use bytes::Bytes;
use futures::SinkExt;
use serde_json::json;
use sha2::Digest;
use tokio::io::AsyncReadExt;

use crate::support::{Api, FrameStream, Sandbox, envelope, manual_server, new_sandbox, t0};

async fn gzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    async_compression::tokio::bufread::GzipEncoder::new(data)
        .read_to_end(&mut out)
        .await
        .unwrap();
    out
}

async fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    async_compression::tokio::bufread::GzipDecoder::new(data)
        .read_to_end(&mut out)
        .await
        .unwrap();
    out
}

#[tokio::test]
async fn gzip_uploads_are_decoded_and_downloads_coded_when_accepted() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let content: Vec<u8> = (0..200_000u32)
        .flat_map(|i| (i % 251).to_le_bytes())
        .collect();

    // Octet-stream, gzip-coded: the file holds the decoded bytes.
    let up = api
        .envd(&sandbox, reqwest::Method::POST, "/files")
        .query(&[("path", "z/data.bin")])
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip")
        .body(gzip(&content).await)
        .send()
        .await
        .unwrap();
    assert_eq!(up.status().as_u16(), 200);
    let on_disk = std::fs::read(server.sandbox_home(&sandbox.id).join("z/data.bin")).unwrap();
    assert_eq!(on_disk, content);

    // Multipart, the whole body gzip-coded (Content-Encoding covers the body).
    let boundary = "b0undary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"z/m.txt\"\r\n\r\nmultipart text\r\n--{boundary}--\r\n"
    )
    .into_bytes();
    body = gzip(&body).await;
    let multi = api
        .envd(&sandbox, reqwest::Method::POST, "/files")
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .header("content-encoding", "gzip")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(multi.status().as_u16(), 200);
    assert_eq!(api.download(&sandbox, "z/m.txt").await.1, "multipart text");

    // A coding envd does not speak is refused with its words; so is a body that is not gzip.
    let br = api
        .envd(&sandbox, reqwest::Method::POST, "/files")
        .query(&[("path", "z/br.bin")])
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "br")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(br.status().as_u16(), 400);
    let text = br.text().await.unwrap();
    assert!(
        text.contains(
            "error decompressing request body: unsupported Content-Encoding: br, supported: [gzip]"
        ),
        "{text}"
    );
    let garbage = api
        .envd(&sandbox, reqwest::Method::POST, "/files")
        .query(&[("path", "z/bad.bin")])
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip")
        .body("not gzip at all")
        .send()
        .await
        .unwrap();
    assert_eq!(garbage.status().as_u16(), 400);

    // Download with Accept-Encoding: gzip → gzip-coded, no length, decodes to the file.
    let down = api
        .envd(&sandbox, reqwest::Method::GET, "/files")
        .query(&[("path", "z/data.bin")])
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(down.status().as_u16(), 200);
    assert_eq!(down.headers()["content-encoding"], "gzip");
    assert_eq!(down.headers()["vary"], "Accept-Encoding");
    assert!(down.headers().get("content-length").is_none());
    let coded = down.bytes().await.unwrap();
    assert!(coded.len() < content.len(), "the coded body is smaller");
    assert_eq!(gunzip(&coded).await, content);

    // Without the header, or with a Range, identity as before.
    let plain = api
        .envd(&sandbox, reqwest::Method::GET, "/files")
        .query(&[("path", "z/data.bin")])
        .send()
        .await
        .unwrap();
    assert!(plain.headers().get("content-encoding").is_none());
    assert_eq!(plain.bytes().await.unwrap().len(), content.len());
    let ranged = api
        .envd(&sandbox, reqwest::Method::GET, "/files")
        .query(&[("path", "z/data.bin")])
        .header("accept-encoding", "gzip")
        .header("range", "bytes=0-3")
        .send()
        .await
        .unwrap();
    assert_eq!(ranged.status().as_u16(), 206);
    assert!(ranged.headers().get("content-encoding").is_none());
    assert_eq!(&ranged.bytes().await.unwrap()[..], &content[..4]);
    // Identity refused and nothing else acceptable: 406.
    let refused = api
        .envd(&sandbox, reqwest::Method::GET, "/files")
        .query(&[("path", "z/data.bin")])
        .header("accept-encoding", "br, identity;q=0")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 406);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn upload_metadata_is_stored_as_xattrs_and_read_back_by_every_entry() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let up = api
        .envd(&sandbox, reqwest::Method::POST, "/files")
        .query(&[("path", "meta.txt")])
        .header("content-type", "application/octet-stream")
        .header("x-metadata-Owner", "alice")
        .header("x-metadata-stage", "draft 1")
        .body("m")
        .send()
        .await
        .unwrap();
    assert_eq!(up.status().as_u16(), 200);
    let written: serde_json::Value = serde_json::from_slice(&up.bytes().await.unwrap()).unwrap();
    let expected = json!({"owner": "alice", "stage": "draft 1"});
    assert_eq!(written[0]["metadata"], expected, "{written}");

    let stat = api
        .rpc(
            &sandbox,
            "filesystem.Filesystem/Stat",
            json!({"path": "meta.txt"}),
        )
        .await;
    assert_eq!(stat.json["entry"]["metadata"], expected);
    let listed = api
        .rpc(
            &sandbox,
            "filesystem.Filesystem/ListDir",
            json!({"path": "/home/user"}),
        )
        .await;
    let entry = listed.json["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "meta.txt")
        .unwrap()
        .clone();
    assert_eq!(entry["metadata"], expected);

    // Set inside the sandbox (as `setfattr` would): reported too.
    let run = api
        .run(
            &sandbox,
            "python3 -c \"import os; os.setxattr('meta.txt', 'user.e2b.from-shell', b'yes')\"",
        )
        .await;
    assert_eq!(
        run.end["exited"],
        true,
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stat = api
        .rpc(
            &sandbox,
            "filesystem.Filesystem/Stat",
            json!({"path": "meta.txt"}),
        )
        .await;
    assert_eq!(stat.json["entry"]["metadata"]["from-shell"], "yes");

    // Overwriting replaces the whole set (keys not sent are gone).
    let again = api
        .envd(&sandbox, reqwest::Method::POST, "/files")
        .query(&[("path", "meta.txt")])
        .header("content-type", "application/octet-stream")
        .header("x-metadata-stage", "final")
        .body("m2")
        .send()
        .await
        .unwrap();
    let written: serde_json::Value = serde_json::from_slice(&again.bytes().await.unwrap()).unwrap();
    assert_eq!(written[0]["metadata"], json!({"stage": "final"}));
    let plain = api.upload(&sandbox, "meta.txt", b"m3").await;
    assert!(plain.json[0].get("metadata").is_none(), "{}", plain.text);

    // Values envd refuses are refused with its words.
    let bad = api
        .envd(&sandbox, reqwest::Method::POST, "/files")
        .query(&[("path", "bad.txt")])
        .header("content-type", "application/octet-stream")
        .header("x-metadata-k", "v".repeat(5000))
        .body("b")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 400);
    assert!(
        bad.text()
            .await
            .unwrap()
            .contains("invalid metadata: total metadata size")
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn symlink_entries_report_their_resolved_target_as_envd_does() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    api.upload(&sandbox, "dir/real.txt", b"r").await;
    let home = server.sandbox_home(&sandbox.id);
    std::os::unix::fs::symlink("dir/real.txt", home.join("rel-link")).unwrap();
    std::os::unix::fs::symlink("/home/user/dir", home.join("dir-link")).unwrap();
    std::os::unix::fs::symlink("chain", home.join("chain2")).unwrap();
    std::os::unix::fs::symlink("rel-link", home.join("chain")).unwrap();
    std::os::unix::fs::symlink("nowhere", home.join("dangling")).unwrap();
    let stat = |path: &'static str| {
        let api = &api;
        let sandbox = &sandbox;
        async move {
            api.rpc(sandbox, "filesystem.Filesystem/Stat", json!({"path": path}))
                .await
                .json["entry"]
                .clone()
        }
    };
    let rel = stat("rel-link").await;
    assert_eq!(rel["symlinkTarget"], "/home/user/dir/real.txt");
    assert_eq!(rel["type"], "FILE_TYPE_FILE");
    assert_eq!(rel["mode"], 0o644);
    assert!(rel["permissions"].as_str().unwrap().starts_with('L'));
    assert_eq!(rel["path"], "/home/user/rel-link");
    let dir = stat("dir-link").await;
    assert_eq!(dir["symlinkTarget"], "/home/user/dir");
    assert_eq!(dir["type"], "FILE_TYPE_DIRECTORY");
    // A chain resolves to its end, as Go's EvalSymlinks does.
    assert_eq!(
        stat("chain2").await["symlinkTarget"],
        "/home/user/dir/real.txt"
    );
    // A dangling link names itself and has no type.
    let dangling = stat("dangling").await;
    assert_eq!(dangling["symlinkTarget"], "/home/user/dangling");
    assert!(dangling.get("type").is_none(), "{dangling}");
    server.shutdown().await.unwrap();
}

fn sign(path: &str, operation: &str, user: &str, token: &str, expiration: Option<u64>) -> String {
    let mut raw = format!("{path}:{operation}:{user}:{token}");
    if let Some(exp) = expiration {
        raw.push_str(&format!(":{exp}"));
    }
    let digest = sha2::Sha256::digest(raw.as_bytes());
    format!("v1_{}", STANDARD_NO_PAD.encode(digest))
}

#[tokio::test]
async fn signed_urls_expire_and_refuse_with_envds_words() {
    // contract: X6 (a secure sandbox's /files takes the token or a valid signature)
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let token = sandbox.token.clone().expect("v2 sandboxes have a token");
    let now = t0()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let url = |query: &[(&str, String)]| {
        let mut url = reqwest::Url::parse(&format!("{}/files", server.url())).unwrap();
        url.query_pairs_mut().extend_pairs(query);
        url
    };
    let message = |reply: reqwest::Response| async move {
        let status = reply.status().as_u16();
        let body: serde_json::Value =
            serde_json::from_slice(&reply.bytes().await.unwrap()).unwrap();
        (
            status,
            body["message"].as_str().unwrap_or_default().to_owned(),
        )
    };

    // A signed write with expiry, then a signed read of it: no header at all.
    let exp = now + 60;
    let put = reqwest::Client::new()
        .post(url(&[
            ("path", "s.txt".into()),
            ("signature", sign("s.txt", "write", "", &token, Some(exp))),
            ("signature_expiration", exp.to_string()),
        ]))
        .header("content-type", "application/octet-stream")
        .body("signed write")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status().as_u16(), 200);
    let read_url = url(&[
        ("path", "s.txt".into()),
        ("signature", sign("s.txt", "read", "", &token, Some(exp))),
        ("signature_expiration", exp.to_string()),
    ]);
    assert_eq!(
        reqwest::get(read_url.clone())
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "signed write"
    );
    // Up to its second, then expired.
    server.clock().advance(Duration::from_secs(60));
    assert_eq!(
        reqwest::get(read_url.clone())
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    server.clock().advance(Duration::from_secs(1));
    assert_eq!(
        message(reqwest::get(read_url).await.unwrap()).await,
        (401, "signature is already expired".to_owned())
    );
    // A read signature does not grant a write; a tampered one nothing.
    let read_sig = sign("s.txt", "read", "", &token, None);
    let as_write = reqwest::Client::new()
        .post(url(&[
            ("path", "s.txt".into()),
            ("signature", read_sig.clone()),
        ]))
        .header("content-type", "application/octet-stream")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(
        message(as_write).await,
        (401, "invalid signature".to_owned())
    );
    // With the sandbox header: missing and wrong signatures, a wrong header.
    let with_header = |query: Vec<(&'static str, String)>, token: Option<&str>| {
        let sandbox = Sandbox {
            id: sandbox.id.clone(),
            token: token.map(str::to_owned),
        };
        api.envd(&sandbox, reqwest::Method::GET, "/files")
            .query(&query)
    };
    assert_eq!(
        message(
            with_header(vec![("path", "s.txt".into())], None)
                .send()
                .await
                .unwrap()
        )
        .await,
        (401, "missing signature query parameter".to_owned())
    );
    assert_eq!(
        message(
            with_header(
                vec![("path", "s.txt".into()), ("signature", "v1_nope".into())],
                None
            )
            .send()
            .await
            .unwrap()
        )
        .await,
        (401, "invalid signature".to_owned())
    );
    assert_eq!(
        message(
            with_header(vec![("path", "s.txt".into())], Some("wrong"))
                .send()
                .await
                .unwrap()
        )
        .await,
        (
            401,
            "access token present in header but does not match".to_owned()
        )
    );
    let signed_with_header = with_header(
        vec![("path", "s.txt".into()), ("signature", read_sig)],
        None,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(signed_with_header.status().as_u16(), 200);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn stream_input_selects_the_process_then_feeds_its_stdin_as_frames_arrive() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let mut out = api
        .start_request(
            &sandbox,
            &json!({"process": {"cmd": "/bin/cat", "args": []}, "stdin": true, "tag": "cat"}),
            &[],
        )
        .await;
    let pid = out.next().await.unwrap().json["event"]["start"]["pid"]
        .as_u64()
        .unwrap();

    let (mut input, frames) = futures::channel::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let call = api
        .envd(
            &sandbox,
            reqwest::Method::POST,
            "/process.Process/StreamInput",
        )
        .header("content-type", "application/connect+json")
        .header("connect-protocol-version", "1")
        .body(reqwest::Body::wrap_stream(frames))
        .send();
    let call = tokio::spawn(call);
    let data = |text: &str| {
        Bytes::from(envelope(
            &json!({"data": {"input": {"stdin": STANDARD.encode(text)}}}),
        ))
    };
    input
        .send(Ok(Bytes::from(envelope(
            &json!({"start": {"process": {"pid": pid}}}),
        ))))
        .await
        .unwrap();
    input.send(Ok(data("hello\n"))).await.unwrap();
    // The bytes reach the process while the input stream is still open.
    assert_eq!(stdout_of(&mut out).await, "hello\n");
    input
        .send(Ok(Bytes::from(envelope(&json!({"keepalive": {}})))))
        .await
        .unwrap();
    input.send(Ok(data("world\n"))).await.unwrap();
    assert_eq!(stdout_of(&mut out).await, "world\n");
    drop(input);
    let reply = call.await.unwrap().unwrap();
    assert_eq!(reply.status().as_u16(), 200);
    let mut frames = FrameStream::new(reply);
    assert_eq!(frames.next().await.unwrap().json, json!({}));
    let end = frames.next().await.unwrap();
    assert_eq!((end.flags, end.json), (2, json!({})));

    // Selecting by tag works too; an unknown process ends the call with not_found.
    let unknown = api
        .envd(
            &sandbox,
            reqwest::Method::POST,
            "/process.Process/StreamInput",
        )
        .header("content-type", "application/connect+json")
        .body(envelope(&json!({"start": {"process": {"pid": 999_999}}})))
        .send()
        .await
        .unwrap();
    let mut frames = FrameStream::new(unknown);
    let end = frames.next().await.unwrap();
    assert_eq!(end.flags, 2);
    assert_eq!(end.json["error"]["code"], "not_found");
    // Data before any start event has no process to go to.
    let early = api
        .envd(
            &sandbox,
            reqwest::Method::POST,
            "/process.Process/StreamInput",
        )
        .header("content-type", "application/connect+json")
        .body(data("x").to_vec())
        .send()
        .await
        .unwrap();
    let end = FrameStream::new(early).next().await.unwrap();
    assert_eq!(end.json["error"]["code"], "invalid_argument");
    // A unary content type is not this RPC's.
    let unary = api
        .rpc(&sandbox, "process.Process/StreamInput", json!({}))
        .await;
    assert_eq!(unary.status, 415);
    let closed = api
        .rpc(
            &sandbox,
            "process.Process/CloseStdin",
            json!({"process": {"tag": "cat"}}),
        )
        .await;
    assert_eq!(closed.status, 200);
    let end = loop {
        let frame = out.next().await.expect("the end event comes");
        if let Some(end) = frame.json["event"].get("end") {
            break end.clone();
        }
    };
    assert_eq!(end["exited"], true, "cat ends at the end of its input");
    server.shutdown().await.unwrap();
}

/// The next stdout chunk of a running process's stream; a bound, not a wait: input held
/// back until the input stream ends would never arrive here, and fails the test.
async fn stdout_of(stream: &mut FrameStream) -> String {
    let next = async {
        loop {
            let frame = stream.next().await.expect("the process is still running");
            if let Some(data) = frame.json["event"]["data"]["stdout"].as_str() {
                return String::from_utf8(STANDARD.decode(data).unwrap()).unwrap();
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), next)
        .await
        .expect("input reaches the process while the input stream is open")
}

#[tokio::test]
async fn compose_concatenates_in_order_removes_the_sources_and_refuses_as_envd() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    for (name, data) in [("a.part", "alpha\n"), ("b.part", "beta\n")] {
        assert_eq!(
            api.upload(&sandbox, name, data.as_bytes()).await.status,
            200
        );
    }
    assert_eq!(api.upload(&sandbox, "joined.txt", b"old").await.status, 200);
    let compose = |body: serde_json::Value| {
        api.envd(&sandbox, reqwest::Method::POST, "/files/compose")
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let done = compose(json!({
        "source_paths": ["b.part", "/home/user/a.part"],
        "destination": "out/joined.txt",
    }))
    .await
    .unwrap();
    assert_eq!(done.status().as_u16(), 200);
    let entry: serde_json::Value = serde_json::from_slice(&done.bytes().await.unwrap()).unwrap();
    assert_eq!(
        entry,
        json!({"path": "/home/user/out/joined.txt", "name": "joined.txt", "type": "file"})
    );
    let (status, joined) = api.download(&sandbox, "out/joined.txt").await;
    assert_eq!((status, &joined[..]), (200, &b"beta\nalpha\n"[..]));
    for gone in ["a.part", "b.part"] {
        assert_eq!(
            api.download(&sandbox, gone).await.0,
            404,
            "{gone} was not removed"
        );
    }
    // The file left at a destination it did not replace is untouched, and nothing is removed.
    assert_eq!(api.upload(&sandbox, "c.part", b"gamma").await.status, 200);
    let refusals = [
        (
            json!({"source_paths": [], "destination": "x"}),
            400,
            "source_paths must not be empty",
        ),
        (
            json!({"source_paths": ["c.part"], "destination": ""}),
            400,
            "destination is required",
        ),
        (
            json!({"source_paths": ["c.part", "missing"], "destination": "joined.txt"}),
            404,
            "source file not found: missing",
        ),
        (
            json!({"source_paths": ["c.part", "/home/user"], "destination": "joined.txt"}),
            400,
            "source path is not a regular file: /home/user",
        ),
        (
            json!({"source_paths": ["joined.txt"], "destination": "/home/user/joined.txt"}),
            400,
            "cannot be the same as destination",
        ),
        (
            json!({"source_paths": ["c.part"], "destination": "x", "username": "nobody"}),
            401,
            "invalid username",
        ),
    ];
    for (body, status, text) in refusals {
        let answer = compose(body.clone()).await.unwrap();
        assert_eq!(answer.status().as_u16(), status, "{body}");
        let answer = answer.text().await.unwrap();
        assert!(answer.contains(text), "{body}: {answer}");
    }
    assert_eq!(api.download(&sandbox, "joined.txt").await.1, &b"old"[..]);
    assert_eq!(api.download(&sandbox, "c.part").await.1, &b"gamma"[..]);
    let wrong_method = api
        .envd(&sandbox, reqwest::Method::GET, "/files/compose")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.status().as_u16(), 405);
}
