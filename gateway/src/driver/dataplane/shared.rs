//! [`Shared`]: what all workers and the daemon's threads share (device, sockets, stop
//! flag, heartbeats, TUN-gone flag), a worker's socket in it ([`socket_of`]), and
//! [`TcpOut`], the outlet to the TCP transport.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::core::device::Device;
use crate::driver::dataplane::heartbeat::Heartbeats;
use crate::driver::dataplane::sockets::SocketSet;
use crate::driver::dataplane::spread::Spread;
use crate::sys::udp::UdpSocket;

/// Where outgoing TCP-fallback messages go; implemented by the TCP transport.
pub trait TcpOut: Send + Sync {
    fn send(&self, conn: u64, msg: &[u8]);
}
/// Shared state the workers watch.
pub struct Shared {
    pub device: Arc<Device>,
    pub sockets: Arc<SocketSet>,
    pub stop: Arc<AtomicBool>,
    pub tcp: Option<Arc<dyn TcpOut>>,
    /// Set when the TUN went away (interface deleted): the process should exit.
    pub tun_gone: Arc<AtomicBool>,
    /// One heartbeat per worker, bumped every round (idle rounds too).
    pub heartbeats: Arc<Heartbeats>,
    /// One peer on every core: set when more than one worker runs and spreading is on.
    pub spread: Option<Arc<Spread>>,
}

/// This worker's socket in the shared set, with the set's generation.
pub fn socket_of(shared: &Shared, index: usize) -> Option<(u64, Arc<UdpSocket>)> {
    let (gen, socks) = shared.sockets.get();
    let s = socks.get(index % socks.len().max(1))?.clone();
    Some((gen, s))
}
