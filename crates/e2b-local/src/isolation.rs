//! How a command is made to see its sandbox: a private mount namespace (preferred) or
//! plain path mapping (fallback).
//!
//! Mount namespace (server runs as root or with CAP_SYS_ADMIN): every command is forked
//! into its own mount namespace, where a tmpfs covers `/home`, the sandbox
//! root is bound onto its user's home (`/home/user`; `/home/agent` on the `agent-home`
//! template), its private tmp onto `/tmp`, and generated
//! `/etc/passwd` and `/etc/group` that define `user` (uid/gid 1000) are bound over the
//! host's; then it drops to that user unless root was asked for. Nothing else of the
//! host is hidden: this is a convenience, not a security boundary.
//!
//! With a mount namespace, each sandbox also gets a PID namespace of its own (a fresh
//! `/proc` shows only its processes) and, with internet access off, a network namespace
//! with only loopback, where the host allows them ([`crate::sandbox_ns`]).
//!
//! A sandbox with a root layer ([`crate::root_layer`]) is started in the mount namespace
//! that holds its overlay; after the binds above, the command binds them and the host's
//! other top-level mounts into the overlay and makes it its root (`pivot_root`), so what it
//! writes outside its areas lands in the layer.
//!
//! Path mapping: commands run as the server's own user with `HOME` set to the sandbox
//! root and `TMPDIR` to its tmp; a `cwd` under `/home/user` or `/tmp` is mapped to the
//! host directory. `whoami` then prints the server's user.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::root_layer::RootLayer;
use crate::sandbox_ns::{NsCapability, SandboxNs};
use crate::syscall::{check, cstring};
use crate::volumes::{MOUNT_ROOT, MountPoint, VolumeMount};

/// How commands are isolated (the public configuration choice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IsolationMode {
    /// Use a mount namespace when the OS allows it, else path mapping (with a warning).
    Auto,
    /// Require a mount namespace; starting fails where the OS does not allow one.
    MountNamespace,
    /// Never use namespaces: commands run as the server's user with paths mapped.
    PathMapping,
}

/// The file the root-layer probe looks for at `/` (it exists only in the probe's layer).
const LAYER_PROBE: &str = "e2b-local-layer-probe";

/// The uid and gid of the sandbox user `user`.
pub(crate) const USER_ID: u32 = 1000;

/// The user a request runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SandboxUser {
    User,
    Root,
}

impl SandboxUser {
    /// Parses a username as envd does: `user` (or none) and `root` exist, nothing else.
    pub(crate) fn parse(name: Option<&str>) -> Result<SandboxUser, String> {
        match name {
            None | Some("") | Some("user") => Ok(SandboxUser::User),
            Some("root") => Ok(SandboxUser::Root),
            Some(other) => Err(format!("invalid username: '{other}'")),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            SandboxUser::User => "user",
            SandboxUser::Root => "root",
        }
    }
}

/// How a command sees the host's system outside its sandbox's areas (home, `/tmp`,
/// volumes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SystemView {
    /// As the host has it (e2b-local is not a security boundary).
    Shared,
    /// Read-only: a template build's steps where the host allows no root layer (no PID
    /// namespace to hold it), which must not install into the host ([`crate::builder`]).
    /// Only with a mount namespace.
    ReadOnly,
    /// Under the sandbox's own writable layer ([`crate::root_layer`]), mounted in the
    /// mount namespace the command is started in. Shared with the sandbox's process table:
    /// every request of the sandbox gets its view.
    Layered(std::sync::Arc<RootLayer>),
}

/// The mechanism actually in use.
#[derive(Debug)]
pub(crate) enum Isolation {
    Namespace {
        passwd: PathBuf,
        group: PathBuf,
        /// PID and network namespaces the host allows on top (see [`crate::sandbox_ns`]).
        capability: NsCapability,
        /// Why a PID or network namespace is unavailable, said at start and by the
        /// admin `isolation` route.
        missing: Vec<String>,
    },
    PathMapping,
}

/// A command to start, in sandbox terms.
#[derive(Debug)]
pub(crate) struct CommandSpec<'a> {
    pub(crate) sandbox_id: &'a str,
    pub(crate) home: &'a Path,
    /// What the sandbox calls its user's home (a directory directly under `/home`).
    pub(crate) virt_home: &'a str,
    pub(crate) tmp: &'a Path,
    pub(crate) user: SandboxUser,
    pub(crate) program: &'a str,
    pub(crate) args: &'a [String],
    /// The working directory as the sandbox names it.
    pub(crate) cwd_virtual: &'a str,
    /// The same directory on the host (used by path mapping).
    pub(crate) cwd_host: &'a Path,
    pub(crate) sandbox_envs: &'a BTreeMap<String, String>,
    pub(crate) request_envs: &'a BTreeMap<String, String>,
    pub(crate) stdio: CommandStdio<'a>,
    /// The command joins the sandbox's own PID namespace, so it mounts a fresh /proc.
    pub(crate) own_pid_namespace: bool,
    /// Start it under the egress filter (see [`crate::egress`]).
    pub(crate) egress: Option<EgressSpec<'a>>,
    /// The CA bundle and hosts file every command gets, with the trust variables
    /// (mount namespaces only; see [`crate::egress::Trust`]).
    pub(crate) trust: Option<&'a crate::egress::Trust>,
    /// The file bound over [`crate::paths::BOOT_ID`] (mount namespaces only).
    pub(crate) boot_id: Option<&'a Path>,
    /// The volumes the sandbox mounts (bound in mount namespaces; symlinks otherwise).
    pub(crate) volumes: &'a [VolumeMount],
    /// The host's system as the command sees it (mount namespaces only).
    pub(crate) system: &'a SystemView,
}

/// What a command under the egress filter needs before exec.
#[derive(Debug)]
pub(crate) struct EgressSpec<'a> {
    /// Where the filter's listener is sent ([`crate::egress::Handoff::child_end`]).
    pub(crate) handoff: std::os::fd::RawFd,
    /// Bound over `/etc/resolv.conf` (DNS over TCP), when the host has one.
    pub(crate) resolv_conf: Option<&'a Path>,
}

/// What a command's stdin, stdout and stderr are.
#[derive(Debug)]
pub(crate) enum CommandStdio<'a> {
    /// Pipes for stdout and stderr, and for stdin when asked (else `/dev/null`).
    Pipes { stdin: bool },
    /// All three on this terminal slave, which the command takes as its controlling
    /// terminal in a session of its own (as envd's PTY processes do).
    Terminal(&'a std::os::fd::OwnedFd),
}

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Isolation {
    /// Chooses the mechanism; `etc_dir` receives the generated passwd and group files.
    pub(crate) fn prepare(mode: IsolationMode, etc_dir: &Path) -> io::Result<Isolation> {
        if mode == IsolationMode::PathMapping {
            return Ok(Isolation::PathMapping);
        }
        let attempt = Isolation::namespace(etc_dir).and_then(|iso| {
            iso.probe(etc_dir, None, &SystemView::Shared)?;
            Ok(iso)
        });
        match (attempt, mode) {
            (Ok(iso), _) => Ok(iso.with_sandbox_namespaces(etc_dir)),
            (Err(error), IsolationMode::MountNamespace) => Err(error),
            (Err(error), _) => {
                tracing::warn!(%error, "mount namespaces unavailable; commands run as the server's user with path mapping");
                Ok(Isolation::PathMapping)
            }
        }
    }

    fn namespace(etc_dir: &Path) -> io::Result<Isolation> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "not running as root",
            ));
        }
        fs::create_dir_all(etc_dir)?;
        let passwd = etc_dir.join("passwd");
        let group = etc_dir.join("group");
        let host_passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
        let host_group = fs::read_to_string("/etc/group").unwrap_or_default();
        fs::write(
            &passwd,
            account_file(
                &host_passwd,
                &format!("user:x:{USER_ID}:{USER_ID}:user:/home/user:/bin/bash"),
            ),
        )?;
        fs::write(
            &group,
            account_file(&host_group, &format!("user:x:{USER_ID}:")),
        )?;
        Ok(Isolation::Namespace {
            passwd,
            group,
            capability: NsCapability::NONE,
            missing: Vec::new(),
        })
    }

    /// Finds which PID and network namespaces the host allows, by running the probe
    /// inside them; what is missing is logged once here.
    fn with_sandbox_namespaces(self, etc_dir: &Path) -> Isolation {
        let mut missing = Vec::new();
        let mut capability = NsCapability::NONE;
        for offline in [true, false] {
            let attempt = SandboxNs::create(offline, None).and_then(|ns| {
                let probed = self.probe(etc_dir, Some(&ns), &SystemView::Shared);
                ns.kill();
                probed
            });
            match attempt {
                Ok(()) => {
                    capability = NsCapability {
                        pid: true,
                        net: offline,
                        layer: false,
                    };
                    break;
                }
                Err(error) if offline => {
                    missing.push(format!("network namespaces unavailable: {error}"));
                }
                Err(error) => missing.push(format!("PID namespaces unavailable: {error}")),
            }
        }
        if !capability.pid {
            missing.retain(|m| !m.starts_with("network"));
            missing.push("network namespaces unavailable: they need a PID namespace".to_owned());
            missing.push("root layers unavailable: they need a PID namespace".to_owned());
        } else {
            match self.probe_layer(etc_dir) {
                Ok(()) => capability.layer = true,
                Err(error) => missing.push(format!("root layers unavailable: {error}")),
            }
        }
        for reason in &missing {
            tracing::warn!(
                %reason,
                "sandboxes share the host's namespaces: commands see host processes, or reach the network with internet access off"
            );
        }
        match self {
            Isolation::Namespace { passwd, group, .. } => Isolation::Namespace {
                passwd,
                group,
                capability,
                missing,
            },
            Isolation::PathMapping => Isolation::PathMapping,
        }
    }

    /// The PID and network namespaces the host allows.
    pub(crate) fn ns_capability(&self) -> NsCapability {
        match self {
            Isolation::Namespace { capability, .. } => *capability,
            Isolation::PathMapping => NsCapability::NONE,
        }
    }

    /// Why sandboxes lack a PID or network namespace (empty when they have both).
    pub(crate) fn ns_missing(&self) -> Vec<String> {
        match self {
            Isolation::Namespace { missing, .. } => missing.clone(),
            Isolation::PathMapping => {
                vec!["path mapping: commands run as host processes, without namespaces".to_owned()]
            }
        }
    }

    /// Runs the probe under a root layer, which holds a file the host lacks.
    fn probe_layer(&self, etc_dir: &Path) -> io::Result<()> {
        let dir = etc_dir.join("probe-sandbox");
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        let layer = RootLayer::create_empty(&dir)?;
        let probed = fs::write(dir.join(crate::root_layer::LAYER_DIR).join(LAYER_PROBE), "")
            .and_then(|()| SandboxNs::create(false, Some(&layer)))
            .and_then(|ns| {
                let probed = self.probe(
                    etc_dir,
                    Some(&ns),
                    &SystemView::Layered(std::sync::Arc::new(layer.clone())),
                );
                ns.kill();
                probed
            });
        let _ = fs::remove_dir_all(&dir);
        probed
    }

    /// Runs `id -un` through the namespace set-up once (inside `ns` when given), so a
    /// host that refuses it is detected at start rather than on the first command.
    fn probe(&self, etc_dir: &Path, ns: Option<&SandboxNs>, system: &SystemView) -> io::Result<()> {
        let home = etc_dir.join("probe-home");
        let tmp = etc_dir.join("probe-tmp");
        fs::create_dir_all(&home)?;
        fs::create_dir_all(&tmp)?;
        std::os::unix::fs::chown(&home, Some(USER_ID), Some(USER_ID))?;
        let envs = BTreeMap::new();
        // Inside a PID namespace the init (pid 1 of the fresh /proc) must be ours.
        let script = match (ns, system) {
            (None, _) => "id -un; test -d /home/user",
            (Some(_), SystemView::Layered(_)) => {
                "id -un; test -d /home/user; test \"$(cat /proc/1/comm)\" = sleep; test -e /e2b-local-layer-probe"
            }
            (Some(_), _) => "id -un; test -d /home/user; test \"$(cat /proc/1/comm)\" = sleep",
        };
        let args = ["-c".to_owned(), script.to_owned()];
        let spec = CommandSpec {
            sandbox_id: "probe",
            home: &home,
            virt_home: crate::paths::HOME,
            tmp: &tmp,
            user: SandboxUser::User,
            program: "/bin/sh",
            args: &args,
            cwd_virtual: "/home/user",
            cwd_host: &home,
            sandbox_envs: &envs,
            request_envs: &envs,
            stdio: CommandStdio::Pipes { stdin: false },
            own_pid_namespace: ns.is_some(),
            egress: None,
            trust: None,
            boot_id: None,
            volumes: &[],
            system,
        };
        let mut command = self.std_command(&spec)?;
        let output = match ns {
            None => command.output()?,
            Some(ns) => ns.run_inside(|| command.output())?,
        };
        let who = String::from_utf8_lossy(&output.stdout);
        if output.status.success() && who.trim() == "user" {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "namespace probe failed: status {}, stdout {who:?}, stderr {:?}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )))
        }
    }

    /// uid/gid that files written by the server on behalf of `user` must get.
    pub(crate) fn owner(&self, user: SandboxUser) -> Option<(u32, u32)> {
        match (self, user) {
            (Isolation::Namespace { .. }, SandboxUser::User) => Some((USER_ID, USER_ID)),
            (Isolation::Namespace { .. }, SandboxUser::Root) => Some((0, 0)),
            (Isolation::PathMapping, _) => None,
        }
    }

    /// The name reported as a file's owner for `uid`.
    pub(crate) fn user_name(&self, uid: u32) -> String {
        match (self, uid) {
            (_, 0) => "root".to_owned(),
            (Isolation::Namespace { .. }, USER_ID) => "user".to_owned(),
            (Isolation::PathMapping, uid) if uid == current_uid() => "user".to_owned(),
            (_, uid) => uid.to_string(),
        }
    }

    /// Builds the command for `spec`. Like envd's, a command stays in the server's session
    /// and process group (only a terminal gets a session of its own, which it must lead):
    /// a command that wants a group of its own, such as agent-sandbox's `setsid` launcher,
    /// makes one itself.
    pub(crate) fn command(&self, spec: &CommandSpec<'_>) -> io::Result<tokio::process::Command> {
        Ok(tokio::process::Command::from(self.std_command(spec)?))
    }

    fn std_command(&self, spec: &CommandSpec<'_>) -> io::Result<std::process::Command> {
        use std::os::unix::process::CommandExt;
        use std::process::Stdio;

        let mut command = std::process::Command::new(spec.program);
        command.args(spec.args);
        command.env_clear();
        let (home, user) = match (self, spec.user) {
            (Isolation::Namespace { .. }, SandboxUser::User) => (spec.virt_home.to_owned(), "user"),
            (Isolation::Namespace { .. }, SandboxUser::Root) => ("/root".to_owned(), "root"),
            (Isolation::PathMapping, u) => (spec.home.to_string_lossy().into_owned(), u.name()),
        };
        command
            .env("PATH", DEFAULT_PATH)
            .env("HOME", &home)
            .env("USER", user)
            .env("LOGNAME", user)
            .env("E2B_SANDBOX", "true")
            .env("E2B_SANDBOX_ID", spec.sandbox_id);
        if let Isolation::PathMapping = self {
            command.env("TMPDIR", spec.tmp);
        }
        // Before the sandbox's and the request's variables, which may point elsewhere.
        if let (Isolation::Namespace { .. }, Some(trust)) = (self, spec.trust) {
            for name in crate::egress::TRUST_VARIABLES {
                command.env(name, trust.bundle_path());
            }
        }
        command.envs(spec.sandbox_envs);
        command.envs(spec.request_envs);
        let terminal = match &spec.stdio {
            CommandStdio::Pipes { stdin } => {
                command
                    .stdin(if *stdin {
                        Stdio::piped()
                    } else {
                        Stdio::null()
                    })
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                false
            }
            CommandStdio::Terminal(slave) => {
                command
                    .stdin(Stdio::from(slave.try_clone()?))
                    .stdout(Stdio::from(slave.try_clone()?))
                    .stderr(Stdio::from(slave.try_clone()?));
                true
            }
        };
        // envd runs as a service and starts commands with every signal at its default; this
        // server may have been started with some ignored (a shell's `&` ignores SIGINT and
        // SIGQUIT), and an ignored signal stays ignored across exec.
        // SAFETY: only async-signal-safe calls (signal) between fork and exec.
        unsafe {
            command.pre_exec(default_signals);
        }
        match self {
            Isolation::PathMapping => {
                command.current_dir(spec.cwd_host);
                if terminal {
                    // SAFETY: only async-signal-safe calls between fork and exec.
                    unsafe {
                        command.pre_exec(|| crate::pty::take_as_controlling_terminal());
                    }
                }
            }
            Isolation::Namespace { passwd, group, .. } => {
                let plan = MountPlan {
                    home: cstring(spec.home)?,
                    virt_home: CString::new(spec.virt_home).map_err(io::Error::other)?,
                    tmp: cstring(spec.tmp)?,
                    passwd: cstring(passwd)?,
                    group: cstring(group)?,
                    cwd: CString::new(spec.cwd_virtual).map_err(io::Error::other)?,
                    drop_to: (spec.user == SandboxUser::User).then_some(USER_ID),
                    fresh_proc: spec.own_pid_namespace,
                    terminal,
                    egress_handoff: spec.egress.as_ref().map(|e| e.handoff),
                    resolv_conf: match spec.egress.as_ref().and_then(|e| e.resolv_conf) {
                        Some(path) => Some(cstring(path)?),
                        None => None,
                    },
                    ca_bundle: match spec.trust.filter(|t| t.bind_bundle) {
                        Some(trust) => Some(cstring(&trust.bundle)?),
                        None => None,
                    },
                    hosts: match spec.trust.and_then(|t| t.hosts.as_deref()) {
                        Some(path) => Some(cstring(path)?),
                        None => None,
                    },
                    boot_id: match spec.boot_id.filter(|path| path.is_file()) {
                        Some(path) => Some(cstring(path)?),
                        None => None,
                    },
                    volumes: volume_binds(spec)?,
                    read_only_root: *spec.system == SystemView::ReadOnly,
                    layer: None,
                };
                let plan = match spec.system {
                    SystemView::Layered(layer) => MountPlan {
                        layer: Some(LayerPlan::new(layer, &plan, spec)?),
                        ..plan
                    },
                    SystemView::Shared | SystemView::ReadOnly => plan,
                };
                // SAFETY: the closure only calls async-signal-safe libc functions on
                // strings prepared before the fork; it allocates nothing.
                unsafe {
                    command.pre_exec(move || plan.enter());
                }
            }
        }
        Ok(command)
    }
}

/// Resets every catchable signal to its default action (a `pre_exec` hook: async-signal-safe).
fn default_signals() -> io::Result<()> {
    for signal in 1..=31 {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: signal() is async-signal-safe; an invalid number only returns SIG_ERR.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
        }
    }
    Ok(())
}

/// Everything the child needs after fork, prepared beforehand (no allocation after fork).
struct MountPlan {
    home: CString,
    /// Where `home` is mounted: the user's home as the sandbox names it.
    virt_home: CString,
    tmp: CString,
    passwd: CString,
    group: CString,
    cwd: CString,
    drop_to: Option<u32>,
    /// Mount a /proc of the command's own PID namespace over the host's.
    fresh_proc: bool,
    /// Take stdin (a terminal slave) as controlling terminal in a new session.
    terminal: bool,
    /// Install the egress filter and send its listener here.
    egress_handoff: Option<std::os::fd::RawFd>,
    /// Bind this over `/etc/resolv.conf`.
    resolv_conf: Option<CString>,
    /// Bind this over the system CA bundle (the host's plus e2b-local's CA).
    ca_bundle: Option<CString>,
    /// Bind this over `/etc/hosts` (the host's plus `--add-host` lines).
    hosts: Option<CString>,
    /// Bind this over `/proc/sys/kernel/random/boot_id` (the sandbox's boot id).
    boot_id: Option<CString>,
    /// The volumes to bind, in order.
    volumes: Vec<VolumeBind>,
    /// Make the root mount read-only for this command ([`SystemView::ReadOnly`]).
    read_only_root: bool,
    /// Make the sandbox's root layer the command's root ([`SystemView::Layered`]).
    layer: Option<LayerPlan>,
}

/// How a command moves into its sandbox's root layer, prepared before the fork.
struct LayerPlan {
    /// Where the overlay is mounted (in the namespace the command is forked in). Opened
    /// before the command's own mounts: the path may lie under the host's `/tmp`, which
    /// they cover.
    root: CString,
    /// The mounts to bring over from the command's namespace into the overlay, each to the
    /// same path there, parents first.
    binds: Vec<LayerBind>,
}

struct LayerBind {
    source: CString,
    /// Relative to the overlay's root (the working directory when it is bound).
    target: CString,
    need: Need,
}

/// Whether a command can do without a bind (in order of precedence).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Need {
    /// The sandbox's own areas and files: without them the command would see the host's.
    Required,
    /// The host's other mounts: one the layer has replaced (a file where its mount point
    /// was) stays as the layer has it.
    BestEffort,
}

impl LayerPlan {
    fn new(layer: &RootLayer, plan: &MountPlan, spec: &CommandSpec<'_>) -> io::Result<LayerPlan> {
        let mut own: Vec<&Path> = vec![
            Path::new("/home"),
            Path::new("/etc/passwd"),
            Path::new("/etc/group"),
            Path::new("/tmp"),
        ];
        if plan.resolv_conf.is_some() {
            own.push(Path::new("/etc/resolv.conf"));
        }
        if plan.ca_bundle.is_some() {
            own.push(Path::new("/etc/ssl/certs/ca-certificates.crt"));
        }
        if plan.hosts.is_some() {
            own.push(Path::new("/etc/hosts"));
        }
        if plan.fresh_proc {
            own.push(Path::new("/proc"));
        }
        if plan.volumes.iter().any(|v| v.cover_mount_root) {
            own.push(Path::new(MOUNT_ROOT));
        }
        for volume in spec.volumes {
            if volume.point == MountPoint::EmptyHostDir {
                own.push(Path::new(&volume.path));
            }
        }
        let host = crate::root_layer::host_top_mounts()?;
        let mut points: Vec<(&Path, Need)> = own.into_iter().map(|p| (p, Need::Required)).collect();
        points.extend(
            host.iter()
                .filter(|p| !p.starts_with(layer.root()))
                .map(|p| (p.as_path(), Need::BestEffort)),
        );
        // Parents before what lies under them; of one path, the required entry.
        points.sort();
        points.dedup_by(|later, kept| later.0 == kept.0);
        let root = layer.root();
        let binds = points
            .into_iter()
            .map(|(point, need)| {
                let inside = point.strip_prefix("/").unwrap_or(point);
                Ok(LayerBind {
                    source: cstring(point)?,
                    target: cstring(inside)?,
                    need,
                })
            })
            .collect::<io::Result<_>>()?;
        Ok(LayerPlan {
            root: cstring(root)?,
            binds,
        })
    }
}

/// One volume's bind, prepared before the fork.
struct VolumeBind {
    /// The volume's directory on the host.
    source: CString,
    /// Where it is bound; for a mount in the sandbox's home or tmp, the host directory of the
    /// mount point, bound before those areas are (their binds carry it along).
    target: CString,
    /// Lay a tmpfs over [`MOUNT_ROOT`] first (the first mount under it does).
    cover_mount_root: bool,
    /// The directories from the area (or [`MOUNT_ROOT`]) down to `target`, made when
    /// missing.
    make: Vec<CString>,
}

/// The binds of a command's volumes; a volume deleted since the sandbox was made fails
/// the command, naming it, rather than leave its mount point bare.
fn volume_binds(spec: &CommandSpec<'_>) -> io::Result<Vec<VolumeBind>> {
    let mut binds = Vec::new();
    let mut mount_root_covered = false;
    for volume in spec.volumes {
        if volume.point == MountPoint::Link {
            continue;
        }
        if !volume.host.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "volume '{}' mounted at {} was deleted",
                    volume.name, volume.path
                ),
            ));
        }
        let (base, rest) = match volume.point {
            MountPoint::InArea => match area_host_dir(spec, &volume.path) {
                Some(found) => found,
                None => continue,
            },
            MountPoint::UnderMountRoot => (
                PathBuf::from(MOUNT_ROOT),
                volume.path[MOUNT_ROOT.len()..].trim_start_matches('/'),
            ),
            MountPoint::EmptyHostDir | MountPoint::Link => (PathBuf::from(&volume.path), ""),
        };
        let cover_mount_root = volume.point == MountPoint::UnderMountRoot && !mount_root_covered;
        mount_root_covered |= cover_mount_root;
        let mut make = Vec::new();
        let mut target = base;
        for part in rest.split('/').filter(|p| !p.is_empty()) {
            target.push(part);
            make.push(cstring(&target)?);
        }
        binds.push(VolumeBind {
            source: cstring(&volume.host)?,
            target: cstring(&target)?,
            cover_mount_root,
            make,
        });
    }
    Ok(binds)
}

/// The host directory of the area holding `path` (the sandbox's home or tmp), and the rest
/// of the path below it.
fn area_host_dir<'p>(spec: &CommandSpec<'_>, path: &'p str) -> Option<(PathBuf, &'p str)> {
    crate::volumes::area_of(path, spec.virt_home)
        .map(|(area, rest)| (area.dir(spec.home, spec.tmp).to_path_buf(), rest))
}

impl MountPlan {
    /// Runs in the forked child: new mount namespace, binds, user switch.
    fn enter(&self) -> io::Result<()> {
        let none = std::ptr::null::<libc::c_char>();
        // SAFETY: all pointers are valid NUL-terminated strings owned by `self` or
        // static literals; these calls are async-signal-safe.
        unsafe {
            if self.terminal {
                crate::pty::take_as_controlling_terminal()?;
            }
            check(libc::unshare(libc::CLONE_NEWNS))?;
            // Nothing below may propagate back to the host's mount table.
            check(libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            // The copy of the overlay this namespace got, reached before /tmp is covered.
            let layer_root = match &self.layer {
                Some(layer) => {
                    let fd = libc::open(
                        layer.root.as_ptr(),
                        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    );
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Some(fd)
                }
                None => None,
            };
            // Before /home and /tmp are replaced: the volumes' directories (and the
            // mount points in the sandbox's areas) may lie under the host's /tmp.
            for volume in &self.volumes {
                if volume.cover_mount_root {
                    check(libc::mount(
                        c"tmpfs".as_ptr(),
                        c"/mnt".as_ptr(),
                        c"tmpfs".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV,
                        c"mode=755".as_ptr().cast(),
                    ))?;
                }
                for dir in &volume.make {
                    if libc::mkdir(dir.as_ptr(), 0o755) < 0 {
                        let error = io::Error::last_os_error();
                        if error.raw_os_error() != Some(libc::EEXIST) {
                            return Err(error);
                        }
                    }
                }
                check(libc::mount(
                    volume.source.as_ptr(),
                    volume.target.as_ptr(),
                    none,
                    libc::MS_BIND,
                    std::ptr::null(),
                ))?;
            }
            if self.fresh_proc {
                check(libc::mount(
                    c"proc".as_ptr(),
                    c"/proc".as_ptr(),
                    c"proc".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    std::ptr::null(),
                ))?;
            }
            // Over the /proc the command sees, fresh or the host's. A host that refuses it
            // leaves the host's boot id in view, which is no reason to refuse the command.
            if let Some(boot_id) = &self.boot_id {
                libc::mount(
                    boot_id.as_ptr(),
                    c"/proc/sys/kernel/random/boot_id".as_ptr(),
                    none,
                    libc::MS_BIND,
                    std::ptr::null(),
                );
            }
            check(libc::mount(
                c"tmpfs".as_ptr(),
                c"/home".as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=755".as_ptr().cast(),
            ))?;
            check(libc::mkdir(self.virt_home.as_ptr(), 0o755))?;
            check(libc::mount(
                self.home.as_ptr(),
                self.virt_home.as_ptr(),
                none,
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                self.passwd.as_ptr(),
                c"/etc/passwd".as_ptr(),
                none,
                libc::MS_BIND,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                self.group.as_ptr(),
                c"/etc/group".as_ptr(),
                none,
                libc::MS_BIND,
                std::ptr::null(),
            ))?;
            if let Some(resolv) = &self.resolv_conf {
                check(libc::mount(
                    resolv.as_ptr(),
                    c"/etc/resolv.conf".as_ptr(),
                    none,
                    libc::MS_BIND,
                    std::ptr::null(),
                ))?;
            }
            if let Some(bundle) = &self.ca_bundle {
                check(libc::mount(
                    bundle.as_ptr(),
                    c"/etc/ssl/certs/ca-certificates.crt".as_ptr(),
                    none,
                    libc::MS_BIND,
                    std::ptr::null(),
                ))?;
            }
            if let Some(hosts) = &self.hosts {
                check(libc::mount(
                    hosts.as_ptr(),
                    c"/etc/hosts".as_ptr(),
                    none,
                    libc::MS_BIND,
                    std::ptr::null(),
                ))?;
            }
            // Last, because the sources above may live under the host's /tmp.
            check(libc::mount(
                self.tmp.as_ptr(),
                c"/tmp".as_ptr(),
                none,
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ))?;
            if let (Some(layer), Some(fd)) = (&self.layer, layer_root) {
                check(libc::fchdir(fd))?;
                libc::close(fd);
                for bind in &layer.binds {
                    let bound = libc::mount(
                        bind.source.as_ptr(),
                        bind.target.as_ptr(),
                        none,
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    );
                    if bound < 0 && bind.need == Need::Required {
                        return Err(io::Error::last_os_error());
                    }
                }
                // The overlay becomes the root and the host's root, with everything on it,
                // is let go: what the command needs of it was bound over just above.
                if libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) < 0 {
                    return Err(io::Error::last_os_error());
                }
                check(libc::umount2(c".".as_ptr(), libc::MNT_DETACH))?;
                check(libc::chdir(c"/".as_ptr()))?;
            }
            // Only the root mount's own flag: /home, /tmp, /proc, /dev and the volumes are
            // mounts of their own and stay writable; the host's mount is not touched
            // (private propagation above).
            if self.read_only_root {
                check(libc::mount(
                    none,
                    c"/".as_ptr(),
                    none,
                    libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY,
                    std::ptr::null(),
                ))?;
            }
            // While still root: installing a filter needs CAP_SYS_ADMIN (or no_new_privs,
            // which would break setuid programs in the sandbox).
            if let Some(handoff) = self.egress_handoff {
                crate::egress::filter::install_and_send(handoff)?;
            }
            if let Some(id) = self.drop_to {
                let groups = [id as libc::gid_t];
                check(libc::setgroups(1, groups.as_ptr()))?;
                check(libc::setgid(id))?;
                check(libc::setuid(id))?;
            }
            check(libc::chdir(self.cwd.as_ptr()))?;
        }
        Ok(())
    }
}

/// The host's account file without any entry named `user` or numbered 1000, plus ours.
fn account_file(host: &str, ours: &str) -> String {
    let mut out = String::new();
    for line in host.lines() {
        let mut fields = line.split(':');
        let name = fields.next().unwrap_or_default();
        let id = fields.nth(1).unwrap_or_default();
        if name == "user" || id == USER_ID.to_string() {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(ours);
    out.push('\n');
    out
}

fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn account_file_replaces_uid_1000_and_user() {
        let host = "root:x:0:0:root:/root:/bin/bash\nbob:x:1000:1000::/home/bob:/bin/sh\nuser:x:1001:1001::/x:/bin/sh\n";
        let out = account_file(host, "user:x:1000:1000:user:/home/user:/bin/bash");
        assert_eq!(
            out,
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\n"
        );
    }

    /// Runs `script` as root through the namespace set-up, as a sandbox with `system` would.
    fn run_as_root(
        iso: &Isolation,
        dir: &Path,
        ns: Option<&SandboxNs>,
        system: &SystemView,
        script: &str,
    ) -> std::process::Output {
        let (home, tmp) = (dir.join("home"), dir.join("tmp"));
        fs::create_dir_all(&home).unwrap();
        fs::create_dir_all(&tmp).unwrap();
        let envs = BTreeMap::new();
        let args = ["-c".to_owned(), script.to_owned()];
        let spec = CommandSpec {
            sandbox_id: "test",
            home: &home,
            virt_home: crate::paths::HOME,
            tmp: &tmp,
            user: SandboxUser::Root,
            program: "/bin/sh",
            args: &args,
            cwd_virtual: "/",
            cwd_host: Path::new("/"),
            sandbox_envs: &envs,
            request_envs: &envs,
            stdio: CommandStdio::Pipes { stdin: false },
            own_pid_namespace: ns.is_some(),
            egress: None,
            trust: None,
            boot_id: None,
            volumes: &[],
            system,
        };
        let mut command = iso.std_command(&spec).unwrap();
        match ns {
            None => command.output().unwrap(),
            Some(ns) => ns.run_inside(|| command.output()).unwrap(),
        }
    }

    #[test]
    fn root_writes_outside_the_areas_fail_read_only_and_land_in_the_layer_when_layered() {
        // contract: L22 — a build's steps never write the host's system.
        let dir = tempfile::tempdir().unwrap();
        let iso = Isolation::prepare(IsolationMode::Auto, &dir.path().join("etc")).unwrap();
        if !matches!(iso, Isolation::Namespace { .. }) {
            // Path mapping (not root): commands are host processes, no system view applies.
            assert!(iso.ns_capability() == NsCapability::NONE);
            return;
        }
        let name = format!("e2b-local-test-{}", crate::token::new_uuid());
        let target = Path::new("/usr/local").join(&name);
        let write = format!(
            "mkdir {} && echo hi > {}/f",
            target.display(),
            target.display()
        );

        let read_only = run_as_root(&iso, dir.path(), None, &SystemView::ReadOnly, &write);
        assert!(!read_only.status.success());
        assert!(
            String::from_utf8_lossy(&read_only.stderr).contains("Read-only file system"),
            "{read_only:?}"
        );
        assert!(!target.exists());

        if !iso.ns_capability().pid {
            return;
        }
        // Where a PID namespace can hold it, a layer must work (its probe passes).
        assert!(iso.ns_capability().layer, "{:?}", iso.ns_missing());
        let sandbox = dir.path().join("sandbox");
        let layer = RootLayer::create_empty(&sandbox).unwrap();
        let ns = SandboxNs::create(false, Some(&layer)).unwrap();
        let layered = SystemView::Layered(std::sync::Arc::new(layer.clone()));
        let wrote = run_as_root(&iso, dir.path(), Some(&ns), &layered, &write);
        assert!(wrote.status.success(), "{wrote:?}");
        assert!(!target.exists(), "the host's /usr/local was written");
        let upper = sandbox.join(crate::root_layer::LAYER_DIR);
        assert_eq!(
            fs::read_to_string(upper.join("usr/local").join(&name).join("f")).unwrap(),
            "hi\n"
        );
        // A second command of the sandbox sees the first one's write (one overlay), and the
        // host's other mounts through it.
        let read = run_as_root(
            &iso,
            dir.path(),
            Some(&ns),
            &layered,
            &format!(
                "cat {}/f; test -c /dev/null && test -d /proc/self && echo mounts",
                target.display()
            ),
        );
        assert_eq!(
            String::from_utf8_lossy(&read.stdout),
            "hi\nmounts\n",
            "{read:?}"
        );
        ns.kill();
    }

    #[test]
    fn usernames_parse_like_envd() {
        assert_eq!(SandboxUser::parse(None).unwrap(), SandboxUser::User);
        assert_eq!(SandboxUser::parse(Some("root")).unwrap(), SandboxUser::Root);
        assert!(SandboxUser::parse(Some("mallory")).is_err());
    }
}
