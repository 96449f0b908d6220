//! The io_uring ring of one worker and the lifecycle of every operation on it.
//!
//! Ownership rule: from the moment an SQE that uses a buffer is pushed until its last
//! completion arrives, the kernel owns that buffer. Here that is a move: the buffer's
//! [`BufId`] goes into the ring's in-flight slot table ([`Ring`] keyed by `user_data`)
//! on submit and comes back out inside the [`Completion`]. Nothing else can reach it in
//! between. All SQEs go through one function, `Ring::push`.
//!
//! Operations:
//! - TUN: one multishot read (`READ_MULTISHOT`) on a second provided buffer ring of pool
//!   buffers ([`TunToken`]), or `ReadFixed` per buffer where the kernel lacks it;
//!   `WriteFixed` on registered file 1 with the pool's registered buffers.
//! - UDP receive: one multishot `RecvMsg` on registered file 0 with a provided buffer
//!   ring ([`RecvToken`] lends one of its buffers to the caller until recycled).
//! - UDP send: `SendMsg` from a pool buffer, optionally with a `UDP_SEGMENT` cmsg (the
//!   segment size is the caller's policy).
//!
//! [`check`] probes once per process what this kernel offers and logs it (or why the
//! portable path must be used) exactly once.
//!
//! Owns: the probe, the ring, the registered buffer pool and the provided buffer rings:
//! one set of kernel structures and their `unsafe` lifetimes. Invariant: none of that
//! memory goes away while the kernel may still use it (dropping a [`Ring`] cancels and
//! reaps everything in flight first), and every SAFETY argument sits beside what it
//! relies on.

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::OnceLock;
use std::time::Duration;

use io_uring::types::{BufRingEntry, CancelBuilder, Fd, Fixed, RecvMsgOut, SubmitArgs, Timespec};
use io_uring::{cqueue, opcode, squeue, EnterFlags, IoUring, Probe};
use nix::errno::Errno;

pub use crate::cmsg::{canonical, to_socket_family};
use crate::cmsg::{
    parse_sockaddr, recv_meta, to_raw, write_send_cmsgs, CmsgBuf, PktInfo, RawAddr, RecvMeta,
};
use crate::hugepage::{BufId, BufPool};

/// Registered file index of the UDP socket.
pub const FILE_UDP: u32 = 0;
/// Registered file index of the TUN queue.
pub const FILE_TUN: u32 = 1;
/// Bytes reserved for the source address in each multishot receive buffer.
pub const RECV_NAME_LEN: u32 = std::mem::size_of::<libc::sockaddr_storage>() as u32;
/// Bytes reserved for control messages in each receive buffer: a dual-stack socket
/// receiving IPv4 gets `UDP_GRO` (24 bytes with its header), `IPV6_PKTINFO` (40) and
/// `IP_PKTINFO` (32): 96. A message whose control does not fit is dropped (MSG_CTRUNC),
/// exactly as on the recvmmsg path, whose [`CmsgBuf`] is as large.
pub const RECV_CONTROL_LEN: u32 = 128;
/// `struct io_uring_recvmsg_out` (namelen, controllen, payloadlen, flags: four u32s)
/// that starts every multishot receive buffer.
pub const RECVMSG_OUT_LEN: usize = 16;
/// Buffer group id of the provided receive ring.
const RECV_BGID: u16 = 0;
/// Buffer group id of the provided TUN read ring (multishot reads).
const TUN_BGID: u16 = 1;

/// `user_data` values that are not slot indices.
const UD_RECV: u64 = u64::MAX - 1;
const UD_IGNORE: u64 = u64::MAX - 2;
const UD_TUN: u64 = u64::MAX - 3;
const UD_WAKE: u64 = u64::MAX - 4;

/// What io_uring can do on this kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// `IORING_OP_RECVMSG` with `IORING_RECV_MULTISHOT` (6.0).
    pub multishot_recvmsg: bool,
    /// Provided buffer rings, `IORING_REGISTER_PBUF_RING` (5.19).
    pub buf_ring: bool,
    /// `READ_FIXED`/`WRITE_FIXED` (5.1).
    pub rw_fixed: bool,
    /// `SENDMSG` (5.3).
    pub sendmsg: bool,
    /// `IORING_ENTER_EXT_ARG`: waits with a timeout (5.11).
    pub ext_arg: bool,
    /// `IORING_FEAT_NODROP`: completions are never lost on CQ overflow (5.5).
    pub nodrop: bool,
    /// `IORING_OP_READ_MULTISHOT` (6.7): one armed read drains the TUN into a buffer ring.
    pub read_multishot: bool,
}

impl fmt::Display for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let yn = |b: bool| if b { "yes" } else { "no" };
        write!(
            f,
            "multishot recvmsg {}, buffer rings {}, fixed read/write {}, sendmsg {}, wait timeout {}, nodrop {}, multishot read {}",
            yn(self.multishot_recvmsg),
            yn(self.buf_ring),
            yn(self.rw_fixed),
            yn(self.sendmsg),
            yn(self.ext_arg),
            yn(self.nodrop),
            yn(self.read_multishot)
        )
    }
}

/// Why io_uring cannot be used (the worker then takes the portable path), or why one
/// ring setup step failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UringError {
    /// `kernel.io_uring_disabled` is 2 (or 1 and we are not allowed).
    Disabled(u8),
    /// `io_uring_setup` failed: `ENOSYS` (no io_uring in this kernel), `EPERM`
    /// (disabled or blocked by seccomp), `ENOMEM` (memlock limit).
    Setup(Errno),
    /// An operation or feature we need is missing (kernel too old).
    Missing(&'static str),
    /// A registration (`files`, `buffers`, `buffer ring`) failed.
    Register { what: &'static str, errno: Errno },
    /// The buffer pool has too few buffers for the ring's receive ring plus reads.
    PoolTooSmall { need: usize, have: usize },
    /// The submission queue stayed full even after submitting.
    QueueFull,
    /// A ring setting is out of range.
    BadConfig(&'static str),
    /// `io_uring_enter` failed.
    Enter(Errno),
}

impl fmt::Display for UringError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disabled(v) => write!(
                f,
                "io_uring is disabled by sysctl kernel.io_uring_disabled = {v}; set it to 0 to use it"
            ),
            Self::Setup(Errno::ENOSYS) => f.write_str("this kernel has no io_uring (ENOSYS)"),
            Self::Setup(Errno::EPERM) => f.write_str(
                "io_uring_setup is not permitted (EPERM: kernel.io_uring_disabled, seccomp or a container policy)",
            ),
            Self::Setup(e) => write!(f, "io_uring_setup failed: {}", e.desc()),
            Self::Missing(what) => write!(f, "the kernel lacks io_uring {what} (needs Linux 6.0 or newer)"),
            Self::Register { what, errno: Errno::ENOMEM } => write!(
                f,
                "cannot register io_uring {what}: out of locked memory (raise RLIMIT_MEMLOCK or lower `Buffers =`)"
            ),
            Self::Register { what, errno } => write!(f, "cannot register io_uring {what}: {}", errno.desc()),
            Self::PoolTooSmall { need, have } => write!(
                f,
                "the buffer pool has {have} buffers but io_uring needs at least {need} (raise `Buffers =`)"
            ),
            Self::QueueFull => f.write_str("io_uring submission queue full"),
            Self::BadConfig(what) => write!(f, "io_uring ring setting: {what}"),
            Self::Enter(e) => write!(f, "io_uring_enter failed: {}", e.desc()),
        }
    }
}

impl std::error::Error for UringError {}

fn errno_of(e: &io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// Probe (once per process) whether io_uring with everything the fast path needs works
/// here, and log the answer once: the features, or why the portable path is used.
pub fn check() -> Result<Features, UringError> {
    static RESULT: OnceLock<Result<Features, UringError>> = OnceLock::new();
    RESULT
        .get_or_init(|| {
            let r = probe();
            match &r {
                Ok(f) => log::info!("io_uring: {f}"),
                Err(e) => log::warn!("io_uring not used: {e}; the workers take the portable path"),
            }
            r
        })
        .clone()
}

/// Probe without caching or logging; see [`check`].
pub fn probe() -> Result<Features, UringError> {
    if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled") {
        if s.trim() == "2" {
            return Err(UringError::Disabled(2));
        }
    }
    let ring: IoUring = IoUring::new(8).map_err(|e| {
        let errno = errno_of(&e);
        // With io_uring_disabled = 1 an unprivileged setup fails with EPERM: say which.
        let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
            .map(|s| s.trim() == "1")
            .unwrap_or(false);
        if errno == Errno::EPERM && disabled {
            UringError::Disabled(1)
        } else {
            UringError::Setup(errno)
        }
    })?;
    let mut p = Probe::new();
    ring.submitter()
        .register_probe(&mut p)
        .map_err(|e| UringError::Register {
            what: "probe",
            errno: errno_of(&e),
        })?;
    let mut f = Features {
        multishot_recvmsg: false,
        buf_ring: false,
        rw_fixed: p.is_supported(opcode::ReadFixed::CODE)
            && p.is_supported(opcode::WriteFixed::CODE),
        sendmsg: p.is_supported(opcode::SendMsg::CODE),
        ext_arg: ring.params().is_feature_ext_arg(),
        nodrop: ring.params().is_feature_nodrop(),
        read_multishot: p.is_supported(opcode::ReadMulti::CODE),
    };
    if !f.rw_fixed {
        return Err(UringError::Missing("READ_FIXED/WRITE_FIXED"));
    }
    if !f.sendmsg || !p.is_supported(opcode::RecvMsg::CODE) {
        return Err(UringError::Missing("SENDMSG/RECVMSG"));
    }
    if !f.ext_arg {
        return Err(UringError::Missing(
            "waits with a timeout (IORING_ENTER_EXT_ARG)",
        ));
    }
    // A one-entry buffer ring with one buffer, and a multishot recvmsg on a fresh
    // UDP socket nobody sends to: a kernel without multishot recvmsg rejects it at once (EINVAL); one
    // with it leaves it armed, and the cancel ends it with ECANCELED.
    let multishot = {
        // Declared before `ring`, so dropped after it: nothing the ring references
        // goes away while the ring exists.
        let page = ProbeRing::new().ok_or(UringError::Missing("provided buffer rings"))?;
        let hdr = recv_msghdr();
        let sock = std::net::UdpSocket::bind(("::", 0))
            .or_else(|_| std::net::UdpSocket::bind(("0.0.0.0", 0)))
            .map_err(|e| UringError::Register {
                what: "probe socket",
                errno: errno_of(&e),
            })?;
        let ring = ring;
        if !page.register(&ring) {
            return Err(UringError::Missing("provided buffer rings"));
        }
        f.buf_ring = true;
        probe_multishot(ring, &hdr, std::os::fd::AsRawFd::as_raw_fd(&sock))?
    };
    f.multishot_recvmsg = multishot;
    if !multishot {
        return Err(UringError::Missing("multishot recvmsg"));
    }
    Ok(f)
}

/// Submit the multishot probe on `ring` and tell whether the kernel kept it armed.
fn probe_multishot(mut ring: IoUring, hdr: &libc::msghdr, fd: RawFd) -> Result<bool, UringError> {
    let recv = opcode::RecvMsgMulti::new(Fd(fd), hdr, RECV_BGID)
        .build()
        .user_data(1);
    let cancel = opcode::AsyncCancel::new(1).build().user_data(2);
    // SAFETY: `hdr` and the buffer ring outlive `ring` (the caller declared them first),
    // and the sync cancel below ends the receive before we return.
    unsafe { ring.submission().push_multiple(&[recv, cancel]) }
        .map_err(|_| UringError::QueueFull)?;
    let ts = Timespec::new().sec(1);
    let args = SubmitArgs::new().timespec(&ts);
    let (mut seen, mut multishot) = (0, false);
    for _ in 0..4 {
        match ring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            Err(e) if matches!(errno_of(&e), Errno::ETIME | Errno::EINTR) => {}
            Err(e) => return Err(UringError::Enter(errno_of(&e))),
        }
        for cqe in ring.completion() {
            if cqe.user_data() == 1 {
                multishot = cqe.result() == -libc::ECANCELED || cqe.result() >= 0;
            }
            seen += 1;
        }
        if seen >= 2 {
            break;
        }
    }
    let _ = ring
        .submitter()
        .register_sync_cancel(None, CancelBuilder::any());
    Ok(multishot)
}

/// The probe's buffer ring: page 0 the ring, page 1 its one buffer.
struct ProbeRing(Mapping);

impl ProbeRing {
    fn new() -> Option<ProbeRing> {
        let mem = Mapping::new(2 * 4096).ok()?;
        let base = mem.0.as_ptr();
        // SAFETY: entry 0 lies in page 0 of the live mapping; the tail field overlays
        // entry 0's `resv`. Nothing else references the mapping yet.
        unsafe {
            let e = &mut *base.cast::<BufRingEntry>();
            e.set_addr(base.add(4096) as u64);
            e.set_len(4096);
            e.set_bid(0);
            let tail = BufRingEntry::tail(base.cast()) as *mut u16;
            std::sync::atomic::AtomicU16::from_ptr(tail)
                .store(1, std::sync::atomic::Ordering::Release);
        }
        Some(ProbeRing(mem))
    }

    /// Register as buffer group RECV_BGID; false when the kernel has no buffer rings.
    fn register(&self, ring: &IoUring) -> bool {
        // SAFETY: page 0 is page-aligned, live and holds one entry; the caller keeps
        // `self` alive longer than `ring`.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                self.0 .0.as_ptr() as u64,
                1,
                RECV_BGID,
                0,
            )
        }
        .is_ok()
    }
}

/// A page-aligned anonymous mapping (for the provided buffer ring).
struct Mapping(NonNull<u8>, usize);

impl Mapping {
    fn new(len: usize) -> io::Result<Mapping> {
        // SAFETY: anonymous mapping at a kernel-chosen address: touches no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p.cast())
            .map(|p| Mapping(p, len))
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.0.as_ptr().cast(), self.1) };
    }
}

/// The msghdr a multishot recvmsg uses as its template: only the name and control
/// lengths matter to the kernel.
fn recv_msghdr() -> Box<libc::msghdr> {
    // SAFETY: msghdr is plain old data; all-zero is a valid (empty) value.
    let mut h: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
    h.msg_namelen = RECV_NAME_LEN;
    h.msg_controllen = RECV_CONTROL_LEN as _;
    h
}

/// How to build a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// Submission queue entries (power of two; the CQ gets four times as many).
    pub sq_entries: u32,
    /// Operations that may be in flight at once (slot table size).
    pub max_in_flight: u32,
    /// Buffers lent to the kernel for UDP receives (power of two, at most 32768).
    pub recv_buffers: u16,
    /// Buffers lent to the kernel for multishot TUN reads (power of two, at most 32768;
    /// 0, or a kernel without `READ_MULTISHOT`: no TUN ring, reads one buffer each).
    pub tun_buffers: u16,
    /// Kernel-side submission polling with this idle time (ms); `None`: off.
    pub sqpoll_idle_ms: Option<u32>,
    /// `IORING_SETUP_DEFER_TASKRUN` (6.1; ignored with SQPOLL, dropped where missing).
    /// The ring must then be used from the thread that created it only.
    pub defer_taskrun: bool,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            sq_entries: 256,
            max_in_flight: 1024,
            recv_buffers: 64,
            tun_buffers: 0,
            sqpoll_idle_ms: None,
            defer_taskrun: true,
        }
    }
}

/// The state a `SendMsg` SQE points into; lives in its slot until the completion.
#[repr(C)]
struct SendState {
    hdr: libc::msghdr,
    iov: libc::iovec,
    addr: RawAddr,
    /// Room for a `UDP_SEGMENT` and a pktinfo cmsg, written by `cmsg::write_send_cmsgs`.
    cmsg: CmsgBuf,
    /// The send named its source address (a pktinfo cmsg).
    with_src: bool,
}

/// A `UDP_SEGMENT` send as it was asked for, handed back with its completion so that a
/// batch the kernel refused as a whole (a path MTU below the segment size: `EMSGSIZE`
/// since Linux 6.14, `EINVAL` before) can be sent again one datagram at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segmented {
    /// As given to [`Ring::send_udp`] (v4-mapped on a dual-stack socket).
    pub to: SocketAddr,
    /// Bytes of the buffer sent.
    pub len: usize,
    pub segment: u16,
    pub src: Option<PktInfo>,
}

/// What a slot's operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    TunRead,
    TunWrite,
    UdpSend,
}

/// One in-flight operation. `buf` is `Some` exactly while the kernel owns the buffer.
struct Slot {
    kind: OpKind,
    buf: Option<BufId>,
    send: SendState,
    /// For a `UdpSend` with `UDP_SEGMENT`: what it was (outside `send`, which starts zeroed).
    segmented: Option<Segmented>,
}

/// A finished operation, handing its buffer (if any) back to the caller.
#[derive(Debug)]
pub enum Completion<'p> {
    /// A TUN read: `Ok(n)` bytes are in the buffer. `Err(EAGAIN)`: resubmit with
    /// [`Ring::read_tun_after_poll`].
    TunRead {
        buf: BufId,
        res: Result<usize, Errno>,
    },
    /// A TUN write finished; the buffer is free again.
    TunWrite {
        buf: BufId,
        res: Result<usize, Errno>,
    },
    /// A UDP send finished; the buffer is free again (and still holds what was sent).
    /// `with_src`: it named its source address (an error may then mean that address is
    /// gone); `segmented`: it was a GSO send (`EINVAL`/`EIO`/`EMSGSIZE` may then mean GSO
    /// does not work on this route, or not toward this destination: resend it unsegmented).
    UdpSend {
        buf: BufId,
        res: Result<usize, Errno>,
        with_src: bool,
        segmented: Option<Segmented>,
    },
    /// The multishot receive produced a datagram (`Ok`) or an error. When `rearm` is
    /// true the receive has ended and must be armed again ([`Ring::arm_recv`]).
    Recv {
        res: Result<RecvToken<'p>, Errno>,
        rearm: bool,
    },
    /// The multishot TUN read filled a buffer of the TUN ring (`Ok`) or ended with an
    /// error. Give the buffer back with [`Ring::recycle_tun`]; when the read is no longer
    /// armed ([`Ring::tun_armed`]) arm it again ([`Ring::arm_tun`]).
    TunReadMulti { res: Result<TunToken<'p>, Errno> },
    /// The wake-up file ([`Ring::arm_wake`]) became readable: another thread has work
    /// for this one. When the poll is no longer armed, arm it again.
    Wake,
    /// Internal (poll, cancel) completion: nothing to do.
    Internal,
}

/// One packet read from the TUN into a buffer of the TUN ring, ours until
/// [`Ring::recycle_tun`] hands it back to the kernel.
#[derive(Debug)]
#[must_use = "recycle the TUN buffer with Ring::recycle_tun"]
pub struct TunToken<'p> {
    bid: u16,
    ptr: *mut u8,
    /// Bytes the read filled.
    pub len: usize,
    cap: usize,
    _pool: PhantomData<&'p BufPool>,
}

impl TunToken<'_> {
    /// The whole buffer, writable: the packet is `[..len]`, the rest is room (padding,
    /// in-place work).
    pub fn buf_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr/cap describe one pool buffer of the TUN ring that the kernel has
        // completed into and does not own again until `recycle_tun` consumes this token;
        // exactly one token exists per completed bid, and the pool outlives 'p.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.cap) }
    }
}

/// One received datagram, in a provided buffer the kernel lent us. Give it back with
/// [`Ring::recycle`] (dropping it instead leaks that buffer from the receive ring).
#[derive(Debug)]
#[must_use = "recycle the receive buffer with Ring::recycle"]
pub struct RecvToken<'p> {
    bid: u16,
    ptr: *const u8,
    len: usize,
    _pool: PhantomData<&'p BufPool>,
}

/// A received datagram, parsed.
#[derive(Debug)]
pub struct RecvMsg<'a> {
    /// Source address (`None`: an address family we do not know).
    pub from: Option<SocketAddr>,
    pub payload: &'a [u8],
    /// Control messages, laid out as `msg_control` (parse with CMSG rules).
    pub control: &'a [u8],
    /// The datagram did not fit the buffer.
    pub truncated: bool,
    /// The control messages did not fit their room.
    pub control_truncated: bool,
}

impl RecvMsg<'_> {
    /// What the message says, checked exactly as a `recvmmsg` message is
    /// ([`recv_meta`]): source, the local address it came to (`IP_PKTINFO`), the GRO
    /// segment size (1..=65535, at most the payload). `Err` for a truncated message,
    /// an unknown source family or malformed control data: drop it.
    pub fn meta(&self) -> io::Result<RecvMeta> {
        let flags = (if self.truncated { libc::MSG_TRUNC } else { 0 })
            | (if self.control_truncated {
                libc::MSG_CTRUNC
            } else {
                0
            });
        recv_meta(self.payload.len(), flags, self.from, self.control)
    }
}

impl RecvToken<'_> {
    /// The raw provided buffer contents (an `io_uring_recvmsg_out` header first).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr/len describe the filled part of a pool buffer the kernel has
        // completed into; it is not handed back to the kernel until `recycle` consumes
        // this token, and the pool outlives 'p.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Parse source address, payload and cmsgs; `None` for a malformed buffer.
    pub fn parse(&self) -> Option<RecvMsg<'_>> {
        parse_recv_buffer(self.bytes())
    }
}

/// Parse one filled multishot-recvmsg buffer: the `io_uring_recvmsg_out` header, then
/// [`RECV_NAME_LEN`] bytes of name, [`RECV_CONTROL_LEN`] bytes of control, then the
/// payload. Trusts none of the lengths in the header; `None` for a buffer shorter than
/// the fixed part. Pure over bytes (the fuzz target `uring_recv` drives it).
pub fn parse_recv_buffer(bytes: &[u8]) -> Option<RecvMsg<'_>> {
    let hdr = recv_msghdr_value();
    // The crate validates the layout and clamps the lengths; its accessors borrow the
    // parser, so take the lengths and slice our own bytes at the fixed offsets.
    let out = RecvMsgOut::parse(bytes, &hdr).ok()?;
    let name_at = RECVMSG_OUT_LEN;
    let control_at = name_at + RECV_NAME_LEN as usize;
    let payload_at = control_at + RECV_CONTROL_LEN as usize;
    Some(RecvMsg {
        from: parse_sockaddr(bytes.get(name_at..name_at + out.name_data().len())?),
        control: bytes.get(control_at..control_at + out.control_data().len())?,
        payload: bytes.get(payload_at..payload_at + out.payload_data().len())?,
        truncated: out.is_payload_truncated(),
        control_truncated: out.is_control_data_truncated(),
    })
}

fn recv_msghdr_value() -> libc::msghdr {
    // SAFETY: msghdr is plain old data; all-zero is a valid value.
    let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
    h.msg_namelen = RECV_NAME_LEN;
    h.msg_controllen = RECV_CONTROL_LEN as _;
    h
}

/// A provided buffer ring (UDP receives, multishot TUN reads): `entries` pool buffers
/// lent to the kernel, which picks one per datagram or packet and reports its id (`bid`)
/// in the completion.
struct BufRing {
    mem: Mapping,
    entries: u16,
    /// bid -> pool buffer. While a bid is in the ring the kernel owns that buffer; while
    /// a [`RecvToken`] for it exists, the caller reads it.
    ids: Box<[BufId]>,
    tail: u16,
}

impl BufRing {
    /// Take `entries` pool buffers, lend them all to the kernel as buffer group `bgid`
    /// of `ring`. `need`: the pool buffers the whole ring setup needs (for the error).
    fn register(
        ring: &IoUring,
        pool: &BufPool,
        entries: u16,
        bgid: u16,
        need: usize,
    ) -> Result<BufRing, UringError> {
        let ring_bytes =
            (usize::from(entries) * std::mem::size_of::<BufRingEntry>()).div_ceil(4096) * 4096;
        let mem = Mapping::new(ring_bytes).map_err(|e| UringError::Register {
            what: "buffer ring memory",
            errno: errno_of(&e),
        })?;
        // SAFETY: `mem` is page-aligned, zeroed and large enough for `entries` entries; it
        // lives in the returned BufRing, which the Ring keeps, and the ring is torn down
        // (Drop) before it is unmapped.
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(mem.0.as_ptr() as u64, entries, bgid, 0)
        }
        .map_err(|e| UringError::Register {
            what: "buffer ring",
            errno: errno_of(&e),
        })?;
        let mut ids = Vec::with_capacity(usize::from(entries));
        for _ in 0..entries {
            match pool.alloc() {
                Some(id) => ids.push(id),
                None => {
                    let have = pool.available() + ids.len();
                    ids.into_iter().for_each(|id| pool.free(id));
                    let _ = ring.submitter().unregister_buf_ring(bgid);
                    return Err(UringError::PoolTooSmall { need, have });
                }
            }
        }
        let mut r = BufRing {
            mem,
            entries,
            ids: ids.into_boxed_slice(),
            tail: 0,
        };
        for bid in 0..entries {
            r.lend(bid, pool);
        }
        r.publish();
        Ok(r)
    }

    /// Give the ring's buffers back to the pool: only once the kernel certainly does not
    /// use them (nothing armed on this group, or the ring gone).
    fn release(self, pool: &BufPool) {
        for b in self.ids.into_vec() {
            pool.free(b);
        }
    }

    /// Put pool buffer `bid` (whole) at the tail, unpublished.
    fn lend(&mut self, bid: u16, pool: &BufPool) {
        if let Some(id) = self.ids.get(usize::from(bid)) {
            let addr = pool.ptr(id) as u64;
            let len = u32::try_from(pool.buf_size()).unwrap_or(u32::MAX);
            self.add(bid, addr, len);
        }
    }

    /// Hand buffer `bid` back to the kernel.
    fn recycle(&mut self, bid: u16, pool: &BufPool) {
        self.lend(bid, pool);
        self.publish();
    }

    fn entry(&mut self, i: u16) -> &mut BufRingEntry {
        let idx = usize::from(i & (self.entries - 1));
        // SAFETY: the mapping holds `entries` entries (checked at construction), idx is
        // masked below that, and the kernel only reads entries between head and tail,
        // which excludes the one we are about to publish.
        unsafe { &mut *self.mem.0.as_ptr().cast::<BufRingEntry>().add(idx) }
    }

    /// Put buffer `bid` (with its address and length) at the tail, unpublished.
    fn add(&mut self, bid: u16, addr: u64, len: u32) {
        let t = self.tail;
        let e = self.entry(t);
        e.set_addr(addr);
        e.set_len(len);
        e.set_bid(bid);
        self.tail = t.wrapping_add(1);
    }

    /// Publish entries added since the last call.
    fn publish(&self) {
        // SAFETY: the tail field lives in entry 0 of the live, page-aligned ring; the
        // kernel reads it concurrently, hence the atomic release store that orders the
        // entry writes above before it.
        unsafe {
            let tail = BufRingEntry::tail(self.mem.0.as_ptr().cast()) as *mut u16;
            std::sync::atomic::AtomicU16::from_ptr(tail)
                .store(self.tail, std::sync::atomic::Ordering::Release);
        }
    }
}

/// One worker's io_uring. `'p`: the pool whose buffers are registered must outlive it.
pub struct Ring<'p> {
    // Declared first so it is dropped first; `Drop` also cancels and reaps everything
    // in flight before the pool or receive ring memory can go away.
    ring: IoUring,
    pool: &'p BufPool,
    slots: Box<[Slot]>,
    free_slots: Vec<u32>,
    recv: BufRing,
    recv_hdr: Box<libc::msghdr>,
    recv_armed: bool,
    /// The TUN read ring, when multishot TUN reads are used.
    tun: Option<BufRing>,
    tun_armed: bool,
    /// The multishot poll on the wake-up file ([`Ring::arm_wake`]) is armed.
    wake_armed: bool,
    /// SQEs pushed but not yet submitted.
    unsubmitted: u32,
    in_flight: u32,
}

/// An operation the ring could not take (no free slot, queue full): the buffer comes back.
#[derive(Debug)]
pub struct Rejected(pub BufId, pub UringError);

impl<'p> Ring<'p> {
    /// Build a ring: set it up (with SQPOLL if asked and allowed, else without, saying
    /// so), register `udp` and `tun` (either may be `-1` for an empty slot) and every
    /// pool buffer, take `recv_buffers` pool buffers for the receive ring.
    pub fn new(
        cfg: &RingConfig,
        pool: &'p BufPool,
        udp: RawFd,
        tun: RawFd,
    ) -> Result<Ring<'p>, UringError> {
        let features = check()?;
        let entries = cfg.recv_buffers;
        if entries == 0 || !entries.is_power_of_two() || entries > 1 << 15 {
            return Err(UringError::BadConfig(
                "the receive ring size must be a power of two from 1 to 32768",
            ));
        }
        let tun_entries = if features.read_multishot {
            cfg.tun_buffers
        } else {
            0
        };
        if tun_entries != 0 && (!tun_entries.is_power_of_two() || tun_entries > 1 << 15) {
            return Err(UringError::BadConfig(
                "the TUN ring size must be a power of two from 1 to 32768",
            ));
        }
        let need = usize::from(entries) + usize::from(tun_entries) + 1;
        if pool.available() < need {
            return Err(UringError::PoolTooSmall {
                need,
                have: pool.available(),
            });
        }
        let build = |sqpoll: Option<u32>, defer: bool| {
            let mut b = IoUring::builder();
            b.setup_cqsize(cfg.sq_entries.saturating_mul(4));
            if let Some(idle) = sqpoll {
                b.setup_sqpoll(idle);
            }
            if defer {
                // Completions are only posted while we wait in io_uring_enter (we always
                // do, once per loop), which saves the interrupts of async task work.
                b.setup_single_issuer().setup_defer_taskrun();
            }
            b.build(cfg.sq_entries)
        };
        // SQPOLL and DEFER_TASKRUN exclude each other; kernels without either get a plain ring.
        let defer = cfg.defer_taskrun && cfg.sqpoll_idle_ms.is_none();
        let ring = match build(cfg.sqpoll_idle_ms, defer) {
            Ok(r) => r,
            Err(e) if cfg.sqpoll_idle_ms.is_some() => {
                log::warn!(
                    "io_uring: SQPOLL not available ({e}); submitting from the worker instead"
                );
                build(None, false).map_err(|e| UringError::Setup(errno_of(&e)))?
            }
            Err(_) if defer => build(None, false).map_err(|e| UringError::Setup(errno_of(&e)))?,
            Err(e) => return Err(UringError::Setup(errno_of(&e))),
        };
        ring.submitter()
            .register_files(&[udp, tun])
            .map_err(|e| UringError::Register {
                what: "files",
                errno: errno_of(&e),
            })?;
        let iov = pool.iovecs();
        // SAFETY: the iovecs describe pool buffers, which outlive the ring ('p), and the
        // ring is dropped (unregistering them) before the pool.
        unsafe { ring.submitter().register_buffers(&iov) }.map_err(|e| UringError::Register {
            what: "buffers",
            errno: errno_of(&e),
        })?;

        let recv = BufRing::register(&ring, pool, entries, RECV_BGID, need)?;
        let tun = match tun_entries {
            0 => None,
            n => match BufRing::register(&ring, pool, n, TUN_BGID, need) {
                Ok(r) => Some(r),
                Err(e) => {
                    recv.release(pool);
                    return Err(e);
                }
            },
        };

        let slots: Box<[Slot]> = (0..cfg.max_in_flight)
            .map(|_| Slot {
                kind: OpKind::TunRead,
                buf: None,
                // SAFETY: plain old data; all-zero is valid and is overwritten before use.
                send: unsafe { std::mem::zeroed() },
                segmented: None,
            })
            .collect();
        Ok(Ring {
            ring,
            pool,
            free_slots: (0..cfg.max_in_flight).rev().collect(),
            slots,
            recv,
            recv_hdr: recv_msghdr(),
            recv_armed: false,
            tun,
            tun_armed: false,
            wake_armed: false,
            unsubmitted: 0,
            in_flight: 0,
        })
    }

    /// Replace the registered UDP socket (listen port change). Operations in flight on
    /// the old one finish on it; re-arm the receive afterwards (cancel it first).
    pub fn set_udp(&mut self, fd: RawFd) -> Result<(), UringError> {
        self.ring
            .submitter()
            .register_files_update(FILE_UDP, &[fd])
            .map(drop)
            .map_err(|e| UringError::Register {
                what: "UDP socket",
                errno: errno_of(&e),
            })
    }

    /// The one function that puts SQEs on the submission queue: submits first when the
    /// queue is full. All SQEs of one call land contiguously (for links).
    fn push(&mut self, sqes: &[squeue::Entry]) -> Result<(), UringError> {
        let n = sqes.len();
        if self.sq_room() < n {
            self.submit()?;
            if self.sq_room() < n && self.sqpoll() {
                // The kernel thread drains the queue on its own; wait for room.
                let _ = self.ring.submitter().squeue_wait();
            }
            if self.sq_room() < n {
                return Err(UringError::QueueFull);
            }
        }
        // SAFETY: every buffer, msghdr and file these SQEs reference is owned by a slot
        // (or by `self`) until its completion is reaped in `complete`, and `Drop` reaps
        // all before the memory goes.
        unsafe { self.ring.submission().push_multiple(sqes) }.map_err(|_| UringError::QueueFull)?;
        self.unsubmitted += n as u32;
        Ok(())
    }

    /// Free entries in the submission queue.
    pub fn sq_room(&mut self) -> usize {
        let sq = self.ring.submission();
        sq.capacity() - sq.len()
    }

    fn take_slot(&mut self, kind: OpKind, buf: BufId) -> Result<u32, Rejected> {
        match self.free_slots.pop() {
            Some(i) => {
                let s = &mut self.slots[i as usize];
                s.kind = kind;
                s.buf = Some(buf);
                Ok(i)
            }
            None => Err(Rejected(buf, UringError::QueueFull)),
        }
    }

    /// Push `sqes` for slot `i`; on failure give the slot and its buffer back.
    fn push_for(&mut self, i: u32, sqes: &[squeue::Entry]) -> Result<(), Rejected> {
        match self.push(sqes) {
            Ok(()) => {
                self.in_flight += 1;
                Ok(())
            }
            Err(e) => {
                let buf = self.slots[i as usize].buf.take();
                self.free_slots.push(i);
                match buf {
                    Some(b) => Err(Rejected(b, e)),
                    // Unreachable: take_slot just put the buffer there.
                    None => Ok(()),
                }
            }
        }
    }

    /// Read one packet from the TUN into `buf` (the kernel owns it until the completion).
    pub fn read_tun(&mut self, buf: BufId) -> Result<(), Rejected> {
        let sqe = self.read_sqe(&buf);
        let i = self.take_slot(OpKind::TunRead, buf)?;
        self.push_for(i, &[sqe.user_data(u64::from(i))])
    }

    /// As [`read_tun`](Self::read_tun), but only once the TUN is readable (after a read
    /// completed with `EAGAIN`): a poll linked in front of the read.
    pub fn read_tun_after_poll(&mut self, buf: BufId) -> Result<(), Rejected> {
        let read = self.read_sqe(&buf);
        let i = self.take_slot(OpKind::TunRead, buf)?;
        let poll = opcode::PollAdd::new(Fixed(FILE_TUN), libc::POLLIN as u32)
            .build()
            .flags(squeue::Flags::IO_LINK)
            .user_data(UD_IGNORE);
        self.push_for(i, &[poll, read.user_data(u64::from(i))])
    }

    fn read_sqe(&self, buf: &BufId) -> squeue::Entry {
        let len = u32::try_from(self.pool.buf_size()).unwrap_or(u32::MAX);
        opcode::ReadFixed::new(Fixed(FILE_TUN), self.pool.ptr(buf), len, buf.buf_index()).build()
    }

    /// Write the first `len` bytes of `buf` to the TUN as one packet.
    pub fn write_tun(&mut self, buf: BufId, len: usize) -> Result<(), Rejected> {
        let len = len.min(self.pool.buf_size()) as u32;
        let sqe =
            opcode::WriteFixed::new(Fixed(FILE_TUN), self.pool.ptr(&buf), len, buf.buf_index())
                .build();
        let i = self.take_slot(OpKind::TunWrite, buf)?;
        self.push_for(i, &[sqe.user_data(u64::from(i))])
    }

    /// Send the first `len` bytes of `buf` to `to` on the UDP socket (give a v4 address
    /// v4-mapped to a dual-stack socket: [`to_socket_family`]). With `segment`, the kernel
    /// (or NIC) cuts it into datagrams of that size (`UDP_SEGMENT`); with `src`, it leaves
    /// from that local address (`IP_PKTINFO`/`IPV6_PKTINFO`).
    pub fn send_udp(
        &mut self,
        buf: BufId,
        len: usize,
        to: SocketAddr,
        segment: Option<u16>,
        src: Option<PktInfo>,
    ) -> Result<(), Rejected> {
        let len = len.min(self.pool.buf_size());
        let base = self.pool.ptr(&buf);
        let i = self.take_slot(OpKind::UdpSend, buf)?;
        let slot = &mut self.slots[i as usize];
        let st = &mut slot.send;
        let (addr, namelen) = to_raw(to, to.is_ipv6());
        st.addr = addr;
        st.iov = libc::iovec {
            iov_base: base.cast(),
            iov_len: len,
        };
        // SAFETY: plain old data; all-zero is a valid msghdr.
        st.hdr = unsafe { std::mem::zeroed() };
        st.hdr.msg_name = (&mut st.addr as *mut RawAddr).cast();
        st.hdr.msg_namelen = namelen;
        st.hdr.msg_iov = &mut st.iov;
        st.hdr.msg_iovlen = 1;
        let clen = write_send_cmsgs(&mut st.cmsg.0, segment, src);
        st.with_src = src.is_some() && clen > 0;
        if clen > 0 {
            st.hdr.msg_control = st.cmsg.0.as_mut_ptr().cast();
            st.hdr.msg_controllen = clen as _;
        }
        slot.segmented = segment.filter(|_| clen > 0).map(|segment| Segmented {
            to,
            len,
            segment,
            src,
        });
        let sqe = opcode::SendMsg::new(Fixed(FILE_UDP), &st.hdr)
            .build()
            .user_data(u64::from(i));
        self.push_for(i, &[sqe])
    }

    /// Arm the multishot receive on the UDP socket (no-op when it is armed).
    pub fn arm_recv(&mut self) -> Result<(), UringError> {
        if self.recv_armed {
            return Ok(());
        }
        let sqe = opcode::RecvMsgMulti::new(Fixed(FILE_UDP), &*self.recv_hdr, RECV_BGID)
            .build()
            .user_data(UD_RECV);
        self.push(&[sqe])?;
        self.recv_armed = true;
        Ok(())
    }

    /// Ask the kernel to end the multishot receive (its last completion says `rearm`).
    pub fn cancel_recv(&mut self) -> Result<(), UringError> {
        if !self.recv_armed {
            return Ok(());
        }
        self.push(&[opcode::AsyncCancel::new(UD_RECV)
            .build()
            .user_data(UD_IGNORE)])
    }

    /// Whether the multishot receive is armed.
    pub fn recv_armed(&self) -> bool {
        self.recv_armed
    }

    /// Give a receive buffer back to the kernel.
    pub fn recycle(&mut self, tok: RecvToken<'p>) {
        self.recv.recycle(tok.bid, self.pool);
    }

    /// Whether TUN reads are multishot on a buffer ring (else one [`read_tun`] per
    /// buffer). Set at construction; [`Ring::drop_tun_ring`] turns it off.
    ///
    /// [`read_tun`]: Ring::read_tun
    pub fn tun_multishot(&self) -> bool {
        self.tun.is_some()
    }

    /// Arm the multishot TUN read (no-op when armed or without a TUN ring): one armed
    /// poll on the TUN queue; each readiness reads packets into ring buffers until the
    /// queue is empty. K single reads would each sit on the queue's wait list, and every
    /// packet would wake all K (most to find nothing and re-arm).
    pub fn arm_tun(&mut self) -> Result<(), UringError> {
        if self.tun_armed || self.tun.is_none() {
            return Ok(());
        }
        let sqe = opcode::ReadMulti::new(Fixed(FILE_TUN), 0, TUN_BGID)
            .build()
            .user_data(UD_TUN);
        self.push(&[sqe])?;
        self.tun_armed = true;
        Ok(())
    }

    /// Arm a multishot poll for input on `fd` (an eventfd another thread writes to wake
    /// this ring's waiter; the caller keeps it open as long as the ring): each wake-up
    /// completes as [`Completion::Wake`] and ends the wait. No-op when armed.
    pub fn arm_wake(&mut self, fd: RawFd) -> Result<(), UringError> {
        if self.wake_armed {
            return Ok(());
        }
        let sqe = opcode::PollAdd::new(Fd(fd), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(UD_WAKE);
        self.push(&[sqe])?;
        self.wake_armed = true;
        Ok(())
    }

    /// Whether the multishot TUN read is armed.
    pub fn tun_armed(&self) -> bool {
        self.tun_armed
    }

    /// Give a TUN ring buffer back to the kernel.
    pub fn recycle_tun(&mut self, tok: TunToken<'p>) {
        if let Some(r) = &mut self.tun {
            r.recycle(tok.bid, self.pool);
        }
    }

    /// Stop using multishot TUN reads (the kernel refused them for this file): the
    /// ring's buffers go back to the pool, for single reads. Only while not armed.
    pub fn drop_tun_ring(&mut self) {
        if self.tun_armed {
            return;
        }
        if let Some(r) = self.tun.take() {
            let _ = self.ring.submitter().unregister_buf_ring(TUN_BGID);
            r.release(self.pool);
        }
    }

    /// Submit everything pushed so far (one `io_uring_enter`).
    pub fn submit(&mut self) -> Result<(), UringError> {
        match self.ring.submit() {
            Ok(_) => {
                self.unsubmitted = 0;
                Ok(())
            }
            Err(e) => match errno_of(&e) {
                // EBUSY: the CQ is overflowing; the caller reaps and we try again later.
                Errno::EINTR | Errno::EBUSY | Errno::EAGAIN => Ok(()),
                other => Err(UringError::Enter(other)),
            },
        }
    }

    /// Submit and wait until at least one completion is there or `timeout` passes.
    pub fn submit_and_wait(&mut self, timeout: Duration) -> Result<(), UringError> {
        let ts = Timespec::from(timeout);
        let args = SubmitArgs::new().timespec(&ts);
        // Waiting for packets is not waiting for storage: where the kernel lets us say so
        // (6.15), the sleep is not accounted as iowait (which would show an idle gateway
        // as 100 % iowait and steer idle and frequency governors as if a disk were due).
        let flags = if self.ring.params().is_feature_no_iowait() {
            EnterFlags::NO_IOWAIT
        } else {
            EnterFlags::empty()
        };
        match self
            .ring
            .submitter()
            .submit_with_args_and_flags(1, &args, flags)
        {
            Ok(_) => {
                self.unsubmitted = 0;
                Ok(())
            }
            Err(e) => match errno_of(&e) {
                Errno::ETIME | Errno::EINTR | Errno::EBUSY | Errno::EAGAIN => Ok(()),
                other => Err(UringError::Enter(other)),
            },
        }
    }

    /// Move up to `out.capacity()` completions out of the CQ (so handling them may push
    /// new SQEs). Returns how many.
    pub fn reap<const N: usize>(&mut self, out: &mut heapless::Vec<cqueue::Entry, N>) -> usize {
        out.clear();
        let mut cq = self.ring.completion();
        while !out.is_full() {
            match cq.next() {
                Some(c) => {
                    // Cannot fail: checked `is_full` above.
                    let _ = out.push(c);
                }
                None => break,
            }
        }
        out.len()
    }

    /// Turn a completion into its result, moving its buffer back to the caller.
    pub fn complete(&mut self, cqe: &cqueue::Entry) -> Completion<'p> {
        let ud = cqe.user_data();
        let res = cqe.result();
        let result = || {
            if res < 0 {
                Err(Errno::from_raw(-res))
            } else {
                Ok(res as usize)
            }
        };
        if ud == UD_IGNORE {
            return Completion::Internal;
        }
        if ud == UD_WAKE {
            if !cqueue::more(cqe.flags()) {
                self.wake_armed = false;
            }
            return Completion::Wake;
        }
        if ud == UD_RECV {
            let more = cqueue::more(cqe.flags());
            if !more {
                self.recv_armed = false;
            }
            let res = match (result(), cqueue::buffer_select(cqe.flags())) {
                (Ok(n), Some(bid)) => match self.recv.ids.get(usize::from(bid)) {
                    Some(id) => Ok(RecvToken {
                        bid,
                        ptr: self.pool.ptr(id),
                        len: n.min(self.pool.buf_size()),
                        _pool: PhantomData,
                    }),
                    None => Err(Errno::EINVAL),
                },
                (Ok(_), None) => Err(Errno::ENOBUFS),
                (Err(e), _) => Err(e),
            };
            return Completion::Recv { res, rearm: !more };
        }
        if ud == UD_TUN {
            if !cqueue::more(cqe.flags()) {
                self.tun_armed = false;
            }
            let cap = self.pool.buf_size();
            let res = match (result(), cqueue::buffer_select(cqe.flags()), &self.tun) {
                (Ok(n), Some(bid), Some(r)) => match r.ids.get(usize::from(bid)) {
                    Some(id) => Ok(TunToken {
                        bid,
                        ptr: self.pool.ptr(id),
                        len: n.min(cap),
                        cap,
                        _pool: PhantomData,
                    }),
                    None => Err(Errno::EINVAL),
                },
                (Ok(_), _, _) => Err(Errno::ENOBUFS),
                (Err(e), _, _) => Err(e),
            };
            return Completion::TunReadMulti { res };
        }
        let Some(slot) = usize::try_from(ud).ok().and_then(|i| self.slots.get_mut(i)) else {
            return Completion::Internal;
        };
        let Some(buf) = slot.buf.take() else {
            return Completion::Internal;
        };
        let kind = slot.kind;
        let (with_src, segmented) = (slot.send.with_src, slot.segmented.take());
        self.free_slots.push(ud as u32);
        self.in_flight = self.in_flight.saturating_sub(1);
        let res = result();
        match kind {
            OpKind::TunRead => Completion::TunRead { buf, res },
            OpKind::TunWrite => Completion::TunWrite { buf, res },
            OpKind::UdpSend => Completion::UdpSend {
                buf,
                res,
                with_src,
                segmented,
            },
        }
    }

    /// Operations (excluding the multishot receive) the kernel still owns.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Whether DEFER_TASKRUN took effect.
    pub fn defer_taskrun(&self) -> bool {
        // Set together with SINGLE_ISSUER only (the crate exposes no DEFER_TASKRUN getter).
        self.ring.params().is_setup_single_issuer()
    }

    /// Whether the kernel polls the submission queue (SQPOLL took effect).
    pub fn sqpoll(&self) -> bool {
        self.ring.params().is_setup_sqpoll()
    }

    /// Free slots for new operations.
    pub fn free_slots(&self) -> usize {
        self.free_slots.len()
    }
}

impl Drop for Ring<'_> {
    fn drop(&mut self) {
        // Cancel everything and reap until nothing is in flight, so no kernel write can
        // land in pool or buffer-ring memory after the ring is gone. Bounded: a wedged
        // kernel must not hang shutdown forever.
        let _ = self.ring.submit();
        let _ = self
            .ring
            .submitter()
            .register_sync_cancel(Some(Timespec::new().sec(1)), CancelBuilder::any());
        let mut cqes: heapless::Vec<cqueue::Entry, 64> = heapless::Vec::new();
        for _ in 0..100 {
            if self.in_flight == 0 && !self.recv_armed && !self.tun_armed {
                break;
            }
            let _ = self.submit_and_wait(Duration::from_millis(10));
            while self.reap(&mut cqes) > 0 {
                for c in cqes.clone() {
                    match self.complete(&c) {
                        Completion::Recv { res: Ok(tok), .. } => self.recycle(tok),
                        Completion::TunReadMulti { res: Ok(tok) } => self.recycle_tun(tok),
                        Completion::TunRead { buf, .. }
                        | Completion::TunWrite { buf, .. }
                        | Completion::UdpSend { buf, .. } => self.pool.free(buf),
                        _ => {}
                    }
                }
            }
        }
        // The receive ring's buffers go back to the pool only when the kernel has
        // certainly let go of them; otherwise they stay out of circulation.
        if !self.recv_armed {
            for b in std::mem::take(&mut self.recv.ids).into_vec() {
                self.pool.free(b);
            }
        }
        // The ring memory itself is unmapped with the field, after the kernel ring.
        if let (false, Some(r)) = (self.tun_armed, &mut self.tun) {
            for b in std::mem::take(&mut r.ids).into_vec() {
                self.pool.free(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hugepage::PoolConfig;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    /// Skip (return) with a message when io_uring or a needed feature is missing.
    macro_rules! require_uring {
        () => {
            match probe() {
                Ok(f) => f,
                Err(e) => {
                    crate::testutil::not_run(&format!("{e}"));
                    return;
                }
            }
        };
    }

    fn pool(n: u32) -> BufPool {
        BufPool::new(&PoolConfig {
            count: n,
            buf_size: 65536 + 512,
            hugepages: false,
        })
        .expect("pool")
    }

    #[test]
    fn probe_reports_features() {
        let f = require_uring!();
        eprintln!("io_uring features: {f}");
        assert!(f.multishot_recvmsg && f.buf_ring && f.rw_fixed && f.sendmsg);
        assert_eq!(check(), Ok(f));
    }

    /// A filled multishot-recvmsg buffer as the kernel lays it out: the
    /// `io_uring_recvmsg_out` header, the name, the control room, the payload.
    fn recv_buffer(name: &[u8], control: &[u8], payload: &[u8], flags: u32) -> Vec<u8> {
        let mut v = Vec::new();
        for x in [name.len(), control.len(), payload.len()] {
            v.extend_from_slice(&(x as u32).to_ne_bytes());
        }
        v.extend_from_slice(&flags.to_ne_bytes());
        let mut n = name.to_vec();
        n.resize(RECV_NAME_LEN as usize, 0);
        v.extend_from_slice(&n);
        let mut c = control.to_vec();
        c.resize(RECV_CONTROL_LEN as usize, 0);
        v.extend_from_slice(&c);
        v.extend_from_slice(payload);
        v
    }

    /// The io_uring receive reads what the recvmmsg path reads, with the same checks:
    /// the source, the local address from IP_PKTINFO / IPV6_PKTINFO (replies leave from
    /// it), the GRO size (range-checked), and truncation.
    #[test]
    fn recv_buffer_meta_has_pktinfo_and_checked_gro() {
        use crate::cmsg::{sockaddr_bytes, write_send_cmsgs, SOL_UDP, UDP_GRO};
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
        let from: SocketAddr = "192.0.2.9:51820".parse().expect("addr");
        // As a dual-stack socket reports an IPv4 sender: v4-mapped.
        let (raw, namelen) = sockaddr_bytes(from, true);
        let name = &raw[..namelen];
        let local = PktInfo {
            ip: IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7)),
            ifindex: 3,
        };
        let gro = |v: i32| {
            let mut c = CmsgBuf::default();
            let mut n = write_send_cmsgs(&mut c.0, None, Some(local));
            // A UDP_GRO cmsg after the pktinfo: size_t len; int level; int type; int v.
            let at = n;
            let w = std::mem::size_of::<usize>();
            c.0[at..at + w].copy_from_slice(&(w + 8 + 4).to_ne_bytes());
            c.0[at + w..at + w + 4].copy_from_slice(&SOL_UDP.to_ne_bytes());
            c.0[at + w + 4..at + w + 8].copy_from_slice(&UDP_GRO.to_ne_bytes());
            c.0[at + w + 8..at + w + 12].copy_from_slice(&v.to_ne_bytes());
            n += (w + 12).next_multiple_of(w);
            c.0[..n].to_vec()
        };
        let payload = [7u8; 2500];
        let buf = recv_buffer(name, &gro(1000), &payload, 0);
        let m = parse_recv_buffer(&buf)
            .expect("parses")
            .meta()
            .expect("valid");
        assert_eq!(m.src, from, "canonical source");
        assert_eq!(m.dst, Some(local), "IP_PKTINFO read on the io_uring path");
        assert_eq!((m.len, m.segment_size, m.segments()), (2500, 1000, 3));

        // IPv6 pktinfo.
        let v6 = PktInfo {
            ip: IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 5)),
            ifindex: 2,
        };
        let mut c = CmsgBuf::default();
        let n = write_send_cmsgs(&mut c.0, None, Some(v6));
        let buf = recv_buffer(name, &c.0[..n], &payload[..100], 0);
        let m = parse_recv_buffer(&buf)
            .expect("parses")
            .meta()
            .expect("valid");
        assert_eq!((m.dst, m.segment_size), (Some(v6), 100));

        // A GRO size out of 1..=65535 is malformed, not "one datagram" (as it was here
        // before the parsers were shared).
        for bad in [0, -1, 70_000] {
            let buf = recv_buffer(name, &gro(bad), &payload, 0);
            let msg = parse_recv_buffer(&buf).expect("parses");
            assert!(msg.meta().is_err(), "GRO size {bad} accepted");
        }
        // Truncated payload or control data: dropped like recvmmsg's MSG_TRUNC/CTRUNC.
        for flags in [libc::MSG_TRUNC, libc::MSG_CTRUNC] {
            let buf = recv_buffer(name, &gro(1000), &payload, flags as u32);
            assert!(parse_recv_buffer(&buf).expect("parses").meta().is_err());
        }
        // An unknown source family.
        let buf = recv_buffer(&[0xff; 16], &[], &payload, 0);
        assert!(parse_recv_buffer(&buf).expect("parses").meta().is_err());
    }

    /// Drive `ring` until `want` completions of interest were handled by `f`.
    fn drive<'p>(ring: &mut Ring<'p>, mut f: impl FnMut(&mut Ring<'p>, Completion<'p>) -> bool) {
        let mut cq: heapless::Vec<cqueue::Entry, 32> = heapless::Vec::new();
        for _ in 0..500 {
            ring.submit_and_wait(Duration::from_millis(10))
                .expect("wait");
            ring.reap(&mut cq);
            for c in cq.clone() {
                let comp = ring.complete(&c);
                if f(ring, comp) {
                    return;
                }
            }
        }
        panic!("no completion arrived");
    }

    #[test]
    fn udp_echo_through_multishot_recvmsg_and_sendmsg() {
        require_uring!();
        let p = pool(16);
        echo(
            &p,
            &RingConfig {
                recv_buffers: 4,
                max_in_flight: 8,
                ..RingConfig::default()
            },
        );
        let plain = RingConfig {
            recv_buffers: 4,
            max_in_flight: 8,
            defer_taskrun: false,
            ..RingConfig::default()
        };
        echo(&p, &plain);
    }

    #[test]
    fn udp_echo_with_sqpoll() {
        require_uring!();
        let p = pool(16);
        let cfg = RingConfig {
            recv_buffers: 4,
            max_in_flight: 8,
            sqpoll_idle_ms: Some(50),
            ..RingConfig::default()
        };
        let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
        match Ring::new(&cfg, &p, sock.as_raw_fd(), -1) {
            Ok(r) if r.sqpoll() => {}
            _ => {
                crate::testutil::not_run("SQPOLL not available here");
                return;
            }
        }
        echo(&p, &cfg);
    }

    #[test]
    #[ignore = "needs root (sets vm.nr_hugepages): ci/test.sh unit runs it with --include-ignored"]
    fn udp_echo_from_registered_hugepage_buffers() {
        require_uring!();
        use crate::hugepage::{tests as hp, Backing};
        let _g = hp::HUGE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let Some(old) = hp::nr_hugepages() else {
            crate::testutil::not_run("no hugetlb");
            return;
        };
        let _restore = hp::Restore(old);
        if !hp::set_nr_hugepages(old + 2) {
            crate::testutil::not_run("cannot write vm.nr_hugepages");
            return;
        }
        let p = BufPool::new(&PoolConfig::new(16)).expect("pool");
        if !matches!(p.backing(), Backing::Huge { .. }) {
            crate::testutil::not_run(&format!(
                "the kernel did not give us hugepages ({:?})",
                p.backing()
            ));
            return;
        }
        echo(
            &p,
            &RingConfig {
                recv_buffers: 4,
                max_in_flight: 8,
                ..RingConfig::default()
            },
        );
    }

    /// Ten datagrams echoed by a ring on `p` (more than its receive buffers, so recycling
    /// must keep the multishot receive going); every buffer is back in the pool at the end.
    fn echo(p: &BufPool, cfg: &RingConfig) {
        let server = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let client = UdpSocket::bind("127.0.0.1:0").expect("bind");
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let total = p.available();
        let mut ring = Ring::new(cfg, p, server.as_raw_fd(), -1).expect("ring");
        assert_eq!(
            p.available(),
            total - usize::from(cfg.recv_buffers),
            "buffers lent to the receive ring"
        );
        ring.arm_recv().expect("arm");
        ring.submit().expect("submit");

        // More datagrams than receive buffers: recycling keeps the multishot going.
        for round in 0..10u8 {
            let msg = [b'p', b'i', b'n', b'g', round];
            client
                .send_to(&msg, server.local_addr().expect("addr"))
                .expect("send");
            drive(&mut ring, |ring, c| match c {
                Completion::Recv {
                    res: Ok(tok),
                    rearm,
                } => {
                    let m = tok.parse().expect("parse");
                    assert_eq!(m.payload, &msg);
                    assert_eq!(m.from, Some(client.local_addr().expect("addr")));
                    assert!(!m.truncated);
                    let mut b = p.alloc().expect("buf");
                    p.buf_mut(&mut b)[..m.payload.len()].copy_from_slice(m.payload);
                    let (n, from) = (m.payload.len(), m.from.expect("from"));
                    ring.recycle(tok);
                    if rearm {
                        ring.arm_recv().expect("rearm");
                    }
                    ring.send_udp(b, n, from, None, None)
                        .map_err(|r| r.1)
                        .expect("send");
                    false
                }
                Completion::UdpSend { buf, res, .. } => {
                    assert_eq!(res, Ok(5));
                    p.free(buf);
                    true
                }
                Completion::Recv { res: Err(e), .. } => panic!("recv: {e}"),
                _ => false,
            });
            let mut rb = [0u8; 16];
            let (n, from) = client.recv_from(&mut rb).expect("echo");
            assert_eq!(&rb[..n], &msg);
            assert_eq!(from, server.local_addr().expect("addr"));
        }
        assert!(ring.recv_armed());
        eprintln!(
            "echo: sqpoll {}, defer_taskrun {}",
            ring.sqpoll(),
            ring.defer_taskrun()
        );
        assert_eq!(ring.in_flight(), 0);
        drop(ring);
        assert_eq!(p.available(), total, "every buffer came back");
    }

    #[test]
    fn replacing_the_udp_socket_moves_the_receive() {
        require_uring!();
        let old = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let new = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let client = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let p = pool(8);
        let cfg = RingConfig {
            recv_buffers: 2,
            max_in_flight: 4,
            ..RingConfig::default()
        };
        let mut ring = Ring::new(&cfg, &p, old.as_raw_fd(), -1).expect("ring");
        ring.arm_recv().expect("arm");
        ring.set_udp(new.as_raw_fd()).expect("replace");
        ring.cancel_recv().expect("cancel");
        drive(&mut ring, |_, c| {
            matches!(
                c,
                Completion::Recv {
                    res: Err(Errno::ECANCELED),
                    rearm: true
                }
            )
        });
        assert!(!ring.recv_armed());
        ring.arm_recv().expect("re-arm");
        client
            .send_to(b"to-new", new.local_addr().expect("addr"))
            .expect("send");
        drive(&mut ring, |ring, c| match c {
            Completion::Recv { res: Ok(tok), .. } => {
                let m = tok.parse().expect("parse");
                assert_eq!(m.payload, b"to-new");
                ring.recycle(tok);
                true
            }
            _ => false,
        });
    }

    #[test]
    fn sendmsg_with_udp_segment_splits_the_datagram() {
        require_uring!();
        let server = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let client = UdpSocket::bind("127.0.0.1:0").expect("bind");
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let p = pool(4);
        let cfg = RingConfig {
            recv_buffers: 1,
            max_in_flight: 4,
            ..RingConfig::default()
        };
        let mut ring = Ring::new(&cfg, &p, server.as_raw_fd(), -1).expect("ring");
        let mut b = p.alloc().expect("buf");
        for (i, x) in p.buf_mut(&mut b)[..3000].iter_mut().enumerate() {
            *x = (i / 1000) as u8;
        }
        ring.send_udp(
            b,
            3000,
            client.local_addr().expect("addr"),
            Some(1000),
            None,
        )
        .map_err(|r| r.1)
        .expect("send");
        drive(&mut ring, |_, c| match c {
            Completion::UdpSend { buf, res, .. } => {
                assert_eq!(res, Ok(3000));
                p.free(buf);
                true
            }
            _ => false,
        });
        for seg in 0..3u8 {
            let mut rb = [0u8; 4096];
            let n = client.recv(&mut rb).expect("segment");
            assert_eq!(n, 1000);
            assert!(rb[..n].iter().all(|&x| x == seg));
        }
    }

    #[test]
    #[ignore = "needs root (network namespaces, /dev/net/tun): ci/test.sh unit runs it with --include-ignored"]
    fn tun_read_fixed_and_write_fixed() {
        require_uring!();
        crate::testutil::in_new_netns(|| {
            use crate::testutil::ip;
            let tun = crate::tun::Tun::create("rgur0", 1, false).expect("tun");
            ip(&["link", "set", "lo", "up"]);
            ip(&["addr", "add", "10.78.0.1/24", "dev", "rgur0"]);
            ip(&["link", "set", "rgur0", "up"]);
            let q = tun.queue(0).expect("queue");
            let udp = UdpSocket::bind("127.0.0.1:0").expect("bind");
            let p = pool(8);
            let cfg = RingConfig {
                recv_buffers: 1,
                max_in_flight: 8,
                ..RingConfig::default()
            };
            let mut ring = Ring::new(&cfg, &p, udp.as_raw_fd(), q.as_raw_fd()).expect("ring");
            for _ in 0..2 {
                ring.read_tun(p.alloc().expect("buf"))
                    .map_err(|r| r.1)
                    .expect("read");
            }
            ring.submit().expect("submit");

            let sock = UdpSocket::bind("10.78.0.1:0").expect("bind");
            sock.send_to(b"via-uring", "10.78.0.2:7777").expect("send");
            let mut pkt = Vec::new();
            drive(&mut ring, |ring, c| match c {
                Completion::TunRead { buf, res: Ok(n) } => {
                    let b = &p.buf(&buf)[..n];
                    let ours = n > 28 && b[9] == 17 && &b[28..] == b"via-uring";
                    if ours {
                        pkt = b.to_vec();
                        p.free(buf);
                    } else {
                        ring.read_tun(buf).map_err(|r| r.1).expect("reread");
                    }
                    ours
                }
                Completion::TunRead {
                    buf,
                    res: Err(Errno::EAGAIN),
                } => {
                    ring.read_tun_after_poll(buf)
                        .map_err(|r| r.1)
                        .expect("poll+read");
                    false
                }
                Completion::TunRead { res: Err(e), .. } => panic!("tun read: {e}"),
                _ => false,
            });
            // Swap addresses and ports; UDP checksum 0 = none.
            let (src, dst) = (pkt[12..16].to_vec(), pkt[16..20].to_vec());
            pkt[12..16].copy_from_slice(&dst);
            pkt[16..20].copy_from_slice(&src);
            let (sp, dp) = (pkt[20..22].to_vec(), pkt[22..24].to_vec());
            pkt[20..22].copy_from_slice(&dp);
            pkt[22..24].copy_from_slice(&sp);
            pkt[26] = 0;
            pkt[27] = 0;
            let mut b = p.alloc().expect("buf");
            p.buf_mut(&mut b)[..pkt.len()].copy_from_slice(&pkt);
            ring.write_tun(b, pkt.len())
                .map_err(|r| r.1)
                .expect("write");
            let want = pkt.len();
            drive(&mut ring, |_, c| match c {
                Completion::TunWrite { buf, res } => {
                    assert_eq!(res, Ok(want));
                    p.free(buf);
                    true
                }
                _ => false,
            });
            sock.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let mut rb = [0u8; 64];
            let (n, from) = sock.recv_from(&mut rb).expect("recv");
            assert_eq!(&rb[..n], b"via-uring");
            assert_eq!(from.to_string(), "10.78.0.2:7777");
            // The remaining read is cancelled by Drop and its buffer returned.
            drop(ring);
            assert_eq!(p.available(), 8);
        });
    }

    /// One armed multishot read serves many packets, more than the TUN ring has buffers
    /// (each recycled after use), without re-arming per packet; Drop ends it and every
    /// buffer is back in the pool.
    #[test]
    #[ignore = "needs root (network namespaces, /dev/net/tun): ci/test.sh unit runs it with --include-ignored"]
    fn tun_multishot_read_serves_many_packets_from_one_arm() {
        let f = require_uring!();
        if !f.read_multishot {
            crate::testutil::not_run("no IORING_OP_READ_MULTISHOT (kernel < 6.7)");
            return;
        }
        crate::testutil::in_new_netns(|| {
            use crate::testutil::ip;
            let tun = crate::tun::Tun::create("rgur1", 1, false).expect("tun");
            ip(&["link", "set", "lo", "up"]);
            ip(&["addr", "add", "10.79.0.1/24", "dev", "rgur1"]);
            ip(&["link", "set", "rgur1", "up"]);
            let q = tun.queue(0).expect("queue");
            let udp = UdpSocket::bind("127.0.0.1:0").expect("bind");
            let p = pool(8);
            let cfg = RingConfig {
                recv_buffers: 1,
                tun_buffers: 2,
                max_in_flight: 8,
                ..RingConfig::default()
            };
            let mut ring = Ring::new(&cfg, &p, udp.as_raw_fd(), q.as_raw_fd()).expect("ring");
            assert!(ring.tun_multishot());
            assert_eq!(p.available(), 8 - 1 - 2);
            ring.arm_tun().expect("arm");
            ring.submit().expect("submit");
            let sock = UdpSocket::bind("10.79.0.1:0").expect("bind");
            const N: u8 = 12;
            let (mut seen, mut arms) = (Vec::new(), 1);
            for i in 0..N {
                sock.send_to(&[b'm', i], "10.79.0.2:7777").expect("send");
                drive(&mut ring, |ring, c| match c {
                    Completion::TunReadMulti { res: Ok(mut tok) } => {
                        let n = tok.len;
                        let b = &tok.buf_mut()[..n];
                        let ours = n == 30 && b[9] == 17 && b[28] == b'm';
                        if ours {
                            seen.push(b[29]);
                        }
                        ring.recycle_tun(tok);
                        ours
                    }
                    Completion::TunReadMulti {
                        res: Err(Errno::ENOBUFS),
                    } => false,
                    Completion::TunReadMulti { res: Err(e) } => panic!("tun read: {e}"),
                    _ => false,
                });
                if !ring.tun_armed() {
                    arms += 1;
                    ring.arm_tun().expect("re-arm");
                }
            }
            assert_eq!(seen, (0..N).collect::<Vec<_>>());
            assert_eq!(arms, 1, "the read stayed armed across {N} packets");
            drop(ring);
            assert_eq!(p.available(), 8);
        });
    }
}
