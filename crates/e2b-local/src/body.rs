//! The request body as `dispatch` hands it to handlers: shared, so that whatever a
//! handler left unread can be read after it answered and before the answer goes out.
//!
//! Like Go's net/http (which real envd runs on): an answer decided before the body was
//! read (a 400 for a rejected upload, a 401, an injected fault) first reads a bounded
//! remainder of the body, so a client still sending gets the answer instead of a reset,
//! and a body left short of its end (a multipart epilogue, a chunked body's final
//! `0\r\n\r\n` arriving in a later packet) is read to the end, so the keep-alive
//! connection is at the start of the next request. A remainder over the bound, or one
//! that does not arrive in time, answers with `Connection: close` instead.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, HttpBody};
use bytes::Bytes;
use http_body_util::BodyExt;

/// Largest unread remainder read and thrown away after an answer (Go's bound).
pub(crate) const DRAIN_LIMIT: usize = 256 * 1024;

/// How long the remainder may take to arrive before the connection is given up.
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// One request body, readable by the handler and afterwards by `dispatch`.
#[derive(Clone)]
pub(crate) struct SharedBody {
    inner: Arc<Mutex<Body>>,
}

impl std::fmt::Debug for SharedBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedBody")
    }
}

impl SharedBody {
    pub(crate) fn new(body: Body) -> SharedBody {
        SharedBody {
            inner: Arc::new(Mutex::new(body)),
        }
    }

    /// Reads and discards what is left of the body, up to [`DRAIN_LIMIT`] bytes and
    /// [`DRAIN_TIME`]; true when the body's end was reached (the connection is reusable).
    pub(crate) async fn drain(&self) -> bool {
        let mut rest = self.clone();
        let read = async move {
            let mut read = 0usize;
            loop {
                match rest.frame().await {
                    None => return true,
                    Some(Err(_)) => return false,
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref() {
                            read = read.saturating_add(data.len());
                            if read > DRAIN_LIMIT {
                                return false;
                            }
                        }
                    }
                }
            }
        };
        tokio::time::timeout(DRAIN_TIME, read)
            .await
            .unwrap_or(false)
    }
}

impl HttpBody for SharedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let mut body = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        Pin::new(&mut *body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .size_hint()
    }
}
