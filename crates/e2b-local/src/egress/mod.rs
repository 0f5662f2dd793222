//! Egress rules (E2B's `allowOut` / `denyOut`), enforced on the sandbox's own processes.
//!
//! The rules of a sandbox live in a [`LivePolicy`], replaced whole by the update route;
//! every new connection is judged against the policy of that moment. Every command of a
//! sandbox with rules starts under a seccomp filter ([`filter`]) whose listener the server
//! serves ([`notify`]); names are checked by an in-process proxy ([`proxy`]). A sandbox
//! without rules pays nothing.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

mod ca;
pub(crate) mod filter;
mod intercept;
mod notify;
mod proxy;
mod relay;
pub(crate) mod rules;
mod sock;
mod socks;
pub(crate) mod transform;
mod upstream;

pub(crate) use self::intercept::upstream_tls;
pub(crate) use self::proxy::Proxy;
pub(crate) use self::rules::{NetworkRecord, Policy};

/// Appended to the sandbox's resolv.conf: the filter refuses UDP sockets, so the resolver
/// must ask over TCP, whose connects the filter sees.
pub(crate) const RESOLV_OPTIONS: &str = "options use-vc";

/// A sandbox's current policy, shared by whatever enforces it.
#[derive(Debug)]
pub(crate) struct LivePolicy(
    RwLock<Arc<Policy>>,
    crate::sandbox_log::SandboxLog,
    Option<crate::identity::Workload>,
);

impl LivePolicy {
    /// `workload`: the sandbox and the identity tokens its header rules may name.
    pub(crate) fn new(
        policy: Policy,
        log: crate::sandbox_log::SandboxLog,
        workload: Option<crate::identity::Workload>,
    ) -> Arc<LivePolicy> {
        Arc::new(LivePolicy(RwLock::new(Arc::new(policy)), log, workload))
    }

    /// The sandbox's workload identity, when its create named tokens.
    pub(crate) fn workload(&self) -> Option<&crate::identity::Workload> {
        self.2.as_ref()
    }

    /// The policy now.
    pub(crate) fn current(&self) -> Arc<Policy> {
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces the policy; connections made from now on follow it.
    pub(crate) fn set(&self, policy: Policy) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(policy);
    }

    /// Records a connection the rules refused, in the sandbox's log (what a user
    /// debugging a policy looks for).
    pub(crate) fn refused(&self, dest: std::net::SocketAddr, name: Option<&str>) {
        let mut fields = vec![
            ("destination", dest.ip().to_string()),
            ("port", dest.port().to_string()),
        ];
        if let Some(name) = name {
            fields.push(("name", name.to_owned()));
        }
        self.1.push(
            crate::sandbox_log::Level::Warn,
            format!("egress connection to {dest} refused by the network rules"),
            &fields,
        );
    }
}

/// The name servers of the host's resolv.conf (the sandbox's too: it is not replaced).
pub(crate) fn host_name_servers() -> Vec<std::net::IpAddr> {
    rules::name_servers(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default())
}

/// Why path mapping cannot enforce rules: the filter is installed while the command is
/// still root, in its mount namespace (where its resolv.conf is bound too).
pub(crate) const PATH_MAPPING: &str =
    "commands run with path mapping (e2b-local is not root), where egress rules cannot be enforced";

/// The bundle of trusted CAs that programs read by default (Debian's, and others').
pub(crate) const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The variables that point common TLS stacks at a bundle (OpenSSL and curl, Python's
/// requests, Node): set to the sandbox's bundle, unless the sandbox or command sets them.
pub(crate) const TRUST_VARIABLES: [&str; 4] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "CURL_CA_BUNDLE",
];

/// What every command of a sandbox gets so that it trusts the CA and resolves the added
/// hosts (mount-namespace commands only: path mapping cannot bind files).
#[derive(Debug)]
pub(crate) struct Trust {
    /// The host's bundle plus the CA, bound over [`SYSTEM_BUNDLE`] when the host has one.
    pub(crate) bundle: PathBuf,
    pub(crate) bind_bundle: bool,
    /// The host's hosts file plus `--add-host` lines, bound over `/etc/hosts` (`None`:
    /// no host added).
    pub(crate) hosts: Option<PathBuf>,
}

impl Trust {
    /// The bundle's path as the sandbox sees it (what the variables say).
    pub(crate) fn bundle_path(&self) -> &Path {
        if self.bind_bundle {
            Path::new(SYSTEM_BUNDLE)
        } else {
            &self.bundle
        }
    }
}

/// How the egress machinery is set up (from the server's config).
#[derive(Debug)]
pub(crate) struct Setup<'a> {
    pub(crate) state_dir: &'a Path,
    /// The TLS client side for upstreams of intercepted connections ([`upstream_tls`]).
    pub(crate) upstream: Arc<rustls::ClientConfig>,
    /// Names every sandbox (and the proxy) resolves to the given address.
    pub(crate) add_hosts: &'a [(String, std::net::IpAddr)],
    /// The team's secrets, which header values name as `${e2b.secrets.<name>}`.
    pub(crate) secrets: Arc<crate::secrets::Secrets>,
    /// The issuer of the workload tokens they name as `${e2b.identity.tokens.<name>}`.
    pub(crate) identity: Arc<crate::identity::Issuer>,
}

/// The server's egress machinery: the proxy for domain rules and header rules, the
/// resolv.conf that filtered commands see, and the CA every command trusts; absent where
/// rules cannot be enforced.
#[derive(Debug)]
pub(crate) struct Egress {
    pub(crate) proxy: Arc<Proxy>,
    task: tokio::task::JoinHandle<()>,
    /// Bound over `/etc/resolv.conf` for filtered commands (`None`: the host has none).
    pub(crate) resolv_conf: Option<PathBuf>,
    pub(crate) trust: Trust,
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Egress {
    /// Starts the proxy, after checking that this kernel can enforce rules (for commands
    /// in a mount namespace; with path mapping, see [`PATH_MAPPING`]): the error is why
    /// not, said by every create or update that asks for rules.
    pub(crate) async fn start(setup: &Setup<'_>) -> Result<Egress, String> {
        probe().map_err(|error| {
            format!("this kernel refuses the seccomp user-notification filter that enforces them ({error})")
        })?;
        let etc_dir = setup.state_dir.join("etc");
        std::fs::create_dir_all(&etc_dir)
            .map_err(|error| format!("cannot create {}: {error}", etc_dir.display()))?;
        let resolv_conf = match std::fs::read_to_string("/etc/resolv.conf") {
            Ok(host) => {
                let path = etc_dir.join("resolv.conf");
                let kept: Vec<&str> = host
                    .lines()
                    .filter(|line| !line.trim_start().starts_with("options"))
                    .collect();
                std::fs::write(&path, format!("{}\n{RESOLV_OPTIONS}\n", kept.join("\n")))
                    .map_err(|error| format!("cannot write {}: {error}", path.display()))?;
                Some(path)
            }
            Err(_) => None,
        };
        let ca = ca::Ca::open(&setup.state_dir.join("ca"))?;
        let trust = trust_files(&etc_dir, ca.pem(), setup.add_hosts)?;
        let interceptor = intercept::Interceptor::new(
            ca,
            Arc::clone(&setup.upstream),
            Arc::new(crate::identity::Placeholders {
                secrets: Arc::clone(&setup.secrets),
                identity: Arc::clone(&setup.identity),
            }),
        );
        let (proxy, task) = Proxy::start(interceptor)
            .await
            .map_err(|error| format!("cannot start the egress proxy: {error}"))?;
        Ok(Egress {
            proxy,
            task,
            resolv_conf,
            trust,
        })
    }
}

/// Writes the sandbox's bundle (the host's plus the CA) and hosts file.
fn trust_files(
    etc_dir: &Path,
    ca_pem: &str,
    add_hosts: &[(String, std::net::IpAddr)],
) -> Result<Trust, String> {
    let write = |name: &str, text: String| {
        let path = etc_dir.join(name);
        std::fs::write(&path, text)
            .map_err(|error| format!("cannot write {}: {error}", path.display()))?;
        Ok::<_, String>(path)
    };
    let host_bundle = std::fs::read_to_string(SYSTEM_BUNDLE).ok();
    let mut bundle = host_bundle.clone().unwrap_or_default();
    if !bundle.is_empty() && !bundle.ends_with('\n') {
        bundle.push('\n');
    }
    bundle.push_str(ca_pem);
    let bundle = write("ca-certificates.crt", bundle)?;
    let hosts = if add_hosts.is_empty() {
        None
    } else {
        let mut text = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        for (name, ip) in add_hosts {
            text.push_str(&format!("{ip}\t{name}\n"));
        }
        Some(write("hosts", text)?)
    };
    Ok(Trust {
        bundle,
        bind_bundle: host_bundle.is_some(),
        hosts,
    })
}

/// The channel a filtered command sends its seccomp listener back through.
#[derive(Debug)]
pub(crate) struct Handoff {
    ours: OwnedFd,
    theirs: OwnedFd,
}

impl Handoff {
    pub(crate) fn new() -> io::Result<Handoff> {
        let mut fds = [0; 2];
        // SAFETY: fds has room for the two descriptors, owned right after.
        let result = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if result < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both are fresh descriptors of ours.
        Ok(unsafe {
            Handoff {
                ours: OwnedFd::from_raw_fd(fds[0]),
                theirs: OwnedFd::from_raw_fd(fds[1]),
            }
        })
    }

    /// The end the command writes to between fork and exec (closed by its exec).
    pub(crate) fn child_end(&self) -> RawFd {
        self.theirs.as_raw_fd()
    }

    /// Once the command is spawned: takes its listener and serves it on a thread of its
    /// own until every process under the filter is gone.
    pub(crate) fn supervise(self, policy: Arc<LivePolicy>, proxy: Arc<Proxy>) -> io::Result<()> {
        drop(self.theirs);
        let listener = filter::recv_fd(&self.ours)?;
        std::thread::Builder::new()
            .name("e2b-local-egress-listener".to_owned())
            .spawn(move || notify::serve(listener, policy, proxy))?;
        Ok(())
    }
}

/// Starts `true` under the filter and takes its listener, and takes one of our own fds
/// (the pidfd itself) with `pidfd_getfd`: what enforcement needs of the kernel.
fn probe() -> io::Result<()> {
    use std::os::unix::process::CommandExt;
    let handoff = Handoff::new()?;
    let socket = handoff.child_end();
    let mut command = std::process::Command::new("true");
    // SAFETY: install_and_send is async-signal-safe and allocates nothing.
    unsafe {
        command.pre_exec(move || filter::install_and_send(socket));
    }
    let status = command.status()?;
    if !status.success() {
        return Err(io::Error::other(format!("the probe exited with {status}")));
    }
    drop(handoff.theirs);
    let _listener = filter::recv_fd(&handoff.ours)?;
    // SAFETY: plain system calls on our own pid and fd 0; results are closed at once.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0);
        if pidfd < 0 {
            return Err(io::Error::last_os_error());
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as RawFd);
        let copy = libc::syscall(
            libc::SYS_pidfd_getfd,
            pidfd.as_raw_fd(),
            pidfd.as_raw_fd(),
            0,
        );
        if copy < 0 {
            return Err(io::Error::last_os_error());
        }
        drop(OwnedFd::from_raw_fd(copy as RawFd));
    }
    Ok(())
}
