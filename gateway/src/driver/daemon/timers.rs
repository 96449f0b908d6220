//! The timer thread: every 250 ms the device's timers (handshake retries, keepalives,
//! recorded in an [`Outbox`] and sent once the device has returned) and the fallback client's
//! tick; the tunnel's MTU followed (padding must never pass it); once a second the
//! workers' heartbeats into the status file.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::events::EventBatch;
use super::status::StatusBoard;
use crate::core::device::SCRATCH_SIZE;
use crate::driver::dataplane::outbox::{Outbox, Outlets};
use crate::driver::dataplane::shared::Shared;
use crate::driver::tcp::fallback::FallbackManager;
use crate::driver::tcp::link::DeviceSink;

/// Run the timer thread until `sh.stop` is set.
pub(super) fn run(
    sh: &Shared,
    sink: Option<&DeviceSink>,
    ifname: &str,
    board: &StatusBoard,
    events: &EventBatch,
) {
    let mut scratch = vec![0u8; SCRATCH_SIZE];
    let mut io = Outbox::default();
    let mut fallback = FallbackManager::new();
    let start = std::time::Instant::now();
    let mut ticks = 0u64;
    let health_file = crate::run::peers::path(ifname);
    let mut health_written = String::new();
    let mut bursts = super::events::DropBursts::new();
    loop {
        // wg-quick (or anyone) may change the MTU at any time; padding must
        // never push a packet past it (and needs it known from the start).
        if let Some(mtu) = read_mtu(ifname) {
            sh.device.set_mtu(mtu);
        }
        if sh.stop.load(Ordering::Relaxed) {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
        if ticks.is_multiple_of(4) {
            // Once a second: the workers' heartbeats for init's health
            // watch (a stuck timer thread stops them moving too).
            // Not once stopping: the file is removed on the way out.
            if !sh.stop.load(Ordering::Relaxed) {
                if ticks.is_multiple_of(20) {
                    // Every 5 s: the peers' health (one brief lock per peer).
                    let stats = sh.device.peer_stats();
                    board.peers(super::status::peer_lines(&stats));
                    let text = crate::run::peers::text(
                        &stats
                            .iter()
                            .map(|s| crate::run::peers::PeerHealth {
                                key: s.public_key,
                                health: s.health.as_str().into(),
                                shared: s.shared_key.map(|(a, b)| (a.ip(), b.ip())),
                            })
                            .collect::<Vec<_>>(),
                    );
                    if text != health_written {
                        match crate::run::peers::write(&health_file, &text) {
                            Ok(()) => health_written = text,
                            Err(e) => log::debug!("{}: {e}", health_file.display()),
                        }
                    }
                }
                board.heartbeats(sh.heartbeats.snapshot());
            }
        }
        ticks += 1;
        sh.device.update_timers(
            start.elapsed(),
            std::time::SystemTime::now(),
            &mut scratch,
            &mut io,
        );
        io.flush(&mut Outlets {
            udp: Some(&sh.sockets),
            tcp: sh.tcp.as_deref(),
            tun: None,
        });
        if let Some(sink) = sink {
            fallback.tick(std::time::Instant::now(), &sh.device, sink, &sh.sockets);
        }
        // Sessions, endpoint moves, two devices on one key: said and batched.
        events.take_from(&sh.device);
        if ticks.is_multiple_of(240) {
            // Once a minute: the firewall's drop counters (none without its table).
            if let Ok(c) = crate::sys::nftables::counters(crate::core::firewall::TABLE) {
                let c: Vec<(String, u64)> = c.into_iter().map(|(n, p, _)| (n, p)).collect();
                if let Some(t) = bursts.observe(std::time::Instant::now(), &c) {
                    events.say(&t);
                }
            }
        }
        events.tick(std::time::Instant::now());
    }
}

/// The interface's MTU from sysfs (None when it cannot be read).
pub(super) fn read_mtu(ifname: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}
