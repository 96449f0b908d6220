//! rtnetlink over a raw `NETLINK_ROUTE` socket: what the appliance needs instead of the
//! `ip` binary. This file owns the socket (synchronous requests: send, read to the ack;
//! dumps read to `NLMSG_DONE`), the message header and attribute encoding, and the
//! reading of the kernel's answers; one file per message kind builds and parses its
//! messages and adds its `Netlink` methods: `link` (up/down, MTU), `addr` (addresses,
//! lifetimes, flags), `route` (routes, the ones we own), `neigh` (the neighbour and
//! proxy tables). Messages are built into a caller-owned `Vec<u8>` by small pure
//! functions (unit-tested byte for byte); the socket part is `nix`'s safe wrappers, so
//! none of this needs `unsafe`.

use std::fmt;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    bind, recv, send, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol,
    SockType,
};

mod addr;
mod link;
mod neigh;
mod route;

pub use addr::{AddrDetail, Lifetime};
pub use neigh::{Neighbour, ProxyNeighbour};
pub use route::{Route, RTPROT_RICEGUARD, TUNNEL_METRIC6};

// The attribute encoding is the core's (`core::netlink`), shared with nf_tables' messages.
use riceguard_core::netlink::{attrs, put_attr};

// Message types, flags and families from <linux/netlink.h> and <linux/rtnetlink.h> that
// every kind uses, spelled out so the encoding is testable without a kernel; each kind's
// own constants are in its file.
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_REPLACE: u16 = 0x100;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const NLMSG_HDRLEN: usize = 16;

/// Why a netlink request failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum NetlinkError {
    /// The socket could not be opened, bound, written or read.
    Socket(nix::Error),
    /// No interface with this name exists.
    NoSuchInterface(String),
    /// The kernel refused the request (errno from its `NLMSG_ERROR` answer).
    Kernel { what: String, errno: nix::Error },
    /// The kernel's answer was not a well-formed netlink message.
    Malformed,
}

impl fmt::Display for NetlinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetlinkError::Socket(e) => write!(
                f,
                "netlink socket: {e} (is this Linux, with CAP_NET_ADMIN?)"
            ),
            NetlinkError::NoSuchInterface(n) => write!(f, "no network interface named `{n}`"),
            NetlinkError::Kernel { what, errno } => write!(f, "{what}: the kernel said {errno}"),
            NetlinkError::Malformed => f.write_str("malformed netlink answer from the kernel"),
        }
    }
}

impl std::error::Error for NetlinkError {}

/// A bound `NETLINK_ROUTE` socket. Requests are synchronous: send, then read until the ack.
pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

impl Netlink {
    pub fn open() -> Result<Netlink, NetlinkError> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )
        .map_err(NetlinkError::Socket)?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(NetlinkError::Socket)?;
        Ok(Netlink {
            fd,
            seq: 1,
            buf: vec![0u8; 32 * 1024],
        })
    }

    /// The interface index of `name`.
    pub fn ifindex(name: &str) -> Result<u32, NetlinkError> {
        nix::net::if_::if_nametoindex(name).map_err(|_| NetlinkError::NoSuchInterface(name.into()))
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn send_all(&self, msg: &[u8]) -> Result<(), NetlinkError> {
        let n = send(self.fd.as_raw_fd(), msg, MsgFlags::empty()).map_err(NetlinkError::Socket)?;
        if n != msg.len() {
            return Err(NetlinkError::Malformed);
        }
        Ok(())
    }

    /// Send one request with `NLM_F_ACK` and wait for its answer.
    fn request(&mut self, msg: &[u8], what: &str) -> Result<(), NetlinkError> {
        self.send_all(msg)?;
        let seq = u32::from_ne_bytes([msg[8], msg[9], msg[10], msg[11]]);
        loop {
            let n = recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty())
                .map_err(NetlinkError::Socket)?;
            for m in Messages::new(&self.buf[..n]) {
                let m = m?;
                if m.seq != seq {
                    continue;
                }
                if m.kind == NLMSG_ERROR {
                    let errno = parse_error(m.payload)?;
                    return if errno == 0 {
                        Ok(())
                    } else {
                        Err(NetlinkError::Kernel {
                            what: what.into(),
                            errno: nix::Error::from_raw(-errno),
                        })
                    };
                }
            }
        }
    }

    /// Send a dump request (`header` is the family header) and hand each answer's
    /// type and payload to `f` until the kernel says done.
    fn dump_each(
        &mut self,
        kind: u16,
        header: &[u8],
        what: &str,
        mut f: impl FnMut(u16, &[u8]),
    ) -> Result<(), NetlinkError> {
        let seq = self.next_seq();
        let mut m = Vec::with_capacity(16 + header.len());
        put_hdr(&mut m, kind, NLM_F_REQUEST | NLM_F_DUMP, seq);
        m.extend_from_slice(header);
        finish(&mut m);
        self.send_all(&m)?;
        loop {
            let n = recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty())
                .map_err(NetlinkError::Socket)?;
            for msg in Messages::new(&self.buf[..n]) {
                let msg = msg?;
                if msg.seq != seq {
                    continue;
                }
                match msg.kind {
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => {
                        let errno = parse_error(msg.payload)?;
                        return Err(NetlinkError::Kernel {
                            what: what.into(),
                            errno: nix::Error::from_raw(-errno),
                        });
                    }
                    k => f(k, msg.payload),
                }
            }
        }
    }
}

fn put_hdr(m: &mut Vec<u8>, kind: u16, flags: u16, seq: u32) {
    m.clear();
    m.extend_from_slice(&0u32.to_ne_bytes()); // length, patched by `finish`
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
}

fn finish(m: &mut [u8]) {
    let len = m.len() as u32;
    m[0..4].copy_from_slice(&len.to_ne_bytes());
}

/// What a delete request's answer means: `Ok(true)` deleted, `Ok(false)` there was
/// nothing to delete (`ENOENT`, `ESRCH`: the kernel's "no such route/neighbour").
fn deleted(r: Result<(), NetlinkError>) -> Result<bool, NetlinkError> {
    match r {
        Ok(()) => Ok(true),
        Err(NetlinkError::Kernel {
            errno: nix::Error::ENOENT | nix::Error::ESRCH,
            ..
        }) => Ok(false),
        Err(e) => Err(e),
    }
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn family(ip: &IpAddr) -> u8 {
    if ip.is_ipv4() {
        AF_INET
    } else {
        AF_INET6
    }
}

struct Msg<'a> {
    kind: u16,
    seq: u32,
    payload: &'a [u8],
}

/// Iterator over the netlink messages in one datagram; a bad length ends it with an error.
struct Messages<'a> {
    rest: &'a [u8],
}

impl<'a> Messages<'a> {
    fn new(b: &'a [u8]) -> Self {
        Messages { rest: b }
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Msg<'a>, NetlinkError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.len() < NLMSG_HDRLEN {
            return None;
        }
        let r = self.rest;
        let len = u32::from_ne_bytes([r[0], r[1], r[2], r[3]]) as usize;
        if len < NLMSG_HDRLEN || len > r.len() {
            self.rest = &[];
            return Some(Err(NetlinkError::Malformed));
        }
        let kind = u16::from_ne_bytes([r[4], r[5]]);
        let seq = u32::from_ne_bytes([r[8], r[9], r[10], r[11]]);
        let aligned = (len + 3) & !3;
        self.rest = if aligned >= r.len() {
            &[]
        } else {
            &r[aligned..]
        };
        Some(Ok(Msg {
            kind,
            seq,
            payload: &r[NLMSG_HDRLEN..len],
        }))
    }
}

/// The (negative) errno of an `NLMSG_ERROR` payload; 0 is an ack.
fn parse_error(p: &[u8]) -> Result<i32, NetlinkError> {
    if p.len() < 4 {
        return Err(NetlinkError::Malformed);
    }
    Ok(i32::from_ne_bytes([p[0], p[1], p[2], p[3]]))
}

pub(super) fn ip_from(family: u8, data: &[u8]) -> Option<IpAddr> {
    match (family, data.len()) {
        (AF_INET, 4) => Some(IpAddr::from([data[0], data[1], data[2], data[3]])),
        (AF_INET6, 16) => {
            let mut o = [0u8; 16];
            o.copy_from_slice(data);
            Some(IpAddr::from(o))
        }
        _ => None,
    }
}

pub(super) fn u32_from(data: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(data.get(..4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use riceguard_core::net::Cidr;

    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let mut bad = vec![0u8; 20];
        bad[0] = 200; // length past the end
        assert!(matches!(
            Messages::new(&bad).next(),
            Some(Err(NetlinkError::Malformed))
        ));
        assert!(parse_error(&[1]).is_err());
        assert_eq!(Messages::new(&[1, 2, 3]).count(), 0);
    }

    /// Against the real kernel, in a private network namespace of this test's thread.
    #[test]
    #[ignore = "needs root (network namespaces): ci/test.sh unit runs it with --include-ignored"]
    fn kernel_roundtrip_in_private_netns() {
        let r = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("unshare a network namespace (needs root)");
            let mut nl = Netlink::open().unwrap();
            nl.set_link_up("lo", true).unwrap();
            nl.set_mtu("lo", 9000).unwrap();
            nl.add_address("lo", cidr("10.9.9.1/24")).unwrap();
            nl.add_address("lo", cidr("fd99::1/64")).unwrap();
            nl.add_route(Route {
                dst: cidr("10.77.0.0/16"),
                gateway: Some("10.9.9.2".parse().unwrap()),
                ifindex: None,
            })
            .unwrap();
            let got = nl.addresses("lo").unwrap();
            assert!(got.contains(&cidr("10.9.9.1/24")), "{got:?}");
            assert!(got.contains(&cidr("fd99::1/64")), "{got:?}");
            let routes = std::fs::read_to_string("/proc/thread-self/net/route").unwrap();
            assert!(routes.contains("00004D0A"), "{routes}"); // 10.77.0.0, little-endian hex
            let mtu = std::fs::read_to_string("/sys/class/net/lo/mtu").unwrap_or_default();
            // sysfs shows the mount's namespace, not the thread's: only check when it agrees.
            let _ = mtu;
            assert!(nl.delete_address("lo", cidr("10.9.9.1/24")).unwrap());
            assert!(!nl.delete_address("lo", cidr("10.9.9.1/24")).unwrap());
            assert!(!nl.addresses("lo").unwrap().contains(&cidr("10.9.9.1/24")));
            assert!(matches!(
                nl.set_link_up("nope0", true),
                Err(NetlinkError::NoSuchInterface(_))
            ));
            let e = nl.add_route(Route {
                dst: cidr("10.78.0.0/16"),
                gateway: Some("10.200.0.1".parse().unwrap()),
                ifindex: None,
            });
            assert!(
                matches!(e, Err(NetlinkError::Kernel { .. })),
                "unreachable gateway must be refused"
            );
        });
        r.join().unwrap();
    }

    /// Against the real kernel, in a private network namespace of this test's thread.
    #[test]
    #[ignore = "needs root (a private network namespace); run with --ignored as root"]
    fn kernel_owned_routes_and_proxies() {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let mut nl = Netlink::open().unwrap();
            nl.set_link_up("lo", true).unwrap();
            nl.add_address("lo", cidr("10.9.9.1/24")).unwrap();
            nl.add_address("lo", cidr("10.9.8.1/24")).unwrap();
            let lo = Netlink::ifindex("lo").unwrap();
            nl.add_owned_route(cidr("10.66.2.0/24"), lo).unwrap();
            nl.add_owned_route(cidr("fd66::/64"), lo).unwrap();
            // Someone else's route to the same prefix is not replaced.
            nl.add_route(Route {
                dst: cidr("10.66.3.0/24"),
                gateway: None,
                ifindex: Some(lo),
            })
            .unwrap();
            assert!(nl.add_owned_route(cidr("10.66.3.0/24"), lo).is_err());
            let routes = nl.routes().unwrap();
            let ours: Vec<Cidr> = routes
                .iter()
                .filter(|r| r.protocol == RTPROT_RICEGUARD && r.oif == Some(lo))
                .map(|r| r.dst)
                .collect();
            assert_eq!(ours.len(), 2, "{routes:?}");
            assert!(ours.contains(&cidr("10.66.2.0/24")) && ours.contains(&cidr("fd66::/64")));
            // Delete matches our protocol only: the hand-made route stays.
            assert!(!nl.delete_owned_route(cidr("10.66.3.0/24"), lo).unwrap());
            assert!(nl.delete_owned_route(cidr("10.66.2.0/24"), lo).unwrap());
            assert!(nl.delete_owned_route(cidr("fd66::/64"), lo).unwrap());
            let left = nl.routes().unwrap();
            assert!(left.iter().any(|r| r.dst == cidr("10.66.3.0/24")));
            assert!(!left.iter().any(|r| r.protocol == RTPROT_RICEGUARD));
            // Addresses go one at a time.
            assert!(nl.delete_address("lo", cidr("10.9.8.1/24")).unwrap());
            assert!(!nl.delete_address("lo", cidr("10.9.8.1/24")).unwrap());
            assert!(nl
                .link_addresses(lo)
                .unwrap()
                .contains(&cidr("10.9.9.1/24")));
            // Proxy entries.
            let a: IpAddr = "10.9.9.77".parse().unwrap();
            let b: IpAddr = "fd99::77".parse().unwrap();
            nl.add_proxy_neighbour(lo, a).unwrap();
            nl.add_proxy_neighbour(lo, b).unwrap();
            let px = nl.proxy_neighbours().unwrap();
            assert!(
                px.contains(&ProxyNeighbour {
                    ifindex: lo,
                    addr: a,
                    protocol: RTPROT_RICEGUARD
                }),
                "{px:?}"
            );
            assert!(
                px.iter()
                    .any(|p| p.addr == b && p.protocol == RTPROT_RICEGUARD),
                "{px:?}"
            );
            assert!(nl.delete_proxy_neighbour(lo, a).unwrap());
            assert!(!nl.delete_proxy_neighbour(lo, a).unwrap());
            assert!(nl.delete_proxy_neighbour(lo, b).unwrap());
            assert!(nl.proxy_neighbours().unwrap().is_empty());
        })
        .join()
        .unwrap();
    }
}
