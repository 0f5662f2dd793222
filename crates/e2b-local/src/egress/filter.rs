//! The seccomp filter a command of a sandbox with rules is started under, and the hand-off
//! of its user-notification listener to the server.
//!
//! The filter (inherited by every descendant, and never removable) sends each `connect` to
//! the server, which judges it ([`super::notify`]). So that nothing reaches the network
//! without a `connect`, it also refuses what would: datagram and raw sockets of the
//! internet families (so UDP too: DNS then goes over TCP, see [`super::RESOLV_OPTIONS`]),
//! packet and other exotic socket families, stream protocols other than TCP and MPTCP (SCTP
//! connects from `sendmsg`), TCP Fast Open's connecting `sendto`/`sendmsg`, `io_uring`
//! (whose connects no filter sees), and system calls of another ABI (x32, i386), whose
//! numbers differ.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use libc::sock_filter;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// x32 system calls on x86_64 carry this bit.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
const MSG_FASTOPEN: u32 = 0x2000_0000;
const IPPROTO_MPTCP: u32 = 262;

const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const BPF_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const BPF_JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const BPF_JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
const BPF_AND_K: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// Offsets in `struct seccomp_data`: the low 32 bits of argument `i` (little endian).
const NR: u32 = 0;
const ARCH: u32 = 4;
const fn arg(i: u32) -> u32 {
    16 + 8 * i
}

const fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

const fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

const fn errno(code: i32) -> sock_filter {
    stmt(BPF_RET_K, libc::SECCOMP_RET_ERRNO | (code as u32 & 0xffff))
}

const ALLOW: sock_filter = stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW);
const NOTIFY: sock_filter = stmt(BPF_RET_K, libc::SECCOMP_RET_USER_NOTIF);

/// The program. Jumps are relative: each names how many instructions it skips.
#[rustfmt::skip]
static PROGRAM: [sock_filter; 37] = [
    /* 0 */ stmt(BPF_LD_W_ABS, ARCH),
    /* 1 */ jump(BPF_JEQ_K, AUDIT_ARCH, 1, 0),
    /* 2 */ errno(libc::ENOSYS),
    /* 3 */ stmt(BPF_LD_W_ABS, NR),
    /* 4 */ jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1),
    /* 5 */ errno(libc::ENOSYS),
    /* 6 */ jump(BPF_JEQ_K, libc::SYS_connect as u32, 0, 1),
    /* 7 */ NOTIFY,
    /* 8 */ jump(BPF_JEQ_K, libc::SYS_io_uring_setup as u32, 0, 1),
    /* 9 */ errno(libc::EPERM),
    /* 10 */ jump(BPF_JEQ_K, libc::SYS_socket as u32, 9, 0),
    /* 11 */ jump(BPF_JEQ_K, libc::SYS_sendto as u32, 2, 0),
    /* 12 */ jump(BPF_JEQ_K, libc::SYS_sendmmsg as u32, 1, 0),
    /* 13 */ jump(BPF_JEQ_K, libc::SYS_sendmsg as u32, 2, 5),
    // sendto, sendmmsg: flags are the fourth argument.
    /* 14 */ stmt(BPF_LD_W_ABS, arg(3)),
    /* 15 */ jump(BPF_JSET_K, MSG_FASTOPEN, 2, 3),
    // sendmsg: the third.
    /* 16 */ stmt(BPF_LD_W_ABS, arg(2)),
    /* 17 */ jump(BPF_JSET_K, MSG_FASTOPEN, 0, 1),
    /* 18 */ errno(libc::EOPNOTSUPP),
    /* 19 */ ALLOW,
    // socket(domain, type, protocol).
    /* 20 */ stmt(BPF_LD_W_ABS, arg(0)),
    /* 21 */ jump(BPF_JEQ_K, libc::AF_INET as u32, 5, 0),
    /* 22 */ jump(BPF_JEQ_K, libc::AF_INET6 as u32, 4, 0),
    /* 23 */ jump(BPF_JEQ_K, libc::AF_UNIX as u32, 2, 0),
    /* 24 */ jump(BPF_JEQ_K, libc::AF_NETLINK as u32, 1, 0),
    /* 25 */ errno(libc::EAFNOSUPPORT),
    /* 26 */ ALLOW,
    /* 27 */ stmt(BPF_LD_W_ABS, arg(1)),
    /* 28 */ stmt(BPF_AND_K, 0xf),
    /* 29 */ jump(BPF_JEQ_K, libc::SOCK_STREAM as u32, 1, 0),
    /* 30 */ errno(libc::EACCES),
    /* 31 */ stmt(BPF_LD_W_ABS, arg(2)),
    /* 32 */ jump(BPF_JEQ_K, 0, 2, 0),
    /* 33 */ jump(BPF_JEQ_K, libc::IPPROTO_TCP as u32, 1, 0),
    /* 34 */ jump(BPF_JEQ_K, IPPROTO_MPTCP, 0, 1),
    /* 35 */ ALLOW,
    /* 36 */ errno(libc::EPROTONOSUPPORT),
];

/// Installs the filter on the calling process and sends its listener over `socket`.
/// Runs between fork and exec: only async-signal-safe calls, no allocation.
pub(crate) fn install_and_send(socket: RawFd) -> io::Result<()> {
    let program = libc::sock_fprog {
        len: PROGRAM.len() as u16,
        filter: PROGRAM.as_ptr().cast_mut(),
    };
    // SAFETY: the program is a valid, 'static BPF program; seccomp copies it.
    let listener = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &program as *const libc::sock_fprog,
        )
    };
    if listener < 0 {
        return Err(io::Error::last_os_error());
    }
    let listener = listener as RawFd;
    let sent = send_fd(socket, listener);
    // SAFETY: the listener is ours; the sandbox must never hold it.
    unsafe { libc::close(listener) };
    sent
}

/// Sends one descriptor with SCM_RIGHTS (async-signal-safe: a stack buffer only).
fn send_fd(socket: RawFd, fd: RawFd) -> io::Result<()> {
    // u64s keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; 4];
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: every pointer refers to the stack buffers above, sized for one fd.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(size_of::<RawFd>() as u32) as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        if libc::sendmsg(socket, &msg, libc::MSG_NOSIGNAL) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives the descriptor [`send_fd`] sent, without waiting (it was sent before exec).
pub(crate) fn recv_fd(socket: &OwnedFd) -> io::Result<OwnedFd> {
    let mut control = [0u64; 4];
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: as in send_fd; the received fd is checked before it is owned.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = size_of_val(&control) as _;
        let flags = libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC;
        if libc::recvmsg(socket.as_raw_fd(), &mut msg, flags) < 0 {
            return Err(io::Error::last_os_error());
        }
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(io::Error::other("the command sent no seccomp listener"));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
        Ok(OwnedFd::from_raw_fd(fd))
    }
}
