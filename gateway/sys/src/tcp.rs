//! TCP socket plumbing for the fallback transport: the socket options that keep a
//! WireGuard-over-TCP connection low-latency and bounded (`TCP_NODELAY`,
//! `TCP_NOTSENT_LOWAT`, `TCP_USER_TIMEOUT`, keepalives, buffer sizes, `SO_MARK`),
//! per-connection congestion control (`TCP_CONGESTION`), `TCP_INFO` reads, listening
//! and non-blocking connecting sockets, and the one-syscall batch write.
//!
//! nix's safe socket options are used where nix has them; `TCP_NOTSENT_LOWAT` and
//! `TCP_INFO` go through libc directly.

use std::fmt;
use std::io::{self, IoSlice};
use std::mem;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{
    self, sockopt, AddressFamily, MsgFlags, SockFlag, SockType, SockaddrStorage,
};

/// TCP keepalive timing: first probe after `idle`, then every `interval`, give up after
/// `count` unanswered probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalive {
    pub idle: Duration,
    pub interval: Duration,
    pub count: u32,
}

/// The options applied to every fallback socket (connect and accept side).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpTuning {
    pub nodelay: bool,
    /// Unsent bytes the kernel may hold before the socket stops being writable: small,
    /// so packets wait in our bounded queue (where whole ones can be dropped) rather than
    /// in the kernel, and latency stays low under bulk.
    pub notsent_lowat: Option<u32>,
    /// Close the connection when sent data stays unacknowledged this long.
    pub user_timeout: Option<Duration>,
    pub keepalive: Option<Keepalive>,
    pub send_buffer: Option<u32>,
    pub recv_buffer: Option<u32>,
    pub fwmark: Option<u32>,
}

impl Default for TcpTuning {
    fn default() -> Self {
        TcpTuning {
            nodelay: true,
            notsent_lowat: Some(128 * 1024),
            user_timeout: Some(Duration::from_secs(30)),
            keepalive: Some(Keepalive {
                idle: Duration::from_secs(25),
                interval: Duration::from_secs(5),
                count: 3,
            }),
            send_buffer: None,
            recv_buffer: None,
            fwmark: None,
        }
    }
}

/// A socket option that could not be set; says which, so the user can act on it.
#[derive(Debug)]
pub struct TcpOptError {
    pub option: &'static str,
    pub source: Errno,
}

impl fmt::Display for TcpOptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "could not set {} on a TCP socket: {}",
            self.option, self.source
        )
    }
}

impl std::error::Error for TcpOptError {}

fn opt<T>(option: &'static str, r: nix::Result<T>) -> Result<T, TcpOptError> {
    r.map_err(|source| TcpOptError { option, source })
}

fn secs(d: Duration) -> u32 {
    u32::try_from(d.as_secs().max(1)).unwrap_or(u32::MAX)
}

/// Apply `t` to a TCP socket.
pub fn apply(fd: &impl AsFd, t: &TcpTuning) -> Result<(), TcpOptError> {
    opt(
        "TCP_NODELAY",
        socket::setsockopt(fd, sockopt::TcpNoDelay, &t.nodelay),
    )?;
    if let Some(v) = t.notsent_lowat {
        opt("TCP_NOTSENT_LOWAT", set_notsent_lowat(fd.as_fd(), v))?;
    }
    if let Some(d) = t.user_timeout {
        let ms = u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
        opt(
            "TCP_USER_TIMEOUT",
            socket::setsockopt(fd, sockopt::TcpUserTimeout, &ms),
        )?;
    }
    if let Some(k) = t.keepalive {
        opt(
            "SO_KEEPALIVE",
            socket::setsockopt(fd, sockopt::KeepAlive, &true),
        )?;
        opt(
            "TCP_KEEPIDLE",
            socket::setsockopt(fd, sockopt::TcpKeepIdle, &secs(k.idle)),
        )?;
        opt(
            "TCP_KEEPINTVL",
            socket::setsockopt(fd, sockopt::TcpKeepInterval, &secs(k.interval)),
        )?;
        opt(
            "TCP_KEEPCNT",
            socket::setsockopt(fd, sockopt::TcpKeepCount, &k.count.max(1)),
        )?;
    }
    if let Some(v) = t.send_buffer {
        opt(
            "SO_SNDBUF",
            socket::setsockopt(fd, sockopt::SndBuf, &(v as usize)),
        )?;
    }
    if let Some(v) = t.recv_buffer {
        opt(
            "SO_RCVBUF",
            socket::setsockopt(fd, sockopt::RcvBuf, &(v as usize)),
        )?;
    }
    if let Some(m) = t.fwmark {
        opt("SO_MARK", socket::setsockopt(fd, sockopt::Mark, &m))?;
    }
    Ok(())
}

/// `TCP_NOTSENT_LOWAT` (not among nix's socket options).
pub fn set_notsent_lowat(fd: BorrowedFd<'_>, bytes: u32) -> nix::Result<()> {
    let v: libc::c_int = bytes.min(i32::MAX as u32) as libc::c_int;
    // SAFETY: `fd` is a live descriptor for the duration of the borrow; the option value
    // points to a c_int that outlives the call and its size is passed exactly.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NOTSENT_LOWAT,
            (&v as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    Errno::result(r).map(drop)
}

/// Set the congestion control algorithm of one socket.
pub fn set_congestion(fd: &impl AsFd, name: &str) -> nix::Result<()> {
    socket::setsockopt(fd, sockopt::TcpCongestion, &std::ffi::OsString::from(name))
}

/// The socket's congestion control algorithm.
pub fn congestion(fd: &impl AsFd) -> nix::Result<String> {
    let s = socket::getsockopt(fd, sockopt::TcpCongestion)?;
    Ok(s.to_string_lossy().trim_end_matches('\0').to_string())
}

/// What we read from `TCP_INFO`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpInfo {
    /// Smoothed RTT; zero before the first sample.
    pub srtt: Duration,
    pub rttvar: Duration,
    pub snd_mss: u32,
    pub snd_cwnd: u32,
    pub total_retrans: u32,
    pub bytes_acked: u64,
    pub bytes_received: u64,
    pub notsent_bytes: u32,
}

/// Read `TCP_INFO`. Fields a kernel does not fill stay zero (the kernel copies at most
/// the length we pass and reports how much it wrote).
pub fn tcp_info(fd: &impl AsFd) -> nix::Result<TcpInfo> {
    // SAFETY: tcp_info is plain integers, for which all-zero bytes are a valid value.
    let mut ti: libc::tcp_info = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `fd` is borrowed live; `ti` is a writable tcp_info of `len` bytes and
    // `len` is a valid in/out length the kernel will not exceed.
    let r = unsafe {
        libc::getsockopt(
            fd.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut ti as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    Errno::result(r)?;
    Ok(TcpInfo {
        srtt: Duration::from_micros(u64::from(ti.tcpi_rtt)),
        rttvar: Duration::from_micros(u64::from(ti.tcpi_rttvar)),
        snd_mss: ti.tcpi_snd_mss,
        snd_cwnd: ti.tcpi_snd_cwnd,
        total_retrans: ti.tcpi_total_retrans,
        bytes_acked: ti.tcpi_bytes_acked,
        bytes_received: ti.tcpi_bytes_received,
        notsent_bytes: ti.tcpi_notsent_bytes,
    })
}

/// Write the slices with one `sendmsg` (never blocking, never raising SIGPIPE).
/// Returns the bytes the kernel took, which may end mid-frame; `WouldBlock` when the
/// socket is full.
pub fn send_slices(fd: &impl AsFd, iov: &[IoSlice<'_>]) -> io::Result<usize> {
    let flags = MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT;
    loop {
        match socket::sendmsg::<()>(fd.as_fd().as_raw_fd(), iov, &[], flags, None) {
            Err(Errno::EINTR) => continue,
            r => return r.map_err(io::Error::from),
        }
    }
}

/// Blocking variant for the standalone helpers: write all of `iov` (one `sendmsg` in
/// the common case; more only when the kernel takes a part).
pub fn send_all(fd: &impl AsFd, data: &[u8]) -> io::Result<()> {
    let mut off = 0;
    while off < data.len() {
        match socket::send(fd.as_fd().as_raw_fd(), &data[off..], MsgFlags::MSG_NOSIGNAL) {
            Ok(n) => off += n,
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn family(addr: &SocketAddr) -> AddressFamily {
    if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

/// A non-blocking listening socket. An unspecified IPv6 address (`[::]:port`) listens
/// on IPv4 too (`IPV6_V6ONLY` off), so one socket per port serves both.
pub fn listen(addr: SocketAddr, backlog: i32) -> io::Result<TcpListener> {
    let fd = socket::socket(
        family(&addr),
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    if let SocketAddr::V6(a) = addr {
        socket::setsockopt(&fd, sockopt::Ipv6V6Only, &!a.ip().is_unspecified())?;
    }
    socket::bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
    socket::listen(
        &fd,
        socket::Backlog::new(backlog).unwrap_or(socket::Backlog::MAXCONN),
    )?;
    Ok(TcpListener::from(fd))
}

/// Start a non-blocking connect with `tuning` applied before the SYN (so buffer sizes
/// and the mark hold from the first packet). Completion: the socket turns writable;
/// then [`take_error`] says whether it worked.
pub fn connect_nonblocking(addr: SocketAddr, tuning: &TcpTuning) -> io::Result<TcpStream> {
    let fd: OwnedFd = socket::socket(
        family(&addr),
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    apply(&fd, tuning).map_err(io::Error::other)?;
    match socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(addr)) {
        Ok(()) | Err(Errno::EINPROGRESS) => Ok(TcpStream::from(fd)),
        Err(e) => Err(e.into()),
    }
}

/// The pending error of a socket (`SO_ERROR`), e.g. the result of a non-blocking connect.
pub fn take_error(fd: &impl AsFd) -> io::Result<()> {
    let e = socket::getsockopt(fd, sockopt::SocketError)?;
    if e == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn pair() -> (TcpStream, TcpStream) {
        let l = listen("127.0.0.1:0".parse().unwrap(), 8).unwrap();
        let addr = l.local_addr().unwrap();
        let c = connect_nonblocking(addr, &TcpTuning::default()).unwrap();
        l.set_nonblocking(false).unwrap();
        let (s, _) = l.accept().unwrap();
        c.set_nonblocking(false).unwrap();
        (c, s)
    }

    #[test]
    fn options_apply_and_read_back() {
        let (c, _s) = pair();
        take_error(&c).unwrap();
        assert!(socket::getsockopt(&c, sockopt::TcpNoDelay).unwrap());
        assert_eq!(
            socket::getsockopt(&c, sockopt::TcpUserTimeout).unwrap(),
            30_000
        );
        assert_eq!(socket::getsockopt(&c, sockopt::TcpKeepIdle).unwrap(), 25);
        set_congestion(&c, "reno").unwrap();
        assert_eq!(congestion(&c).unwrap(), "reno");
        assert!(set_congestion(&c, "no-such-cc").is_err());
        let info = tcp_info(&c).unwrap();
        assert!(info.snd_mss > 0);
    }

    #[test]
    fn slices_leave_in_one_write() {
        let (c, mut s) = pair();
        let n = send_slices(&c, &[IoSlice::new(&[0, 3]), IoSlice::new(b"abc")]).unwrap();
        assert_eq!(n, 5);
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, &[0, 3, b'a', b'b', b'c']);
    }

    #[test]
    fn dual_stack_listener() {
        let l = match listen("[::]:0".parse().unwrap(), 8) {
            Ok(l) => l,
            Err(e) => {
                crate::testutil::not_run(&format!("no IPv6 here ({e})"));
                return;
            }
        };
        let port = l.local_addr().unwrap().port();
        let c = connect_nonblocking(
            SocketAddr::from(([127, 0, 0, 1], port)),
            &TcpTuning::default(),
        );
        assert!(c.is_ok());
    }
}
