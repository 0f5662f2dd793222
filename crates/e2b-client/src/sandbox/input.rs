//! `process.Process/StreamInput`: one client-streaming call that carries a process's stdin
//! in order, instead of one `SendInput` request per chunk.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use reqwest::Method;
use reqwest::header::CONTENT_TYPE;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::Sandbox;
use crate::error::{Error, Operation};
use crate::framing::{Read, ServerStream, encode_envelope};
use crate::http::{Ctx, Http, Pool};
use crate::json;
use crate::retry::Idempotency;

/// The largest stdin chunk put in one message; a longer `send` is split.
const CHUNK: usize = 64 * 1024;

/// Messages queued ahead of the network at most: a slow sandbox slows `send` down.
const QUEUED: usize = 8;

/// The largest answer read (it is `{}` and an end frame).
const ANSWER_LIMIT: usize = 64 * 1024;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum Event<'a> {
    Start { process: Selector },
    Data { input: Input<'a> },
    Keepalive {},
}

#[derive(Serialize)]
struct Selector {
    pid: u32,
}

/// Where input goes: `{"stdin": …}` or `{"pty": …}`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum Input<'a> {
    Stdin(&'a str),
    Pty(&'a str),
}

/// What an [`InputStream`] feeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Feeds {
    Stdin,
    Terminal,
}

fn message(ctx: &Ctx, event: &Event<'_>) -> Result<Bytes, Error> {
    let payload = serde_json::to_vec(event)
        .map_err(|error| ctx.invalid_input(format!("cannot encode the message: {error}")))?;
    Ok(encode_envelope(&payload))
}

/// An open input stream to one process's stdin (the process must have been started with
/// stdin open). Bytes go out in order as [`InputStream::send`] is called, each send waiting
/// for room (at most eight 64 KiB messages wait in memory); [`InputStream::finish`] ends
/// the stream and reports what envd answered. Dropping it without `finish` abandons the
/// call. stdin itself stays open: close it with `close_stdin`.
pub struct InputStream {
    ctx: Ctx,
    http: Arc<Http>,
    feeds: Feeds,
    frames: Option<mpsc::Sender<Bytes>>,
    call: Option<JoinHandle<Result<(), Error>>>,
}

impl fmt::Debug for InputStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InputStream")
            .field("open", &self.frames.is_some())
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    /// Opens `process.Process/StreamInput` for process `pid`: its first message selects the
    /// process, then [`InputStream::send`] feeds its stdin. A pid envd does not know ends
    /// the call with an error that `send` or `finish` returns ([`Error::is_not_found`]).
    /// Never retried (input is not idempotent).
    pub async fn stream_input(&self, pid: u32) -> Result<InputStream, Error> {
        self.open_input(pid, Feeds::Stdin).await
    }

    /// Like [`Sandbox::stream_input`], for a process on a terminal
    /// ([`Sandbox::start_pty`](crate::Sandbox::start_pty)): [`InputStream::send`] types on
    /// it, as [`Sandbox::send_pty_input`](crate::Sandbox::send_pty_input) does, in one
    /// streamed call instead of one request per keystroke.
    pub async fn stream_pty_input(&self, pid: u32) -> Result<InputStream, Error> {
        self.open_input(pid, Feeds::Terminal).await
    }

    async fn open_input(&self, pid: u32, feeds: Feeds) -> Result<InputStream, Error> {
        let ctx = self.ctx(Operation::StreamInput);
        let first = message(
            &ctx,
            &Event::Start {
                process: Selector { pid },
            },
        )?;
        let (sender, mut receiver) = mpsc::channel::<Bytes>(QUEUED);
        sender
            .send(first)
            .await
            .map_err(|_| ctx.protocol("the input stream closed before it started"))?;
        let body = futures::stream::poll_fn(move |cx| {
            receiver
                .poll_recv(cx)
                .map(|next| next.map(Ok::<Bytes, std::io::Error>))
        });
        let builder = self
            .request(
                &ctx,
                Pool::Default,
                Method::POST,
                "/process.Process/StreamInput",
            )?
            .header(CONTENT_TYPE, "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .header("Connect-Accept-Encoding", "identity")
            .header("Connect-Content-Encoding", "identity")
            .body(reqwest::Body::wrap_stream(body));
        let request = ctx.build(builder)?;
        let http = Arc::clone(&self.http);
        let call_ctx = ctx.clone();
        let call = tokio::spawn(async move {
            // The answer comes only after the stream ends, so the request's deadline starts
            // when `finish` does (it bounds the wait); until then the stream is open.
            let response = http
                .send(
                    &call_ctx,
                    Pool::Default,
                    request,
                    Idempotency::NotIdempotent,
                    tokio::time::Instant::now() + std::time::Duration::from_secs(365 * 24 * 3600),
                )
                .await?;
            let deadline = http.deadline_from_now();
            let body = http
                .read_capped(&call_ctx, response, ANSWER_LIMIT, deadline)
                .await?;
            answer_error(&call_ctx, body, http.deadline).await
        });
        Ok(InputStream {
            ctx,
            http: Arc::clone(&self.http),
            feeds,
            frames: Some(sender),
            call: Some(call),
        })
    }
}

/// The error in a StreamInput answer's end frame, if any (the answer is read whole first,
/// capped, then through the one stream reader).
async fn answer_error(ctx: &Ctx, body: Bytes, idle: std::time::Duration) -> Result<(), Error> {
    let whole = futures::stream::once(async move { Ok::<Bytes, reqwest::Error>(body) });
    let mut reader = ServerStream::new(ctx.clone(), whole, ANSWER_LIMIT, idle, None);
    loop {
        match reader.next().await? {
            Read::Message(_) => {}
            Read::End => return Ok(()),
            Read::BodyEnd => return Err(ctx.protocol("the answer ended without an end of stream")),
        }
    }
}

impl InputStream {
    /// Sends `data` to the process's stdin, or types it on its terminal (in messages of at
    /// most 64 KiB), waiting for room. When the call has already ended (envd refused it), that error is returned.
    pub async fn send(&mut self, data: Bytes) -> Result<(), Error> {
        for chunk in data.chunks(CHUNK) {
            let encoded = json::encode_bytes(chunk);
            let input = match self.feeds {
                Feeds::Stdin => Input::Stdin(&encoded),
                Feeds::Terminal => Input::Pty(&encoded),
            };
            let frame = message(&self.ctx, &Event::Data { input })?;
            self.push(frame).await?;
        }
        Ok(())
    }

    /// Sends a keepalive message (for a proxy that closes idle requests).
    pub async fn keepalive(&mut self) -> Result<(), Error> {
        let frame = message(&self.ctx, &Event::Keepalive {})?;
        self.push(frame).await
    }

    async fn push(&mut self, frame: Bytes) -> Result<(), Error> {
        let Some(frames) = &self.frames else {
            return Err(self.ctx.invalid_input("the input stream is finished"));
        };
        match tokio::time::timeout(self.http.deadline, frames.send(frame)).await {
            Err(_) => Err(self.ctx.deadline(self.http.deadline)),
            Ok(Ok(())) => Ok(()),
            // The request is over: say why.
            Ok(Err(_)) => {
                self.frames = None;
                Err(self.outcome().await.err().unwrap_or_else(|| {
                    self.ctx.protocol("the input stream ended before its input")
                }))
            }
        }
    }

    /// Ends the stream and waits (up to the request deadline) for envd's answer.
    pub async fn finish(mut self) -> Result<(), Error> {
        self.frames = None;
        self.outcome().await
    }

    async fn outcome(&mut self) -> Result<(), Error> {
        let Some(call) = self.call.take() else {
            return Err(self.ctx.invalid_input("the input stream is finished"));
        };
        match tokio::time::timeout(self.http.deadline, call).await {
            Err(_) => Err(self.ctx.deadline(self.http.deadline)),
            Ok(Err(join)) => Err(self.ctx.protocol(format!("the input call failed: {join}"))),
            Ok(Ok(result)) => result,
        }
    }
}

impl Drop for InputStream {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            call.abort();
        }
    }
}
