//! The TUN device: `/dev/net/tun` opened by hand so we get N queues (`IFF_MULTI_QUEUE`),
//! an optional `virtio_net_hdr` in front of every packet (`IFF_VNET_HDR`) and the
//! checksum/segmentation offloads that come with it (`TUNSETOFFLOAD`).
//!
//! The `tun` crate (0.7) refuses `queues != 1`, which is why this exists. One `TunQueue`
//! per worker; each is a non-blocking fd that can be read/written directly or handed to
//! io_uring via `AsRawFd`.

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Bytes of the `virtio_net_hdr` the kernel puts in front of each packet when the
/// device was created with `vnet_hdr` (the legacy header without `num_buffers`).
pub const VNET_HDR_LEN: usize = 10;

/// Longest interface name (without the NUL) Linux accepts.
const IFNAMSIZ: usize = libc::IFNAMSIZ;

/// The offloads `TUNSETOFFLOAD` accepted, as `TUN_F_*` bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TunOffload(u32);

impl TunOffload {
    /// No offload: every packet is a plain, fully checksummed IP packet.
    pub const NONE: Self = Self(0);
    /// The kernel may hand us packets whose L4 checksum is partial (`NEEDS_CSUM`).
    pub const CSUM: Self = Self(libc::TUN_F_CSUM);
    /// TCP over IPv4 super-packets (TSO) in both directions.
    pub const TSO4: Self = Self(libc::TUN_F_TSO4);
    /// TCP over IPv6 super-packets.
    pub const TSO6: Self = Self(libc::TUN_F_TSO6);
    /// UDP over IPv4 super-packets (USO, Linux 6.2+).
    pub const USO4: Self = Self(libc::TUN_F_USO4);
    /// UDP over IPv6 super-packets (USO, Linux 6.2+).
    pub const USO6: Self = Self(libc::TUN_F_USO6);

    /// The raw `TUN_F_*` bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// TSO for both IP versions (needs `CSUM` too): the write side may coalesce TCP.
    pub fn tso(self) -> bool {
        self.contains(Self::CSUM | Self::TSO4 | Self::TSO6)
    }

    /// USO for both IP versions: the write side may coalesce UDP.
    pub fn uso(self) -> bool {
        self.contains(Self::CSUM | Self::USO4 | Self::USO6)
    }
}

impl std::ops::BitOr for TunOffload {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl fmt::Display for TunOffload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("none");
        }
        let names = [
            (Self::CSUM, "csum"),
            (Self::TSO4, "tso4"),
            (Self::TSO6, "tso6"),
            (Self::USO4, "uso4"),
            (Self::USO6, "uso6"),
        ];
        let mut first = true;
        for (bit, name) in names {
            if self.contains(bit) {
                if !first {
                    f.write_str("+")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        Ok(())
    }
}

/// Why a TUN device could not be set up.
#[derive(Debug)]
#[non_exhaustive]
pub enum TunError {
    /// The name is empty, too long (max 15 bytes) or has a NUL or `/`.
    InvalidName(String),
    /// `queues` was 0 (or too many for one device).
    InvalidQueues(usize),
    /// `/dev/net/tun` could not be opened.
    Open(io::Error),
    /// `TUNSETIFF` failed (name in use by a non-TUN device, no CAP_NET_ADMIN, ...).
    SetIff { name: String, source: io::Error },
    /// `TUNSETVNETHDRSZ` failed.
    VnetHdr(io::Error),
    /// The interface index could not be read back.
    Ifindex { name: String, source: io::Error },
}

impl fmt::Display for TunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidName(n) => write!(
                f,
                "invalid TUN interface name {n:?}: use 1 to 15 bytes without '/' or NUL"
            ),
            Self::InvalidQueues(q) => {
                write!(f, "invalid TUN queue count {q}: use 1 to 256 queues")
            }
            Self::Open(e) => write!(
                f,
                "cannot open /dev/net/tun: {e} (is the tun module loaded and are we root?)"
            ),
            Self::SetIff { name, source } => write!(
                f,
                "cannot create TUN {name:?}: {source} (name taken by a non-TUN device, or missing CAP_NET_ADMIN)"
            ),
            Self::VnetHdr(e) => write!(f, "cannot set the TUN virtio header size: {e}"),
            Self::Ifindex { name, source } => {
                write!(f, "cannot read the index of TUN {name:?}: {source}")
            }
        }
    }
}

impl std::error::Error for TunError {}

/// `struct ifreq` with the `ifr_flags` member of its union; longer than the kernel's
/// (40 bytes on 64-bit) so the kernel's copy never reads past it.
#[repr(C)]
struct IfReqFlags {
    name: [u8; IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 30],
}

/// One queue of a TUN device: a non-blocking fd.
#[derive(Debug)]
pub struct TunQueue {
    fd: OwnedFd,
}

impl TunQueue {
    /// Another handle on the same queue (a dup'd fd), for a second writer thread.
    pub fn try_clone(&self) -> io::Result<TunQueue> {
        Ok(TunQueue {
            fd: self.fd.try_clone()?,
        })
    }

    /// Read one packet (with the virtio header in front if the device has one).
    /// `WouldBlock` when none is waiting. The buffer should hold 65535 + header bytes
    /// when TSO/USO is on, else MTU + header.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        nix::unistd::read(&self.fd, buf).map_err(io::Error::from)
    }

    /// Write one packet (with the virtio header in front if the device has one).
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        nix::unistd::write(&self.fd, buf).map_err(io::Error::from)
    }
}

impl AsRawFd for TunQueue {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for TunQueue {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A TUN device with one or more queues. Dropping it closes the queues; the kernel then
/// removes the (non-persistent) interface.
#[derive(Debug)]
pub struct Tun {
    name: String,
    ifindex: u32,
    vnet_hdr: bool,
    offload: TunOffload,
    queues: Vec<TunQueue>,
}

impl Tun {
    /// Create (or attach to) TUN `name` with `queues` queues (`IFF_MULTI_QUEUE` when more
    /// than one). With `vnet_hdr`, every packet carries a `virtio_net_hdr` and the widest
    /// offload set the kernel takes is switched on: CSUM+TSO4/6+USO4/6, else without USO,
    /// else none (see [`Tun::offload`]).
    pub fn create(name: &str, queues: usize, vnet_hdr: bool) -> Result<Tun, TunError> {
        if name.is_empty() || name.len() >= IFNAMSIZ || name.bytes().any(|b| b == 0 || b == b'/') {
            return Err(TunError::InvalidName(name.to_string()));
        }
        if queues == 0 || queues > 256 {
            return Err(TunError::InvalidQueues(queues));
        }
        let mut flags = libc::IFF_TUN | libc::IFF_NO_PI;
        if queues > 1 {
            flags |= libc::IFF_MULTI_QUEUE;
        }
        if vnet_hdr {
            flags |= libc::IFF_VNET_HDR;
        }

        let mut actual_name = name.to_string();
        let mut qs = Vec::with_capacity(queues);
        for _ in 0..queues {
            let fd = open_dev_tun()?;
            // The kernel may complete a name pattern like "wg%d"; later queues attach to
            // the name it chose.
            actual_name = set_iff(&fd, &actual_name, flags)?;
            if vnet_hdr {
                let size: libc::c_int = VNET_HDR_LEN as libc::c_int;
                // SAFETY: TUNSETVNETHDRSZ reads one c_int from the pointer, which points
                // to a live local.
                let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETVNETHDRSZ, &size) };
                if rc < 0 {
                    return Err(TunError::VnetHdr(io::Error::last_os_error()));
                }
            }
            qs.push(TunQueue { fd });
        }

        let offload = match qs.first() {
            Some(q) if vnet_hdr => set_best_offload(q.fd.as_raw_fd()),
            _ => TunOffload::NONE,
        };
        let ifindex =
            nix::net::if_::if_nametoindex(actual_name.as_str()).map_err(|e| TunError::Ifindex {
                name: actual_name.clone(),
                source: e.into(),
            })?;
        Ok(Tun {
            name: actual_name,
            ifindex,
            vnet_hdr,
            offload,
            queues: qs,
        })
    }

    /// Queue `i` (0-based), if it exists.
    pub fn queue(&self, i: usize) -> Option<&TunQueue> {
        self.queues.get(i)
    }

    /// All queues, for handing one to each worker.
    pub fn queues(&self) -> &[TunQueue] {
        &self.queues
    }

    /// Take the queues out (e.g. to move one into each worker thread). The interface
    /// lives until the last queue is dropped.
    pub fn into_queues(self) -> Vec<TunQueue> {
        self.queues
    }

    /// Interface name as the kernel has it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Interface index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Whether packets carry a [`VNET_HDR_LEN`]-byte virtio header.
    pub fn vnet_hdr(&self) -> bool {
        self.vnet_hdr
    }

    /// The offloads that stuck (`NONE` without `vnet_hdr`).
    pub fn offload(&self) -> TunOffload {
        self.offload
    }
}

fn open_dev_tun() -> Result<OwnedFd, TunError> {
    let path = c"/dev/net/tun";
    // SAFETY: path is a valid NUL-terminated string; open has no other preconditions.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return Err(TunError::Open(io::Error::last_os_error()));
    }
    // SAFETY: fd was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// TUNSETIFF on `fd`; returns the name the kernel settled on.
fn set_iff(fd: &OwnedFd, name: &str, flags: libc::c_int) -> Result<String, TunError> {
    let mut req = IfReqFlags {
        name: [0; IFNAMSIZ],
        // The TUN flags all fit in the low 16 bits of ifr_flags.
        flags: flags as libc::c_short,
        _pad: [0; 30],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads and writes a struct ifreq; `req` is at least that large,
    // properly laid out (#[repr(C)]) and lives across the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req) };
    if rc < 0 {
        return Err(TunError::SetIff {
            name: name.to_string(),
            source: io::Error::last_os_error(),
        });
    }
    // The kernel NUL-terminates the name; fall back to what we asked for if not.
    Ok(CStr::from_bytes_until_nul(&req.name)
        .ok()
        .and_then(|c| c.to_str().ok())
        .map(str::to_string)
        .unwrap_or_else(|| name.to_string()))
}

/// Try the widest offload set first and step down; report what stuck.
fn set_best_offload(fd: RawFd) -> TunOffload {
    let tso = TunOffload::CSUM | TunOffload::TSO4 | TunOffload::TSO6;
    for want in [tso | TunOffload::USO4 | TunOffload::USO6, tso] {
        let bits: libc::c_ulong = want.bits().into();
        // SAFETY: TUNSETOFFLOAD takes its argument by value (an unsigned long); no memory
        // is passed.
        let rc = unsafe { libc::ioctl(fd, libc::TUNSETOFFLOAD, bits) };
        if rc == 0 {
            return want;
        }
    }
    TunOffload::NONE
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{in_new_netns, ip};

    #[test]
    fn rejects_bad_names_and_queues() {
        assert!(matches!(
            Tun::create("", 1, false),
            Err(TunError::InvalidName(_))
        ));
        assert!(matches!(
            Tun::create("a-very-long-name-x", 1, false),
            Err(TunError::InvalidName(_))
        ));
        assert!(matches!(
            Tun::create("a/b", 1, false),
            Err(TunError::InvalidName(_))
        ));
        assert!(matches!(
            Tun::create("rgq", 0, false),
            Err(TunError::InvalidQueues(0))
        ));
    }

    #[test]
    fn offload_display() {
        assert_eq!(TunOffload::NONE.to_string(), "none");
        let t = TunOffload::CSUM | TunOffload::TSO4 | TunOffload::TSO6;
        assert_eq!(t.to_string(), "csum+tso4+tso6");
        assert!(t.tso() && !t.uso());
    }

    #[test]
    #[ignore = "needs root (network namespaces, /dev/net/tun): ci/test.sh unit runs it with --include-ignored"]
    fn multi_queue_vnet_hdr_device() {
        in_new_netns(|| {
            let tun = Tun::create("rgmq0", 3, true).expect("create");
            assert_eq!(tun.name(), "rgmq0");
            assert!(tun.ifindex() > 0);
            assert_eq!(tun.queues().len(), 3);
            assert!(tun.queue(2).is_some() && tun.queue(3).is_none());
            // Every kernel we target (4.x+) takes CSUM+TSO; USO needs 6.2.
            assert!(tun.offload().tso(), "offload {}", tun.offload());
            let mut buf = [0u8; 2048];
            let e = tun.queue(0).map(|q| q.read(&mut buf));
            assert!(matches!(e, Some(Err(ref e)) if e.kind() == io::ErrorKind::WouldBlock));
        });
    }

    #[test]
    #[ignore = "needs root (network namespaces, /dev/net/tun): ci/test.sh unit runs it with --include-ignored"]
    fn name_pattern_is_completed() {
        in_new_netns(|| {
            let tun = Tun::create("rgp%d", 1, false).expect("create");
            assert!(tun.name().starts_with("rgp") && !tun.name().contains('%'));
        });
    }

    #[test]
    #[ignore = "needs root (network namespaces, /dev/net/tun): ci/test.sh unit runs it with --include-ignored"]
    fn reads_a_routed_packet_and_writes_one_back() {
        in_new_netns(|| {
            let tun = Tun::create("rgrw0", 1, false).expect("create");
            ip(&["link", "set", "lo", "up"]);
            ip(&["addr", "add", "10.77.0.1/24", "dev", "rgrw0"]);
            ip(&["link", "set", "rgrw0", "up"]);
            let q = tun.queue(0).expect("queue 0");

            // A datagram to a peer "behind" the TUN comes out of the queue as an IP packet.
            let sock = std::net::UdpSocket::bind("10.77.0.1:0").expect("bind");
            sock.send_to(b"hello-tun", "10.77.0.2:9999").expect("send");
            let mut buf = [0u8; 2048];
            let n = read_until(q, &mut buf, |p| p.len() > 28 && p[9] == 17);
            assert_eq!(buf[0] >> 4, 4);
            assert_eq!(&buf[28..n], b"hello-tun");

            // Turn it around: swap addresses and ports, and the socket receives it.
            let mut pkt = buf[..n].to_vec();
            let (src, dst) = (pkt[12..16].to_vec(), pkt[16..20].to_vec());
            pkt[12..16].copy_from_slice(&dst);
            pkt[16..20].copy_from_slice(&src);
            let (sp, dp) = (pkt[20..22].to_vec(), pkt[22..24].to_vec());
            pkt[20..22].copy_from_slice(&dp);
            pkt[22..24].copy_from_slice(&sp);
            pkt[26] = 0; // UDP checksum 0: "none" for IPv4
            pkt[27] = 0;
            // The IPv4 header checksum is unchanged by swapping two of its words.
            assert_eq!(q.write(&pkt).expect("write"), pkt.len());
            sock.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .expect("timeout");
            let mut rb = [0u8; 64];
            let (m, from) = sock.recv_from(&mut rb).expect("recv");
            assert_eq!(&rb[..m], b"hello-tun");
            assert_eq!(from.to_string(), "10.77.0.2:9999");
        });
    }

    /// A mini data plane without crypto: two namespaces joined by two vnet_hdr TUNs and a
    /// userspace forwarder that splits what one TUN reads (`core::gso::Splitter`) and
    /// coalesces it again for the other (`core::gso::Coalescer`). A TCP transfer and a UDP
    /// GSO burst must arrive intact, which checks our virtio header, partial checksums and
    /// segment fixes against the real kernel.
    #[test]
    #[ignore = "needs root (network namespaces, /dev/net/tun): ci/test.sh unit runs it with --include-ignored"]
    fn forwarding_v4_between_namespaces_splits_and_coalesces() {
        forward_through_two_tuns(false);
    }

    #[test]
    #[ignore = "needs root (network namespaces, /dev/net/tun): ci/test.sh unit runs it with --include-ignored"]
    fn forwarding_v6_between_namespaces_splits_and_coalesces() {
        forward_through_two_tuns(true);
    }

    fn forward_through_two_tuns(v6: bool) {
        use riceguard_core::gso::{CoalesceOptions, Coalescer, Splitter, VIRTIO_NET_HDR_LEN};
        use std::io::{Read, Write};
        use std::sync::mpsc;
        use std::time::{Duration, Instant};

        const BYTES: usize = 3 << 20;
        let addr_b = move |port: u16| -> std::net::SocketAddr {
            if v6 {
                (std::net::Ipv6Addr::new(0xfd79, 1, 0, 0, 0, 0, 0, 1), port).into()
            } else {
                (std::net::Ipv4Addr::new(10, 79, 1, 1), port).into()
            }
        };
        let addr_a = move |port: u16| -> std::net::SocketAddr {
            if v6 {
                (std::net::Ipv6Addr::new(0xfd79, 0, 0, 0, 0, 0, 0, 1), port).into()
            } else {
                (std::net::Ipv4Addr::new(10, 79, 0, 1), port).into()
            }
        };
        let pattern = |i: usize| (i % 251) as u8;

        let (tx_b, rx_b) = mpsc::channel();
        let server = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            let tun = Tun::create("rgfwb0", 1, true).expect("tun b");
            ip(&["link", "set", "lo", "up"]);
            ip(&[
                "addr",
                "add",
                if v6 { "fd79:1::1/64" } else { "10.79.1.1/24" },
                "dev",
                "rgfwb0",
                "nodad",
            ]);
            ip(&["link", "set", "rgfwb0", "up"]);
            ip(&[
                "route",
                "add",
                if v6 { "fd79::/64" } else { "10.79.0.0/24" },
                "dev",
                "rgfwb0",
            ]);
            let l = std::net::TcpListener::bind(addr_b(5001)).expect("listen");
            let u = crate::udp::UdpSocket::bind(
                addr_b(5002),
                &crate::udp::UdpOptions {
                    gro: false,
                    ..Default::default()
                },
            )
            .expect("udp b");
            tx_b.send(tun).expect("send tun");
            let (mut c, _) = l.accept().expect("accept");
            c.set_read_timeout(Some(Duration::from_secs(20)))
                .expect("timeout");
            let mut got = 0usize;
            let mut ok = true;
            let mut buf = vec![0u8; 65536];
            loop {
                let n = c.read(&mut buf).expect("read");
                if n == 0 {
                    break;
                }
                ok &= buf[..n]
                    .iter()
                    .enumerate()
                    .all(|(k, b)| *b == pattern(got + k));
                got += n;
            }
            // Ten 1200-byte datagrams of the UDP GSO burst.
            let mut dgrams = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(10);
            while dgrams.len() < 10 && Instant::now() < deadline {
                match u.recv_gro(&mut buf) {
                    Ok(m) => dgrams.push(m.len),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(e) => panic!("udp recv: {e}"),
                }
            }
            (got, ok, dgrams)
        });
        let tun_b: Tun = rx_b.recv().expect("tun b");

        let (tx_a, rx_a) = mpsc::channel();
        let client = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            let tun = Tun::create("rgfwa0", 1, true).expect("tun a");
            ip(&["link", "set", "lo", "up"]);
            ip(&[
                "addr",
                "add",
                if v6 { "fd79::1/64" } else { "10.79.0.1/24" },
                "dev",
                "rgfwa0",
                "nodad",
            ]);
            ip(&["link", "set", "rgfwa0", "up"]);
            ip(&[
                "route",
                "add",
                if v6 { "fd79:1::/64" } else { "10.79.1.0/24" },
                "dev",
                "rgfwa0",
            ]);
            let u = crate::udp::UdpSocket::bind(addr_a(0), &Default::default()).expect("udp a");
            tx_a.send(tun).expect("send tun");
            let dst = addr_b(5001);
            let mut s = std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(10))
                .expect("connect");
            let data: Vec<u8> = (0..BYTES).map(pattern).collect();
            s.write_all(&data).expect("write");
            s.shutdown(std::net::Shutdown::Write).expect("shutdown");
            let burst = vec![9u8; 12_000];
            u.send_segmented(addr_b(5002), &burst, 1200)
                .expect("udp gso");
        });
        let tun_a: Tun = rx_a.recv().expect("tun a");

        let (qa, qb) = (tun_a.queue(0).expect("qa"), tun_b.queue(0).expect("qb"));
        let opts = |t: &Tun| CoalesceOptions {
            tcp: t.offload().tso(),
            udp: t.offload().uso(),
        };
        let mut to_b = Coalescer::new(opts(&tun_b));
        let mut to_a = Coalescer::new(opts(&tun_a));
        let mut rbuf = vec![0u8; VIRTIO_NET_HDR_LEN + 65536];
        let mut wbuf = vec![0u8; VIRTIO_NET_HDR_LEN + 65536];
        let mut segs: Vec<Vec<u8>> = Vec::new();
        let (mut super_reads, mut super_writes) = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(40);
        while !server.is_finished() && Instant::now() < deadline {
            let mut pfd = [
                nix::poll::PollFd::new(qa.as_fd(), nix::poll::PollFlags::POLLIN),
                nix::poll::PollFd::new(qb.as_fd(), nix::poll::PollFlags::POLLIN),
            ];
            let _ = nix::poll::poll(&mut pfd, 20u16);
            for (src, dst, co) in [(qa, qb, &mut to_b), (qb, qa, &mut to_a)] {
                segs.clear();
                // A batch: up to 16 reads, each split into its segments.
                for _ in 0..16 {
                    let n = match src.read(&mut rbuf) {
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => panic!("tun read: {e}"),
                    };
                    let mut sp = Splitter::new(&rbuf[..n]).expect("kernel packet splits");
                    if sp.count() > 1 {
                        super_reads += 1;
                    }
                    let mut seg = vec![0u8; sp.max_segment_len()];
                    while let Some(r) = sp.next_into(&mut seg) {
                        let len = r.expect("segment");
                        segs.push(seg[..len].to_vec());
                    }
                }
                let mut start = 0;
                while start < segs.len() {
                    let batch = &segs[start..];
                    let n = co.plan(batch);
                    for g in co.groups() {
                        let len = co.write(&g, batch, &mut wbuf).expect("coalesce");
                        if g.count > 1 {
                            super_writes += 1;
                        }
                        dst.write(&wbuf[..len]).expect("tun write");
                    }
                    start += n;
                }
            }
        }
        let (got, ok, dgrams) = server.join().expect("server");
        client.join().expect("client");
        assert_eq!(got, BYTES, "all TCP bytes arrived");
        assert!(ok, "TCP bytes intact");
        assert_eq!(dgrams, vec![1200; 10], "UDP burst arrived as 10 datagrams");
        if tun_a.offload().tso() {
            assert!(super_reads > 0, "kernel handed us TSO/USO super-packets");
            assert!(super_writes > 0, "we wrote coalesced super-packets");
        }
        eprintln!(
            "v6={v6} offload a={} b={}, super-packets read {super_reads}, written {super_writes}",
            tun_a.offload(),
            tun_b.offload()
        );
    }

    /// Poll `q` (bounded) until a packet matching `want` arrives; skip others
    /// (IPv6 router solicitations and the like).
    pub(crate) fn read_until(q: &TunQueue, buf: &mut [u8], want: impl Fn(&[u8]) -> bool) -> usize {
        for _ in 0..500 {
            match q.read(buf) {
                Ok(n) if want(&buf[..n]) => return n,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let mut pfd = [nix::poll::PollFd::new(
                        q.as_fd(),
                        nix::poll::PollFlags::POLLIN,
                    )];
                    let _ = nix::poll::poll(&mut pfd, 10u16);
                }
                Err(e) => panic!("tun read: {e}"),
            }
        }
        panic!("no matching packet on the TUN");
    }
}
