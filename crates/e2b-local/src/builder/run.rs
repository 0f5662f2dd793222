//! Running one build: its sandbox, its steps in order, the start and ready commands, and
//! filing the result; and starting a built template's start command in a new sandbox.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Step;
use crate::app::App;
use crate::builds::{BuildConfig, Failure, Job, RunDefaults};
use crate::envd::Ctx;
use crate::envd::process::{Launch, launch};
use crate::isolation::SandboxUser;
use crate::process_table::{EndInfo, Event, Listing};
use crate::snapshots::{BuildTarget, Reference};
use crate::store::CreateParams;

/// How long a ready command may keep failing (E2B's limit).
const READY_TIMEOUT: Duration = Duration::from_secs(600);

/// How often a failing ready command is tried again.
const READY_INTERVAL: Duration = Duration::from_millis(200);

/// What the build starts from.
#[derive(Debug)]
pub(super) enum Source {
    /// An image name: e2b-local pulls none and starts from the host's system.
    Image(String),
    /// A template's name or id.
    Template(String),
}

/// A started build's request.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) source: Source,
    pub(super) steps: Vec<Step>,
    pub(super) start_cmd: Option<String>,
    pub(super) ready_cmd: Option<String>,
}

/// Where the steps are: the current user, working directory and variables.
#[derive(Debug)]
struct Context {
    user: SandboxUser,
    /// `None`: the user's home.
    workdir: Option<String>,
    envs: BTreeMap<String, String>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
}

impl Context {
    /// A build from an image or a template that carries no build's context (a built-in
    /// one, a snapshot): `user`, in the home, no variables, no start command.
    fn fresh() -> Context {
        Context {
            user: SandboxUser::User,
            workdir: None,
            envs: BTreeMap::new(),
            start_cmd: None,
            ready_cmd: None,
        }
    }
}

/// The sandbox a build's steps run in, as `create` needs it.
struct Base {
    template: String,
    origin: Option<crate::store::SnapshotOrigin>,
    files: Option<std::path::PathBuf>,
    context: Context,
}

fn failure(step: &str, message: impl Into<String>) -> Failure {
    Failure {
        message: message.into(),
        step: Some(step.to_owned()),
    }
}

/// Runs a build to its end: `Ok` once it is filed.
pub(super) async fn build(app: &Arc<App>, job: &Job, plan: Plan) -> Result<(), Failure> {
    let base = base(app, job, &plan.source)?;
    let params = CreateParams {
        template: base.template.clone(),
        // As long as a sandbox may live: a build ends its sandbox itself.
        timeout_secs: crate::store::MAX_TIMEOUT_SECS,
        metadata: BTreeMap::new(),
        env_vars: BTreeMap::new(),
        auto_pause: false,
        auto_pause_memory: true,
        auto_resume: false,
        allow_internet_access: None,
        secure: false,
        with_token: false,
        origin: base.origin.clone(),
        network: None,
        files_from: base.files.clone(),
        volume_mounts: Vec::new(),
        iam_tokens: BTreeMap::new(),
        build_of: Some(job.build_id.clone()),
        defaults: None,
    };
    let creator = Arc::clone(app);
    let record = tokio::task::spawn_blocking(move || creator.store.create(params))
        .await
        .map_err(|e| failure("base", format!("creating the build's sandbox failed: {e}")))?
        .map_err(|e| {
            failure(
                "base",
                format!("creating the build's sandbox failed: {}", e.message),
            )
        })?;
    let outcome = run_in(app, job, &record.id, base.context, plan).await;
    let killer = Arc::clone(app);
    let id = record.id.clone();
    if let Ok(Err(error)) = tokio::task::spawn_blocking(move || killer.store.kill(&id)).await {
        tracing::warn!(sandbox_id = %record.id, error = %error.message, "removing a build's sandbox failed");
    }
    outcome
}

/// What the build starts from, logged as E2B's base phase logs it.
fn base(app: &App, job: &Job, source: &Source) -> Result<Base, Failure> {
    let fresh = |template: &str| Base {
        template: template.to_owned(),
        origin: None,
        files: None,
        context: Context::fresh(),
    };
    match source {
        Source::Image(image) => {
            job.log("info", Some("base"), format!("[base] FROM {image}"));
            job.log(
                "warn",
                Some("base"),
                "[base] e2b-local pulls no images: the steps start from this host's system, \
                 as sandboxes of the template 'base' do; what they write outside the home \
                 and /tmp goes to the template's own layer, not to the host",
            );
            job.log("info", Some("base"), "[base] DEFAULT USER user");
            Ok(fresh("base"))
        }
        Source::Template(name) => {
            job.log("info", Some("base"), format!("[base] FROM TEMPLATE {name}"));
            if let Some(builtin) = app.builtin_template(name) {
                return Ok(fresh(builtin));
            }
            let found = app
                .snapshots
                .resolve(&Reference::parse(name))
                .ok_or_else(|| failure("base", format!("template '{name}' not found")))?;
            let config = found.config.clone();
            let context = match config {
                Some(config) => Context {
                    user: SandboxUser::parse(Some(&config.defaults.user))
                        .map_err(|e| failure("base", e))?,
                    workdir: config.defaults.workdir,
                    envs: config.envs,
                    start_cmd: config.start_cmd,
                    ready_cmd: config.ready_cmd,
                },
                None => Context::fresh(),
            };
            Ok(Base {
                template: found.template_id,
                origin: Some(found.origin),
                files: Some(found.files),
                context,
            })
        }
    }
}

/// The steps, the start and ready commands and the filing, in the build's sandbox.
async fn run_in(
    app: &Arc<App>,
    job: &Job,
    sandbox_id: &str,
    mut context: Context,
    plan: Plan,
) -> Result<(), Failure> {
    let sandbox = app.store.running(sandbox_id).ok_or_else(|| {
        failure(
            "base",
            format!("the build's sandbox {sandbox_id} is not running"),
        )
    })?;
    let ctx = Ctx {
        app: Arc::clone(app),
        sandbox,
    };
    let total = plan.steps.len();
    for (index, step) in plan.steps.iter().enumerate() {
        let number = (index + 1).to_string();
        job.log(
            "info",
            Some(&number),
            format!(
                "[builder {}/{total}] {} {}",
                index + 1,
                step.kind,
                step.args.join(" ")
            ),
        );
        run_step(&ctx, job, &mut context, step, &number)
            .await
            .map_err(|message| failure(&number, message))?;
    }
    if plan.start_cmd.is_some() {
        context.start_cmd = plan.start_cmd;
    }
    if plan.ready_cmd.is_some() {
        context.ready_cmd = plan.ready_cmd;
    }
    let config = BuildConfig {
        defaults: RunDefaults {
            user: context.user.name().to_owned(),
            workdir: context.workdir,
        },
        envs: context.envs,
        start_cmd: context.start_cmd,
        ready_cmd: context.ready_cmd,
    };
    job.log(
        "info",
        Some("finalize"),
        "[finalize] Finalizing template build",
    );
    if config.start_cmd.is_some() || config.ready_cmd.is_some() {
        start_and_wait(&ctx, &config, |level, message| {
            job.log(level, Some("finalize"), format!("[finalize] {message}"));
        })
        .await
        .map_err(|message| failure("finalize", message))?;
    }
    let filer = Arc::clone(app);
    let id = sandbox_id.to_owned();
    let capture = tokio::task::spawn_blocking(move || {
        let source = filer.store.snapshot_source(&id)?;
        filer.snapshots.capture(source)
    })
    .await
    .map_err(|e| {
        failure(
            "finalize",
            format!("saving the template's files failed: {e}"),
        )
    })?
    .map_err(|e| failure("finalize", e.message))?;
    let target = BuildTarget {
        template_id: &job.template_id,
        alias: &job.alias,
        build_id: &job.build_id,
        tags: &job.tags,
    };
    app.snapshots
        .commit_build(capture, &target, config)
        .map_err(|e| failure("finalize", e.message))?;
    job.log("info", Some("finalize"), "[finalize] Template is ready");
    Ok(())
}

/// Runs one step; the error is the build's reason.
async fn run_step(
    ctx: &Ctx,
    job: &Job,
    context: &mut Context,
    step: &Step,
    number: &str,
) -> Result<(), String> {
    let log_output = |line: &str| job.log("info", Some(number), line.to_owned());
    match step.kind.to_ascii_uppercase().as_str() {
        "RUN" => {
            let command = step.args.first().ok_or("RUN needs a command")?;
            let user = match step.args.get(1).filter(|u| !u.is_empty()) {
                Some(name) => SandboxUser::parse(Some(name)).map_err(|e| {
                    format!(
                        "failed to run command '{command}': command failed: unauthenticated: {e}"
                    )
                })?,
                None => context.user,
            };
            let args = ["-l".to_owned(), "-c".to_owned(), command.clone()];
            let end = run(
                ctx,
                user,
                &args,
                &context.envs,
                context.workdir.as_deref(),
                log_output,
            )
            .await
            .map_err(|e| format!("failed to run command '{command}': {e}"))?;
            ended_well(&end).map_err(|e| format!("failed to run command '{command}': {e}"))
        }
        "ENV" | "ARG" => {
            if !step.args.len().is_multiple_of(2) {
                return Err(format!("{} needs pairs of name and value", step.kind));
            }
            for pair in step.args.chunks(2) {
                let value = expand(ctx, context, &pair[1]).await?;
                context.envs.insert(pair[0].clone(), value);
            }
            Ok(())
        }
        "WORKDIR" => {
            let path = step.args.first().ok_or("WORKDIR needs a path")?;
            let path = if path.starts_with('/') {
                path.clone()
            } else {
                let base = context.workdir.as_deref().unwrap_or("/");
                format!("{}/{path}", base.trim_end_matches('/'))
            };
            let script =
                r#"[ -d "$1" ] || { mkdir -p -- "$1" && { [ -z "$2" ] || chown "$2" "$1"; }; }"#;
            root_script(
                ctx,
                script,
                &[path.clone(), owner(ctx, context.user, "")],
                (&context.envs, None),
                log_output,
            )
            .await
            .map_err(|e| format!("WORKDIR {path}: {e}"))?;
            context.workdir = Some(path);
            Ok(())
        }
        "USER" => {
            let name = step.args.first().ok_or("USER needs a user name")?;
            context.user = SandboxUser::parse(Some(name)).map_err(|e| {
                format!(
                    "USER {name}: e2b-local's sandboxes have the users 'user' and 'root' only ({e})"
                )
            })?;
            Ok(())
        }
        "COPY" | "ADD" => copy(ctx, job, context, step, number).await,
        other => Err(format!("command type {other} is not implemented")),
    }
}

/// Unpacks a COPY step's archive in the sandbox and moves (a file, a link) or merges (a
/// directory) its source into the destination, as E2B's builder does: owned by the
/// step's user (the current one by default), with the step's mode.
async fn copy(
    ctx: &Ctx,
    job: &Job,
    context: &Context,
    step: &Step,
    number: &str,
) -> Result<(), String> {
    let [src, dest, user, mode, ..] = step.args.as_slice() else {
        return Err("COPY needs a source, a destination, a user and a mode".to_owned());
    };
    let hash = step
        .files_hash
        .as_deref()
        .ok_or("COPY requires files hash to be set")?;
    let archive = ctx.app.builds.upload_paths(hash).map_err(|e| e.message)?.1;
    if !archive.is_file() {
        return Err(format!(
            "the files of COPY {src} were never uploaded (hash {hash})"
        ));
    }
    // Into the sandbox's own /tmp, where its commands can read it.
    let name = format!(".e2b-copy-{hash}-{number}.tar");
    let host_copy = ctx.sandbox.tmp.join(&name);
    tokio::fs::copy(&archive, &host_copy)
        .await
        .map_err(|e| format!("COPY {src}: {e}"))?;
    let in_sandbox = if ctx.app.isolation_is_namespace() {
        format!("/tmp/{name}")
    } else {
        host_copy.to_string_lossy().into_owned()
    };
    let mode = match mode.as_str() {
        "" => String::new(),
        mode if mode.bytes().all(|b| (b'0'..=b'7').contains(&b)) => mode.to_owned(),
        other => return Err(format!("COPY {src}: invalid mode '{other}'")),
    };
    root_script(
        ctx,
        COPY_SCRIPT,
        &[
            in_sandbox,
            static_prefix(src),
            dest.clone(),
            owner(ctx, context.user, user),
            mode,
        ],
        (&context.envs, context.workdir.as_deref()),
        |line: &str| job.log("debug", Some(number), line.to_owned()),
    )
    .await
    .map_err(|e| format!("COPY {src} {dest}: {e}"))
}

/// Runs one of the builder's own scripts as root with its positional arguments, in the
/// step's variables and working directory; a failure says why in the script's own last
/// words (a read-only system, say), which the build's status then shows.
async fn root_script(
    ctx: &Ctx,
    script: &str,
    positional: &[String],
    (envs, cwd): (&BTreeMap<String, String>, Option<&str>),
    mut on_line: impl FnMut(&str),
) -> Result<(), String> {
    let mut args = vec!["-c".to_owned(), script.to_owned(), "e2b-build".to_owned()];
    args.extend_from_slice(positional);
    let mut last = String::new();
    let end = run(ctx, SandboxUser::Root, &args, envs, cwd, |line: &str| {
        on_line(line);
        last = line.to_owned();
    })
    .await?;
    ended_well(&end).map_err(|e| format!("{last} ({e})"))
}

/// `$1` the archive, `$2` the source within it, `$3` the destination (relative to the
/// working directory), `$4` the owner (empty: leave it), `$5` the mode (empty: leave it).
/// GNU tar finds out itself whether the archive is gzip'd (SDKs may send it plain).
const COPY_SCRIPT: &str = r#"set -e
unpack=$(mktemp -d)
trap 'rm -rf "$unpack" "$1"' EXIT
tar -xf "$1" -C "$unpack"
src="$unpack/$2"
[ -e "$src" ] || [ -L "$src" ] || { echo "no $2 in the uploaded files" >&2; exit 1; }
if [ -d "$src" ] && [ ! -L "$src" ]; then
    [ -z "$4" ] || chown -R "$4" "$src"
    [ -z "$5" ] || chmod -R "$5" "$src"
    mkdir -p -- "$3"
    (cd "$src" && tar -cf - .) | (cd "$3" && tar -xpf -)
else
    case "$3" in
        */) mkdir -p -- "$3"; target="$3$(basename -- "$src")" ;;
        *) mkdir -p -- "$(dirname -- "$3")"; target="$3" ;;
    esac
    [ -z "$4" ] || chown -h "$4" "$src"
    if [ -n "$5" ] && [ ! -L "$src" ]; then chmod "$5" "$src"; fi
    mv -f -- "$src" "$target"
fi
"#;

/// The part of a COPY source before its first glob character, cut at its last `/`
/// (`folder/*` → `folder`, `*.txt` → `.`, `app.py` → `app.py`): what the archive's
/// members are under.
fn static_prefix(src: &str) -> String {
    let src = src.trim_start_matches("./");
    match src.find(['*', '?', '[', '{']) {
        None => src.trim_end_matches('/').to_owned(),
        Some(at) => match src[..at].rfind('/') {
            Some(slash) if slash > 0 => src[..slash].to_owned(),
            _ => ".".to_owned(),
        },
    }
}

/// `user:group` for chown: the step's user (a bare name gets its own group) or the
/// current one; empty under path mapping, where the server cannot give files away.
fn owner(ctx: &Ctx, current: SandboxUser, asked: &str) -> String {
    if !ctx.app.isolation_is_namespace() {
        return String::new();
    }
    let name = if asked.is_empty() {
        current.name()
    } else {
        asked
    };
    if name.contains(':') {
        name.to_owned()
    } else {
        format!("{name}:{name}")
    }
}

/// An ENV value as the sandbox's shell expands it (`$PATH:/x`), as E2B's builder does.
async fn expand(ctx: &Ctx, context: &Context, value: &str) -> Result<String, String> {
    let escaped: String = value
        .chars()
        .flat_map(|c| match c {
            '\\' | '"' | '`' => vec!['\\', c],
            c => vec![c],
        })
        .collect();
    let args = ["-c".to_owned(), format!("printf '%s' \"{escaped}\"")];
    let mut out = String::new();
    let end = run(
        ctx,
        context.user,
        &args,
        &context.envs,
        context.workdir.as_deref(),
        |line: &str| {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(line);
        },
    )
    .await
    .map_err(|e| format!("ENV: {e}"))?;
    ended_well(&end).map_err(|e| format!("ENV: expanding '{value}' failed: {e}"))?;
    Ok(out)
}

fn ended_well(end: &EndInfo) -> Result<(), String> {
    if end.exit_code == 0 && end.exited {
        Ok(())
    } else {
        Err(format!("command failed: {}", end.status))
    }
}

/// Runs `/bin/bash args…` in the sandbox to its end, handing each line of its output
/// (stdout and stderr as they come) to `on_line`.
async fn run(
    ctx: &Ctx,
    user: SandboxUser,
    args: &[String],
    envs: &BTreeMap<String, String>,
    cwd: Option<&str>,
    mut on_line: impl FnMut(&str),
) -> Result<EndInfo, String> {
    let (_proc, mut events) = launch(
        ctx,
        Launch {
            user,
            cmd: "/bin/bash",
            args,
            envs,
            cwd,
            tag: None,
            stdin: false,
            terminal: None,
            deadline: None,
            listing: Listing::Listed,
        },
    )
    .map_err(|e| e.message)?;
    let mut pending: Vec<u8> = Vec::new();
    let mut flush = |pending: &mut Vec<u8>, all: bool| {
        while let Some(at) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=at).collect();
            on_line(String::from_utf8_lossy(&line[..line.len() - 1]).trim_end_matches('\r'));
        }
        if all && !pending.is_empty() {
            on_line(&String::from_utf8_lossy(pending));
            pending.clear();
        }
    };
    while let Some(event) = events.recv().await {
        match event {
            Event::Stdout(bytes) | Event::Stderr(bytes) | Event::Pty(bytes) => {
                pending.extend_from_slice(&bytes);
                flush(&mut pending, false);
            }
            Event::End(end) => {
                flush(&mut pending, true);
                return Ok(end);
            }
            Event::SandboxGone => return Err("the build's sandbox went away".to_owned()),
        }
    }
    Err("the command's output ended without its exit".to_owned())
}

/// Starts the start command in the background (its output drained) and tries the ready
/// command until it passes, the start command ends, or [`READY_TIMEOUT`] passes.
async fn start_and_wait(
    ctx: &Ctx,
    config: &BuildConfig,
    mut log: impl FnMut(&'static str, String),
) -> Result<(), String> {
    let user = SandboxUser::parse(Some(&config.defaults.user))?;
    let cwd = config.defaults.workdir.as_deref();
    let start = match &config.start_cmd {
        Some(command) => {
            log("info", format!("Running start command: {command}"));
            let args = ["-l".to_owned(), "-c".to_owned(), command.clone()];
            let (proc, mut events) = launch(
                ctx,
                Launch {
                    user,
                    cmd: "/bin/bash",
                    args: &args,
                    envs: &config.envs,
                    cwd,
                    tag: Some("start".to_owned()),
                    stdin: false,
                    terminal: None,
                    deadline: None,
                    listing: Listing::Listed,
                },
            )
            .map_err(|e| format!("start command failed: {}", e.message))?;
            // Nobody reads the start command's output; its pipes must not fill.
            tokio::spawn(async move { while events.recv().await.is_some() {} });
            Some(proc)
        }
        None => None,
    };
    let ready = config.ready_cmd.clone().unwrap_or_else(|| {
        if start.is_some() {
            "sleep 20"
        } else {
            "sleep 0"
        }
        .to_owned()
    });
    log("info", format!("Waiting for template to be ready: {ready}"));
    let args = ["-l".to_owned(), "-c".to_owned(), ready.clone()];
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if start.as_ref().is_some_and(|proc| proc.end().is_some()) {
            break;
        }
        let end = run(ctx, user, &args, &config.envs, cwd, |_| {})
            .await
            .map_err(|e| format!("ready command failed: {e}"))?;
        if end.exit_code == 0 && end.exited {
            break;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "ready command timed out after {}s: {ready}",
                READY_TIMEOUT.as_secs()
            ));
        }
        tokio::time::sleep(READY_INTERVAL).await;
    }
    log("info", "Template is ready".to_owned());
    Ok(())
}

/// Starts a built template's start command in a new sandbox of it and waits for its
/// ready command, as the build did (e2b-local keeps no memory, so the process is not
/// already running as it is on E2B).
pub(crate) async fn start_in_sandbox(
    app: &Arc<App>,
    sandbox_id: &str,
    config: &BuildConfig,
) -> Result<(), String> {
    let sandbox = app
        .store
        .running(sandbox_id)
        .ok_or_else(|| format!("sandbox {sandbox_id} is not running"))?;
    let ctx = Ctx {
        app: Arc::clone(app),
        sandbox,
    };
    start_and_wait(&ctx, config, |_, _| {}).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_source_is_found_under_its_static_prefix() {
        assert_eq!(static_prefix("folder/*"), "folder");
        assert_eq!(static_prefix("folder/sub/*.txt"), "folder/sub");
        assert_eq!(static_prefix("*.txt"), ".");
        assert_eq!(static_prefix("app.py"), "app.py");
        assert_eq!(static_prefix("./dir/"), "dir");
        assert_eq!(static_prefix("folder/symlink.txt"), "folder/symlink.txt");
    }
}
