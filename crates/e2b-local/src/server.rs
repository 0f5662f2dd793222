//! The [`Server`] handle (start, shutdown, accessors) and `dispatch`, where every
//! request enters: admin, envd (by header or pre-signed URL) or REST, and is counted in
//! flight until its answer's body is done.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use http::HeaderValue;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::app::App;
use crate::body::SharedBody;
use crate::clock::Clock;
use crate::config::{ApiKeyPolicy, ServerConfig};
use crate::conn::ConnSocket;
use crate::error::Error;
use crate::fault_state::FaultState;
use crate::faults::{self, Faults, FaultyListener};
use crate::isolation::{Isolation, SandboxUser};
use crate::plane::Plane;
use crate::requests::{RequestCounter, RequestCounts};
use crate::secrets::Secrets;
use crate::snapshots::Snapshots;
use crate::store::Store;
use crate::{envd, rest};

/// A running e2b-local server. Dropping it kills every sandbox process and stops
/// serving; [`Server::shutdown`] does the same and waits for the server to finish.
pub struct Server {
    app: Arc<App>,
    addr: SocketAddr,
    state_dir: PathBuf,
    running: Option<Running>,
    // Declared last: removed only after everything above is gone.
    _temp_dir: Option<tempfile::TempDir>,
}

struct Running {
    stop: oneshot::Sender<()>,
    serve: JoinHandle<std::io::Result<()>>,
    sweeper: JoinHandle<()>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .field("state_dir", &self.state_dir)
            .field("isolation", &self.app.isolation)
            .finish_non_exhaustive()
    }
}

/// How often idle servers apply lease expiry (requests apply it too, lazily).
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// How long shutdown waits for open connections before cutting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// E2B's public templates every team can use besides `base`: the code interpreter's
/// (served here by [`crate::interpreter`], as for any template).
const PUBLIC_TEMPLATES: &[&str] = &["code-interpreter-v1"];

fn with_public_templates(configured: &[String]) -> Vec<String> {
    let mut templates = configured.to_vec();
    for name in PUBLIC_TEMPLATES {
        if !templates.iter().any(|t| t == name) {
            templates.push((*name).to_owned());
        }
    }
    templates
}

impl Server {
    /// Starts a server with `config`; it is listening when this returns.
    pub async fn start(config: ServerConfig) -> Result<Server, Error> {
        if !config.templates.iter().any(|t| t == "base") {
            return Err(Error::InvalidConfig {
                reason: "the template list must include \"base\"".to_owned(),
            });
        }
        if let ApiKeyPolicy::Exact(key) = &config.api_key
            && key.trim().is_empty()
        {
            return Err(Error::InvalidConfig {
                reason: "the required API key is empty".to_owned(),
            });
        }
        let (temp_dir, state_dir) = match &config.state_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| Error::StateDir {
                    operation: "create state directory",
                    path: dir.clone(),
                    source,
                })?;
                (None, dir.clone())
            }
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("e2b-local-")
                    .tempdir()
                    .map_err(|source| Error::StateDir {
                        operation: "create temporary state directory",
                        path: std::env::temp_dir(),
                        source,
                    })?;
                let path = temp.path().to_path_buf();
                (Some(temp), path)
            }
        };
        // A bad --upstream-ca stops the start: it is the operator's mistake to see at once.
        let upstream = crate::egress::upstream_tls(&config.upstream_ca)
            .map_err(|reason| Error::InvalidConfig { reason })?;
        let etc_dir = state_dir.join("etc");
        let mode = config.isolation;
        let isolation = tokio::task::spawn_blocking(move || Isolation::prepare(mode, &etc_dir))
            .await
            .map_err(|e| Error::Serve {
                operation: "prepare isolation",
                source: std::io::Error::other(e),
            })?
            .map_err(|source| Error::StateDir {
                operation: "prepare command isolation",
                path: state_dir.join("etc"),
                source,
            })?;
        // Before egress: header rules resolve secret placeholders at each request.
        let secrets = Arc::new(Secrets::open(&state_dir, config.clock.clone()).map_err(
            |source| Error::StateDir {
                operation: "open secrets",
                path: state_dir.join("secrets.json"),
                source,
            },
        )?);
        let identity = Arc::new(
            crate::identity::Issuer::open(&state_dir, config.clock.clone()).map_err(|source| {
                Error::StateDir {
                    operation: "open the workload identity key",
                    path: state_dir.join("identity-key.p8"),
                    source,
                }
            })?,
        );
        let egress = if matches!(isolation, Isolation::Namespace { .. }) {
            crate::egress::Egress::start(&crate::egress::Setup {
                state_dir: &state_dir,
                upstream,
                add_hosts: &config.add_hosts,
                secrets: Arc::clone(&secrets),
                identity: Arc::clone(&identity),
            })
            .await
        } else {
            Err(crate::egress::PATH_MAPPING.to_owned())
        };
        if let Err(why) = &egress {
            tracing::warn!(%why, "egress rules (network.allowOut/denyOut) will be refused");
        }
        let store = Store::open(
            &state_dir,
            config.clock.clone(),
            isolation.owner(SandboxUser::User),
            isolation.ns_capability(),
            egress.as_ref().err().cloned(),
        )
        .map_err(|source| Error::StateDir {
            operation: "open sandbox records",
            path: state_dir.join("sandboxes"),
            source,
        })?;
        store.set_max_running(config.max_running);
        let snapshots = Snapshots::open(&state_dir, config.clock.clone()).map_err(|source| {
            Error::StateDir {
                operation: "open snapshots",
                path: state_dir.join("snapshots"),
                source,
            }
        })?;
        let kernel_python = kernel_python(&config, &isolation)?;
        let volumes =
            crate::volumes::Volumes::open(&state_dir).map_err(|source| Error::StateDir {
                operation: "open volumes",
                path: state_dir.join("volumes"),
                source,
            })?;
        let builds =
            crate::builds::Builds::open(&state_dir, config.clock.clone()).map_err(|source| {
                Error::StateDir {
                    operation: "open template builds",
                    path: state_dir.join("template-files"),
                    source,
                }
            })?;
        let app = Arc::new(App {
            store,
            builds,
            volumes,
            kernel_python,
            identity,
            snapshots,
            secrets,
            clock: config.clock.clone(),
            faults: FaultState::new(config.latency),
            api_key: config.api_key.clone(),
            templates: with_public_templates(&config.templates),
            isolation: Arc::new(isolation),
            requests: RequestCounter::default(),
            egress: egress.ok(),
            create_keys: std::sync::Mutex::default(),
            interpreters: crate::kernels::Interpreters::default(),
        });
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: config.listen,
            source,
        })?;
        if let Some(egress) = &app.egress {
            egress.proxy.set_api_addr(addr);
        }
        app.identity.set_url(format!("http://{addr}"));
        app.builds.set_url(format!("http://{addr}"));
        let router = Router::new()
            .fallback(dispatch)
            .with_state(Arc::clone(&app));
        let (stop, stopped) = oneshot::channel::<()>();
        let listener = FaultyListener {
            inner: listener,
            faults: Arc::clone(&app),
        };
        let serve = tokio::spawn(async move {
            axum::serve(
                listener,
                router.into_make_service_with_connect_info::<ConnSocket>(),
            )
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
        });
        let sweep_app = Arc::clone(&app);
        let sweeper = tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                sweep_app.store.sweep();
            }
        });
        tracing::info!(%addr, isolation = ?app.isolation, state_dir = %state_dir.display(), "e2b-local listening");
        Ok(Server {
            app,
            addr,
            state_dir,
            running: Some(Running {
                stop,
                serve,
                sweeper,
            }),
            _temp_dir: temp_dir,
        })
    }

    /// Starts on 127.0.0.1 with a free port and the [`ServerConfig::loopback`] settings.
    pub async fn start_loopback() -> Result<Server, Error> {
        Server::start(ServerConfig::loopback()).await
    }

    /// `http://127.0.0.1:PORT`: both the E2B_API_URL and the E2B_SANDBOX_URL to use.
    pub fn url(&self) -> String {
        let ip = if self.addr.ip().is_unspecified() {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            self.addr.ip()
        };
        format!("http://{}", SocketAddr::new(ip, self.addr.port()))
    }

    /// The bound address (with the real port when port 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The knobs (latency, failures, drops, vanishing sandboxes).
    pub fn faults(&self) -> Faults {
        Faults {
            app: Arc::clone(&self.app),
        }
    }

    /// The clock driving leases; [`Clock::advance`] makes leases expire without waiting.
    pub fn clock(&self) -> Clock {
        self.app.clock.clone()
    }

    /// A snapshot of the requests received so far, by route (see [`RequestCounts`] for the
    /// labels). Diff two snapshots with [`RequestCounts::since`], or start afresh with
    /// [`Server::reset_requests`]. Also served at `GET /_e2b_local/requests`.
    pub fn requests(&self) -> RequestCounts {
        self.app.requests.snapshot()
    }

    /// Sets every request count back to zero (also `POST /_e2b_local/requests/reset`).
    pub fn reset_requests(&self) {
        self.app.requests.reset();
    }

    /// Sets (or with `None` lifts) the limit of concurrently running sandboxes
    /// (`--max-running`; also `POST /_e2b_local/limits`). Lowering it stops nothing.
    pub fn set_max_running(&self, max_running: Option<u32>) {
        self.app.store.set_max_running(max_running);
    }

    /// The limit of concurrently running sandboxes and how many run now.
    pub fn running_limit(&self) -> (Option<u32>, usize) {
        self.app.store.running_limit()
    }

    /// The state directory in use (a temporary one unless configured).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// The host directory a sandbox's commands see as `/home/user` (it may not exist).
    pub fn sandbox_home(&self, sandbox_id: &str) -> PathBuf {
        self.app.store.home_dir(sandbox_id)
    }

    /// Kills every sandbox process, stops accepting, and waits (briefly) for open
    /// connections. Sandbox records stay in a configured state directory.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        let Some(running) = self.running.take() else {
            return Ok(());
        };
        running.sweeper.abort();
        // Killing the processes ends their streams, so graceful shutdown can finish.
        self.app.store.kill_all_processes();
        let _ = running.stop.send(());
        let mut serve = running.serve;
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut serve).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(source))) => Err(Error::Serve {
                operation: "serve connections",
                source,
            }),
            Ok(Err(join)) => Err(Error::Serve {
                operation: "join server task",
                source: std::io::Error::other(join),
            }),
            Err(_elapsed) => {
                serve.abort();
                Ok(())
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            self.app.store.kill_all_processes();
            running.sweeper.abort();
            let _ = running.stop.send(());
            running.serve.abort();
        }
    }
}

/// Every request enters here: admin, envd (by header or pre-signed URL) or REST. The
/// body is shared so that what a handler left unread is read before the answer goes out
/// (see [`crate::body`]); every answer carries `Server-Timing` and is logged at debug.
async fn dispatch(State(app): State<Arc<App>>, request: Request) -> Response {
    let started = Instant::now();
    let counted = !request.uri().path().starts_with("/_e2b_local/");
    // Dropped with this future if the client goes away before the answer.
    let in_flight = counted.then(|| InFlight::enter(Arc::clone(&app)));
    let (parts, body) = request.into_parts();
    let body = SharedBody::new(body);
    let request = Request::from_parts(parts, Body::new(body.clone()));
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let (mut response, sandbox) = route(Arc::clone(&app), request).await;
    if !body.drain().await {
        response
            .headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    let elapsed = started.elapsed();
    let millis = elapsed.as_secs_f64() * 1000.0;
    if let Ok(value) = HeaderValue::from_str(&format!("app;dur={millis:.3}")) {
        response.headers_mut().insert("server-timing", value);
    }
    if let Some(in_flight) = in_flight {
        // Counted requests add their time in the server once the answer's body is done.
        response = response.map(|body| Body::new(TimedBody::new(body, started, in_flight)));
    }
    // The path only: a pre-signed URL's query carries its signature, and the API key
    // and access token travel in headers, which are never logged.
    tracing::debug!(
        target: "e2b_local::request",
        %method,
        %path,
        sandbox = %sandbox.as_deref().unwrap_or("-"),
        status = response.status().as_u16(),
        duration_ms = format_args!("{millis:.3}"),
        "request"
    );
    response
}

/// Routes one request; also names the sandbox it concerned, for the request log.
async fn route(app: Arc<App>, request: Request) -> (Response, Option<String>) {
    let path = request.uri().path();
    if path.starts_with("/_e2b_local/") {
        // Admin routes are never subject to faults or latency.
        let sandbox = rest::sandbox_in_path(path);
        return (rest::handle(app, request).await, sandbox);
    }
    let mut sandbox = request
        .headers()
        .get("e2b-sandbox-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if sandbox.is_none() && path == "/files" {
        sandbox = envd::signing::find_signed_sandbox(&app, &request);
        if sandbox.is_none() && has_signature(&request) {
            // A signed URL no running sandbox signed: envd's 401, not a REST 404.
            app.requests.record(Plane::Envd, request.method(), path);
            return (envd::signing::no_signer(), None);
        }
    }
    let plane = if sandbox.is_some() {
        Plane::Envd
    } else {
        Plane::Rest
    };
    let logged = sandbox.clone().or_else(|| rest::sandbox_in_path(path));
    // Counted on arrival, before faults: a request failed by a fault rule was still sent.
    app.requests.record(plane, request.method(), path);
    if let Some(id) = &sandbox {
        // A paused sandbox created with autoResume wakes for this request, as on E2B.
        app.store.wake_on_traffic(id);
    }
    let handler_app = Arc::clone(&app);
    let response = faults::apply(&app, plane, request, move |request| {
        Box::pin(async move {
            match sandbox {
                Some(id) if crate::interpreter::is_for(&request) => {
                    crate::interpreter::handle(handler_app, id, request).await
                }
                Some(id) => envd::handle(handler_app, id, request).await,
                None if crate::volumes::content::is_for(request.uri().path()) => {
                    crate::volumes::content::handle(handler_app, request).await
                }
                None => rest::handle(handler_app, request).await,
            }
        })
    })
    .await;
    (response, logged)
}

fn has_signature(request: &Request) -> bool {
    crate::parse::query_pairs(request.uri().query().unwrap_or_default())
        .iter()
        .any(|(key, _)| key == "signature")
}

/// A counted request in flight, from the moment it arrives (before its handler ran: a
/// `Start` spawns its process inside the handler) until its answer's body is dropped. It
/// holds the app, so the app outlives every answer still being sent.
struct InFlight(Arc<App>);

impl InFlight {
    fn enter(app: Arc<App>) -> InFlight {
        app.requests.arrived();
        InFlight(app)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.requests.left();
    }
}

/// An answer's body that adds the request's server time to the counter once it is dropped:
/// after its last byte went out, or when the client went away. A streamed answer (a
/// process's events) thus counts until its end, not only until its headers.
struct TimedBody {
    inner: Body,
    started: Instant,
    in_flight: InFlight,
}

impl TimedBody {
    fn new(inner: Body, started: Instant, in_flight: InFlight) -> TimedBody {
        TimedBody {
            inner,
            started,
            in_flight,
        }
    }
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for TimedBody {
    fn drop(&mut self) {
        self.in_flight
            .0
            .requests
            .add_server_time(self.started.elapsed());
    }
}

/// The program the code interpreter's kernels run: `kernel_python` when set (checked), else
/// `python3` from the sandbox's `PATH`.
fn kernel_python(config: &ServerConfig, isolation: &Isolation) -> Result<String, Error> {
    let Some(path) = &config.kernel_python else {
        return Ok("python3".to_owned());
    };
    let refuse = |why: &str| Error::InvalidConfig {
        reason: format!("kernel_python {}: {why}", path.display()),
    };
    if !path.is_absolute() {
        return Err(refuse("not an absolute path"));
    }
    let hidden = path.starts_with("/home") || path.starts_with("/tmp");
    if matches!(isolation, Isolation::Namespace { .. }) && hidden {
        return Err(refuse(
            "commands run in a mount namespace, which replaces /home and /tmp: the kernels \
             would not find it (put it elsewhere, or use path mapping)",
        ));
    }
    if !path.is_file() {
        return Err(refuse("no such file"));
    }
    path.to_str()
        .map(str::to_owned)
        .ok_or_else(|| refuse("not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_python_is_an_absolute_file_the_kernels_can_see() {
        let mut config = ServerConfig::loopback();
        assert_eq!(
            kernel_python(&config, &Isolation::PathMapping).unwrap(),
            "python3"
        );
        for (path, why) in [
            ("bin/python", "absolute"),
            ("/nonexistent/bin/python", "no such file"),
        ] {
            config.kernel_python = Some(PathBuf::from(path));
            let err = kernel_python(&config, &Isolation::PathMapping).unwrap_err();
            assert!(err.to_string().contains(why), "{path}: {err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let python = dir.path().join("python");
        std::fs::write(&python, "").unwrap();
        config.kernel_python = Some(python.clone());
        assert_eq!(
            kernel_python(&config, &Isolation::PathMapping).unwrap(),
            python.to_str().unwrap()
        );
    }
}
