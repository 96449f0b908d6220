//! Batching adapters that put the offload building blocks under a worker loop without
//! changing the device: a [`TxBatch`] that gathers the WireGuard datagrams of one TUN
//! read into `UDP_SEGMENT` sends, a [`TunBatch`] that gathers the decrypted packets of one
//! UDP receive batch and coalesces them into `virtio_net_hdr` super-packets, and
//! [`OffloadIo`], the device's `Io` sink over both.
//!
//! Call sequence in a worker (buffers allocated once, before the loop):
//!
//! ```text
//! TUN readable:  n = q.read(&mut rbuf)?;
//!                split_tun_read(&rbuf[..n], vnet_hdr, &mut seg, |p| device.handle_tun_packet(.., p, .., &mut io))?;
//!                io.flush();        // the GSO sends of this read
//! UDP readable:  k = sock.recv_batch(&mut bufs, &mut metas)?;
//!                for m in metas[..k] { for d in datagrams(buf, m) { device.handle_datagram(.., d, .., &mut io) } }
//!                io.flush();        // the coalesced TUN writes of this batch
//! ```
//!
//! Both batches also flush themselves when full, so `flush` only bounds latency.

use std::net::SocketAddr;

use crate::core::device::{Io, PeerAddr};
use crate::core::gso::{
    CoalesceOptions, Coalescer, GsoBatch, GsoError, Splitter, MAX_BATCH, VIRTIO_NET_HDR_LEN,
};
use crate::driver::worker::TcpOut;
use crate::sys::tun::TunQueue;
use crate::sys::udp::{RecvMeta, UdpSocket};

/// Largest send one GSO batch carries (also the biggest single datagram we send).
const GSO_BUF: usize = 65536;
/// Bytes of decrypted packets a [`TunBatch`] holds before it must flush.
const ARENA: usize = 512 * 1024;

/// Gathers datagrams to one destination at a time into a `UDP_SEGMENT` send.
pub struct TxBatch {
    buf: Vec<u8>,
    batch: Option<GsoBatch>,
    /// Sends the kernel refused (counted, not retried: UDP is lossy anyway).
    pub send_errors: u64,
}

impl Default for TxBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl TxBatch {
    pub fn new() -> Self {
        TxBatch {
            buf: vec![0; GSO_BUF],
            batch: None,
            send_errors: 0,
        }
    }

    /// Queue one datagram for `dst`; sends what was queued first when `dst` changes or
    /// the datagram cannot join (bigger than the segment size, batch full).
    pub fn push(&mut self, sock: &UdpSocket, dst: SocketAddr, d: &[u8]) {
        if d.is_empty() || d.len() > GSO_BUF {
            return;
        }
        let joins = self
            .batch
            .as_ref()
            .is_some_and(|b| b.destination() == dst && b.can_push(d.len()));
        if !joins {
            self.flush(sock);
            let b = GsoBatch::new(dst, sock.max_gso_segments());
            if !b.can_push(d.len()) {
                // Too big for any batch (a 65507+ byte datagram): let the kernel judge it.
                self.send(sock, dst, d, d.len());
                return;
            }
            self.batch = Some(b);
        }
        if let Some(b) = self.batch.as_mut() {
            let at = b.size();
            self.buf[at..at + d.len()].copy_from_slice(d);
            b.push(d.len());
        }
    }

    /// Send what is queued.
    pub fn flush(&mut self, sock: &UdpSocket) {
        let Some(t) = self.batch.take().and_then(|mut b| b.finish()) else {
            return;
        };
        let buf = std::mem::take(&mut self.buf);
        self.send(sock, t.destination, &buf[..t.size], t.segment_size);
        self.buf = buf;
    }

    fn send(&mut self, sock: &UdpSocket, dst: SocketAddr, d: &[u8], seg: usize) {
        let seg = u16::try_from(seg).unwrap_or(u16::MAX);
        if let Err(e) = sock.send_segmented(dst, d, seg) {
            self.send_errors += 1;
            log::trace!("send to {dst}: {e}");
        }
    }
}

/// Gathers decrypted packets and writes them to the TUN coalesced.
pub struct TunBatch {
    arena: Vec<u8>,
    used: usize,
    spans: heapless::Vec<(u32, u32), MAX_BATCH>,
    coalescer: Coalescer,
    out: Vec<u8>,
    vnet_hdr: bool,
    /// Writes the TUN refused.
    pub write_errors: u64,
    /// Super-packets written (each merged two or more packets).
    pub coalesced: u64,
}

impl TunBatch {
    /// `opts` from the TUN's offload (`tso()`, `uso()`); `vnet_hdr` as the TUN was created.
    pub fn new(opts: CoalesceOptions, vnet_hdr: bool) -> Self {
        TunBatch {
            arena: vec![0; ARENA],
            used: 0,
            spans: heapless::Vec::new(),
            coalescer: Coalescer::new(opts),
            out: vec![0; VIRTIO_NET_HDR_LEN + 65535],
            vnet_hdr,
            write_errors: 0,
            coalesced: 0,
        }
    }

    /// Queue one plain IP packet.
    pub fn push(&mut self, tun: &TunQueue, p: &[u8]) {
        if !self.vnet_hdr {
            if let Err(e) = tun.write(p) {
                self.write_errors += 1;
                log::trace!("tun write: {e}");
            }
            return;
        }
        if p.len() > ARENA {
            return;
        }
        if self.spans.is_full() || self.used + p.len() > ARENA {
            self.flush(tun);
        }
        self.arena[self.used..self.used + p.len()].copy_from_slice(p);
        // Cannot fail: flushed above when full.
        let _ = self.spans.push((self.used as u32, p.len() as u32));
        self.used += p.len();
    }

    /// Coalesce and write what is queued.
    pub fn flush(&mut self, tun: &TunQueue) {
        if self.spans.is_empty() {
            return;
        }
        let mut pkts: heapless::Vec<&[u8], MAX_BATCH> = heapless::Vec::new();
        for &(at, len) in &self.spans {
            let _ = pkts.push(&self.arena[at as usize..(at + len) as usize]);
        }
        self.coalescer.plan(&pkts);
        let mut errors = 0;
        for g in self.coalescer.groups() {
            match self.coalescer.write(&g, &pkts, &mut self.out) {
                Ok(n) => {
                    if g.count > 1 {
                        self.coalesced += 1;
                    }
                    if let Err(e) = tun.write(&self.out[..n]) {
                        errors += 1;
                        log::trace!("tun write: {e}");
                    }
                }
                Err(e) => {
                    errors += 1;
                    log::trace!("coalesce: {e}");
                }
            }
        }
        self.write_errors += errors;
        self.spans.clear();
        self.used = 0;
    }
}

/// The device's `Io` sink for an offloading worker.
pub struct OffloadIo<'a> {
    pub sock: &'a UdpSocket,
    pub tun: &'a TunQueue,
    pub tcp: Option<&'a dyn TcpOut>,
    pub tx: &'a mut TxBatch,
    pub rx: &'a mut TunBatch,
}

impl OffloadIo<'_> {
    /// Send and write everything queued (end of a TUN read or a UDP receive batch).
    pub fn flush(&mut self) {
        self.tx.flush(self.sock);
        self.rx.flush(self.tun);
    }
}

impl Io for OffloadIo<'_> {
    fn send(&mut self, to: PeerAddr, d: &[u8]) {
        match to {
            PeerAddr::Udp(a) => self.tx.push(self.sock, a, d),
            PeerAddr::Tcp { conn, .. } => {
                if let Some(t) = self.tcp {
                    t.send(conn, d);
                }
            }
        }
    }

    fn tun_write(&mut self, p: &[u8]) {
        self.rx.push(self.tun, p);
    }
}

/// Hand each plain IP packet of one TUN read to `f`: the read itself without
/// `vnet_hdr`, else its segments (split into `seg`, which needs 65535 bytes).
/// Returns the number of packets; a malformed read is an error (count and drop it).
pub fn split_tun_read(
    read: &[u8],
    vnet_hdr: bool,
    seg: &mut [u8],
    mut f: impl FnMut(&[u8]),
) -> Result<usize, GsoError> {
    if !vnet_hdr {
        f(read);
        return Ok(1);
    }
    let mut s = Splitter::new(read)?;
    let mut n = 0;
    while let Some(r) = s.next_into(seg) {
        let len = r?;
        f(&seg[..len]);
        n += 1;
    }
    Ok(n)
}

/// The datagrams of one received buffer (several when GRO coalesced them).
pub fn datagrams<'b>(buf: &'b [u8], m: &RecvMeta) -> impl Iterator<Item = &'b [u8]> {
    let len = m.len.min(buf.len());
    buf[..len].chunks(m.segment_size.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::gso::checksum;
    use crate::sys::tun::tests::{can_net_admin, in_new_netns, ip};
    use crate::sys::tun::Tun;
    use crate::sys::udp::UdpOptions;
    use std::os::fd::AsFd;

    fn wait_readable(s: &UdpSocket) -> bool {
        let mut pfd = [nix::poll::PollFd::new(
            s.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        nix::poll::poll(&mut pfd, 5000u16).unwrap_or(0) == 1
    }

    fn recv_all(s: &UdpSocket, want: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        while out.iter().sum::<usize>() < want && wait_readable(s) {
            let m = s.recv_gro(&mut buf).expect("recv");
            out.extend(datagrams(&buf, &m).map(<[u8]>::len));
        }
        out
    }

    #[test]
    fn tx_batch_groups_by_destination_and_size() {
        let opts = UdpOptions {
            gro: false,
            ..UdpOptions::default()
        };
        let a = UdpSocket::bind("127.0.0.1:0".parse().expect("a"), &opts).expect("a");
        let b = UdpSocket::bind("127.0.0.1:0".parse().expect("b"), &opts).expect("b");
        let c = UdpSocket::bind("127.0.0.1:0".parse().expect("c"), &opts).expect("c");
        let mut tx = TxBatch::new();
        for _ in 0..5 {
            tx.push(&a, b.local_addr(), &[1; 1200]);
        }
        tx.push(&a, b.local_addr(), &[2; 300]); // short last: closes the batch
        tx.push(&a, b.local_addr(), &[3; 1200]); // starts a new one
        tx.push(&a, c.local_addr(), &[4; 80]); // other destination
        tx.flush(&a);
        assert_eq!(
            recv_all(&b, 1200 * 6 + 300),
            [1200, 1200, 1200, 1200, 1200, 300, 1200]
        );
        assert_eq!(recv_all(&c, 80), [80]);
        assert_eq!(tx.send_errors, 0);
    }

    #[test]
    fn datagrams_of_a_gro_buffer() {
        let buf = [0u8; 2500];
        let m = RecvMeta {
            len: 2500,
            segment_size: 1000,
            ..RecvMeta::default()
        };
        let lens: Vec<usize> = datagrams(&buf, &m).map(<[u8]>::len).collect();
        assert_eq!(lens, [1000, 1000, 500]);
        let bogus = RecvMeta {
            len: 9000,
            segment_size: 0,
            ..m
        };
        assert_eq!(
            datagrams(&buf, &bogus).map(<[u8]>::len).sum::<usize>(),
            2500
        );
    }

    /// An IPv4/UDP packet 10.81.0.2:7 -> 10.81.0.1:port with valid checksums.
    fn udp4(port: u16, payload: &[u8]) -> Vec<u8> {
        udp4_from([10, 81, 0, 2], port, payload)
    }

    fn udp4_from(src: [u8; 4], port: u16, payload: &[u8]) -> Vec<u8> {
        let total = 28 + payload.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[6] = 0x40;
        p[8] = 64;
        p[9] = 17;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&[10, 81, 0, 1]);
        let c = !checksum::fold(checksum::sum(&p[..20], 0));
        p[10..12].copy_from_slice(&c.to_be_bytes());
        p[20..22].copy_from_slice(&7u16.to_be_bytes());
        p[22..24].copy_from_slice(&port.to_be_bytes());
        p[24..26].copy_from_slice(&((total - 20) as u16).to_be_bytes());
        p[28..].copy_from_slice(payload);
        let ph = checksum::pseudo_header(&p[12..16], &p[16..20], 17, total - 20);
        let c = !checksum::fold(checksum::sum(&p[20..], ph));
        p[26..28].copy_from_slice(&c.to_be_bytes());
        p
    }

    #[test]
    fn tun_batch_writes_coalesced_packets_the_kernel_accepts() {
        if !can_net_admin() {
            eprintln!("skipped: needs root and /dev/net/tun");
            return;
        }
        in_new_netns(|| {
            let tun = Tun::create("rgob0", 1, true).expect("tun");
            ip(&["link", "set", "lo", "up"]);
            ip(&["addr", "add", "10.81.0.1/24", "dev", "rgob0"]);
            ip(&["link", "set", "rgob0", "up"]);
            let opts = UdpOptions {
                gro: false,
                ..UdpOptions::default()
            };
            let s = UdpSocket::bind("10.81.0.1:5000".parse().expect("addr"), &opts).expect("bind");
            let q = tun.queue(0).expect("q");
            let co = CoalesceOptions {
                tcp: tun.offload().tso(),
                udp: tun.offload().uso(),
            };
            let mut rx = TunBatch::new(co, true);
            for i in 0..10u8 {
                rx.push(q, &udp4(5000, &[i; 1000]));
            }
            rx.push(q, &udp4(5000, &[10; 400]));
            rx.flush(q);
            assert_eq!(rx.write_errors, 0);
            assert_eq!(
                rx.coalesced,
                u64::from(tun.offload().uso()),
                "one USO super-packet"
            );
            let got = recv_all(&s, 10_400);
            assert_eq!(got.len(), 11, "{got:?}");
            assert_eq!(got.iter().sum::<usize>(), 10_400);

            // Without vnet_hdr the packets go straight through.
            let plain = Tun::create("rgob1", 1, false).expect("tun");
            ip(&["addr", "add", "10.81.1.1/24", "dev", "rgob1"]);
            ip(&["link", "set", "rgob1", "up"]);
            let mut rx = TunBatch::new(CoalesceOptions::default(), false);
            let p = udp4_from([10, 81, 1, 2], 5000, &[1; 100]);
            rx.push(plain.queue(0).expect("q"), &p);
            assert_eq!(recv_all(&s, 100), [100]);
        });
    }

    #[test]
    fn split_tun_read_plain_and_malformed() {
        let p = udp4(1, &[1; 10]);
        let mut seg = vec![0u8; 65535];
        let mut seen = Vec::new();
        assert_eq!(
            split_tun_read(&p, false, &mut seg, |x| seen.push(x.len())),
            Ok(1)
        );
        let mut v = vec![0u8; VIRTIO_NET_HDR_LEN];
        v.extend_from_slice(&p);
        assert_eq!(
            split_tun_read(&v, true, &mut seg, |x| seen.push(x.len())),
            Ok(1)
        );
        assert_eq!(seen, [38, 38]);
        assert!(split_tun_read(&v[..5], true, &mut seg, |_| {}).is_err());
    }
}
