//! Deferred sends: what the device asks to send while it holds a peer lock is recorded
//! here and sent once it has returned — [`TcpQueue`] (a worker round's TCP-carried
//! messages), [`TimerIo`] (the timer thread's handshakes and keepalives) and
//! [`Deferred`] (the TCP thread's sends and TUN writes, through its [`Outlets`]). UDP
//! leaves from the peer's sticky source. No syscall happens while recording.

use crate::core::device::{Io, PeerAddr};
use crate::driver::dataplane::shared::TcpOut;
use crate::driver::dataplane::sockets::SocketSet;
use crate::driver::dataplane::tun_batch::write_plain;
use crate::sys::tun::TunQueue;

/// TCP-fallback messages gathered during a round, sent when it ends (the transport's
/// send may write to the socket: not under a peer lock).
#[derive(Default)]
pub struct TcpQueue {
    bytes: Vec<u8>,
    msgs: Vec<(u64, u32, u32)>,
}

impl TcpQueue {
    pub(super) fn push(&mut self, conn: u64, d: &[u8]) {
        self.msgs
            .push((conn, self.bytes.len() as u32, d.len() as u32));
        self.bytes.extend_from_slice(d);
    }

    pub(super) fn send(&mut self, tcp: Option<&dyn TcpOut>) {
        if let Some(t) = tcp {
            for &(conn, at, len) in &self.msgs {
                t.send(conn, &self.bytes[at as usize..(at + len) as usize]);
            }
        }
        self.msgs.clear();
        self.bytes.clear();
    }
}

/// The device's sink for timer work (handshake retries, keepalives): it records, and
/// [`TimerIo::send_all`] sends once the device has returned (no syscall under a peer
/// lock). Timer messages are few; a small allocation each is fine here.
pub struct TimerIo<'a> {
    sockets: &'a SocketSet,
    tcp: Option<&'a dyn TcpOut>,
    queued: Vec<(PeerAddr, Vec<u8>)>,
}

impl<'a> TimerIo<'a> {
    pub fn new(sockets: &'a SocketSet, tcp: Option<&'a dyn TcpOut>) -> Self {
        TimerIo {
            sockets,
            tcp,
            queued: Vec::new(),
        }
    }

    pub fn send_all(&mut self) {
        for (to, d) in self.queued.drain(..) {
            match to {
                PeerAddr::Udp(a) => self.sockets.send_sticky(&d, a),
                PeerAddr::Tcp { conn, .. } => {
                    if let Some(t) = self.tcp {
                        t.send(conn, &d);
                    }
                }
            }
        }
    }
}

impl Io for TimerIo<'_> {
    fn send(&mut self, to: PeerAddr, d: &[u8]) {
        self.queued.push((to, d.to_vec()));
    }

    fn tun_write(&mut self, _p: &[u8]) {}
}

/// The device's sink on the TCP thread (TCP-carried messages, fallback probes): it
/// only records, and [`Deferred::run`] does the sends and TUN writes once the device
/// has returned, so no syscall happens under a peer lock.
#[derive(Default)]
pub struct Deferred {
    bytes: Vec<u8>,
    sends: Vec<(PeerAddr, usize, usize)>,
    writes: Vec<(usize, usize)>,
}

impl Io for Deferred {
    fn send(&mut self, to: PeerAddr, d: &[u8]) {
        self.sends.push((to, self.bytes.len(), d.len()));
        self.bytes.extend_from_slice(d);
    }

    fn tun_write(&mut self, p: &[u8]) {
        self.writes.push((self.bytes.len(), p.len()));
        self.bytes.extend_from_slice(p);
    }
}

/// Where a [`Deferred`]'s sends and writes go.
pub struct Outlets<'a> {
    pub sockets: &'a SocketSet,
    pub slot: &'a dyn TcpOut,
    pub tun: &'a TunQueue,
    pub vnet_hdr: bool,
}

impl Deferred {
    pub fn run(&mut self, out: &Outlets<'_>, tunbuf: &mut [u8]) {
        for &(to, at, len) in &self.sends {
            let d = &self.bytes[at..at + len];
            match to {
                PeerAddr::Tcp { conn, .. } => out.slot.send(conn, d),
                PeerAddr::Udp(a) => out.sockets.send_sticky(d, a),
            }
        }
        for &(at, len) in &self.writes {
            let p = &self.bytes[at..at + len];
            let _ = write_plain(out.tun, out.vnet_hdr, p, tunbuf);
        }
        self.bytes.clear();
        self.sends.clear();
        self.writes.clear();
    }
}
