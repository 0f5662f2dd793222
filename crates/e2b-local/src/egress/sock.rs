//! Socket calls both sides of the egress filter make (the notifier that connects a command's
//! socket, the proxy that relays what it let through): connect, bind, addresses and options,
//! each turning a failed libc call into its errno.

use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, OwnedFd};

pub(super) fn sockopt(socket: &OwnedFd, option: i32) -> Result<i32, i32> {
    let mut value: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: value and len describe a c_int.
    let result = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    errno_unless_ok(result, libc::ENOTSOCK).map(|()| value)
}

/// An internet address from raw sockaddr bytes (`None`: another family or too short).
pub(super) fn parse_sockaddr(raw: &[u8]) -> Option<SocketAddr> {
    let family = i32::from(u16::from_ne_bytes([*raw.first()?, *raw.get(1)?]));
    let port = u16::from_be_bytes([*raw.get(2)?, *raw.get(3)?]);
    if family == libc::AF_INET && raw.len() >= size_of::<libc::sockaddr_in>() {
        let ip = Ipv4Addr::new(raw[4], raw[5], raw[6], raw[7]);
        Some(SocketAddr::V4(SocketAddrV4::new(ip, port)))
    } else if family == libc::AF_INET6 && raw.len() >= size_of::<libc::sockaddr_in6>() {
        let flowinfo = u32::from_be_bytes(raw[4..8].try_into().ok()?);
        let octets: [u8; 16] = raw[8..24].try_into().ok()?;
        let scope = u32::from_ne_bytes(raw[24..28].try_into().ok()?);
        Some(SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(octets),
            port,
            flowinfo,
            scope,
        )))
    } else {
        None
    }
}

/// Connects `socket` to `dest` as its own `connect` would: 0 or the errno.
pub(super) fn connect(socket: &OwnedFd, dest: SocketAddr) -> Result<(), i32> {
    let (storage, len) = sockaddr(dest);
    // SAFETY: storage holds a sockaddr of `len` bytes.
    let result = unsafe {
        libc::connect(
            socket.as_raw_fd(),
            (&storage as *const libc::sockaddr_storage).cast(),
            len,
        )
    };
    errno_unless_ok(result, libc::ECONNREFUSED)
}

pub(super) fn connect_unspec(socket: &OwnedFd) -> Result<(), i32> {
    // SAFETY: a zeroed sockaddr is AF_UNSPEC.
    let mut addr: libc::sockaddr = unsafe { std::mem::zeroed() };
    addr.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    // SAFETY: addr is a valid sockaddr.
    let result = unsafe {
        libc::connect(
            socket.as_raw_fd(),
            &addr,
            size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
    errno_unless_ok(result, libc::EINVAL)
}

/// A sockaddr for `addr` (a v4 address for a v6 socket is written v4-mapped by callers).
pub(super) fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and suitably aligned.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// The local address of a socket, when it has one.
pub(super) fn local_addr(socket: &OwnedFd) -> Option<SocketAddr> {
    // SAFETY: storage and len describe a sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let result = unsafe {
        libc::getsockname(
            socket.as_raw_fd(),
            (&mut storage as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if result < 0 {
        return None;
    }
    // SAFETY: the kernel wrote `len` bytes of a sockaddr.
    let raw = unsafe {
        std::slice::from_raw_parts(
            (&storage as *const libc::sockaddr_storage).cast::<u8>(),
            len as usize,
        )
    };
    parse_sockaddr(raw).map(|addr| match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => addr,
        },
        v4 => v4,
    })
}

/// Binds a socket to `addr` (the proxy's side of loopback).
pub(super) fn bind(socket: &OwnedFd, addr: SocketAddr) -> Result<(), i32> {
    let (storage, len) = sockaddr(addr);
    // SAFETY: storage holds a sockaddr of `len` bytes.
    let result = unsafe {
        libc::bind(
            socket.as_raw_fd(),
            (&storage as *const libc::sockaddr_storage).cast(),
            len,
        )
    };
    errno_unless_ok(result, libc::EADDRNOTAVAIL)
}

/// A libc call's result as the errno the caller's own call would have failed with:
/// `fallback` when the OS names none.
fn errno_unless_ok(result: libc::c_int, fallback: i32) -> Result<(), i32> {
    if result < 0 {
        Err(io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(fallback))
    } else {
        Ok(())
    }
}
