//! A sandbox's own PID namespace (and, with internet access off, its own network
//! namespace with only loopback), so its commands see only its processes.
//!
//! The namespaces are held by a tiny init: `sleep` started as pid 1 of a fresh PID
//! namespace with SIGCHLD ignored, so that it reaps every orphan of the sandbox
//! without a line of code (an ignored SIGCHLD survives `exec`). Commands are forked
//! from a short-lived thread that first joined the init's namespaces (`setns` changes
//! the namespace of the calling thread's *children* for PID, of the thread itself for
//! network), so they stay children of the server, which waits for them and reads their
//! output as before, while being members of the sandbox's namespaces. Killing the init
//! makes the kernel kill every process left in its PID namespace: pause and kill reach
//! even processes that left the command's process group and dropped its environment.
//!
//! A sandbox with a root layer gets a mount namespace too, made by the holder thread before
//! it starts the init, with the layer's overlay mounted in it ([`crate::root_layer`]);
//! commands are forked from a thread that joined it as well, and copy it.
//!
//! The init must not outlive the server either, or a SIGKILLed server leaves its
//! sandboxes' processes behind: it is started with a parent-death signal (SIGKILL). That
//! signal fires when the *thread* that forked it ends, so the thread that creates a
//! namespace stays, blocked, for as long as the namespace is held, and reaps the init
//! once it is dropped.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::sync::mpsc;

use crate::syscall::check;

/// Which namespaces the host lets e2b-local create, found when the server starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NsCapability {
    pub(crate) pid: bool,
    pub(crate) net: bool,
    /// Root layers ([`crate::root_layer`]): overlay mounts held in a PID namespace's
    /// mount namespace.
    pub(crate) layer: bool,
}

impl NsCapability {
    /// Neither: commands share the host's PID and network namespaces.
    pub(crate) const NONE: NsCapability = NsCapability {
        pid: false,
        net: false,
        layer: false,
    };

    /// The namespaces a sandbox gets; `offline` when it has internet access off and no
    /// other egress rule (rules that allow something are enforced by [`crate::egress`]).
    pub(crate) fn plan(self, offline: bool) -> NsPlan {
        NsPlan {
            pid: self.pid,
            offline: self.pid && self.net && offline,
        }
    }
}

/// Which namespaces one sandbox's commands get besides their mount namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NsPlan {
    /// A PID namespace of the sandbox's own (commands see only its processes).
    pub(crate) pid: bool,
    /// A network namespace with only loopback (internet access off).
    pub(crate) offline: bool,
}

/// The namespaces of one sandbox, alive while its init is.
#[derive(Debug)]
pub(crate) struct SandboxNs {
    /// The init's host pid. It stays ours until `_stop` is dropped: only the holder
    /// thread reaps it, and only after that.
    init_pid: u32,
    pid_ns: File,
    net_ns: Option<File>,
    /// The mount namespace holding the sandbox's root layer, when it has one
    /// ([`crate::root_layer`]).
    mnt_ns: Option<File>,
    /// Dropping it lets the holder thread kill and reap the init, and end.
    _stop: mpsc::Sender<()>,
}

/// What the holder thread hands back once the init runs.
type Started = (u32, Namespaces);

/// The namespaces the init holds, opened.
struct Namespaces {
    pid: File,
    net: Option<File>,
    mnt: Option<File>,
}

impl SandboxNs {
    /// Starts the init in a new PID namespace, plus a new network namespace with only
    /// loopback (brought up) when `offline`, and a mount namespace with `layer` mounted
    /// when there is one.
    pub(crate) fn create(
        offline: bool,
        layer: Option<&crate::root_layer::RootLayer>,
    ) -> io::Result<SandboxNs> {
        let layer = layer.cloned();
        let (started_tx, started_rx) = mpsc::channel::<io::Result<Started>>();
        let (_stop, stopped) = mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("e2b-local-ns".to_owned())
            .spawn(move || {
                let mut init = match SandboxNs::start_init(offline, layer.as_ref()) {
                    Ok((init, namespaces)) => {
                        let _ = started_tx.send(Ok((init.id(), namespaces)));
                        init
                    }
                    Err(error) => {
                        let _ = started_tx.send(Err(error));
                        return;
                    }
                };
                // Held here, alive, so the init's parent-death signal stays armed for
                // the server's lifetime; nothing is ever sent, only the sender dropped.
                let _ = stopped.recv();
                // It exits only once every process of its namespace has been reaped;
                // those are the server's children, reaped by its runtime.
                let _ = init.kill();
                let _ = init.wait();
            })?;
        let (init_pid, namespaces) = started_rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("namespace thread panicked")))?;
        Ok(SandboxNs {
            init_pid,
            pid_ns: namespaces.pid,
            net_ns: namespaces.net,
            mnt_ns: namespaces.mnt,
            _stop,
        })
    }

    /// Runs on the holder thread, which it leaves in the new namespaces.
    fn start_init(
        offline: bool,
        layer: Option<&crate::root_layer::RootLayer>,
    ) -> io::Result<(Child, Namespaces)> {
        // First, so the init lives in it too: the namespace stays while anything does.
        let mnt = layer
            .map(crate::root_layer::RootLayer::mount_in_new_namespace)
            .transpose()?;
        let mut flags = libc::CLONE_NEWPID;
        if offline {
            flags |= libc::CLONE_NEWNET;
        }
        // SAFETY: unshare has no memory-safety preconditions; it affects this thread.
        check(unsafe { libc::unshare(flags) })?;
        if offline {
            loopback_up()?;
        }
        let mut command = std::process::Command::new("sleep");
        command
            .arg("infinity")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl, signal and setsid are async-signal-safe; nothing is allocated.
        unsafe {
            command.pre_exec(|| {
                // Dies with the holder thread, hence with the server, even a SIGKILLed
                // one; its namespace's processes die with it.
                check(libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                ))?;
                if libc::signal(libc::SIGCHLD, libc::SIG_IGN) == libc::SIG_ERR {
                    return Err(io::Error::last_os_error());
                }
                check(libc::setsid())
            });
        }
        let mut init = command.spawn()?;
        let opened = (|| {
            let pid_ns = File::open(format!("/proc/{}/ns/pid", init.id()))?;
            let net_ns = if offline {
                Some(File::open(format!("/proc/{}/ns/net", init.id()))?)
            } else {
                None
            };
            Ok(Namespaces {
                pid: pid_ns,
                net: net_ns,
                mnt,
            })
        })();
        match opened {
            Ok(namespaces) => Ok((init, namespaces)),
            Err(error) => {
                let _ = init.kill();
                let _ = init.wait();
                Err(error)
            }
        }
    }

    /// Runs `start` (which forks the command) on a thread of its own that joined the
    /// sandbox's namespaces, inside the current Tokio runtime if there is one.
    pub(crate) fn run_inside<T: Send>(
        &self,
        start: impl FnOnce() -> io::Result<T> + Send,
    ) -> io::Result<T> {
        let runtime = tokio::runtime::Handle::try_current().ok();
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let _runtime = runtime.as_ref().map(tokio::runtime::Handle::enter);
                    // SAFETY: setns has no memory-safety preconditions; the fds are open.
                    check(unsafe { libc::setns(self.pid_ns.as_raw_fd(), libc::CLONE_NEWPID) })?;
                    if let Some(net) = &self.net_ns {
                        // SAFETY: as above.
                        check(unsafe { libc::setns(net.as_raw_fd(), libc::CLONE_NEWNET) })?;
                    }
                    if let Some(mnt) = &self.mnt_ns {
                        // A thread may change its mount namespace only once it no longer
                        // shares its root and working directory with the process's
                        // other threads; the children it forks take the namespace along.
                        // SAFETY: as above.
                        check(unsafe { libc::unshare(libc::CLONE_FS) })?;
                        // SAFETY: as above.
                        check(unsafe { libc::setns(mnt.as_raw_fd(), libc::CLONE_NEWNS) })?;
                    }
                    start()
                })
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("namespace thread panicked")))
        })
    }

    /// Kills the init, and with it every process of the namespace (also on drop).
    pub(crate) fn kill(self) {
        drop(self);
    }
}

impl Drop for SandboxNs {
    /// Kills the init right away, so its namespace is gone when this returns; the
    /// holder thread reaps it once `_stop` is dropped, right after.
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.init_pid) {
            // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped
            // child (see `init_pid`), so it names no other process.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

impl SandboxNs {
    /// The host pids of the namespace's processes (its init left out) that run under no
    /// seccomp filter: ones a sandbox's egress rules could not hold.
    pub(crate) fn unfiltered_pids(&self) -> io::Result<Vec<u32>> {
        let mut found = Vec::new();
        for pid in self.member_pids()? {
            // Gone meanwhile: nothing left to hold.
            let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                continue;
            };
            let mode = status
                .lines()
                .find_map(|line| line.strip_prefix("Seccomp:"))
                .map(str::trim);
            if mode != Some("2") {
                found.push(pid);
            }
        }
        Ok(found)
    }

    /// The host pids of the namespace's processes, its init left out: every process of
    /// the sandbox, whatever group, session or environment it has.
    pub(crate) fn member_pids(&self) -> io::Result<Vec<u32>> {
        let own = std::fs::read_link(format!("/proc/{}/ns/pid", self.init_pid))?;
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc")? {
            let Some(pid) = entry?
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<u32>().ok())
            else {
                continue;
            };
            if pid != self.init_pid
                && std::fs::read_link(format!("/proc/{pid}/ns/pid"))
                    .ok()
                    .as_ref()
                    == Some(&own)
            {
                found.push(pid);
            }
        }
        Ok(found)
    }
}

/// The pid `host_pid` has inside its own PID namespace (the last `NSpid` field).
pub(crate) fn inner_pid(host_pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{host_pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// Brings up `lo` in the calling thread's network namespace (new ones start with it
/// down, and a sandbox offline still talks to itself over loopback).
fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket/ioctl calls on a zeroed ifreq naming "lo"; the fd is closed.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        for (dst, src) in request.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        let result = (|| {
            check(libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut request))?;
            request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            check(libc::ioctl(fd, libc::SIOCSIFFLAGS, &request))
        })();
        libc::close(fd);
        result
    }
}
