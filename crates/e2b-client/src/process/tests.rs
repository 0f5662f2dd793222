use futures::stream;

use super::*;
use crate::error::Operation;
use crate::framing::{FLAG_END_STREAM, ServerStream};
use crate::http::Target;
use crate::ids::SandboxId;
use crate::secret::ApiKey;

fn ctx() -> Ctx {
    Ctx::new(
        Operation::StartProcess,
        Target::Envd(SandboxId::parse("isbx".to_owned()).expect("valid")),
        ApiKey::new("e2b_key_for_tests_000".to_owned()),
        None,
    )
}

fn frame(flags: u8, payload: &str) -> Vec<u8> {
    let mut out = vec![flags];
    out.extend_from_slice(&u32::try_from(payload.len()).expect("small").to_be_bytes());
    out.extend_from_slice(payload.as_bytes());
    out
}

async fn from_chunks(chunks: Vec<Vec<u8>>) -> Result<ProcessStream, Error> {
    let body = stream::iter(chunks.into_iter().map(|chunk| Ok(Bytes::from(chunk))));
    let reader = ServerStream::new(ctx(), body, 1 << 16, Duration::from_secs(5), None);
    ProcessStream::open(reader).await
}

/// Every item, with a failure to open as the only item.
async fn collect(chunks: Vec<Vec<u8>>) -> Vec<Result<ProcessEvent, Error>> {
    match from_chunks(chunks).await {
        Ok(stream) => stream.collect().await,
        Err(error) => vec![Err(error)],
    }
}

fn happy_wire() -> Vec<u8> {
    let mut wire = Vec::new();
    for line in [
        r#"{"event":{"start":{"pid":1000}}}"#,
        r#"{"event":{"data":{"stdout":"aGVsbG8K"}}}"#,
        r#"{"event":{"data":{"stderr":"d2Fybgo="}}}"#,
        r#"{"event":{"keepalive":{}}}"#,
        r#"{"event":{"somethingNew":{"x":1}}}"#,
        r#"{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}}}"#,
    ] {
        wire.extend(frame(0, line));
    }
    wire.extend(frame(FLAG_END_STREAM, "{}"));
    wire
}

#[tokio::test]
async fn decodes_a_whole_stream_however_it_is_chunked() {
    let wire = happy_wire();
    for size in [1, 2, 3, 7, 64, wire.len()] {
        let chunks: Vec<Vec<u8>> = wire.chunks(size).map(<[u8]>::to_vec).collect();
        let events: Vec<ProcessEvent> = collect(chunks)
            .await
            .into_iter()
            .collect::<Result<_, _>>()
            .expect("valid stream");
        assert_eq!(
            events,
            vec![
                ProcessEvent::Start { pid: 1000 },
                ProcessEvent::Stdout(Bytes::from_static(b"hello\n")),
                ProcessEvent::Stderr(Bytes::from_static(b"warn\n")),
                ProcessEvent::Keepalive,
                ProcessEvent::End(ProcessEnd {
                    exit_code: 3,
                    exited: true,
                    status: "exit status 3".to_owned(),
                    error: Some("exit status 3".to_owned()),
                }),
            ],
            "chunk size {size}"
        );
    }
}

#[tokio::test]
async fn snake_case_and_string_integers_decode() {
    let mut wire = frame(0, r#"{"event":{"start":{"pid":"77"}}}"#);
    wire.extend(frame(
        0,
        r#"{"event":{"end":{"exit_code":"-1","status":"signal: killed"}}}"#,
    ));
    let mut stream = from_chunks(vec![wire]).await.expect("started");
    assert_eq!(stream.pid(), 77);
    assert_eq!(
        stream.next().await.expect("an event").expect("valid"),
        ProcessEvent::Start { pid: 77 }
    );
    let end = stream.next().await.expect("an event").expect("valid");
    assert_eq!(
        end,
        ProcessEvent::End(ProcessEnd {
            exit_code: -1,
            exited: false,
            status: "signal: killed".to_owned(),
            error: None,
        })
    );
    // No end-stream frame after End is tolerated.
    assert!(stream.next().await.is_none());
}

#[tokio::test]
async fn end_stream_error_is_surfaced() {
    let mut wire = frame(0, r#"{"event":{"start":{"pid":1}}}"#);
    wire.extend(frame(
        FLAG_END_STREAM,
        r#"{"error":{"code":"deadline_exceeded","message":"context deadline exceeded"}}"#,
    ));
    let items = collect(vec![wire]).await;
    assert_eq!(items.len(), 2);
    let error = items[1].as_ref().expect_err("an error");
    assert!(error.is_deadline_exceeded(), "{error}");
    assert!(!error.to_string().to_lowercase().contains("timeout"));
}

#[tokio::test]
async fn protocol_violations_are_errors() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (frame(0, r#"{"event":{"keepalive":{}}}"#), "first event"),
        (
            [
                frame(0, r#"{"event":{"start":{"pid":1}}}"#),
                frame(0, r#"{"event":{"start":{"pid":2}}}"#),
            ]
            .concat(),
            "second start",
        ),
        (
            frame(0, r#"{"event":{"start":{"pid":1}}}"#),
            "without an end event",
        ),
        (
            [
                frame(0, r#"{"event":{"start":{"pid":1}}}"#),
                frame(FLAG_END_STREAM, "{}"),
            ]
            .concat(),
            "without an end event",
        ),
        (frame(0, "not json"), "invalid event"),
        (
            [
                frame(0, r#"{"event":{"start":{"pid":1}}}"#),
                frame(0, r#"{"event":{"data":{"stdout":"!!"}}}"#),
            ]
            .concat(),
            "base64",
        ),
        (vec![0, 0, 0, 0, 9, b'{'], "inside a frame"),
        (vec![0, 0xff, 0, 0, 0], "frame cap"),
    ];
    for (wire, expected) in cases {
        let items = collect(vec![wire]).await;
        let error = items
            .iter()
            .find_map(|item| item.as_ref().err())
            .expect("an error");
        assert!(
            matches!(error, Error::Protocol { .. }),
            "{expected}: {error:?}"
        );
        assert!(error.to_string().contains(expected), "{expected}: {error}");
        // Nothing after the error.
        assert!(items.last().is_some_and(Result::is_err));
    }
}

#[tokio::test(start_paused = true)]
async fn a_silent_stream_hits_the_idle_deadline() {
    let body = stream::iter(vec![Ok(Bytes::from(frame(
        0,
        r#"{"event":{"start":{"pid":1}}}"#,
    )))])
    .chain(stream::pending());
    let reader = ServerStream::new(ctx(), body, 1024, Duration::from_secs(30), None);
    let mut stream = ProcessStream::open(reader).await.expect("started");
    assert_eq!(stream.pid(), 1);
    assert!(matches!(
        stream.next().await,
        Some(Ok(ProcessEvent::Start { pid: 1 }))
    ));
    let error = stream.next().await.expect("an item").expect_err("deadline");
    assert!(error.is_deadline_exceeded());
    assert!(stream.next().await.is_none());
}

/// A stream that stops after its start and some output, with no end event, read with a probe
/// that answers `gone`; returns the last item and whether the probe ran.
async fn cut_short(gone: bool) -> (Error, bool) {
    let mut wire = frame(0, r#"{"event":{"start":{"pid":7}}}"#);
    wire.extend(frame(0, r#"{"event":{"data":{"stdout":"aGVsbG8K"}}}"#));
    let body = stream::iter(vec![Ok(Bytes::from(wire))]);
    let probed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = std::sync::Arc::clone(&probed);
    let probe: crate::framing::GoneProbe = Box::new(move || {
        seen.store(true, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move { gone })
    });
    let reader = ServerStream::new(ctx(), body, 1024, Duration::from_secs(5), Some(probe));
    let items: Vec<_> = ProcessStream::open(reader)
        .await
        .expect("started")
        .collect()
        .await;
    let error = items
        .into_iter()
        .last()
        .expect("items")
        .expect_err("no end");
    (error, probed.load(std::sync::atomic::Ordering::SeqCst))
}

#[tokio::test]
async fn a_stream_without_its_end_on_a_gone_sandbox_says_the_sandbox_ended() {
    // contract: O3 — a stream that stops without an end event, on a sandbox the health probe
    // finds gone, names the sandbox and says it was killed or reached its end of life.
    let (error, probed) = cut_short(true).await;
    assert!(probed);
    assert!(error.is_sandbox_gone(), "{error:?}");
    assert!(!error.is_transient(), "{error:?}");
    assert_eq!(error.sandbox_id().map(SandboxId::as_str), Some("isbx"));
    let text = error.to_string();
    assert!(
        text.starts_with("E2B start process failed for sandbox isbx: "),
        "{text}"
    );
    assert!(text.contains("killed or reached its end of life"), "{text}");
    assert!(text.contains("stream ended without an end event"), "{text}");
}

#[tokio::test]
async fn a_stream_without_its_end_on_a_running_sandbox_stays_a_protocol_error() {
    // contract: O3 — the probe finding the sandbox alive leaves the error as it was.
    let (error, probed) = cut_short(false).await;
    assert!(probed);
    assert!(matches!(error, Error::Protocol { .. }), "{error:?}");
    assert!(!error.is_sandbox_gone());
    assert!(!error.to_string().contains("end of life"), "{error}");
}

#[tokio::test]
async fn collect_output_enforces_its_cap() {
    let output = from_chunks(vec![happy_wire()])
        .await
        .expect("started")
        .collect_output(1024)
        .await
        .expect("under the cap");
    assert_eq!(&output.stdout[..], b"hello\n");
    assert_eq!(&output.stderr[..], b"warn\n");
    assert_eq!(output.end.exit_code, 3);
    assert_eq!(output.pid, 1000);
    let error = from_chunks(vec![happy_wire()])
        .await
        .expect("started")
        .collect_output(8)
        .await
        .expect_err("over the cap");
    assert!(error.is_limit_exceeded());
}

#[test]
fn list_response_decodes() {
    let info: ProcessInfo = serde_json::from_str(
        r#"{"config":{"cmd":"/bin/bash","args":["-l","-c","sleep 1"],"envs":null,"cwd":"/home/user"},"pid":"1001","tag":null}"#,
    )
    .expect("valid");
    assert_eq!(info.pid, 1001);
    assert_eq!(info.config.args, ["-l", "-c", "sleep 1"]);
    assert!(info.config.envs.is_empty());
}
