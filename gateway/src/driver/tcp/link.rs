//! Joins the TCP transport (`tcp::transport`) to the WireGuard device: messages arriving
//! on TCP connections go into the device as `PeerAddr::Tcp` ([`DeviceSink`]), and the
//! device's sends to a TCP endpoint go out on that connection ([`TcpSlot`]), recorded
//! while the device runs and made after it returns.
//!
//! Bounded under floods: nothing here keeps per-connection state.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};

use crate::core::config::Config;
use crate::core::device::ConnId;
use crate::core::device::{Device, PeerAddr, TableCache, SCRATCH_SIZE};
use crate::driver::dataplane::outbox::{Outbox, Outlets, TunOut, TunOutlet};
use crate::driver::dataplane::shared::TcpOut;
use crate::driver::dataplane::sockets::SocketSet;
use crate::driver::dataplane::tun_batch::coalesce_options;
use crate::driver::tcp::transport::{TcpConfig, TcpHandle, TcpSink, TcpTransport};
use crate::sys::cmsg::canonical;
use crate::sys::tun::{TunOffload, TunQueue};

/// The current TCP transport's handle, replaceable when the listen port changes.
#[derive(Default)]
pub struct TcpSlot {
    handle: RwLock<Option<TcpHandle>>,
}

impl TcpSlot {
    pub fn set(&self, h: Option<TcpHandle>) {
        *self.handle.write().unwrap_or_else(|p| p.into_inner()) = h;
    }

    pub fn get(&self) -> Option<TcpHandle> {
        self.handle
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl TcpOut for TcpSlot {
    fn send(&self, conn: u64, msg: &[u8]) {
        if let Some(h) = self
            .handle
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            // A full queue drops the whole packet: the inner TCP recovers.
            let _ = h.send(conn, msg);
        }
    }
}

/// The device's side of the TCP transport.
pub struct DeviceSink {
    device: Arc<Device>,
    sockets: Arc<SocketSet>,
    pub(super) slot: Arc<TcpSlot>,
    tun: TunQueue,
    /// The receiving side's working state. Only the transport's one epoll thread calls
    /// `on_message`, so this lock is never contended; it exists because the sink is
    /// shared (`Arc<dyn TcpSink>`), not to serialise threads.
    rx: Mutex<SinkRx>,
}

/// What a worker keeps per thread, for the TCP transport's thread: the table cached per
/// generation (one atomic load per message, as in the UDP workers), the device's
/// scratch, the deferred sends and the TUN's coalescer.
struct SinkRx {
    cache: TableCache,
    scratch: Vec<u8>,
    outbox: Outbox,
    tun_out: TunOutlet,
}

impl DeviceSink {
    pub fn new(
        device: Arc<Device>,
        sockets: Arc<SocketSet>,
        slot: Arc<TcpSlot>,
        tun: TunQueue,
        vnet_hdr: bool,
        offload: TunOffload,
    ) -> DeviceSink {
        let cache = device.cache();
        DeviceSink {
            device,
            sockets,
            slot,
            tun,
            rx: Mutex::new(SinkRx {
                cache,
                scratch: vec![0u8; SCRATCH_SIZE],
                outbox: Outbox::default(),
                tun_out: TunOutlet::new(coalesce_options(offload, vnet_hdr), vnet_hdr),
            }),
        }
    }
}

impl TcpSink for DeviceSink {
    /// The device decides (one place, `Device::handle_datagram`) whether the message
    /// proved a peer's keys; the transport lets only such messages keep the connection.
    fn on_message(&self, conn: ConnId, remote: SocketAddr, msg: &[u8]) -> bool {
        let mut g = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        let SinkRx {
            cache,
            scratch,
            outbox,
            ..
        } = &mut *g;
        let table = cache.get(&self.device);
        let from = PeerAddr::Tcp {
            conn,
            remote: canonical(remote),
        };
        // Recorded only: `on_read_done` carries it out once the read's messages are in.
        self.device
            .handle_datagram(table, from, msg, scratch, outbox)
    }

    /// What the messages of one read asked for, carried out together, so the packets
    /// they carried reach the TUN coalesced.
    fn on_read_done(&self) {
        let mut g = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        let SinkRx {
            outbox, tun_out, ..
        } = &mut *g;
        if outbox.is_empty() {
            return;
        }
        outbox.flush(&mut Outlets {
            udp: Some(&self.sockets),
            tcp: Some(&*self.slot),
            tun: Some(TunOut {
                queue: &self.tun,
                out: tun_out,
            }),
        });
    }

    // Deliberately records nothing: the fallback client polls its own connection (see
    // the module doc), so closes of inbound connections cannot pile up here.
    fn on_closed(&self, _conn: ConnId) {}
}

/// Start a transport listening on `ports` (`[::]:port`, IPv4 too).
pub fn start_transport(
    cfg: &Config,
    ports: &[u16],
    sink: Arc<DeviceSink>,
) -> std::io::Result<TcpTransport> {
    TcpTransport::start(transport_config(cfg, ports), sink)
}

/// The transport's settings for `cfg` listening on `ports`: the `[Gateway]` ones, and
/// the interface's fwmark on every socket, as the UDP sockets have it (else, under
/// wg-quick's `not fwmark` rule, the fallback's own packets would be routed into the
/// tunnel they carry).
pub fn transport_config(cfg: &Config, ports: &[u16]) -> TcpConfig {
    let mut g = cfg.gateway.clone();
    g.tcp_listen = ports.to_vec();
    let mut t = TcpConfig::from_gateway(&g);
    t.tuning.fwmark = cfg.interface.fwmark;
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_config_takes_the_interface_fwmark() {
        let mut cfg = Config::default();
        cfg.gateway.bbr_rtt_ms = 40;
        let t = transport_config(&cfg, &[443]);
        assert_eq!(t.tuning.fwmark, None);
        assert_eq!(t.listen, vec!["[::]:443".parse().unwrap()]);
        cfg.interface.fwmark = Some(51820);
        let t = transport_config(&cfg, &[]);
        assert_eq!(t.tuning.fwmark, Some(51820));
        assert!(t.listen.is_empty());
    }
}
