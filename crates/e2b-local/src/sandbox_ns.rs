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

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};

/// Which namespaces the host lets e2b-local create, found when the server starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NsCapability {
    pub(crate) pid: bool,
    pub(crate) net: bool,
}

impl NsCapability {
    /// Neither: commands share the host's PID and network namespaces.
    pub(crate) const NONE: NsCapability = NsCapability {
        pid: false,
        net: false,
    };

    /// The namespaces a sandbox with this `allowInternetAccess` gets.
    pub(crate) fn plan(self, allow_internet_access: Option<bool>) -> NsPlan {
        NsPlan {
            pid: self.pid,
            offline: self.pid && self.net && allow_internet_access == Some(false),
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
    init: Child,
    pid_ns: File,
    net_ns: Option<File>,
}

impl SandboxNs {
    /// Starts the init in a new PID namespace, plus a new network namespace with only
    /// loopback (brought up) when `offline`.
    pub(crate) fn create(offline: bool) -> io::Result<SandboxNs> {
        std::thread::scope(|scope| {
            scope
                .spawn(move || SandboxNs::create_on_this_thread(offline))
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("namespace thread panicked")))
        })
    }

    /// Runs on a thread of its own, which it leaves in the new namespaces; the thread
    /// ends right after.
    fn create_on_this_thread(offline: bool) -> io::Result<SandboxNs> {
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
        // SAFETY: signal and setsid are async-signal-safe; nothing is allocated.
        unsafe {
            command.pre_exec(|| {
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
            Ok((pid_ns, net_ns))
        })();
        match opened {
            Ok((pid_ns, net_ns)) => Ok(SandboxNs {
                init,
                pid_ns,
                net_ns,
            }),
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
    /// The init is reaped on a thread of its own: it exits only once every process of
    /// its namespace has been reaped, and those are the server's children, reaped by
    /// the runtime this call may be blocking.
    fn drop(&mut self) {
        let _ = self.init.kill();
        if let Ok(pid) = i32::try_from(self.init.id()) {
            std::thread::spawn(move || {
                // SAFETY: waitpid on our own child; no memory is shared.
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
            });
        }
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

fn check(result: libc::c_int) -> io::Result<()> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
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
