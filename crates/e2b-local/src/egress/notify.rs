//! The server's half of the filter: every `connect` of a filtered command arrives here and
//! is judged against the sandbox's policy of that moment.
//!
//! The target's socket is taken with `pidfd_getfd` and connected *from here*, to an
//! address built from the bytes read once, so what was judged is what is connected (a
//! thread of the sandbox rewriting the address meanwhile changes nothing); the socket's
//! options and `O_NONBLOCK` are its own, so the answer is exactly what its `connect` would
//! have said (`EINPROGRESS` for a non-blocking one). A denied connection is refused with
//! `ECONNREFUSED`. Decisions and non-blocking connects are answered on the listener's
//! thread; a blocking connect that may wait for its peer gets a thread of its own (at most
//! [`MAX_WAITING`] at once per command tree). A connection that only a domain rule may allow (ports 80 and 443) is
//! connected to the in-process proxy ([`super::proxy`]), which reads the name it asks for.
//! Only non-internet sockets (Unix, netlink) are let through to the kernel unchanged.

use std::io;
use std::mem::size_of;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::rules::{HTTP_PORT, TLS_PORT, Verdict};
use super::sock::{connect, connect_unspec, parse_sockaddr, sockopt};
use super::{LivePolicy, proxy::Proxy};

/// Serves one command tree's listener until every process under the filter is gone.
pub(crate) fn serve(listener: OwnedFd, policy: Arc<LivePolicy>, proxy: Arc<Proxy>) {
    let waiting = Arc::new(AtomicUsize::new(0));
    loop {
        let mut poll = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, -1) };
        if ready < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if poll.revents & libc::POLLIN == 0 {
            // POLLHUP: no process uses the filter any more.
            return;
        }
        // SAFETY: RECV needs a zeroed notification to fill.
        let mut notif: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: the listener is a seccomp listener; notif is the size RECV expects.
        if unsafe {
            libc::ioctl(
                listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_RECV,
                &mut notif,
            )
        } < 0
        {
            // ENOENT: the caller died or was interrupted before we read it.
            continue;
        }
        match judge(&listener, &notif, &policy, &proxy) {
            Step::Answer(outcome) => reply(&listener, notif.id, outcome),
            Step::Connect(socket, dest) if blocking(&socket) => {
                // A blocking connect takes as long as the peer does: a thread of its own,
                // so the sandbox's other connects are never held up behind it; bounded,
                // so a connect storm cannot pile up threads in the server.
                if waiting.fetch_add(1, Ordering::SeqCst) >= MAX_WAITING {
                    waiting.fetch_sub(1, Ordering::SeqCst);
                    reply(&listener, notif.id, Some(Err(libc::EAGAIN)));
                    continue;
                }
                let Ok(answer) = listener.try_clone() else {
                    waiting.fetch_sub(1, Ordering::SeqCst);
                    reply(&listener, notif.id, Some(Err(libc::EMFILE)));
                    continue;
                };
                let done = Arc::clone(&waiting);
                let id = notif.id;
                let spawned = std::thread::Builder::new()
                    .name("e2b-local-egress".to_owned())
                    .spawn(move || {
                        reply(&answer, id, Some(connect(&socket, dest)));
                        done.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    waiting.fetch_sub(1, Ordering::SeqCst);
                    reply(&listener, notif.id, Some(Err(libc::EAGAIN)));
                }
            }
            Step::Connect(socket, dest) => {
                reply(&listener, notif.id, Some(connect(&socket, dest)));
            }
            Step::Proxy(socket, domain, dest, by_name) => {
                // To the proxy on loopback: answered at once, blocking or not.
                let outcome = proxy.redirect(&socket, domain, dest, by_name, &policy);
                reply(&listener, notif.id, Some(outcome));
            }
        }
    }
}

/// Blocking connects of one command tree waiting at once, at most.
const MAX_WAITING: usize = 64;

/// What to do with one `connect`.
enum Step {
    /// Answer now.
    Answer(Outcome),
    /// Connect the socket to the destination, as asked.
    Connect(OwnedFd, SocketAddr),
    /// Connect it to the proxy, which reads the name (socket domain, destination, and
    /// whether a domain entry must allow the name).
    Proxy(OwnedFd, i32, SocketAddr, bool),
}

/// Whether a socket's connect waits for the peer (no `O_NONBLOCK` on its open file).
fn blocking(socket: &OwnedFd) -> bool {
    // SAFETY: F_GETFL on a valid fd.
    let flags = unsafe { libc::fcntl(socket.as_raw_fd(), libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK == 0
}

/// The answer to one `connect`: `Ok(())` for success, `Err(errno)` else, or `None` to let
/// the kernel run it unchanged.
type Outcome = Option<Result<(), i32>>;

fn judge(
    listener: &OwnedFd,
    notif: &libc::seccomp_notif,
    policy: &LivePolicy,
    proxy: &Proxy,
) -> Step {
    let pid = notif.pid as libc::pid_t;
    let target_fd = notif.data.args[0] as RawFd;
    let len = (notif.data.args[2] as usize).min(size_of::<libc::sockaddr_storage>());
    let mut raw = [0u8; size_of::<libc::sockaddr_storage>()];
    if read_remote(pid, notif.data.args[1] as usize, &mut raw[..len]).is_err() {
        return Step::Answer(Some(Err(libc::EFAULT)));
    }
    let socket = match take_socket(pid, target_fd) {
        Ok(socket) => socket,
        Err(errno) => return Step::Answer(Some(Err(errno))),
    };
    // The pid could have been reused by another process since the notification: only an
    // id still pending proves the socket is the caller's.
    // SAFETY: the listener is valid; the id is a plain u64.
    if unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
            &notif.id,
        )
    } < 0
    {
        return Step::Answer(Some(Err(libc::EINTR)));
    }
    let domain = match sockopt(&socket, libc::SO_DOMAIN) {
        Ok(domain) => domain,
        Err(errno) => return Step::Answer(Some(Err(errno))),
    };
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        // A Unix or netlink socket cannot be aimed at an internet address.
        return Step::Answer(None);
    }
    let family = i32::from(u16::from_ne_bytes([raw[0], raw[1]]));
    if family == libc::AF_UNSPEC {
        // Dissolving an association reaches nothing.
        return Step::Answer(Some(connect_unspec(&socket)));
    }
    let Some(dest) = parse_sockaddr(&raw[..len]) else {
        return Step::Answer(Some(Err(libc::EAFNOSUPPORT)));
    };
    let live = policy;
    let policy = policy.current();
    let verdict = if proxy.is_api(dest) {
        policy.remote_verdict(dest.ip(), dest.port())
    } else {
        policy.verdict(dest.ip(), dest.port())
    };
    let ip = super::rules::unmapped(dest.ip());
    let own = ip == std::net::Ipv4Addr::LOCALHOST
        || ip == std::net::Ipv6Addr::LOCALHOST
        || ip.is_unspecified();
    match verdict {
        // A name with header rules is told only by what the connection asks for: every
        // web connection out goes by the proxy (the sandbox's own loopback excepted).
        //
        // With an `egressProxy`, every allowed TCP connection out goes by the proxy too,
        // which connects through it (DNS to the sandbox's resolvers excepted).
        Verdict::Allow
            if !own
                && ((policy.has_header_rules()
                    && (dest.port() == HTTP_PORT || dest.port() == TLS_PORT))
                    || (policy.egress_proxy().is_some() && !policy.is_dns(ip, dest.port()))) =>
        {
            Step::Proxy(socket, domain, dest, false)
        }
        Verdict::Allow => Step::Connect(socket, dest),
        Verdict::Deny => {
            live.refused(dest, None);
            Step::Answer(Some(Err(libc::ECONNREFUSED)))
        }
        Verdict::ByName => Step::Proxy(socket, domain, dest, true),
    }
}

fn reply(listener: &OwnedFd, id: u64, outcome: Outcome) {
    // SAFETY: zeroed is a valid response to fill in.
    let mut resp: libc::seccomp_notif_resp = unsafe { std::mem::zeroed() };
    resp.id = id;
    match outcome {
        None => resp.flags = libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
        Some(Ok(())) => {}
        Some(Err(errno)) => resp.error = -errno,
    }
    // SAFETY: a valid listener and response. ENOENT (the caller is gone) needs nothing.
    unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            &mut resp,
        )
    };
}

fn read_remote(pid: libc::pid_t, address: usize, buf: &mut [u8]) -> io::Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: address as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: the local iovec is our buffer; the remote one is only read by the kernel.
    let read = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if read == buf.len() as isize {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The caller's socket, shared (same open file) through `pidfd_getfd`.
fn take_socket(pid: libc::pid_t, fd: RawFd) -> Result<OwnedFd, i32> {
    let errno = || {
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EBADF)
    };
    let Some(pidfd) = thread_pidfd(pid) else {
        return Err(libc::EINTR);
    };
    // SAFETY: a plain system call; the returned fd is owned right away.
    unsafe {
        let socket = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0);
        if socket < 0 {
            return Err(errno());
        }
        Ok(OwnedFd::from_raw_fd(socket as RawFd))
    }
}

/// A pidfd for the thread that called `connect` (the notification names a thread, not a
/// process: any thread of a multithreaded program may connect). A thread pidfd reaches that
/// thread's own fd table; kernels before 6.9 lack `PIDFD_THREAD` and get its thread group's.
/// Either way the caller checks afterwards that the notification is still pending, which
/// proves the thread, and so its group, were not replaced meanwhile.
fn thread_pidfd(tid: libc::pid_t) -> Option<OwnedFd> {
    let open = |pid: libc::pid_t, flags: libc::c_uint| {
        // SAFETY: a plain system call; the returned fd is owned right away.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, flags) };
        // SAFETY: a fresh fd of ours.
        (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) })
    };
    open(tid, libc::PIDFD_THREAD).or_else(|| open(thread_group(tid)?, 0))
}

/// The thread group (process) a thread belongs to, from `/proc/<tid>/status`.
fn thread_group(tid: libc::pid_t) -> Option<libc::pid_t> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Tgid:"))?
        .trim()
        .parse()
        .ok()
}
