//! envd's `/files`: uploads and capped downloads.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;

use super::support::*;
use crate::*;

#[tokio::test]
async fn download_is_refused_while_streaming_past_the_cap() {
    // The `/files` read cap (the file tool's `max_bytes`). Not S12: the teardown pull is a tar
    // stream from a command, capped by capped-tar.
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    let server = TestServer::start(move |_, _| {
        let counter = counter.clone();
        // No Content-Length: only counting while reading can stop it.
        let body = futures::stream::iter(0..1000).map(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<Bytes, Infallible>(Bytes::from(vec![b'x'; 64 * 1024]))
        });
        Response::new(Body::from_stream(body))
    })
    .await;
    let client = client(&server.url);
    let mut download = sandbox(&client)
        .read_file_stream("/home/user/big.bin", 256 * 1024)
        .await
        .expect("headers");
    assert_eq!(download.content_length(), None);
    let mut delivered = 0usize;
    let error = loop {
        match download.next().await.expect("an item") {
            Ok(chunk) => delivered += chunk.len(),
            Err(error) => break error,
        }
    };
    assert!(error.is_limit_exceeded(), "{error:?}");
    assert!(delivered <= 256 * 1024);
    drop(download);
    // The server produced far less than the 64 MiB it would have sent.
    assert!(
        sent.load(Ordering::SeqCst) < 1000,
        "{}",
        sent.load(Ordering::SeqCst)
    );
    let request = &server.requests()[0];
    assert_eq!(
        request.path_and_query,
        "/files?path=%2Fhome%2Fuser%2Fbig.bin"
    );
    assert_eq!(request.header("accept-encoding"), Some("identity"));
}

#[tokio::test]
async fn download_with_a_declared_length_over_the_cap_fails_before_reading() {
    let server = TestServer::start(|_, _| Response::new(Body::from(vec![0u8; 4096]))).await;
    let client = client(&server.url);
    let error = sandbox(&client)
        .read_file_stream("/f", 1024)
        .await
        .expect_err("over the cap");
    assert!(error.is_limit_exceeded());
    assert_eq!(
        sandbox(&client)
            .read_file("/f", 4096)
            .await
            .expect("at the cap")
            .len(),
        4096
    );
}

#[tokio::test]
async fn uploads_use_one_multipart_request_or_octet_streams() {
    // contract: S4
    let server = TestServer::start(|request, _| {
        let count = std::str::from_utf8(&request.body)
            .unwrap_or("")
            .matches("name=\"file\"")
            .count()
            .max(1);
        let items: Vec<serde_json::Value> = (0..count)
            .map(|i| serde_json::json!({"path":format!("/home/user/f{i}"),"name":format!("f{i}"),"type":"file"}))
            .collect();
        json(200, &serde_json::Value::Array(items))
    })
    .await;
    let client = client(&server.url);
    let sandbox = sandbox(&client).with_user("root".to_owned());
    let chunks = futures::stream::iter([
        Ok(Bytes::from_static(b"str")),
        Ok(Bytes::from_static(b"eam")),
    ]);
    let written = sandbox
        .write_files(vec![
            UploadFile::bytes("/home/user/a/b.txt".to_owned(), Bytes::from_static(b"one")),
            UploadFile::stream("rel/c.txt".to_owned(), chunks),
        ])
        .await
        .expect("uploaded");
    assert_eq!(written.len(), 2);
    sandbox
        .write_file("/home/user/a b.txt", Bytes::from_static(b"x"))
        .await
        .expect("octet-stream");

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let multipart = &requests[0];
    assert_eq!(multipart.path_and_query, "/files?username=root");
    let content_type = multipart.header("content-type").expect("content type");
    let boundary = content_type
        .strip_prefix("multipart/form-data; boundary=")
        .expect("multipart");
    let body = std::str::from_utf8(&multipart.body).expect("utf-8");
    assert!(body.contains(
        "filename=\"/home/user/a/b.txt\"\r\nContent-Type: application/octet-stream\r\n\r\none\r\n"
    ));
    assert!(body.contains(
        "filename=\"rel/c.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nstream\r\n"
    ));
    assert!(body.ends_with(&format!("--{boundary}--\r\n")));
    let octet = &requests[1];
    assert_eq!(
        octet.path_and_query,
        "/files?path=%2Fhome%2Fuser%2Fa%20b.txt&username=root"
    );
    assert_eq!(
        octet.header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(&octet.body[..], b"x");

    let refused = sandbox
        .write_files(vec![UploadFile::bytes("a\"b".to_owned(), Bytes::new())])
        .await
        .expect_err("bad name");
    assert!(matches!(refused, Error::InvalidInput { .. }));
    assert_eq!(server.requests().len(), 2, "nothing was sent");
}

#[tokio::test]
async fn the_mcp_gateways_token_is_read_as_root_and_its_url_is_port_50005() {
    let server = TestServer::start(|request, index| {
        if index == 0 {
            assert!(
                request.path_and_query.contains("username=root"),
                "{request:?}"
            );
            Response::new(Body::from("gw-token-0123\n"))
        } else {
            json(
                404,
                &serde_json::json!({"code": 404, "message": "file not found"}),
            )
        }
    })
    .await;
    let client = client(&server.url);
    let sandbox = sandbox(&client);
    let token = sandbox.mcp_token().await.expect("read").expect("present");
    assert_eq!(token.expose(), "gw-token-0123");
    assert!(!format!("{token:?}").contains("gw-token"));
    assert_eq!(
        server.requests()[0].path_and_query,
        "/files?path=%2Fetc%2Fmcp-gateway%2F.token&username=root"
    );
    assert!(
        sandbox.mcp_token().await.expect("read").is_none(),
        "no gateway"
    );
    assert!(sandbox.mcp_url().starts_with("https://50005-"));
    assert!(sandbox.mcp_url().ends_with("/mcp"));
}
