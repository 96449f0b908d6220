//! The data-plane UDP socket: dual-stack bind, `SO_REUSEPORT` (one socket per worker),
//! large buffers, `UDP_SEGMENT` (GSO) sends and `UDP_GRO` receives with their cmsgs,
//! and the `sendmmsg`/`recvmmsg` batch paths.
//!
//! Features are probed once in [`UdpSocket::bind`]. A GSO send that fails with `EIO`
//! (no checksum offload on the route) demotes this socket to plain datagrams for good.
//! One that fails with `EINVAL` does not: the usual cause is a path MTU below the
//! segment size toward that one destination (an ICMP "fragmentation needed" or a
//! router advertisement's MTU option lowered it, which anyone on the uplink can send),
//! so GSO only rests toward that destination ([`gso_verdict`], `core::gso_rest`):
//! datagrams to it one by one for a second, doubling up to a minute while the failures
//! go on, then GSO is tried again; every other destination keeps its super-datagrams.
//! Logged at most once a minute. Linux 6.14 and later answer that case with `EMSGSIZE`
//! instead, which needs no rest at all (the kernel only refuses that one send).
//! The rests sit behind a mutex with a count beside it: while nothing rests (the usual
//! case) a send reads the count and takes no lock.
//! [`UdpSocket::send_segmented`] resends the refused batch itself (one by one, which the
//! kernel may fragment) so callers never lose it; the io_uring engine does the same with
//! [`UdpSocket::send_each_from`] ([`gso_refused`]).
//!
//! `IP_MTU_DISCOVER` / `IPV6_MTU_DISCOVER` are left at the kernel's default,
//! `IP_PMTUDISC_WANT` (`net.ipv4.ip_no_pmtu_disc = 0`): a datagram that fits the route's
//! MTU leaves with DF, the kernel learns the path MTU from ICMP errors (the firewall
//! accepts those quoting our datagrams), and a datagram above the learnt path MTU is
//! fragmented locally rather than refused: a 1420-byte inner packet (1480/1500 bytes
//! outer) on a 1280-byte path leaves as two fragments. (IPv4 sets no DF on a GSO send
//! longer than the route's MTU, so its segments may be fragmented by routers on the
//! way; IPv6 routers never fragment, so there PMTU discovery is the only way.)
//!
//! Addresses: a dual-stack socket talks IPv4 as `::ffff:a.b.c.d`; this module maps on
//! the way out and unmaps on the way in, so callers only ever see plain `SocketAddr`s.
//! Address and cmsg encoding is `sys::cmsg`'s, shared with the io_uring path.

use std::fmt;
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::cmsg::{from_raw, invalid, to_raw, RawAddr, SOL_UDP, UDP_GRO, UDP_SEGMENT};
use riceguard_core::gso_rest::GsoRests;
use riceguard_core::offload::{OffloadDecision, SocketProbe};
// The message formats live in `sys::cmsg` (shared with io_uring); re-exported here, where
// callers of the socket look for them.
pub use crate::cmsg::{
    canonical, gro_segment_size, parse_control, parse_sockaddr, recv_meta, write_gso_cmsg,
    write_send_cmsgs, CmsgBuf, PktInfo, RecvControl, RecvMeta,
};

/// Most messages one `sendmmsg`/`recvmmsg` call moves; the arrays live on the stack.
pub const BATCH: usize = 64;
/// Most segments one `UDP_SEGMENT` send may carry (the kernel's `UDP_MAX_SEGMENTS`).
pub const MAX_GSO_SEGMENTS: usize = 64;
/// Socket buffer size we ask for (wireguard-go uses the same 7 MiB).
pub const DEFAULT_BUFFER_BYTES: usize = 7 << 20;

/// How to set the socket up.
#[derive(Clone, Debug)]
pub struct UdpOptions {
    /// `SO_REUSEPORT`, so every worker binds its own socket to the same port.
    pub reuse_port: bool,
    /// Requested send and receive buffer size (forced past `rmem_max` when root).
    pub buffer_bytes: usize,
    /// Try to switch on `UDP_GRO` (then every receive buffer must be 64 KiB).
    pub gro: bool,
    /// Use `UDP_SEGMENT` when the kernel has it.
    pub gso: bool,
    /// Learn the local address each datagram was sent to (`IP_PKTINFO`/
    /// `IPV6_RECVPKTINFO`) so replies can leave from it: a multi-homed gateway must answer
    /// from the address the client used (wireguard-go's "sticky" sockets).
    pub pktinfo: bool,
}

impl Default for UdpOptions {
    fn default() -> Self {
        UdpOptions {
            reuse_port: true,
            buffer_bytes: DEFAULT_BUFFER_BYTES,
            gro: true,
            gso: true,
            pktinfo: true,
        }
    }
}

/// Why the socket could not be set up.
#[derive(Debug)]
#[non_exhaustive]
pub enum UdpError {
    /// `socket()` failed.
    Socket(io::Error),
    /// A socket option the data plane cannot do without failed.
    SetOption {
        option: &'static str,
        source: io::Error,
    },
    /// `bind()` failed (port in use without `SO_REUSEPORT` on both sockets, ...).
    Bind { addr: SocketAddr, source: io::Error },
}

impl fmt::Display for UdpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Socket(e) => write!(f, "cannot create a UDP socket: {e}"),
            Self::SetOption { option, source } => {
                write!(f, "cannot set UDP socket option {option}: {source}")
            }
            Self::Bind { addr, source } => write!(
                f,
                "cannot bind UDP {addr}: {source} (is another program using the port?)"
            ),
        }
    }
}

impl std::error::Error for UdpError {}

/// One message for [`UdpSocket::send_batch`].
#[derive(Clone, Copy, Debug)]
pub struct Transmit<'a> {
    pub dst: SocketAddr,
    pub contents: &'a [u8],
    /// `Some(n)`: GSO, split into `n`-byte datagrams by the kernel (only when
    /// [`UdpSocket::gso_enabled_to`] `dst`). `None`: one datagram.
    pub segment_size: Option<u16>,
    /// Leave from this local address (from [`RecvMeta::dst`]); `None`: routing picks.
    pub src: Option<PktInfo>,
}

impl<'a> Transmit<'a> {
    /// One datagram, routing picks the source.
    pub fn new(dst: SocketAddr, contents: &'a [u8]) -> Self {
        Transmit {
            dst,
            contents,
            segment_size: None,
            src: None,
        }
    }
}

/// The socket. `&self` methods only, so workers may share it across threads.
#[derive(Debug)]
pub struct UdpSocket {
    fd: OwnedFd,
    local: SocketAddr,
    /// The socket is AF_INET6 (IPv4 peers go as v4-mapped addresses).
    v6: bool,
    gso: AtomicBool,
    /// The destinations GSO rests toward after an `EINVAL` ([`gso_verdict`]), by
    /// [`canonical`] address, in milliseconds of [`clock_ms`].
    gso_rests: Mutex<GsoRests>,
    /// `gso_rests.len()`, stored under its lock: 0 lets a send skip the lock. A stale
    /// read costs one lock taken for nothing or one GSO send more, never a wrong send.
    gso_resting: AtomicUsize,
    gro: AtomicBool,
}

/// What a failed `UDP_SEGMENT` send means for the socket (both backends follow it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GsoVerdict {
    /// Not a GSO failure: GSO stays.
    Unrelated,
    /// `EIO`: the route has no checksum offload, which does not come back. No GSO on
    /// this socket from now on.
    Demote,
    /// `EINVAL`: segments above the path MTU toward this destination (which one forged
    /// ICMP error or router advertisement can lower), or a socket that refuses GSO.
    /// Neither is a reason to give GSO up for good, nor to take it from other
    /// destinations: datagram by datagram toward this one for a while
    /// (`core::gso_rest`: 1 s, doubling up to 64 s while it keeps failing), then GSO
    /// again.
    Rest,
}

/// Whether a socket sends with GSO ([`UdpSocket::gso_state`]); the destinations it
/// rests toward are apart ([`UdpSocket::gso_rests`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GsoState {
    /// `UDP_SEGMENT` sends in use (save toward resting destinations).
    On,
    /// Not probed, not wanted by the offload decision, or demoted by an `EIO`.
    Off,
}

/// One destination GSO rests toward ([`UdpSocket::gso_rests`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GsoRest {
    pub dst: SocketAddr,
    /// How long the rest has left.
    pub left: Duration,
}

/// Most `udp gso rest:` lines in the status; more destinations are counted on one more.
pub const REST_LINES: usize = 4;

/// The status file's GSO lines for the workers' sockets. First `udp gso:`, `on` or
/// `off` when they all agree, else how many are on and off (an `EIO` turns one off).
/// Then one `udp gso rest:` line per destination GSO rests toward after an `EINVAL`
/// (merged across sockets, the longest rest first, at most [`REST_LINES`] and a count
/// of the rest): the others still get super-datagrams.
pub fn gso_status_lines(states: &[GsoState], rests: &[GsoRest]) -> Vec<String> {
    let n = states.len();
    let on = states.iter().filter(|s| **s == GsoState::On).count();
    let mut lines = vec![if on == n {
        "udp gso: on".to_string()
    } else if on == 0 {
        "udp gso: off".to_string()
    } else {
        format!("udp gso: on {on} of {n} sockets, off {}", n - on)
    }];
    // Several workers' sockets may rest toward the same peer: its longest rest counts.
    let mut merged: Vec<GsoRest> = Vec::new();
    for r in rests {
        match merged.iter_mut().find(|m| m.dst == r.dst) {
            Some(m) => m.left = m.left.max(r.left),
            None => merged.push(*r),
        }
    }
    merged.sort_by(|a, b| b.left.cmp(&a.left).then(a.dst.cmp(&b.dst)));
    for r in merged.iter().take(REST_LINES) {
        lines.push(format!(
            "udp gso rest: {} one by one for {} s more (EINVAL: segments above its path MTU)",
            r.dst,
            r.left.as_millis().div_ceil(1000)
        ));
    }
    if merged.len() > REST_LINES {
        lines.push(format!(
            "udp gso rest: {} more destinations one by one",
            merged.len() - REST_LINES
        ));
    }
    lines
}

/// The verdict on a GSO send that failed with `errno`.
pub fn gso_verdict(errno: i32) -> GsoVerdict {
    match errno {
        libc::EIO => GsoVerdict::Demote,
        libc::EINVAL => GsoVerdict::Rest,
        _ => GsoVerdict::Unrelated,
    }
}

/// Milliseconds of `CLOCK_BOOTTIME` (never stepped), the time rests are kept in.
fn clock_ms() -> u64 {
    u64::try_from(crate::kernel_clocks::boottime().as_millis()).unwrap_or(u64::MAX)
}

impl UdpSocket {
    /// Bind `addr`. `[::]:port` gives a dual-stack socket that also takes IPv4.
    pub fn bind(addr: SocketAddr, opts: &UdpOptions) -> Result<UdpSocket, UdpError> {
        let v6 = addr.is_ipv6();
        let domain = if v6 { libc::AF_INET6 } else { libc::AF_INET };
        // SAFETY: plain socket() call; the result is checked below.
        let raw = unsafe {
            libc::socket(
                domain,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if raw < 0 {
            return Err(UdpError::Socket(io::Error::last_os_error()));
        }
        // SAFETY: raw is a fresh fd owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let fdr = fd.as_raw_fd();

        if v6 {
            let v6only = if let SocketAddr::V6(a) = addr {
                !a.ip().is_unspecified()
            } else {
                false
            };
            set_int(fdr, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, v6only.into()).map_err(
                |source| UdpError::SetOption {
                    option: "IPV6_V6ONLY",
                    source,
                },
            )?;
        }
        if opts.reuse_port {
            set_int(fdr, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1).map_err(|source| {
                UdpError::SetOption {
                    option: "SO_REUSEPORT",
                    source,
                }
            })?;
        }
        // Buffers are best effort: a small buffer costs speed, not correctness.
        let want = opts.buffer_bytes.min(i32::MAX as usize) as libc::c_int;
        for (force, plain) in [
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        ] {
            if set_int(fdr, libc::SOL_SOCKET, force, want).is_err() {
                let _ = set_int(fdr, libc::SOL_SOCKET, plain, want);
            }
        }

        let (sa, len) = to_raw(addr, v6);
        // SAFETY: sa is a valid sockaddr of `len` bytes that lives across the call.
        let rc = unsafe { libc::bind(fdr, (&sa as *const RawAddr).cast(), len) };
        if rc < 0 {
            return Err(UdpError::Bind {
                addr,
                source: io::Error::last_os_error(),
            });
        }
        let local = local_addr(fdr).map_err(|source| UdpError::Bind { addr, source })?;

        if opts.pktinfo {
            // Best effort: without it replies simply leave from the routed address.
            let _ = set_int(fdr, libc::IPPROTO_IP, libc::IP_PKTINFO, 1);
            if v6 {
                let _ = set_int(fdr, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1);
            }
        }
        let gso = opts.gso && get_int(fdr, SOL_UDP, UDP_SEGMENT).is_ok();
        let gro = opts.gro && set_int(fdr, SOL_UDP, UDP_GRO, 1).is_ok();
        Ok(UdpSocket {
            fd,
            local,
            v6,
            gso: AtomicBool::new(gso),
            gso_rests: Mutex::new(GsoRests::new()),
            gso_resting: AtomicUsize::new(0),
            gro: AtomicBool::new(gro),
        })
    }

    /// The bound address (with the port the kernel picked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Whether `UDP_SEGMENT` sends are in use on this socket (probed at bind, cleared
    /// for good by an `EIO`); a destination may still rest ([`Self::gso_enabled_to`]).
    pub fn gso_enabled(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    /// Whether a GSO send to `dst` may be tried now: GSO on, and not resting toward
    /// `dst` after an `EINVAL`. Takes no lock while no destination rests.
    pub fn gso_enabled_to(&self, dst: SocketAddr) -> bool {
        self.gso_enabled() && !self.gso_resting_to(dst, clock_ms)
    }

    /// Segments one GSO send to `dst` may carry now: [`MAX_GSO_SEGMENTS`], or 1 without
    /// GSO toward it.
    pub fn max_gso_segments_to(&self, dst: SocketAddr) -> usize {
        if self.gso_enabled_to(dst) {
            MAX_GSO_SEGMENTS
        } else {
            1
        }
    }

    /// Whether GSO rests toward `dst` at the time `now` gives (read only while any
    /// destination rests).
    fn gso_resting_to(&self, dst: SocketAddr, now: impl FnOnce() -> u64) -> bool {
        if self.gso_resting.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.with_rests(|r| r.resting(canonical(dst), now()))
    }

    /// The rest table under its lock; the count beside it follows what `f` did. A
    /// panic under the lock cannot leave the table half-changed in a way that matters
    /// (at worst a destination tries GSO once more), so poisoning is ignored.
    fn with_rests<T>(&self, f: impl FnOnce(&mut GsoRests) -> T) -> T {
        let mut r = self
            .gso_rests
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let v = f(&mut r);
        self.gso_resting.store(r.len(), Ordering::Relaxed);
        v
    }

    /// GSO on this socket, for the status file.
    pub fn gso_state(&self) -> GsoState {
        if self.gso_enabled() {
            GsoState::On
        } else {
            GsoState::Off
        }
    }

    /// The destinations GSO rests toward now, for the status file (none once the
    /// socket is off: then no destination gets GSO anyway).
    pub fn gso_rests(&self) -> Vec<GsoRest> {
        self.gso_rests_at(clock_ms())
    }

    fn gso_rests_at(&self, now: u64) -> Vec<GsoRest> {
        if !self.gso_enabled() || self.gso_resting.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        self.with_rests(|r| {
            r.resting_at(now)
                .map(|(dst, left)| GsoRest { dst, left })
                .collect()
        })
    }

    /// A GSO send to `dst` failed with `errno`: follow [`gso_verdict`]. Returns it.
    pub fn gso_failed(&self, errno: i32, dst: SocketAddr) -> GsoVerdict {
        self.gso_failed_at(errno, dst, clock_ms())
    }

    fn gso_failed_at(&self, errno: i32, dst: SocketAddr, now: u64) -> GsoVerdict {
        let v = gso_verdict(errno);
        match v {
            GsoVerdict::Unrelated => {}
            GsoVerdict::Demote => self.disable_gso(),
            GsoVerdict::Rest => {
                let dst = canonical(dst);
                let rest = self.with_rests(|r| r.failed(dst, now));
                if demotion_log_due() {
                    log::warn!(
                        "udp {}: GSO send failed toward {dst} (EINVAL: segments above its path MTU, or GSO refused): datagrams to it one by one for {} s, then GSO again; other destinations keep GSO",
                        self.local,
                        rest.as_millis().div_ceil(1000)
                    );
                }
            }
        }
        v
    }

    /// A GSO send to `dst` went through: forget its rests, so its next failure rests
    /// the shortest time again.
    fn gso_worked(&self, dst: SocketAddr) {
        if self.gso_resting.load(Ordering::Relaxed) != 0 {
            self.with_rests(|r| r.worked(canonical(dst)));
        }
    }

    /// Whether `UDP_GRO` is on: receive buffers must then be 64 KiB each.
    pub fn gro_enabled(&self) -> bool {
        self.gro.load(Ordering::Relaxed)
    }

    /// What bind found, for `core::offload::decide`.
    pub fn probe(&self) -> SocketProbe {
        SocketProbe {
            udp_segment: self.gso_enabled(),
            udp_gro: self.gro_enabled(),
        }
    }

    /// Follow an offload decision: no GSO unless it says so (quietly, unlike a
    /// demotion), and `UDP_GRO` switched off unless it says so.
    pub fn apply(&self, d: &OffloadDecision) {
        if !d.udp_tx.uses_gso() {
            self.gso.store(false, Ordering::Relaxed);
        }
        if !d.udp_rx_gro && self.gro.swap(false, Ordering::Relaxed) {
            // If this fails the socket still delivers whole GRO trains, which the
            // receive path handles anyway; only the decision's wish is lost.
            let _ = set_int(self.fd.as_raw_fd(), SOL_UDP, UDP_GRO, 0);
        }
    }

    /// Fault injection for tests (`RG_FAULT_GSO=einval`): `SO_NO_CHECK` makes the kernel
    /// refuse every GSO send with `EINVAL`, the way a route without checksum offload does
    /// on kernels that return `EIO`, so the run-time demotion can be exercised on kernels
    /// (like 6.18) that segment in software even with tx checksumming off.
    pub fn inject_gso_failure(&self) -> io::Result<()> {
        set_int(self.fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_NO_CHECK, 1)
    }

    /// Stop using GSO on this socket for good (what an `EIO` does). Logged at most
    /// once a minute per process, however many worker sockets demote.
    pub fn disable_gso(&self) {
        if self.gso.swap(false, Ordering::Relaxed) && demotion_log_due() {
            log::warn!(
                "udp {}: GSO send failed (no checksum offload on the route?): sending datagrams one by one on this socket",
                self.local
            );
        }
    }

    /// One datagram. `WouldBlock` when the send buffer is full.
    pub fn send_to(&self, buf: &[u8], dst: SocketAddr) -> io::Result<usize> {
        let (sa, len) = to_raw(dst, self.v6);
        // SAFETY: buf and sa are valid for their lengths for the whole call.
        let rc = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                0,
                (&sa as *const RawAddr).cast(),
                len,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(rc as usize)
    }

    /// One datagram from the local address `src` (`None`: routing picks, as
    /// [`Self::send_to`]). A stale `src` fails with the error [`stale_source_errno`]
    /// recognises; the caller decides whether to forget it and resend.
    pub fn send_from(
        &self,
        src: Option<PktInfo>,
        buf: &[u8],
        dst: SocketAddr,
    ) -> io::Result<usize> {
        if src.is_none() {
            return self.send_to(buf, dst);
        }
        self.send_batch(&[Transmit {
            dst,
            contents: buf,
            segment_size: None,
            src,
        }])
        .map(|_| buf.len())
    }

    /// One GSO send: `buf` leaves as `ceil(len / segment_size)` datagrams to `dst`.
    /// On `EIO` the socket is demoted ([`Self::gso_enabled`] turns false), on `EINVAL`
    /// GSO rests toward `dst` ([`Self::gso_enabled_to`] turns false for it), and the
    /// error is returned: resend as separate datagrams (or use [`Self::send_segmented`],
    /// which does that). Errors with `Unsupported` when GSO is off or rests toward `dst`.
    pub fn send_gso(&self, dst: SocketAddr, buf: &[u8], segment_size: u16) -> io::Result<usize> {
        self.send_gso_from(None, dst, buf, segment_size)
    }

    /// [`Self::send_gso`] from a given local address. A stale `src` (address gone) is
    /// retried once without it before the error counts against GSO.
    pub fn send_gso_from(
        &self,
        src: Option<PktInfo>,
        dst: SocketAddr,
        buf: &[u8],
        segment_size: u16,
    ) -> io::Result<usize> {
        if !self.gso_enabled_to(dst) {
            return Err(io::ErrorKind::Unsupported.into());
        }
        let t = Transmit {
            dst,
            contents: buf,
            segment_size: Some(segment_size),
            src,
        };
        let mut r = self.send_batch(&[t]);
        if src.is_some() && matches!(&r, Err(e) if src_maybe_stale(e)) {
            r = self.send_batch(&[Transmit { src: None, ..t }]);
        }
        match r {
            Ok(_) => {
                self.gso_worked(dst);
                Ok(buf.len())
            }
            Err(e) => {
                if let Some(errno) = e.raw_os_error() {
                    self.gso_failed(errno, dst);
                }
                Err(e)
            }
        }
    }

    /// Send `buf` as `segment_size`-byte datagrams (last may be shorter) to `dst`: one GSO
    /// send when possible, else `sendmmsg` batches; a GSO failure demotes the socket or
    /// rests GSO toward `dst`, and the same call resends. Returns the number of datagrams the kernel took; fewer than
    /// all only when the send buffer filled up (`WouldBlock` on the first is an error).
    pub fn send_segmented(
        &self,
        dst: SocketAddr,
        buf: &[u8],
        segment_size: u16,
    ) -> io::Result<usize> {
        self.send_segmented_from(None, dst, buf, segment_size)
    }

    /// [`Self::send_segmented`] from a given local address (see [`RecvMeta::dst`]); a
    /// stale one is dropped and the send retried.
    pub fn send_segmented_from(
        &self,
        src: Option<PktInfo>,
        dst: SocketAddr,
        buf: &[u8],
        segment_size: u16,
    ) -> io::Result<usize> {
        let seg = usize::from(segment_size);
        if seg == 0 {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let total = buf.len().div_ceil(seg);
        if total > 1 && total <= MAX_GSO_SEGMENTS && self.gso_enabled_to(dst) {
            match self.send_gso_from(src, dst, buf, segment_size) {
                Ok(_) => return Ok(total),
                // Demoted or resting toward dst (EIO, EINVAL), or segments larger than the path
                // MTU (EMSGSIZE: a tunnel MTU above what the outer path carries; GSO
                // cannot fragment, single sends can, and GSO stays): resend this batch
                // one by one.
                Err(e) if e.raw_os_error().is_some_and(gso_refused) => {}
                Err(e) => return Err(e),
            }
        }
        self.send_each_from(src, dst, buf, segment_size)
    }

    /// Send `buf` as `segment_size`-byte datagrams (last may be shorter) to `dst`, never
    /// with GSO: `sendmmsg` batches (what [`Self::send_segmented_from`] falls back to, and
    /// the io_uring backend after the kernel refused a GSO send: [`gso_refused`]). Returns
    /// the number of datagrams the kernel took, as `send_segmented_from`.
    pub fn send_each_from(
        &self,
        mut src: Option<PktInfo>,
        dst: SocketAddr,
        buf: &[u8],
        segment_size: u16,
    ) -> io::Result<usize> {
        let seg = usize::from(segment_size);
        if seg == 0 {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let mut sent = 0;
        let mut chunks = buf.chunks(seg);
        loop {
            let mut msgs = [Transmit {
                src,
                ..Transmit::new(dst, &[])
            }; BATCH];
            let mut n = 0;
            for (slot, chunk) in msgs.iter_mut().zip(chunks.by_ref()) {
                slot.contents = chunk;
                n += 1;
            }
            if n == 0 {
                return Ok(sent);
            }
            let mut r = self.send_batch(&msgs[..n]);
            if src.is_some() && matches!(&r, Err(e) if src_maybe_stale(e)) {
                src = None;
                msgs.iter_mut().for_each(|m| m.src = None);
                r = self.send_batch(&msgs[..n]);
            }
            match r {
                Ok(k) => {
                    sent += k;
                    if k < n {
                        return Ok(sent);
                    }
                }
                Err(e) if sent > 0 && e.kind() == io::ErrorKind::WouldBlock => return Ok(sent),
                Err(e) => return Err(e),
            }
        }
    }

    /// `sendmmsg` of up to [`BATCH`] messages (more are ignored); returns how many the
    /// kernel took. A GSO message's `EIO`/`EINVAL` is returned as is (see [`Self::send_gso`]).
    pub fn send_batch(&self, msgs: &[Transmit<'_>]) -> io::Result<usize> {
        let n = msgs.len().min(BATCH);
        if n == 0 {
            return Ok(0);
        }
        let mut addrs = [MaybeUninit::<RawAddr>::uninit(); BATCH];
        let mut iovs = [MaybeUninit::<libc::iovec>::uninit(); BATCH];
        let mut ctrls = [CmsgBuf([0; 128]); BATCH];
        // SAFETY: mmsghdr is plain old data; all-zero is a valid (empty) value.
        let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for (i, m) in msgs[..n].iter().enumerate() {
            let (sa, salen) = to_raw(m.dst, self.v6);
            let sa = addrs[i].write(sa);
            let iov = iovs[i].write(libc::iovec {
                iov_base: m.contents.as_ptr() as *mut libc::c_void,
                iov_len: m.contents.len(),
            });
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = (sa as *mut RawAddr).cast();
            h.msg_namelen = salen;
            h.msg_iov = iov;
            h.msg_iovlen = 1;
            if m.segment_size.is_some() || m.src.is_some() {
                let ctrl = &mut ctrls[i];
                let src = m.src.filter(|s| s.ip.is_ipv4() == m.dst.is_ipv4());
                let len = write_send_cmsgs(&mut ctrl.0, m.segment_size, src);
                h.msg_control = ctrl.0.as_mut_ptr().cast();
                h.msg_controllen = len as _;
            }
        }
        // SAFETY: hdrs[..n] point at addresses, iovecs and control buffers on this stack
        // frame and at the callers' contents, all alive across the call.
        let rc = unsafe { libc::sendmmsg(self.fd.as_raw_fd(), hdrs.as_mut_ptr(), n as _, 0 as _) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(rc as usize)
    }

    /// One datagram (or, with GRO, one coalesced train) into `buf`.
    pub fn recv_gro(&self, buf: &mut [u8]) -> io::Result<RecvMeta> {
        let mut meta = [RecvMeta::EMPTY];
        self.recv_batch(&mut [buf], &mut meta)?;
        Ok(meta[0])
    }

    /// Plain `recvfrom`-style receive (GRO trains still arrive whole when GRO is on).
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        let m = self.recv_gro(buf)?;
        Ok((m.len, m.src))
    }

    /// `recvmmsg` into up to `min(bufs, metas, BATCH)` buffers; returns how many were
    /// filled (`WouldBlock` when none is waiting). A message with a bogus `UDP_GRO`
    /// cmsg, a truncated datagram or an unknown address family is an `InvalidData` error
    /// only if it is the first; otherwise the batch stops before it.
    pub fn recv_batch(&self, bufs: &mut [&mut [u8]], metas: &mut [RecvMeta]) -> io::Result<usize> {
        let n = bufs.len().min(metas.len()).min(BATCH);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: RawAddr is plain old data; zero is a valid value.
        let mut addrs: [RawAddr; BATCH] = unsafe { std::mem::zeroed() };
        let mut iovs = [MaybeUninit::<libc::iovec>::uninit(); BATCH];
        let mut ctrls = [CmsgBuf([0; 128]); BATCH];
        // SAFETY: mmsghdr is plain old data; all-zero is a valid (empty) value.
        let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for i in 0..n {
            let iov = iovs[i].write(libc::iovec {
                iov_base: bufs[i].as_mut_ptr().cast(),
                iov_len: bufs[i].len(),
            });
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = (&mut addrs[i] as *mut RawAddr).cast();
            h.msg_namelen = size_of::<RawAddr>() as libc::socklen_t;
            h.msg_iov = iov;
            h.msg_iovlen = 1;
            h.msg_control = ctrls[i].0.as_mut_ptr().cast();
            h.msg_controllen = ctrls[i].0.len() as _;
        }
        // SAFETY: every header points at buffers on this frame or the caller's `bufs`,
        // valid for the lengths given and alive across the call; no timeout pointer.
        let rc = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                hdrs.as_mut_ptr(),
                n as _,
                0 as _,
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let got = rc as usize;
        for i in 0..got {
            match parse_received(&hdrs[i], &addrs[i], &ctrls[i]) {
                Ok(m) => metas[i] = m,
                Err(e) if i == 0 => return Err(e),
                // Later bad messages are dropped with the rest of the batch: the caller
                // handles the good prefix.
                Err(_) => return Ok(i),
            }
        }
        Ok(got)
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for UdpSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Rate limit for the demotion warning: true at most once per 60 s.
fn demotion_log_due() -> bool {
    static LAST: AtomicU64 = AtomicU64::new(u64::MAX);
    let now = clock_ms() / 1000;
    let last = LAST.load(Ordering::Relaxed);
    if last != u64::MAX && now < last + 60 {
        return false;
    }
    LAST.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
}

/// What sending from a local address that is gone looks like (EINVAL with an
/// interface index, ENETUNREACH/EADDRNOTAVAIL without).
fn src_maybe_stale(e: &io::Error) -> bool {
    e.raw_os_error().is_some_and(stale_source_errno)
}

/// Whether a send that named its source address failed as if that address were gone
/// (both backends use this verdict).
pub fn stale_source_errno(errno: i32) -> bool {
    matches!(
        errno,
        libc::EINVAL | libc::ENETUNREACH | libc::EADDRNOTAVAIL
    )
}

/// Whether the kernel refused a `UDP_SEGMENT` send as a whole in a way the same datagrams
/// sent one by one get past: [`gso_errno`], or `EMSGSIZE`, what Linux 6.14 and later
/// answer (instead of `EINVAL`) when the segment size is above the path MTU toward that
/// destination. `EMSGSIZE` says nothing about other destinations: GSO stays.
pub fn gso_refused(errno: i32) -> bool {
    gso_errno(errno) || errno == libc::EMSGSIZE
}

/// Whether a `UDP_SEGMENT` send failed because of GSO on this route (no checksum
/// offload, segments above the route's path MTU): [`gso_verdict`] says what follows
/// ([`UdpSocket::gso_failed`] does it).
pub fn gso_errno(errno: i32) -> bool {
    matches!(errno, libc::EIO | libc::EINVAL)
}

/// Check one received header: not truncated, known address, valid GRO size.
fn parse_received(h: &libc::mmsghdr, addr: &RawAddr, ctrl: &CmsgBuf) -> io::Result<RecvMeta> {
    let m = &h.msg_hdr;
    // size_t on glibc, socklen_t on musl.
    #[allow(clippy::unnecessary_cast)]
    let clen = (m.msg_controllen as usize).min(ctrl.0.len());
    recv_meta(
        h.msg_len as usize,
        m.msg_flags,
        from_raw(addr, m.msg_namelen),
        &ctrl.0[..clen],
    )
}

fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    // SAFETY: RawAddr is plain old data; zero is a valid value.
    let mut sa: RawAddr = unsafe { std::mem::zeroed() };
    let mut len = size_of::<RawAddr>() as libc::socklen_t;
    // SAFETY: sa is writable for `len` bytes, len is a valid in/out pointer.
    let rc = unsafe { libc::getsockname(fd, (&mut sa as *mut RawAddr).cast(), &mut len) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    from_raw(&sa, len).ok_or_else(|| invalid("unknown local address family"))
}

fn set_int(fd: RawFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int with its exact size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn get_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v and len are live locals of the sizes the kernel is told.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmsg::tests::gro_cmsg;
    use std::net::{IpAddr, Ipv6Addr};

    /// Test sockets on port 0 without `SO_REUSEPORT`: with it, the kernel may hand two
    /// unrelated sockets (two tests running at once) the same ephemeral port and split
    /// the datagrams between them.
    fn test_opts() -> UdpOptions {
        UdpOptions {
            reuse_port: false,
            ..UdpOptions::default()
        }
    }

    fn loopback(gro: bool) -> UdpSocket {
        let opts = UdpOptions { gro, ..test_opts() };
        UdpSocket::bind("127.0.0.1:0".parse().expect("addr"), &opts).expect("bind")
    }

    /// Wait (bounded) until `s` is readable.
    fn wait_readable(s: &UdpSocket) {
        let mut pfd = [nix::poll::PollFd::new(
            s.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let n = nix::poll::poll(&mut pfd, 5000u16).expect("poll");
        assert_eq!(n, 1, "nothing arrived");
    }

    /// Receive until `want` datagrams have been seen (each GRO train counts its segments).
    fn collect(s: &UdpSocket, want: usize) -> Vec<RecvMeta> {
        let mut out = Vec::new();
        let mut seen = 0;
        let mut storage = vec![[0u8; 65536]; 4];
        while seen < want {
            wait_readable(s);
            let mut bufs: Vec<&mut [u8]> = storage.iter_mut().map(|b| &mut b[..]).collect();
            let mut metas = [RecvMeta::default(); 4];
            let n = s.recv_batch(&mut bufs, &mut metas).expect("recv");
            for m in &metas[..n] {
                seen += m.segments();
                out.push(*m);
            }
        }
        out
    }

    #[test]
    fn send_and_receive_single() {
        let a = loopback(false);
        let b = loopback(false);
        a.send_to(b"ping", b.local_addr()).expect("send");
        wait_readable(&b);
        let mut buf = [0u8; 64];
        let (n, from) = b.recv_from(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"ping");
        assert_eq!(from, a.local_addr());
        let mut empty = [0u8; 16];
        let e = b.recv_from(&mut empty).expect_err("nothing left");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn dual_stack_maps_ipv4() {
        let opts = test_opts();
        let s6 = UdpSocket::bind("[::]:0".parse().expect("addr"), &opts).expect("bind v6");
        let a = loopback(false);
        let port = s6.local_addr().port();
        a.send_to(b"v4", SocketAddr::from(([127, 0, 0, 1], port)))
            .expect("send");
        wait_readable(&s6);
        let mut buf = [0u8; 16];
        let (n, from) = s6.recv_from(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"v4");
        assert_eq!(from, a.local_addr(), "v4-mapped source is unmapped");
        // And back out through the v6 socket to a plain v4 address.
        s6.send_to(b"back", from).expect("send back");
        wait_readable(&a);
        let (n, _) = a.recv_from(&mut buf).expect("recv back");
        assert_eq!(&buf[..n], b"back");
    }

    #[test]
    fn reuse_port_lets_workers_share() {
        let opts = UdpOptions::default();
        let a = UdpSocket::bind("127.0.0.1:0".parse().expect("addr"), &opts).expect("bind");
        let b = UdpSocket::bind(a.local_addr(), &opts).expect("second bind on the same port");
        assert_eq!(a.local_addr(), b.local_addr());
    }

    #[test]
    fn mmsg_batch_round_trip() {
        let a = loopback(false);
        let b = loopback(false);
        let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 100 + usize::from(i)]).collect();
        let msgs: Vec<Transmit<'_>> = payloads
            .iter()
            .map(|p| Transmit::new(b.local_addr(), p))
            .collect();
        assert_eq!(a.send_batch(&msgs).expect("sendmmsg"), 10);
        let got = collect(&b, 10);
        assert_eq!(got.len(), 10);
        for (i, m) in got.iter().enumerate() {
            assert_eq!(m.len, 100 + i);
            assert_eq!(m.segment_size, m.len);
        }
    }

    #[test]
    fn gso_send_arrives_as_separate_datagrams() {
        let a = loopback(false);
        let b = loopback(false);
        if !a.gso_enabled() {
            crate::testutil::not_run("kernel without UDP_SEGMENT");
            return;
        }
        let mut buf = vec![0u8; 12_000];
        for (i, c) in buf.chunks_mut(1200).enumerate() {
            c.fill(i as u8);
        }
        assert_eq!(
            a.send_segmented(b.local_addr(), &buf, 1200).expect("gso"),
            10
        );
        let got = collect(&b, 10);
        assert_eq!(got.len(), 10);
        assert!(got.iter().all(|m| m.len == 1200 && m.src == a.local_addr()));
    }

    #[test]
    fn gso_short_last_segment_and_demotion_fallback() {
        let a = loopback(false);
        let b = loopback(false);
        let buf = vec![7u8; 1200 * 3 + 500];
        // Force the fallback path: same datagrams, without the kernel splitting.
        a.disable_gso();
        assert!(!a.gso_enabled() && a.max_gso_segments_to(b.local_addr()) == 1);
        assert_eq!(
            a.send_segmented(b.local_addr(), &buf, 1200).expect("mmsg"),
            4
        );
        let lens: Vec<usize> = collect(&b, 4).iter().map(|m| m.len).collect();
        assert_eq!(lens, [1200, 1200, 1200, 500]);
        let e = a.send_gso(b.local_addr(), &buf, 1200).expect_err("gso off");
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
    }

    #[test]
    fn gso_verdicts_rest_after_einval_and_demote_after_eio() {
        assert_eq!(gso_verdict(libc::EIO), GsoVerdict::Demote);
        assert_eq!(gso_verdict(libc::EINVAL), GsoVerdict::Rest);
        for e in [libc::EAGAIN, libc::EMSGSIZE, libc::ECONNREFUSED, 0] {
            assert_eq!(gso_verdict(e), GsoVerdict::Unrelated, "{e}");
        }
    }

    #[test]
    fn gso_state_and_status_line() {
        let a = loopback(false);
        if !a.gso_enabled() {
            crate::testutil::not_run("kernel without UDP_SEGMENT");
            return;
        }
        let peer: SocketAddr = "203.0.113.5:51820".parse().expect("addr");
        let mapped: SocketAddr = "[::ffff:203.0.113.5]:51820".parse().expect("addr");
        assert_eq!(a.gso_state(), GsoState::On);
        assert!(a.gso_rests_at(5).is_empty());
        // As the io_uring engine reports it on a dual-stack socket: v4-mapped.
        a.gso_failed_at(libc::EINVAL, mapped, 1000);
        assert_eq!(
            a.gso_state(),
            GsoState::On,
            "an EINVAL rests one destination"
        );
        assert_eq!(
            a.gso_rests_at(1500),
            [GsoRest {
                dst: peer,
                left: Duration::from_millis(500)
            }]
        );
        assert!(a.gso_rests_at(2000).is_empty(), "the rest is over");
        a.gso_failed_at(libc::EIO, peer, 2000);
        assert_eq!(a.gso_state(), GsoState::Off);
        assert!(a.gso_rests_at(1500).is_empty(), "no rests shown once off");

        let rest = |port, ms| GsoRest {
            dst: SocketAddr::from(([203, 0, 113, 5], port)),
            left: Duration::from_millis(ms),
        };
        assert_eq!(
            gso_status_lines(&[GsoState::On, GsoState::On], &[]),
            ["udp gso: on"]
        );
        assert_eq!(gso_status_lines(&[GsoState::Off], &[]), ["udp gso: off"]);
        // Merged across sockets (the longest rest), the longest first.
        assert_eq!(
            gso_status_lines(
                &[GsoState::On, GsoState::On],
                &[rest(51820, 300), rest(51821, 11_200), rest(51820, 1200)]
            ),
            [
                "udp gso: on",
                "udp gso rest: 203.0.113.5:51821 one by one for 12 s more (EINVAL: segments above its path MTU)",
                "udp gso rest: 203.0.113.5:51820 one by one for 2 s more (EINVAL: segments above its path MTU)",
            ]
        );
        assert_eq!(
            gso_status_lines(&[GsoState::Off, GsoState::On], &[]),
            ["udp gso: on 1 of 2 sockets, off 1"]
        );
        let many: Vec<_> = (0..7).map(|i| rest(51820 + i, 1000)).collect();
        let lines = gso_status_lines(&[GsoState::On], &many);
        assert_eq!(lines.len(), 1 + REST_LINES + 1);
        assert_eq!(
            lines.last().map(String::as_str),
            Some("udp gso rest: 3 more destinations one by one")
        );
    }

    /// What a route MTU below the segment size toward one peer does (a forged
    /// "fragmentation needed" can cause it): `EINVAL`, the batch goes out one by one,
    /// GSO rests toward that peer only (another destination keeps it), and comes back
    /// after the rest instead of being off for good.
    #[test]
    fn gso_einval_rests_then_gso_comes_back() {
        let a = loopback(false);
        let b = loopback(false);
        let c = loopback(false);
        if !a.gso_enabled() {
            crate::testutil::not_run("kernel without UDP_SEGMENT");
            return;
        }
        let (to_b, to_c) = (b.local_addr(), c.local_addr());
        assert_eq!(a.gso_resting.load(Ordering::Relaxed), 0, "no lock to send");
        // More segments than any kernel's UDP_MAX_SEGMENTS (64, 128 since 6.x): EINVAL.
        let buf = vec![1u8; 100 * 200];
        let e = a.send_gso(to_b, &buf, 100).expect_err("too many segments");
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        assert!(a.gso_enabled(), "not demoted");
        assert!(!a.gso_enabled_to(to_b) && a.max_gso_segments_to(to_b) == 1);
        // Toward another destination GSO goes on (send_gso refuses when it rests).
        assert!(a.gso_enabled_to(to_c) && a.max_gso_segments_to(to_c) == MAX_GSO_SEGMENTS);
        let ok = vec![2u8; 1200 * 4];
        assert_eq!(a.send_gso(to_c, &ok, 1200).expect("gso to c"), ok.len());
        assert_eq!(collect(&c, 4).len(), 4);
        // Toward b: one by one, nothing lost.
        let e = a.send_gso(to_b, &ok, 1200).expect_err("resting");
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert_eq!(a.send_segmented(to_b, &ok, 1200).expect("one by one"), 4);
        assert_eq!(collect(&b, 4).len(), 4);
        // The rest (the clock is passed in, so no test waits): 1 s, then GSO again; a
        // failure after it rests 2 s.
        let now = clock_ms();
        let left = a.gso_rests_at(now)[0].left;
        assert!(left > Duration::ZERO && left <= Duration::from_secs(1));
        let until = now + left.as_millis() as u64;
        assert!(a.gso_resting_to(to_b, || until - 1));
        assert!(
            !a.gso_resting_to(to_b, || until),
            "GSO again once the rest is over"
        );
        assert_eq!(a.gso_failed_at(libc::EINVAL, to_b, until), GsoVerdict::Rest);
        assert_eq!(a.gso_rests_at(until)[0].left, Duration::from_secs(2));
        // A success forgets b: a rest that ended before the real clock, then GSO works.
        let past = now.checked_sub(3000);
        let Some(past) = past else {
            crate::testutil::not_run("less than 3 s since boot");
            return;
        };
        let fresh = loopback(false);
        fresh.gso_failed_at(libc::EINVAL, to_b, past);
        assert_eq!(fresh.gso_resting.load(Ordering::Relaxed), 1);
        assert!(fresh.gso_enabled_to(to_b), "rest over");
        assert_eq!(fresh.send_segmented(to_b, &ok, 1200).expect("gso"), 4);
        assert_eq!(collect(&b, 4).len(), 4);
        assert_eq!(fresh.gso_resting.load(Ordering::Relaxed), 0, "forgotten");
        // EIO is for good, toward every destination.
        a.gso_failed_at(libc::EIO, to_b, 0);
        assert!(!a.gso_enabled() && !a.gso_enabled_to(to_c));
    }

    #[test]
    fn gro_receive_coalesces() {
        let a = loopback(false);
        let b = loopback(true);
        if !a.gso_enabled() || !b.gro_enabled() {
            crate::testutil::not_run("kernel without UDP_SEGMENT/UDP_GRO");
            return;
        }
        let buf = vec![3u8; 1200 * 10];
        a.send_segmented(b.local_addr(), &buf, 1200).expect("gso");
        let got = collect(&b, 10);
        // On loopback a GSO train is delivered whole to a GRO socket.
        assert!(got.len() < 10, "expected coalescing, got {got:?}");
        assert!(got.iter().all(|m| m.segment_size == 1200));
        assert_eq!(got.iter().map(|m| m.len).sum::<usize>(), 12_000);
    }

    #[test]
    fn pktinfo_replies_leave_from_the_address_used() {
        let any =
            UdpSocket::bind("0.0.0.0:0".parse().expect("addr"), &test_opts()).expect("bind any");
        let port = any.local_addr().port();
        let client = loopback(false);
        // 127.0.0.2 is local too (all of 127/8 is), but not what routing picks for replies.
        client
            .send_to(b"hi", SocketAddr::from(([127, 0, 0, 2], port)))
            .expect("send");
        wait_readable(&any);
        let mut buf = [0u8; 64];
        let m = any.recv_gro(&mut buf).expect("recv");
        let dst = m.dst.expect("pktinfo");
        assert_eq!(dst.ip, IpAddr::from([127, 0, 0, 2]));
        assert!(dst.ifindex > 0);
        // Reply from it, through the GSO path and the plain path.
        let burst = [5u8; 300];
        any.send_segmented_from(Some(dst), m.src, &burst, 100)
            .expect("gso reply");
        any.send_segmented_from(Some(dst), m.src, &burst[..50], 100)
            .expect("single reply");
        for want in collect(&client, 4) {
            assert_eq!(want.src, SocketAddr::from(([127, 0, 0, 2], port)));
        }
        // A source that is not ours any more: retried without it.
        let stale = PktInfo {
            ip: IpAddr::from([192, 0, 2, 99]),
            ifindex: 0,
        };
        any.send_segmented_from(Some(stale), m.src, &burst, 100)
            .expect("stale source retried");
        let with_if = PktInfo {
            ifindex: 1,
            ..stale
        };
        any.send_segmented_from(Some(with_if), m.src, &burst, 100)
            .expect("stale source with an interface retried");
        let got = collect(&client, 6);
        assert!(got
            .iter()
            .all(|r| r.src == SocketAddr::from(([127, 0, 0, 1], port))));
        assert!(
            any.gso_enabled() || !loopback(false).gso_enabled(),
            "no demotion"
        );
    }

    #[test]
    fn pktinfo_dual_stack() {
        let any =
            UdpSocket::bind("[::]:0".parse().expect("addr"), &test_opts()).expect("bind any6");
        let port = any.local_addr().port();
        let client = loopback(false);
        client
            .send_to(b"v4", SocketAddr::from(([127, 0, 0, 3], port)))
            .expect("send");
        wait_readable(&any);
        let mut buf = [0u8; 64];
        let m = any.recv_gro(&mut buf).expect("recv");
        assert_eq!(m.dst.map(|d| d.ip), Some(IpAddr::from([127, 0, 0, 3])));
        any.send_segmented_from(m.dst, m.src, b"back", 100)
            .expect("reply");
        let got = collect(&client, 1);
        assert_eq!(got[0].src, SocketAddr::from(([127, 0, 0, 3], port)));
        // And IPv6.
        let c6 = UdpSocket::bind("[::1]:0".parse().expect("addr"), &test_opts()).expect("bind ::1");
        c6.send_to(b"v6", SocketAddr::from((Ipv6Addr::LOCALHOST, port)))
            .expect("send6");
        wait_readable(&any);
        let m = any.recv_gro(&mut buf).expect("recv6");
        assert_eq!(m.dst.map(|d| d.ip), Some(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        any.send_segmented_from(m.dst, m.src, b"back6", 100)
            .expect("reply6");
        assert_eq!(collect(&c6, 1)[0].len, 5);
    }

    #[test]
    fn bogus_gro_in_a_received_header_is_an_error() {
        let mut ctrl = CmsgBuf([0; 128]);
        let c = gro_cmsg(0, None);
        ctrl.0[..c.len()].copy_from_slice(&c);
        // SAFETY: mmsghdr is plain old data.
        let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
        h.msg_len = 100;
        h.msg_hdr.msg_controllen = c.len() as _;
        let (addr, len) = to_raw("127.0.0.1:5".parse().expect("addr"), false);
        h.msg_hdr.msg_namelen = len;
        let e = parse_received(&h, &addr, &ctrl).expect_err("bogus size");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
