//! Helpers shared by the integration tests: a raw HTTP client for the E2B wire.
#![allow(dead_code, unreachable_pub, missing_debug_implementations)]

use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::{Buf, Bytes, BytesMut};
use e2b_local::{Clock, Server, ServerConfig};
use futures::StreamExt;
use serde_json::{Value, json};

pub const KEY: &str = "test-key";

/// A fixed instant, so lease arithmetic in tests is exact.
pub fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

pub async fn manual_server() -> Server {
    let mut config = ServerConfig::loopback();
    config.clock = Clock::manual(t0());
    Server::start(config).await.expect("server starts")
}

pub struct Api {
    pub url: String,
    pub http: reqwest::Client,
}

pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub json: Value,
    pub text: String,
}

impl Reply {
    /// The pids of a `process.Process/List` answer, in its order.
    pub fn listed_pids(&self) -> Vec<u64> {
        self.json["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["pid"].as_u64().unwrap())
            .collect()
    }
}

impl Api {
    pub fn new(server: &Server) -> Api {
        Api {
            url: server.url(),
            http: reqwest::Client::new(),
        }
    }

    async fn reply(response: reqwest::Response) -> Reply {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.expect("body");
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Reply {
            status,
            headers,
            json,
            text,
        }
    }

    pub async fn rest(&self, method: reqwest::Method, path: &str, body: Option<&str>) -> Reply {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.url))
            .header("x-api-key", KEY);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        Api::reply(request.send().await.expect("request")).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.rest(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: &str) -> Reply {
        self.rest(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        self.rest(reqwest::Method::DELETE, path, None).await
    }

    /// Creates a sandbox through the v2 route and returns (id, envd token).
    pub async fn create(&self, body: Value) -> (String, Option<String>) {
        let reply = self.post("/v2/sandboxes", &body.to_string()).await;
        assert_eq!(reply.status, 201, "{}", reply.text);
        let id = reply.json["sandboxID"].as_str().expect("id").to_owned();
        let token = reply.json["envdAccessToken"].as_str().map(str::to_owned);
        (id, token)
    }

    pub fn envd(
        &self,
        sandbox: &Sandbox,
        method: reqwest::Method,
        path: &str,
    ) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.url))
            .header("e2b-sandbox-id", &sandbox.id)
            .header("e2b-sandbox-port", "49983");
        if let Some(token) = &sandbox.token {
            request = request.header("x-access-token", token);
        }
        request
    }

    /// A unary Connect call.
    pub async fn rpc(&self, sandbox: &Sandbox, method: &str, body: Value) -> Reply {
        let response = self
            .envd(sandbox, reqwest::Method::POST, &format!("/{method}"))
            .header("content-type", "application/json")
            .header("connect-protocol-version", "1")
            .body(body.to_string())
            .send()
            .await
            .expect("rpc");
        Api::reply(response).await
    }

    /// Starts `cmd` (a bash login shell's command line) and returns the open stream.
    pub async fn start(&self, sandbox: &Sandbox, cmd: &str, extra: &[(&str, &str)]) -> FrameStream {
        let body =
            json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd]}, "stdin": false});
        self.start_request(sandbox, &body, extra).await
    }

    /// Starts the program `cmd` with exactly `args` as its arguments (no shell added)
    /// and runs it to completion.
    pub async fn run_argv(&self, sandbox: &Sandbox, cmd: &str, args: &[&str]) -> Run {
        let body = json!({"process": {"cmd": cmd, "args": args}});
        let mut stream = self.start_request(sandbox, &body, &[]).await;
        stream.collect().await
    }

    /// Sends a `StartRequest` and returns the open stream.
    pub async fn start_request(
        &self,
        sandbox: &Sandbox,
        body: &Value,
        extra: &[(&str, &str)],
    ) -> FrameStream {
        let mut request = self
            .envd(sandbox, reqwest::Method::POST, "/process.Process/Start")
            .header("content-type", "application/connect+json")
            .header("connect-protocol-version", "1")
            .body(envelope(body));
        for (k, v) in extra {
            request = request.header(*k, *v);
        }
        let response = request.send().await.expect("start");
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "application/connect+json"
        );
        FrameStream::new(response)
    }

    /// Runs `cmd` to completion; returns (stdout, stderr, end event, end-stream payload).
    pub async fn run(&self, sandbox: &Sandbox, cmd: &str) -> Run {
        let mut stream = self.start(sandbox, cmd, &[]).await;
        stream.collect().await
    }

    pub async fn upload(&self, sandbox: &Sandbox, path: &str, data: &[u8]) -> Reply {
        let response = self
            .envd(sandbox, reqwest::Method::POST, "/files")
            .query(&[("path", path)])
            .header("content-type", "application/octet-stream")
            .body(data.to_vec())
            .send()
            .await
            .expect("upload");
        Api::reply(response).await
    }

    pub async fn download(&self, sandbox: &Sandbox, path: &str) -> (u16, Bytes) {
        let response = self
            .envd(sandbox, reqwest::Method::GET, "/files")
            .query(&[("path", path)])
            .send()
            .await
            .expect("download");
        let status = response.status().as_u16();
        (status, response.bytes().await.expect("bytes"))
    }
}

#[derive(Clone, Debug)]
pub struct Sandbox {
    pub id: String,
    pub token: Option<String>,
}

pub async fn new_sandbox(api: &Api) -> Sandbox {
    let (id, token) = api
        .create(json!({"templateID": "base", "timeout": 300}))
        .await;
    Sandbox { id, token }
}

pub fn envelope(value: &Value) -> Vec<u8> {
    let payload = value.to_string().into_bytes();
    let mut out = vec![0u8];
    out.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Reads Connect envelopes incrementally from a streaming response.
pub struct FrameStream {
    body: futures::stream::BoxStream<'static, reqwest::Result<Bytes>>,
    buffer: BytesMut,
}

pub struct Frame {
    pub flags: u8,
    pub json: Value,
}

pub struct Run {
    pub pid: u64,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub chunks: Vec<usize>,
    pub end: Value,
    pub end_stream: Value,
    pub keepalives: usize,
}

impl FrameStream {
    pub fn new(response: reqwest::Response) -> FrameStream {
        FrameStream {
            body: response.bytes_stream().boxed(),
            buffer: BytesMut::new(),
        }
    }

    /// The next frame, or None at the end of the body.
    pub async fn next(&mut self) -> Option<Frame> {
        match self.try_next().await {
            Ok(frame) => frame,
            Err(e) => panic!("stream error: {e}"),
        }
    }

    /// Like [`FrameStream::next`], with a body that breaks off as an error.
    pub async fn try_next(&mut self) -> Result<Option<Frame>, reqwest::Error> {
        loop {
            if self.buffer.len() >= 5 {
                let len = u32::from_be_bytes(self.buffer[1..5].try_into().unwrap()) as usize;
                if self.buffer.len() >= 5 + len {
                    let flags = self.buffer[0];
                    self.buffer.advance(5);
                    let payload = self.buffer.split_to(len);
                    let json = serde_json::from_slice(&payload).expect("frame json");
                    return Ok(Some(Frame { flags, json }));
                }
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buffer.extend_from_slice(&chunk),
                Some(Err(e)) => return Err(e),
                None => {
                    assert!(self.buffer.is_empty(), "trailing bytes in stream");
                    return Ok(None);
                }
            }
        }
    }

    pub async fn collect(&mut self) -> Run {
        let first = self.next().await.expect("first frame");
        let pid = first.json["event"]["start"]["pid"]
            .as_u64()
            .expect("first event is start");
        let mut run = Run {
            pid,
            stdout: Vec::new(),
            stderr: Vec::new(),
            chunks: Vec::new(),
            end: Value::Null,
            end_stream: Value::Null,
            keepalives: 0,
        };
        while let Some(frame) = self.next().await {
            if frame.flags & 2 != 0 {
                run.end_stream = frame.json;
                assert!(self.next().await.is_none(), "frames after end-stream");
                break;
            }
            let event = &frame.json["event"];
            assert!(run.end.is_null(), "event after end: {event}");
            if let Some(data) = event.get("data") {
                if let Some(b) = data.get("stdout") {
                    let bytes = STANDARD.decode(b.as_str().unwrap()).unwrap();
                    run.chunks.push(bytes.len());
                    run.stdout.extend_from_slice(&bytes);
                }
                if let Some(b) = data.get("stderr") {
                    let bytes = STANDARD.decode(b.as_str().unwrap()).unwrap();
                    run.chunks.push(bytes.len());
                    run.stderr.extend_from_slice(&bytes);
                }
            } else if event.get("keepalive").is_some() {
                run.keepalives += 1;
            } else if let Some(end) = event.get("end") {
                run.end = end.clone();
            } else {
                panic!("unexpected event {event}");
            }
        }
        run
    }
}
