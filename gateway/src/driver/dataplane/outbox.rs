//! Deferred sends, one way for every thread: the device's `Io` calls made under a peer
//! lock are recorded in an [`Outbox`] (no syscall), and [`Outbox::flush`] carries them
//! out once the device has returned, through the [`Outlets`] the caller has — UDP from
//! the peer's sticky source (`SocketSet::send_sticky`), TCP-carried messages to the
//! transport, TUN writes through the coalescer ([`TunBatch`]). A worker records only its
//! TCP-carried messages here (its UDP and TUN traffic has its own batches over the
//! backend); the timer thread records handshakes and keepalives; the TCP thread
//! everything the device answers a TCP-carried message with.

use crate::core::device::{Io, PeerAddr};
use crate::core::gso::CoalesceOptions;
use crate::driver::dataplane::shared::TcpOut;
use crate::driver::dataplane::sockets::SocketSet;
use crate::driver::dataplane::tun_batch::{DirectTun, TunBatch};
use crate::sys::tun::TunQueue;

/// What the device asked for while it ran: sends (to a UDP or TCP endpoint) and TUN
/// writes, in order, their bytes in one growing buffer reused from flush to flush.
#[derive(Default)]
pub struct Outbox {
    bytes: Vec<u8>,
    /// `(destination, start, length)`; `None` is a TUN write.
    items: Vec<(Option<PeerAddr>, u32, u32)>,
    /// Items dropped at a flush for want of their outlet (say, a TUN write on a thread
    /// that has no TUN): none is expected; the tests check it stays 0.
    pub unroutable: u64,
}

impl Outbox {
    fn record(&mut self, to: Option<PeerAddr>, d: &[u8]) {
        let (Ok(at), Ok(len)) = (u32::try_from(self.bytes.len()), u32::try_from(d.len())) else {
            self.unroutable += 1;
            return;
        };
        self.items.push((to, at, len));
        self.bytes.extend_from_slice(d);
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Carry out everything recorded, in order, then forget it. Call only once the
    /// device has returned (never under a peer lock): this makes the syscalls.
    pub fn flush(&mut self, out: &mut Outlets<'_>) {
        let mut tun_used = false;
        for &(to, at, len) in &self.items {
            let d = &self.bytes[at as usize..(at + len) as usize];
            match to {
                Some(PeerAddr::Udp(a)) => match out.udp {
                    Some(s) => s.send_sticky(d, a),
                    None => self.unroutable += 1,
                },
                Some(PeerAddr::Tcp { conn, .. }) => match out.tcp {
                    Some(t) => t.send(conn, d),
                    None => self.unroutable += 1,
                },
                None => match out.tun.as_mut() {
                    Some(t) => {
                        tun_used = true;
                        t.out.push(t.queue, d);
                    }
                    None => self.unroutable += 1,
                },
            }
        }
        if tun_used {
            if let Some(t) = out.tun.as_mut() {
                t.out.flush(t.queue);
            }
        }
        self.items.clear();
        self.bytes.clear();
    }
}

impl Io for Outbox {
    fn send(&mut self, to: PeerAddr, d: &[u8]) {
        self.record(Some(to), d);
    }

    fn tun_write(&mut self, p: &[u8]) {
        self.record(None, p);
    }
}

/// Where an [`Outbox`]'s items go; a thread names the outlets it has.
#[derive(Default)]
pub struct Outlets<'a> {
    /// UDP, from the peer's sticky source.
    pub udp: Option<&'a SocketSet>,
    /// The TCP transport.
    pub tcp: Option<&'a dyn TcpOut>,
    /// The TUN, coalesced.
    pub tun: Option<TunOut<'a>>,
}

/// A TUN queue and the coalescing state a thread keeps for it.
pub struct TunOut<'a> {
    pub queue: &'a TunQueue,
    pub out: &'a mut TunOutlet,
}

/// A non-worker thread's TUN writer: the coalescer's batch and the one buffer its
/// super-packets are built in, allocated once.
pub struct TunOutlet {
    batch: TunBatch,
    buf: Vec<u8>,
    /// Writes the TUN refused.
    pub write_errors: u64,
}

impl TunOutlet {
    /// For a TUN created with `vnet_hdr` whose offload allows `opts`.
    pub fn new(opts: CoalesceOptions, vnet_hdr: bool) -> TunOutlet {
        TunOutlet {
            batch: TunBatch::new(opts, vnet_hdr),
            buf: Vec::new(),
            write_errors: 0,
        }
    }

    fn push(&mut self, queue: &TunQueue, p: &[u8]) {
        let mut sink = DirectTun {
            queue,
            buf: &mut self.buf,
            errors: &mut self.write_errors,
        };
        self.batch.push(&mut sink, p);
    }

    fn flush(&mut self, queue: &TunQueue) {
        let mut sink = DirectTun {
            queue,
            buf: &mut self.buf,
            errors: &mut self.write_errors,
        };
        self.batch.flush(&mut sink);
    }

    /// Super-packets written (each merged two or more packets).
    pub fn coalesced(&self) -> u64 {
        self.batch.coalesced
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Wire(Mutex<Vec<(u64, Vec<u8>)>>);
    impl TcpOut for Wire {
        fn send(&self, conn: u64, msg: &[u8]) {
            self.0.lock().unwrap().push((conn, msg.to_vec()));
        }
    }

    fn tcp(conn: u64) -> PeerAddr {
        PeerAddr::Tcp {
            conn,
            remote: "192.0.2.1:443".parse().unwrap(),
        }
    }

    #[test]
    fn tcp_messages_leave_in_order_and_the_box_empties() {
        let wire = Wire::default();
        let mut ob = Outbox::default();
        ob.send(tcp(7), b"one");
        ob.send(tcp(9), b"two");
        ob.send(tcp(7), b"three");
        assert!(!ob.is_empty());
        ob.flush(&mut Outlets {
            tcp: Some(&wire),
            ..Outlets::default()
        });
        assert!(ob.is_empty());
        assert_eq!(ob.unroutable, 0);
        let got = wire.0.lock().unwrap().clone();
        assert_eq!(
            got,
            vec![
                (7, b"one".to_vec()),
                (9, b"two".to_vec()),
                (7, b"three".to_vec())
            ]
        );
        // A second flush sends nothing again.
        ob.flush(&mut Outlets {
            tcp: Some(&wire),
            ..Outlets::default()
        });
        assert_eq!(wire.0.lock().unwrap().len(), 3);
    }

    #[test]
    fn an_item_without_its_outlet_is_counted_not_sent_elsewhere() {
        let wire = Wire::default();
        let mut ob = Outbox::default();
        let udp: SocketAddr = "192.0.2.2:51820".parse().unwrap();
        ob.send(PeerAddr::Udp(udp), b"udp");
        ob.tun_write(b"\x45packet");
        ob.send(tcp(1), b"tcp");
        ob.flush(&mut Outlets {
            tcp: Some(&wire),
            ..Outlets::default()
        });
        assert_eq!(ob.unroutable, 2);
        assert_eq!(wire.0.lock().unwrap().clone(), vec![(1, b"tcp".to_vec())]);
        assert!(ob.is_empty());
    }

    #[test]
    fn udp_leaves_from_the_sticky_source() {
        use crate::sys::cmsg::PktInfo;
        use crate::sys::udp::{UdpOptions, UdpSocket};
        use std::net::{IpAddr, Ipv4Addr};
        // Two loopback addresses: the peer last reached us at 127.0.0.2, so a datagram
        // the timer thread records must leave from there, not from 127.0.0.1 (what
        // routing picks for 127.0.0.1's peer).
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let to = peer.local_addr().unwrap();
        let ours = UdpSocket::bind("0.0.0.0:0".parse().unwrap(), &UdpOptions::default()).unwrap();
        let set = SocketSet::new(vec![std::sync::Arc::new(ours)], 0);
        let src = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
        crate::driver::dataplane::sticky::Sticky::new(set.sticky.clone()).learn(
            to,
            Some(PktInfo {
                ip: src,
                ifindex: 0,
            }),
        );
        let mut ob = Outbox::default();
        ob.send(PeerAddr::Udp(to), b"keepalive");
        ob.flush(&mut Outlets {
            udp: Some(&set),
            ..Outlets::default()
        });
        let mut buf = [0u8; 64];
        let (n, from) = peer.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"keepalive");
        assert_eq!(from.ip(), src);
        assert_eq!(ob.unroutable, 0);
    }
}
