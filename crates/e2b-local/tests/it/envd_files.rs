//! envd's filesystem: the Filesystem RPCs, `/files` upload and download, and the access
//! token that guards them.

use crate::support::{Api, Sandbox, manual_server, new_sandbox};
use futures::StreamExt;
use serde_json::json;

#[tokio::test]
async fn filesystem_rpcs() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let s = new_sandbox(&api).await;
    let fs = |m: &str| format!("filesystem.Filesystem/{m}");

    let made = api.rpc(&s, &fs("MakeDir"), json!({"path": "a/b/c"})).await;
    assert_eq!(made.status, 200, "{}", made.text);
    assert_eq!(made.json["entry"]["path"], "/home/user/a/b/c");
    assert_eq!(made.json["entry"]["type"], "FILE_TYPE_DIRECTORY");
    assert_eq!(
        api.rpc(&s, &fs("MakeDir"), json!({"path": "a/b/c"}))
            .await
            .json["code"],
        "already_exists"
    );
    assert_eq!(
        api.upload(&s, "/home/user/a/f.txt", b"12345").await.status,
        200
    );
    assert_eq!(
        api.rpc(&s, &fs("MakeDir"), json!({"path": "a/f.txt"}))
            .await
            .json["code"],
        "invalid_argument"
    );

    let stat = api
        .rpc(&s, &fs("Stat"), json!({"path": "/home/user/a/f.txt"}))
        .await;
    let entry = &stat.json["entry"];
    assert_eq!(entry["name"], "f.txt");
    assert_eq!(entry["size"], "5");
    assert_eq!(entry["type"], "FILE_TYPE_FILE");
    assert_eq!(entry["permissions"], "-rw-r--r--");
    assert_eq!(entry["mode"], 0o644);
    assert!(entry["modifiedTime"].as_str().unwrap().ends_with('Z'));
    let missing = api
        .rpc(&s, &fs("Stat"), json!({"path": "/home/user/nope"}))
        .await;
    assert_eq!(
        (missing.status, missing.json["code"].clone()),
        (404, json!("not_found"))
    );

    let one = api.rpc(&s, &fs("ListDir"), json!({"path": "a"})).await;
    let names: Vec<&str> = one.json["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["b", "f.txt"]);
    let deep = api
        .rpc(&s, &fs("ListDir"), json!({"path": "a", "depth": 3}))
        .await;
    let paths: Vec<&str> = deep.json["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        vec!["/home/user/a/b", "/home/user/a/b/c", "/home/user/a/f.txt"]
    );
    assert_eq!(
        api.rpc(&s, &fs("ListDir"), json!({"path": "a/f.txt"}))
            .await
            .json["code"],
        "invalid_argument"
    );
    assert_eq!(
        api.rpc(&s, &fs("ListDir"), json!({"path": "zzz"}))
            .await
            .json["code"],
        "not_found"
    );

    let moved = api
        .rpc(
            &s,
            &fs("Move"),
            json!({"source": "a/f.txt", "destination": "/tmp/x/g.txt"}),
        )
        .await;
    assert_eq!(moved.json["entry"]["path"], "/tmp/x/g.txt");
    assert_eq!(
        api.rpc(
            &s,
            &fs("Move"),
            json!({"source": "a/f.txt", "destination": "h"})
        )
        .await
        .json["code"],
        "not_found"
    );
    assert_eq!(
        api.rpc(&s, &fs("Remove"), json!({"path": "/tmp/x"}))
            .await
            .status,
        200
    );
    assert_eq!(
        api.rpc(&s, &fs("Stat"), json!({"path": "/tmp/x/g.txt"}))
            .await
            .status,
        404
    );
    assert_eq!(
        api.rpc(&s, &fs("Remove"), json!({"path": "/tmp/x"}))
            .await
            .status,
        200,
        "idempotent"
    );

    // Escapes are refused for the server's own operations.
    for path in ["/etc/passwd", "../../etc", "/home/user/../other"] {
        let reply = api.rpc(&s, &fs("Stat"), json!({"path": path})).await;
        assert_eq!(reply.json["code"], "permission_denied", "{path}");
    }
    let _ = api
        .run(&s, "ln -s /etc ~/etc-link; ln -s /tmp ~/tmp-link")
        .await;
    assert_eq!(api.upload(&s, "etc-link/evil", b"x").await.status, 403);
    assert_eq!(api.upload(&s, "tmp-link/fine", b"ok").await.status, 200);
    assert_eq!(&api.download(&s, "/tmp/fine").await.1[..], b"ok");
    // A watch may not lead out of the sandbox either.
    let watcher = api
        .rpc(&s, &fs("CreateWatcher"), json!({"path": "etc-link"}))
        .await;
    assert_eq!(
        (watcher.status, watcher.json["code"].clone()),
        (403, json!("permission_denied"))
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn files_upload_download() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let s = new_sandbox(&api).await;
    // Multipart: many parts, filenames are the destinations, parents created.
    let mut parts: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| {
            (
                format!("n/{}/f{i}.txt", i % 3),
                format!("body {i}").into_bytes(),
            )
        })
        .collect();
    parts.push(("/home/user/abs.txt".into(), b"abs".to_vec()));
    let reply = post_multipart(&api, &s, &parts).await;
    assert_eq!(reply.status().as_u16(), 200);
    let entries: serde_json::Value = serde_json::from_str(&reply.text().await.unwrap()).unwrap();
    assert_eq!(entries.as_array().unwrap().len(), 21);
    assert_eq!(
        entries[0],
        json!({"path": "/home/user/n/0/f0.txt", "name": "f0.txt", "type": "file"})
    );
    assert_eq!(&api.download(&s, "n/2/f5.txt").await.1[..], b"body 5");
    assert_eq!(&api.download(&s, "/home/user/abs.txt").await.1[..], b"abs");

    // Two parts with one destination.
    let dup = vec![
        ("d.txt".to_owned(), b"1".to_vec()),
        ("/home/user/d.txt".to_owned(), b"2".to_vec()),
    ];
    assert_eq!(post_multipart(&api, &s, &dup).await.status().as_u16(), 400);

    // Octet-stream needs ?path.
    let no_path = api
        .envd(&s, reqwest::Method::POST, "/files")
        .header("content-type", "application/octet-stream")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(no_path.status().as_u16(), 400);
    let big = vec![7u8; 5 * 1024 * 1024];
    assert_eq!(api.upload(&s, "big.bin", &big).await.status, 200);
    let response = api
        .envd(&s, reqwest::Method::GET, "/files")
        .query(&[("path", "big.bin")])
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["content-length"], "5242880");
    let mut stream = response.bytes_stream();
    let mut total = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        assert!(chunk.iter().all(|b| *b == 7));
        total += chunk.len();
    }
    assert_eq!(total, big.len());

    let (status, body) = api.download(&s, "/home/user/none.txt").await;
    assert_eq!(status, 404);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
        json!({"code": 404, "message": "path '/home/user/none.txt' does not exist"})
    );
    assert_eq!(api.download(&s, "/home/user").await.0, 400);
    assert_eq!(api.download(&s, "/etc/passwd").await.0, 403);

    // envd health is 204, the REST one 200; the header decides.
    let health = api
        .envd(&s, reqwest::Method::GET, "/health")
        .send()
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 204);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_file_is_served_by_ranges_and_a_range_at_its_end_names_its_size() {
    // As envd's `http.ServeContent`: one range is a 206 with Content-Range, a range at the
    // end is a 416 naming the file's size, and a later request sees what the file has then
    // (the teardown pull reads its growing archive so).
    let server = manual_server().await;
    let api = Api::new(&server);
    let s = new_sandbox(&api).await;
    assert_eq!(api.upload(&s, "grow.bin", b"0123456789").await.status, 200);
    let ranged = |range: &str| {
        api.envd(&s, reqwest::Method::GET, "/files")
            .query(&[("path", "grow.bin")])
            .header("range", range)
            .send()
    };
    let header = |response: &reqwest::Response, name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let part = ranged("bytes=4-").await.unwrap();
    assert_eq!(part.status().as_u16(), 206);
    assert_eq!(
        header(&part, "content-range").as_deref(),
        Some("bytes 4-9/10")
    );
    assert_eq!(header(&part, "accept-ranges").as_deref(), Some("bytes"));
    assert_eq!(&part.bytes().await.unwrap()[..], b"456789");
    let part = ranged("bytes=2-3").await.unwrap();
    assert_eq!(
        header(&part, "content-range").as_deref(),
        Some("bytes 2-3/10")
    );
    assert_eq!(&part.bytes().await.unwrap()[..], b"23");

    let past = ranged("bytes=10-").await.unwrap();
    assert_eq!(past.status().as_u16(), 416);
    assert_eq!(
        header(&past, "content-range").as_deref(),
        Some("bytes */10")
    );
    let invalid = ranged("bytes=5-2").await.unwrap();
    assert_eq!(invalid.status().as_u16(), 416);
    assert_eq!(header(&invalid, "content-range"), None);

    // Once the file has grown, the same range finds what was added.
    assert_eq!(
        api.upload(&s, "grow.bin", b"0123456789abcdef").await.status,
        200
    );
    let more = ranged("bytes=10-").await.unwrap();
    assert_eq!(more.status().as_u16(), 206);
    assert_eq!(
        header(&more, "content-range").as_deref(),
        Some("bytes 10-15/16")
    );
    assert_eq!(&more.bytes().await.unwrap()[..], b"abcdef");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn access_token_is_enforced_when_set() {
    // contract: X6 (secure = true keeps envd's access token on)
    let server = manual_server().await;
    let api = Api::new(&server);
    let (id, token) = api.create(json!({"templateID": "base"})).await;
    let token = token.expect("v2 sandboxes always have a token");
    let anonymous = Sandbox {
        id: id.clone(),
        token: None,
    };
    let wrong = Sandbox {
        id: id.clone(),
        token: Some("wrong".into()),
    };
    let right = Sandbox {
        id: id.clone(),
        token: Some(token.clone()),
    };
    let denied = api.rpc(&anonymous, "process.Process/List", json!({})).await;
    assert_eq!(denied.status, 401);
    assert_eq!(denied.json["code"], 401);
    assert_eq!(
        api.rpc(&wrong, "process.Process/List", json!({}))
            .await
            .status,
        401
    );
    assert_eq!(
        api.rpc(&right, "process.Process/List", json!({}))
            .await
            .status,
        200
    );
    // /health is exempt; /files takes the header or a signature.
    assert_eq!(
        api.envd(&anonymous, reqwest::Method::GET, "/health")
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        204
    );
    assert_eq!(api.upload(&anonymous, "f.txt", b"x").await.status, 401);
    assert_eq!(api.upload(&wrong, "f.txt", b"x").await.status, 401);
    assert_eq!(api.upload(&right, "f.txt", b"signed").await.status, 200);
    // A pre-signed read URL works without any header at all.
    use base64::Engine;
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("f.txt:read::{token}").as_bytes());
    let signature = format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    );
    // The SDK percent-encodes query values (quote_via=quote): '+' and '/' included.
    let encoded = signature.replace('+', "%2B").replace('/', "%2F");
    let url = format!("{}/files?path=f.txt&signature={encoded}", server.url());
    let signed = reqwest::get(&url).await.unwrap();
    assert_eq!(signed.status().as_u16(), 200);
    assert_eq!(signed.text().await.unwrap(), "signed");

    // v1 without secure: no token, envd open.
    let v1 = api
        .post("/sandboxes", r#"{"templateID":"base","timeout":60}"#)
        .await;
    assert!(v1.json.get("envdAccessToken").is_none());
    let open = Sandbox {
        id: v1.json["sandboxID"].as_str().unwrap().to_owned(),
        token: None,
    };
    assert_eq!(
        api.rpc(&open, "process.Process/List", json!({}))
            .await
            .status,
        200
    );
    let secure = api
        .post(
            "/sandboxes",
            r#"{"templateID":"base","timeout":60,"secure":true}"#,
        )
        .await;
    assert!(secure.json["envdAccessToken"].is_string());
    server.shutdown().await.unwrap();
}

/// Sends a multipart/form-data body the way the SDK does: one `file` part per file,
/// the destination path as the part's filename.
async fn post_multipart(api: &Api, s: &Sandbox, parts: &[(String, Vec<u8>)]) -> reqwest::Response {
    let boundary = "e2b-local-test-boundary";
    let mut body = Vec::new();
    for (name, data) in parts {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    api.envd(s, reqwest::Method::POST, "/files")
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .await
        .unwrap()
}
