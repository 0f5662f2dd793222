//! `process.Process/StreamInput`: a client stream of input for one process, as envd
//! serves it. The first message (`start`) selects the process; `data` messages go to its
//! stdin (or terminal) in order as they arrive; `keepalive` does nothing. The one answer
//! (an empty message, or the error that stopped the stream) comes after the client ends
//! its stream.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::{Buf, Bytes, BytesMut};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;

use super::connect::{self, Code, ConnectError, END_STREAM, MAX_REQUEST_BYTES};
use super::ctx::Ctx;
use super::process::{InputMsg, Selector, write_input};
use crate::process_table::Proc;

/// One `StreamInputRequest`: exactly one of its events.
#[derive(Debug, Default, Deserialize)]
struct StreamInputRequest {
    #[serde(default)]
    start: Option<StartEvent>,
    #[serde(default)]
    data: Option<DataEvent>,
    #[serde(default)]
    keepalive: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
struct StartEvent {
    #[serde(default)]
    process: Selector,
}

#[derive(Debug, Default, Deserialize)]
struct DataEvent {
    #[serde(default)]
    input: InputMsg,
}

/// Serves one StreamInput call.
pub(crate) async fn handle(ctx: Ctx, request: Request) -> Response {
    if !connect::is_stream_request(request.headers()) {
        return connect::unsupported_media_type();
    }
    let outcome = consume(&ctx, request.into_body()).await;
    let mut body = BytesMut::new();
    match outcome {
        Ok(()) => {
            body.extend_from_slice(&connect::frame(&json!({})));
            body.extend_from_slice(&connect::end_frame(None));
        }
        Err(error) => body.extend_from_slice(&connect::end_frame(Some(&error))),
    }
    connect::stream_headers(Response::new(Body::from(body.freeze())))
}

/// Reads the client's envelopes as they arrive and acts on each.
async fn consume(ctx: &Ctx, body: Body) -> Result<(), ConnectError> {
    let mut chunks = body.into_data_stream();
    let mut buffer = BytesMut::new();
    let mut target: Option<Arc<Proc>> = None;
    loop {
        while let Some((flags, payload)) = next_envelope(&mut buffer)? {
            if flags & END_STREAM != 0 {
                continue;
            }
            let message: StreamInputRequest = connect::decode(&payload)?;
            apply(ctx, &mut target, message).await?;
        }
        match chunks.next().await {
            Some(Ok(chunk)) => buffer.extend_from_slice(&chunk),
            Some(Err(e)) => {
                return Err(ConnectError::new(
                    Code::Unknown,
                    format!("error streaming input: {e}"),
                ));
            }
            None if buffer.is_empty() => return Ok(()),
            None => {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    "truncated envelope",
                ));
            }
        }
    }
}

/// Takes one complete envelope off the front of `buffer`, if it holds one.
fn next_envelope(buffer: &mut BytesMut) -> Result<Option<(u8, Bytes)>, ConnectError> {
    if buffer.len() < 5 {
        return Ok(None);
    }
    let flags = buffer[0];
    let len = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
    if flags & 0x01 != 0 {
        return Err(ConnectError::new(
            Code::Internal,
            "compressed messages are not supported",
        ));
    }
    if len > MAX_REQUEST_BYTES {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            format!("message of {len} bytes is over the {MAX_REQUEST_BYTES} byte limit"),
        ));
    }
    if buffer.len() < 5 + len {
        return Ok(None);
    }
    buffer.advance(5);
    Ok(Some((flags, buffer.split_to(len).freeze())))
}

async fn apply(
    ctx: &Ctx,
    target: &mut Option<Arc<Proc>>,
    message: StreamInputRequest,
) -> Result<(), ConnectError> {
    match message {
        StreamInputRequest {
            start: Some(start), ..
        } => {
            let found = start.process.find_running(&ctx.sandbox.procs);
            *target = Some(
                found.ok_or_else(|| ConnectError::new(Code::NotFound, start.process.describe()))?,
            );
            Ok(())
        }
        StreamInputRequest {
            data: Some(data), ..
        } => {
            // envd has no process to write to before a start event.
            let Some(proc) = target.as_ref() else {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    "input before the start event that selects the process",
                ));
            };
            write_input(proc, &data.input).await
        }
        StreamInputRequest {
            keepalive: Some(_), ..
        } => Ok(()),
        StreamInputRequest { .. } => Err(ConnectError::new(
            Code::Unimplemented,
            "invalid event type <nil>",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_come_off_as_they_complete() {
        let first = connect::frame(&json!({"keepalive": {}}));
        let mut buffer = BytesMut::from(&first[..3]);
        assert!(next_envelope(&mut buffer).unwrap().is_none());
        buffer.extend_from_slice(&first[3..]);
        buffer.extend_from_slice(&connect::end_frame(None)[..2]);
        let (flags, payload) = next_envelope(&mut buffer).unwrap().unwrap();
        assert_eq!(flags, 0);
        assert_eq!(&payload[..], br#"{"keepalive":{}}"#);
        assert_eq!(buffer.len(), 2, "the next envelope's start stays buffered");
        assert!(next_envelope(&mut buffer).unwrap().is_none());
    }

    #[test]
    fn oversized_envelopes_are_refused_before_buffering() {
        let mut buffer = BytesMut::from(&[0u8, 0xff, 0xff, 0xff, 0xff][..]);
        assert!(next_envelope(&mut buffer).is_err());
    }
}
