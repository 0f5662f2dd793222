//! Process streams read on the calling thread: [`Sandbox::start_blocking`].
//!
//! [`Sandbox::start`] sends its request on the async runtime, whose connection task reads
//! the response and hands each piece to the task that waits for it: a command crosses
//! threads several times, and each crossing is a wake-up of a thread that was asleep. Here
//! the calling thread writes the request on a connection it takes from a pool, and reads the
//! events from that socket itself, blocking: no runtime, no other thread. After the end the
//! connection goes back to the pool for the next command.
//!
//! Plain HTTP/1.1 only, with no proxy: an envd reached without TLS (e2b-local, or a
//! self-hosted E2B on a private network). [`Sandbox::can_start_blocking`] says whether a
//! sandbox qualifies; E2B's cloud (HTTPS) takes [`Sandbox::start`].
//!
//! [`Sandbox::start`]: crate::Sandbox::start
//! [`Sandbox::start_blocking`]: crate::Sandbox::start_blocking
//! [`Sandbox::can_start_blocking`]: crate::Sandbox::can_start_blocking

mod wire;

use std::fmt;
use std::io::{self, Read as _, Write as _};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use http::HeaderValue;

use crate::connections::Connections;
use crate::error::{Error, TransportStage};
use crate::framing::{EnvelopeDecoder, end_of_stream};
use crate::http::Ctx;
use crate::process::{EventOrder, ProcessEvent, parse_event};

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 16 * 1024;
/// Bytes of an error response's body kept for the error.
const ERROR_BODY_LIMIT: usize = 64 * 1024;
/// How long the health probe of a stream that broke off may take.
const PROBE_LIMIT: Duration = Duration::from_secs(5);

/// Where a sandbox's envd is reached by the blocking path.
#[derive(Clone, Debug)]
pub(crate) struct Route {
    /// `host:port`, what is connected to and sent as `Host`.
    authority: String,
    /// The base URL's path, without its trailing `/`, put before each request's path.
    prefix: String,
}

impl Route {
    /// The route of an envd base URL, when it is plain HTTP without credentials or a query.
    pub(crate) fn of(base: &str) -> Option<Route> {
        let url = url::Url::parse(base).ok()?;
        if url.scheme() != "http"
            || !url.username().is_empty()
            || url.password().is_some()
            || url.query().is_some()
            || url.fragment().is_some()
        {
            return None;
        }
        let host = url.host_str()?;
        let port = url.port_or_known_default()?;
        Some(Route {
            authority: format!("{host}:{port}"),
            prefix: url.path().trim_end_matches('/').to_owned(),
        })
    }
}

/// One request of the blocking path: where it goes, what it says, and how long it may take.
pub(crate) struct Request<'a> {
    pub(crate) ctx: Ctx,
    pub(crate) route: &'a Route,
    pub(crate) connections: &'a Arc<Connections>,
    /// `POST` or `GET`.
    pub(crate) method: &'static str,
    /// The path after the route's prefix.
    pub(crate) path: &'a str,
    /// Headers every request to this sandbox carries (its id, port, access token).
    pub(crate) routing: Vec<(&'static str, HeaderValue)>,
    /// Headers of this request only.
    pub(crate) headers: Vec<(&'static str, HeaderValue)>,
    pub(crate) body: &'a [u8],
    /// How long the response head may take (for the error when it passes).
    pub(crate) limit: Duration,
    /// When that is.
    pub(crate) deadline: Instant,
}

/// A connection with a response coming on it.
struct Exchange {
    stream: TcpStream,
    buf: BytesMut,
    head: wire::Head,
}

impl Request<'_> {
    /// Sends the request and reads the response head. A request written on a reused
    /// connection that the server closed meanwhile is written again on a new one (the server
    /// read none of it, or not all: it acted on nothing); once written whole, it is never
    /// sent again.
    fn exchange(&self) -> Result<Exchange, Error> {
        let authority = &self.route.authority;
        let mut headers: Vec<(&str, &[u8])> =
            Vec::with_capacity(self.routing.len() + self.headers.len());
        for (name, value) in self.routing.iter().chain(&self.headers) {
            headers.push((name, value.as_bytes()));
        }
        let path = format!("{}{}", self.route.prefix, self.path);
        let bytes = wire::request(self.method, &path, authority, &headers, self.body);
        let stream = loop {
            let (stream, reused) = match self.connections.checkout(authority) {
                Some(stream) => (stream, true),
                None => match self.connections.connect(authority) {
                    Ok(stream) => (stream, false),
                    Err(error) => {
                        return Err(self.ctx.transport_io(
                            TransportStage::Connect,
                            authority,
                            &error,
                        ));
                    }
                },
            };
            match (&stream).write_all(&bytes) {
                Ok(()) => break stream,
                Err(_) if reused => continue,
                Err(error) => {
                    return Err(self
                        .ctx
                        .transport_io(TransportStage::Request, authority, &error));
                }
            }
        };
        let mut buf = BytesMut::new();
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            match wire::head(&mut buf) {
                Err(detail) => return Err(self.ctx.protocol(detail)),
                Ok(Some(head)) => return Ok(Exchange { stream, buf, head }),
                Ok(None) => {}
            }
            let Some(left) = self
                .deadline
                .checked_duration_since(Instant::now())
                .filter(|left| !left.is_zero())
            else {
                return Err(self.ctx.deadline(self.limit));
            };
            stream.set_read_timeout(Some(left)).map_err(|error| {
                self.ctx
                    .transport_io(TransportStage::Request, authority, &error)
            })?;
            match (&stream).read(&mut chunk) {
                Ok(0) => {
                    let closed = io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection before answering",
                    );
                    return Err(self
                        .ctx
                        .transport_io(TransportStage::Request, authority, &closed));
                }
                Ok(read) => buf.extend_from_slice(&chunk[..read]),
                Err(error) if is_timeout(&error) => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    return Err(self
                        .ctx
                        .transport_io(TransportStage::Request, authority, &error));
                }
            }
        }
    }

    /// The error a non-success response stands for, its body read (up to a cap, briefly).
    fn failure(&self, mut exchange: Exchange) -> Error {
        let mut body = Vec::new();
        let mut chunk = [0u8; READ_CHUNK];
        let until = Instant::now() + PROBE_LIMIT;
        loop {
            let taken = exchange.head.framing.take(&mut exchange.buf, &mut |bytes| {
                let room = ERROR_BODY_LIMIT.saturating_sub(body.len());
                body.extend_from_slice(&bytes[..bytes.len().min(room)]);
            });
            if taken.is_err() || exchange.head.framing.is_done() || body.len() >= ERROR_BODY_LIMIT {
                break;
            }
            let Some(left) = until
                .checked_duration_since(Instant::now())
                .filter(|left| !left.is_zero())
            else {
                break;
            };
            if exchange.stream.set_read_timeout(Some(left)).is_err() {
                break;
            }
            match (&exchange.stream).read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(read) => exchange.buf.extend_from_slice(&chunk[..read]),
            }
        }
        self.ctx.response_error(exchange.head.status, &body)
    }
}

fn is_timeout(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// What [`BlockingProcessStream::next_event`] gave.
#[derive(Debug)]
pub enum Next {
    /// The next event (never `Start`: that one was read by the start).
    Event(ProcessEvent),
    /// The time given passed first; the stream is as it was, ask again.
    Waited,
}

/// A started process's events, read on the calling thread ([`crate::Sandbox::start_blocking`]).
///
/// Output comes as it arrives, then `End`; after it, [`finish`](Self::finish) reads the end
/// of the response so the connection serves the next command. Dropping the stream earlier
/// closes its connection; the process keeps running. Memory is bounded as for
/// [`crate::ProcessStream`]: one frame (capped by [`crate::Limits::max_frame_bytes`]) plus
/// one read.
pub struct BlockingProcessStream {
    stream: Arc<TcpStream>,
    exchange_buf: BytesMut,
    framing: wire::Framing,
    keep_alive: bool,
    decoder: EnvelopeDecoder,
    order: EventOrder,
    ctx: Ctx,
    pid: u32,
    /// The longest silence allowed (keepalives arrive well within it).
    idle: Duration,
    /// The read timeout the socket has now, to set it only when it changes.
    timeout: Option<Duration>,
    /// Everything needed to probe the sandbox's health when the stream breaks off.
    probe: Option<Probe>,
    route: Route,
    connections: Arc<Connections>,
    /// Set once the stream failed or ended: nothing more is read.
    over: bool,
}

struct Probe {
    routing: Vec<(&'static str, HeaderValue)>,
}

impl fmt::Debug for BlockingProcessStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockingProcessStream")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// Ends a read in progress on a [`BlockingProcessStream`] from another thread: the connection
/// is shut down, so the reader's next (or current) read fails at once. It does not hold the
/// connection: once the stream is over (its connection back in the pool), it does nothing.
#[derive(Clone)]
pub struct Interrupter {
    stream: Weak<TcpStream>,
}

impl fmt::Debug for Interrupter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Interrupter").finish_non_exhaustive()
    }
}

impl Interrupter {
    /// Shuts the connection down; the reader's read fails (with an error, as a broken
    /// connection does) and the connection is not reused.
    pub fn interrupt(&self) {
        if let Some(stream) = self.stream.upgrade() {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Starts a process: sends `request`, checks the answer is a Connect stream, and reads up to
/// the `Start` event.
pub(crate) fn start(
    request: &Request<'_>,
    idle: Duration,
    max_frame: usize,
) -> Result<BlockingProcessStream, Error> {
    let exchange = request.exchange()?;
    if exchange.head.status != 200 {
        return Err(request.failure(exchange));
    }
    if !exchange
        .head
        .content_type
        .starts_with("application/connect+json")
    {
        return Err(request.ctx.protocol(format!(
            "expected application/connect+json, got '{}'",
            exchange.head.content_type
        )));
    }
    let mut reader = BlockingProcessStream {
        stream: Arc::new(exchange.stream),
        exchange_buf: exchange.buf,
        framing: exchange.head.framing,
        keep_alive: exchange.head.keep_alive,
        decoder: EnvelopeDecoder::new(max_frame),
        order: EventOrder::default(),
        ctx: request.ctx.clone(),
        pid: 0,
        idle,
        timeout: None,
        probe: Some(Probe {
            routing: request.routing.clone(),
        }),
        route: request.route.clone(),
        connections: Arc::clone(request.connections),
        over: false,
    };
    // The start event was asked for within the request's deadline, as on the async path.
    match reader.read_event(Some(request.deadline))? {
        Some(ProcessEvent::Start { pid }) => {
            reader.pid = pid;
            Ok(reader)
        }
        Some(_) => Err(request.ctx.protocol("first event is not a start event")),
        None => Err(request.ctx.deadline(request.limit)),
    }
}

impl BlockingProcessStream {
    /// The pid of the process inside the sandbox.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A handle that ends this stream's reads from another thread.
    pub fn interrupter(&self) -> Interrupter {
        Interrupter {
            stream: Arc::downgrade(&self.stream),
        }
    }

    /// The next event, waiting at most until `until` (`None`: as long as the stream's
    /// allowed silence). An error ends the stream: the server broke the protocol or ended
    /// with an error (a `deadline_exceeded` process deadline, for one), the connection
    /// failed or was [interrupted](Interrupter), or nothing came for the allowed silence.
    /// Asking after `End` is a protocol error.
    pub fn next_event(&mut self, until: Option<Instant>) -> Result<Next, Error> {
        match self.read_event(until)? {
            Some(event) => Ok(Next::Event(event)),
            None => Ok(Next::Waited),
        }
    }

    /// Reads what follows the `End` event (the end-of-stream message and the end of the
    /// response) for at most `limit`, and gives the connection back for the next request
    /// when all is clean. Returns whether it was.
    pub fn finish(mut self, limit: Duration) -> bool {
        if self.over || !self.order.ended() {
            return false;
        }
        let until = Instant::now() + limit;
        let clean = loop {
            match self.decoder.next_frame() {
                Ok(Some(frame)) if frame.is_end_stream() => {
                    break end_of_stream(&self.ctx, &frame.payload).is_ok();
                }
                Ok(Some(_)) | Err(_) => break false,
                Ok(None) => {}
            }
            match self.fill(Some(until)) {
                Ok(Filled::Bytes) => {}
                Ok(Filled::Waited | Filled::BodyEnd) | Err(_) => break false,
            }
        };
        if !clean || !self.keep_alive {
            return false;
        }
        // The body's own end (the last chunk) follows the message at once.
        while !self.framing.is_done() {
            match self.fill(Some(until)) {
                Ok(Filled::Bytes | Filled::BodyEnd) => {}
                Ok(Filled::Waited) | Err(_) => return false,
            }
        }
        if !self.exchange_buf.is_empty() || self.decoder_has_bytes() {
            return false;
        }
        let BlockingProcessStream {
            stream,
            route,
            connections,
            ..
        } = self;
        // Shared only while an interrupter is shutting it down: then it is not reused.
        match Arc::try_unwrap(stream) {
            Ok(stream) => {
                connections.checkin(&route.authority, stream);
                true
            }
            Err(_) => false,
        }
    }

    fn decoder_has_bytes(&mut self) -> bool {
        self.decoder.finish().is_err()
    }

    /// The next event; `None` when `until` passed first.
    fn read_event(&mut self, until: Option<Instant>) -> Result<Option<ProcessEvent>, Error> {
        if self.over || self.order.ended() {
            return Err(self.ctx.protocol("the stream has ended"));
        }
        let read = self.read_event_inner(until);
        if read.is_err() {
            self.over = true;
        }
        read
    }

    fn read_event_inner(&mut self, until: Option<Instant>) -> Result<Option<ProcessEvent>, Error> {
        loop {
            match self.decoder.next_frame() {
                Err(error) => return Err(self.ctx.protocol(error)),
                Ok(Some(frame)) if frame.is_end_stream() => {
                    end_of_stream(&self.ctx, &frame.payload)?;
                    let short = self.ctx.protocol("stream ended without an end event");
                    return Err(self.lost(short));
                }
                Ok(Some(frame)) => match parse_event(&frame.payload) {
                    Err(detail) => return Err(self.ctx.protocol(detail)),
                    // An event kind this client does not know (and keepalives) pass by.
                    Ok(None | Some(ProcessEvent::Keepalive)) => continue,
                    Ok(Some(event)) => return self.order.check(&self.ctx, event).map(Some),
                },
                Ok(None) => {}
            }
            match self.fill(until)? {
                Filled::Bytes => {}
                Filled::Waited => return Ok(None),
                Filled::BodyEnd => {
                    self.decoder
                        .finish()
                        .map_err(|error| self.ctx.protocol(error))?;
                    let short = self.ctx.protocol("stream ended without an end event");
                    return Err(self.lost(short));
                }
            }
        }
    }

    /// Reads more of the body into the decoder.
    fn fill(&mut self, until: Option<Instant>) -> Result<Filled, Error> {
        if self.framing.is_done() {
            return Ok(Filled::BodyEnd);
        }
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            // Body bytes that came with the head, or past a chunk line, go first.
            if !self.exchange_buf.is_empty() {
                let before = self.exchange_buf.len();
                let decoder = &mut self.decoder;
                self.framing
                    .take(&mut self.exchange_buf, &mut |bytes| decoder.push(bytes))
                    .map_err(|detail| self.ctx.protocol(detail))?;
                if self.exchange_buf.len() != before {
                    return Ok(Filled::Bytes);
                }
                if self.framing.is_done() {
                    return Ok(Filled::BodyEnd);
                }
            }
            // A wait shorter than the allowed silence is the caller's; a whole silence in one
            // read (each read begins after the last bytes) is the stream's failure.
            let (wait, callers) =
                match until.map(|until| until.saturating_duration_since(Instant::now())) {
                    Some(left) if left.is_zero() => return Ok(Filled::Waited),
                    Some(left) if left < self.idle => (left, true),
                    _ => (self.idle, false),
                };
            if self.timeout != Some(wait) {
                self.stream
                    .set_read_timeout(Some(wait))
                    .map_err(|error| self.broken(&error))?;
                self.timeout = Some(wait);
            }
            match (&*self.stream).read(&mut chunk) {
                Ok(0) if self.framing == wire::Framing::UntilClose => {
                    self.framing = wire::Framing::Done;
                    return Ok(Filled::BodyEnd);
                }
                Ok(0) => {
                    let closed = io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the connection closed inside the response",
                    );
                    let broken = self.broken(&closed);
                    return Err(self.lost(broken));
                }
                Ok(read) => self.exchange_buf.extend_from_slice(&chunk[..read]),
                Err(error) if is_timeout(&error) && callers => return Ok(Filled::Waited),
                Err(error) if is_timeout(&error) => return Err(self.ctx.deadline(self.idle)),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    let broken = self.broken(&error);
                    return Err(self.lost(broken));
                }
            }
        }
    }

    fn broken(&self, error: &io::Error) -> Error {
        self.ctx
            .transport_io(TransportStage::Body, &self.route.authority, error)
    }

    /// The error for a stream that broke off (`broken`): when the sandbox turns out to be
    /// gone (envd's `/health` answered by the proxy's "not found"), that. Probes once.
    fn lost(&mut self, broken: Error) -> Error {
        let Some(probe) = self.probe.take() else {
            return broken;
        };
        let request = Request {
            ctx: self.ctx.clone(),
            route: &self.route,
            connections: &self.connections,
            method: "GET",
            path: "/health",
            routing: probe.routing,
            headers: Vec::new(),
            body: &[],
            limit: PROBE_LIMIT,
            deadline: Instant::now() + PROBE_LIMIT,
        };
        let gone = match request.exchange() {
            Ok(exchange) if exchange.head.status == 502 => {
                request.failure(exchange).is_sandbox_gone()
            }
            _ => false,
        };
        if gone {
            self.ctx.sandbox_ended(&broken)
        } else {
            broken
        }
    }
}

enum Filled {
    /// Bytes went to the decoder.
    Bytes,
    /// `until` passed first.
    Waited,
    /// The body ended.
    BodyEnd,
}
