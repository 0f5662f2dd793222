//! The code-interpreter service: what E2B's `code-interpreter` template serves on port
//! 49999 (`/execute` streaming a cell's output as JSON lines, `/contexts` to create, list,
//! restart and remove contexts, `/health`), served for every sandbox whose `python3` can
//! run the kernel, so the official `e2b-code-interpreter` SDK works offline.
//!
//! E2B runs Jupyter with IPython kernels; here each context is one small Python process
//! of the sandbox (`kernel.py`; the contexts and the kernels' lines are [`crate::kernels`])
//! that keeps the context's state, started on first use as root (as E2B's Jupyter runs),
//! hidden from envd's process list, paused, resumed and killed with the sandbox like every
//! process of it. Languages: `python`, `javascript`
//! (a `node` process the Python kernel hosts, `kernel.js`), `bash` and `java` (a JVM the
//! Python kernel hosts, running JShell in-process, `Kernel.java`, where the sandbox has
//! `java`).
//! What the kernel understands of IPython is in `kernel.py`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{Method, StatusCode};
use serde::Deserialize;
use tokio::sync::mpsc;

use crate::app::App;
use crate::envd::Ctx;
use crate::envd::process::{Launch, launch};
use crate::isolation::SandboxUser;
use crate::kernels::{Context, Contexts, Kernel, Said};
use crate::process_table::Listing;
use crate::reply::json_response;
use crate::token::new_uuid;

/// The kernel program (run with `python3 -u -c`; see `kernel.py`'s opening comment), after
/// the chart extractor its figures use (`charts.py`).
const KERNEL: &str = concat!(include_str!("charts.py"), "\n", include_str!("kernel.py"));

/// The JavaScript a `javascript` kernel hosts in `node` (its second argument).
const KERNEL_JS: &str = include_str!("kernel.js");

/// The JShell host a `java` kernel runs in `java` (its second argument).
const KERNEL_JAVA: &str = include_str!("Kernel.java");

/// The service's port in every sandbox (`E2b-Sandbox-Port`).
pub(crate) const PORT: u16 = 49999;

/// A silent cell writes this often, so a client that went away is noticed (a write to
/// its closed connection fails) and its cell interrupted, as E2B's service does.
const KEEPALIVE: Duration = Duration::from_secs(1);

/// How long an interrupted cell whose client went away may take to end before its kernel
/// is killed (its context then starts afresh).
const INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// The working directory of a context created without one.
const DEFAULT_CWD: &str = "/home/user";

/// The languages the kernel runs, by the names the service takes (`js` is javascript;
/// `typescript` and `r`, which E2B's template also has, are refused with a reason).
fn normalize_language(language: Option<&str>) -> Result<String, String> {
    let language = language
        .map(|l| l.trim().to_lowercase())
        .unwrap_or_default();
    match language.as_str() {
        "" | "python" => Ok("python".to_owned()),
        "js" | "javascript" => Ok("javascript".to_owned()),
        "bash" => Ok("bash".to_owned()),
        "java" => Ok("java".to_owned()),
        other => Err(format!(
            "no {other} kernel: e2b-local's code interpreter runs python, javascript, bash and java"
        )),
    }
}

/// Starts the kernel of `language` in `cwd`, as root like E2B's Jupyter.
async fn start_kernel(ctx: &Ctx, language: &str, cwd: &str) -> Result<Kernel, String> {
    let mut args = vec![
        "-u".to_owned(),
        "-c".to_owned(),
        KERNEL.to_owned(),
        language.to_owned(),
    ];
    match language {
        "javascript" => args.push(KERNEL_JS.to_owned()),
        "java" => args.push(KERNEL_JAVA.to_owned()),
        _ => {}
    }
    let envs = BTreeMap::new();
    let (proc, events) = launch(
        ctx,
        Launch {
            user: SandboxUser::Root,
            cmd: &ctx.app.kernel_python,
            args: &args,
            envs: &envs,
            cwd: Some(cwd),
            tag: None,
            stdin: true,
            terminal: None,
            deadline: None,
            listing: Listing::Service,
        },
    )
    .map_err(|e| e.message)?;
    Kernel::attach(proc, events, &ctx.sandbox.id)
        .await
        .map_err(|e| {
            format!("the {language} kernel failed to start (is python3 in the sandbox?): {e}")
        })
}

/// The context's running kernel, started (again) when there is none.
async fn ensure_kernel(
    ctx: &Ctx,
    context: &Context,
    kernel: &mut Option<Kernel>,
) -> Result<(), String> {
    if kernel.as_ref().is_some_and(Kernel::alive) {
        return Ok(());
    }
    let started = start_kernel(ctx, &context.language, &context.cwd).await?;
    context.started(&started);
    *kernel = Some(started);
    Ok(())
}

/// Creates a context and starts its kernel.
async fn create_context(
    ctx: &Ctx,
    language: String,
    cwd: String,
    default: bool,
) -> Result<Arc<Context>, String> {
    let context = Arc::new(Context::new(new_uuid(), language, cwd, default));
    {
        let mut kernel = context.kernel.lock().await;
        ensure_kernel(ctx, &context, &mut kernel).await?;
    }
    Ok(context)
}

/// The default context of `language`, created on first use; the list always starts with
/// python's and javascript's (where the sandbox has `node`), as E2B's service creates them
/// when it starts.
async fn default_of(
    ctx: &Ctx,
    contexts: &Contexts,
    language: &str,
) -> Result<Arc<Context>, String> {
    let mut list = contexts.list.lock().await;
    ensure_defaults(ctx, &mut list).await?;
    if let Some(found) = list.iter().find(|c| c.default && c.language == language) {
        return Ok(Arc::clone(found));
    }
    let context = create_context(ctx, language.to_owned(), DEFAULT_CWD.to_owned(), true).await?;
    list.push(Arc::clone(&context));
    Ok(context)
}

async fn ensure_defaults(ctx: &Ctx, list: &mut Vec<Arc<Context>>) -> Result<(), String> {
    if list.iter().any(|c| c.default && c.language == "python") {
        return Ok(());
    }
    let python = create_context(ctx, "python".to_owned(), DEFAULT_CWD.to_owned(), true).await?;
    list.insert(0, python);
    if !list.iter().any(|c| c.default && c.language == "javascript") {
        // Without node there is no javascript context, as on a template without it.
        if let Ok(javascript) =
            create_context(ctx, "javascript".to_owned(), DEFAULT_CWD.to_owned(), true).await
        {
            list.insert(1, javascript);
        }
    }
    Ok(())
}

/// Serves one request to port 49999 of the sandbox named in its header.
pub(crate) async fn handle(app: Arc<App>, sandbox_id: String, request: Request) -> Response {
    let Some(sandbox) = app.store.running(&sandbox_id) else {
        return crate::envd::sandbox_not_found(&sandbox_id);
    };
    if let Some(denied) = crate::envd::traffic_denied(&sandbox, request.headers()) {
        return denied;
    }
    let ctx = Ctx { app, sandbox };
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    if path == "/health" && method == Method::GET {
        return json_response(StatusCode::OK, &serde_json::json!("OK"));
    }
    let contexts = ctx.app.interpreters.of(&ctx.sandbox.id, &ctx.sandbox.procs);
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method, segments.as_slice()) {
        (Method::POST, ["execute"]) => execute(ctx, contexts, request).await,
        (Method::POST, ["contexts"]) => create(ctx, contexts, request).await,
        (Method::GET, ["contexts"]) => {
            let mut list = contexts.list.lock().await;
            if let Err(e) = ensure_defaults(&ctx, &mut list).await {
                return failed(format!("Failed to create context: {e}"));
            }
            let body: Vec<serde_json::Value> = list.iter().map(|c| c.json()).collect();
            json_response(StatusCode::OK, &serde_json::Value::Array(body))
        }
        (Method::POST, ["contexts", id, "restart"]) => {
            let Some(context) = contexts.find(id).await else {
                return not_found(id);
            };
            context.kill_kernel();
            let mut kernel = context.kernel.lock().await;
            *kernel = None;
            match ensure_kernel(&ctx, &context, &mut kernel).await {
                Ok(()) => json_response(StatusCode::OK, &serde_json::Value::Null),
                Err(e) => failed(format!("Failed to restart context {id}: {e}")),
            }
        }
        (Method::DELETE, ["contexts", id]) => {
            let mut list = contexts.list.lock().await;
            let Some(at) = list.iter().position(|c| c.id == *id) else {
                return not_found(id);
            };
            let context = list.remove(at);
            context.kill_kernel();
            json_response(StatusCode::OK, &serde_json::Value::Null)
        }
        _ => (StatusCode::NOT_FOUND, "Not Found").into_response(),
    }
}

fn not_found(id: &str) -> Response {
    (StatusCode::NOT_FOUND, format!("Context {id} not found")).into_response()
}

fn failed(message: String) -> Response {
    (StatusCode::INTERNAL_SERVER_ERROR, message).into_response()
}

fn invalid(message: String) -> Response {
    json_response(
        StatusCode::UNPROCESSABLE_ENTITY,
        &serde_json::json!({"detail": message}),
    )
}

async fn body_json<T: serde::de::DeserializeOwned>(request: Request) -> Result<T, Response> {
    let bytes = axum::body::to_bytes(request.into_body(), 16 * 1024 * 1024)
        .await
        .map_err(|e| invalid(format!("reading the body failed: {e}")))?;
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        Bytes::from_static(b"{}")
    } else {
        bytes
    };
    serde_json::from_slice(&bytes).map_err(|e| invalid(format!("invalid body: {e}")))
}

#[derive(Debug, Deserialize)]
struct CreateContext {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

async fn create(ctx: Ctx, contexts: Arc<Contexts>, request: Request) -> Response {
    let req: CreateContext = match body_json(request).await {
        Ok(req) => req,
        Err(response) => return response,
    };
    let language = match normalize_language(req.language.as_deref()) {
        Ok(language) => language,
        Err(e) => return failed(format!("Failed to create context: {e}")),
    };
    let cwd = req
        .cwd
        .filter(|cwd| !cwd.is_empty())
        .unwrap_or_else(|| DEFAULT_CWD.to_owned());
    let mut list = contexts.list.lock().await;
    if let Err(e) = ensure_defaults(&ctx, &mut list).await {
        return failed(format!("Failed to create context: {e}"));
    }
    match create_context(&ctx, language, cwd, false).await {
        Ok(context) => {
            list.push(Arc::clone(&context));
            json_response(StatusCode::OK, &context.json())
        }
        Err(e) => failed(format!("Failed to create context: {e}")),
    }
}

#[derive(Debug, Deserialize)]
struct ExecuteRequest {
    code: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
}

async fn execute(ctx: Ctx, contexts: Arc<Contexts>, request: Request) -> Response {
    let req: ExecuteRequest = match body_json(request).await {
        Ok(req) => req,
        Err(response) => return response,
    };
    let context = match (&req.context_id, &req.language) {
        (Some(_), Some(_)) => {
            return (
                StatusCode::BAD_REQUEST,
                "Only one of context_id or language can be provided",
            )
                .into_response();
        }
        (Some(id), None) => match contexts.find(id).await {
            Some(context) => context,
            None => return not_found(id),
        },
        (None, language) => {
            let language = match normalize_language(language.as_deref()) {
                Ok(language) => language,
                Err(e) => return failed(e),
            };
            match default_of(&ctx, &contexts, &language).await {
                Ok(context) => context,
                Err(e) => return failed(e),
            }
        }
    };
    let mut kernel = Arc::clone(&context.kernel).lock_owned().await;
    if let Err(e) = ensure_kernel(&ctx, &context, &mut kernel).await {
        return failed(e);
    }
    let cell = serde_json::json!({"code": req.code, "env": req.env_vars, "silent": false});
    if let Some(running) = kernel.as_ref()
        && let Err(e) = running.send(&cell).await
    {
        *kernel = None;
        return failed(e);
    }
    let (tx, mut rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let pauses = ctx.sandbox.procs.pause_watch();
    tokio::spawn(async move {
        let Some(running) = kernel.as_mut() else {
            return;
        };
        match stream_cell(running, tx, pauses).await {
            CellEnd::Ended => {}
            CellEnd::KernelGone => *kernel = None,
        }
    });
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let mut response = Response::new(Body::from_stream(stream));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-ndjson"),
    );
    response
}

enum CellEnd {
    Ended,
    KernelGone,
}

/// Passes the cell's output on until its end. A client that goes away interrupts the
/// cell (killing the kernel if it does not end soon), and the output is read to the end
/// regardless, so the next cell starts clean; a sandbox that dies or pauses under the
/// cell breaks the response off, as the VM's going does on E2B.
async fn stream_cell(
    kernel: &mut Kernel,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    mut pauses: crate::process_table::PauseWatch,
) -> CellEnd {
    let mut client = Some(tx);
    let mut interrupted_at: Option<tokio::time::Instant> = None;
    loop {
        let grace = async {
            match interrupted_at {
                Some(at) => tokio::time::sleep_until(at + INTERRUPT_GRACE).await,
                None => std::future::pending().await,
            }
        };
        let said = tokio::select! {
            said = kernel.next() => said,
            () = tokio::time::sleep(KEEPALIVE), if client.is_some() => {
                Said::Object(Bytes::from_static(br#"{"type": "keepalive"}"#))
            }
            () = pauses.paused(), if client.is_some() => {
                if let Some(tx) = client.take() {
                    let _ = tx.send(Err(std::io::Error::other("the sandbox paused"))).await;
                }
                continue;
            }
            () = grace => {
                kernel.kill();
                return CellEnd::KernelGone;
            }
        };
        let (line, end) = match said {
            Said::Object(line) if line.is_empty() => continue,
            Said::Object(line) => (line, None),
            Said::End => (
                Bytes::from_static(br#"{"type": "end_of_execution"}"#),
                Some(CellEnd::Ended),
            ),
            Said::Gone { sandbox_gone: true } => {
                if let Some(tx) = client.take() {
                    let _ = tx
                        .send(Err(std::io::Error::other("the sandbox is gone")))
                        .await;
                }
                return CellEnd::KernelGone;
            }
            Said::Gone {
                sandbox_gone: false,
            } => {
                if let Some(tx) = &client {
                    let restarting = serde_json::json!({
                        "type": "error",
                        "name": "ContextRestarting",
                        "value": "Context was restarted",
                        "traceback": "",
                    });
                    let _ = tx.send(Ok(line_of(restarting.to_string().into()))).await;
                    let _ = tx
                        .send(Ok(Bytes::from_static(
                            b"{\"type\": \"end_of_execution\"}\n",
                        )))
                        .await;
                }
                return CellEnd::KernelGone;
            }
        };
        if let Some(tx) = &client
            && tx.send(Ok(line_of(line))).await.is_err()
        {
            client = None;
            kernel.interrupt();
            interrupted_at = Some(tokio::time::Instant::now());
        }
        if let Some(end) = end {
            return end;
        }
    }
}

fn line_of(line: Bytes) -> Bytes {
    let mut out = Vec::with_capacity(line.len() + 1);
    out.extend_from_slice(&line);
    out.push(b'\n');
    Bytes::from(out)
}

/// True for a request to the code interpreter's port (`E2b-Sandbox-Port: 49999`).
pub(crate) fn is_for(request: &Request) -> bool {
    request
        .headers()
        .get("e2b-sandbox-port")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u16>().ok())
        == Some(PORT)
}
