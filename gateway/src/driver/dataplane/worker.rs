//! The per-core worker: ONE loop ([`run_loop`]) over an [`Engine`].
//!
//! A round of the loop: heartbeat, pick up a replaced socket, let the engine re-arm,
//! wait as `Poll =` says, then drain — the engine hands every received buffer and
//! every TUN read to the shared [`Pipeline`] (device, TSO split, GSO batches, GRO
//! coalescing) — and flush the round's batches to the kernel, outside any peer lock.
//! What differs between engines is only how they receive, submit and wait: the poll
//! engine (`dataplane::poll`) and the io_uring engine (`dataplane::uring`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::config::PollMode;
use crate::driver::dataplane::backend::Backend;
use crate::driver::dataplane::pipeline::{Cx, Pipeline};
use crate::driver::dataplane::shared::{socket_of, Shared};
use crate::driver::dataplane::spread::Spread;
use crate::sys::tun::TunQueue;
use crate::sys::udp::UdpSocket;

/// How long one wait may block, so `stop` and socket changes are noticed (and the
/// heartbeat moves while idle).
pub const WAIT: Duration = Duration::from_millis(100);
/// `Poll = adaptive`: after a round with traffic, keep polling without sleeping this
/// long: an answer (a ping reply from the stack, the next packet of a burst) usually
/// comes within it, and a sleeping worker costs a wake-up per packet. Bounded, so an idle
/// worker sleeps. Not the default: on cores shared with other work (our 2-core bench,
/// where both tunnel ends and iperf3 run) the spinning took the time the other side
/// needed — single-stream TCP fell from ~4000 to ~2500 Mbit/s and idle RTT rose from
/// 0.37 to 0.82 ms.
pub const ADAPTIVE_SPIN: Duration = Duration::from_micros(200);

/// Whether a worker polls without sleeping now.
pub fn spin_now(mode: PollMode, hot_until: Instant) -> bool {
    match mode {
        PollMode::Busy => true,
        PollMode::Adaptive => Instant::now() < hot_until,
        PollMode::Sleep => false,
    }
}
/// What a wait ended with.
#[derive(Debug)]
pub enum Waited {
    /// Something may be ready: drain.
    Ready,
    /// The timeout passed with nothing to do.
    Idle,
    /// The wait itself failed (logged; the loop pauses [`WAIT`] and goes on).
    Failed(String),
    /// The TUN was closed or deleted: the worker ends.
    TunGone(String),
}

/// What a drain did.
#[derive(Debug, Default)]
pub struct Drained {
    /// Events handled (datagram buffers, TUN reads, completions): traffic, for the
    /// adaptive wait.
    pub handled: usize,
    /// The TUN failed as a deleted interface does: the worker ends after this round.
    pub tun_gone: Option<String>,
}

/// A worker backend: only what differs between io_uring and the portable path — how
/// it waits, receives and submits. Everything else is [`run_loop`]'s and [`Pipeline`]'s.
pub trait Engine {
    /// The buffers its executor lends the batches.
    type Buf;
    /// The executor of one round's batches ([`Backend`]): queues sends and TUN writes,
    /// hands them to the kernel in `submit`.
    type Exec<'e>: Backend<Buf = Self::Buf>
    where
        Self: 'e;
    /// Serve this socket from now on (a listen-port change).
    fn set_socket(&mut self, sock: &Arc<UdpSocket>) -> Result<(), String>;
    /// Before the wait: keep what the backend has in flight armed (reads, receives).
    fn arm(&mut self) {}
    /// Wait for work, at most `timeout` (zero: only look).
    fn wait(&mut self, timeout: Duration) -> Waited;
    /// Hand everything ready to `p` (with [`Self::exec`]'s executor).
    fn drain(&mut self, p: &mut Pipeline<Self::Buf>, cx: &Cx<'_>) -> Drained;
    /// The executor, for the end-of-round flush.
    fn exec(&mut self) -> Self::Exec<'_>;
    /// Packets dropped (no buffer, ring slot or room in the socket) since the last call.
    fn take_dropped(&mut self) -> u64;
}

/// One round after the wait: drain into the pipeline, then flush it (the batches go
/// to the kernel here, outside any peer lock).
pub fn round<E: Engine>(e: &mut E, p: &mut Pipeline<E::Buf>, cx: &Cx<'_>) -> Drained {
    p.begin_round();
    let d = e.drain(p, cx);
    // Lane roles other workers handed over (woken for them, or found on the way).
    p.serve_roles(&mut e.exec(), cx);
    p.flush(&mut e.exec(), cx);
    d
}

/// Spreading, when the daemon turned it on: worker `index` of the pool takes part, with
/// another handle on its TUN queue for the lane writes. Returns the pool (its engine
/// watches the wake-up file); `None` (and said) when the handle cannot be had: the
/// worker then opens and writes the trains it receives itself, as without spreading,
/// and never sets itself idle, so no role is handed to it.
pub fn spread_into<B>(
    p: &mut Pipeline<B>,
    index: usize,
    tun: &TunQueue,
    shared: &Shared,
) -> Option<Arc<Spread>> {
    let sp = shared.spread.clone()?;
    match tun.try_clone() {
        Ok(q) => {
            if !sp.join(index, q) {
                return None;
            }
            p.spread(sp.clone(), index);
            Some(sp)
        }
        Err(e) => {
            log::error!("worker {index}: no second handle on the TUN queue ({e}): not spreading");
            None
        }
    }
}

/// THE worker loop, for every backend: until `shared.stop` is set, or the TUN goes
/// away (then `shared.tun_gone` is set). Every round, idle ones too, bumps this
/// worker's heartbeat (one wait is at most [`WAIT`]).
pub fn run_loop<E: Engine>(
    index: usize,
    e: &mut E,
    p: &mut Pipeline<E::Buf>,
    poll_mode: PollMode,
    shared: &Shared,
    mut gen: u64,
) {
    let mut cache = shared.device.cache();
    let tcp = shared.tcp.clone();
    let mut hot_until = Instant::now();
    let mut dropped_total: u64 = 0;
    let spread = p.spreading().map(|(sp, _)| sp.clone());
    while !shared.stop.load(Ordering::Relaxed) {
        shared.heartbeats.beat(index);
        if shared.sockets.generation() != gen {
            if let Some((g, s)) = socket_of(shared, index) {
                // On failure the old socket goes on serving (said once, not every round).
                if let Err(err) = e.set_socket(&s) {
                    log::warn!("worker {index}: keeping the old UDP socket: {err}");
                }
                gen = g;
            }
        }
        e.arm();
        // `Poll = adaptive` polls without sleeping for a moment after traffic, `busy`
        // always, `sleep` (the default) never.
        let timeout = if spin_now(poll_mode, hot_until) {
            Duration::ZERO
        } else {
            WAIT
        };
        // Asleep: other workers may hand this one a lane role (and wake it).
        let spread = spread.as_deref();
        if let (Some(sp), false) = (spread, timeout.is_zero()) {
            sp.set_idle(index, true);
        }
        let waited = e.wait(timeout);
        if let Some(sp) = spread {
            sp.set_idle(index, false);
        }
        match waited {
            Waited::Ready => {}
            Waited::Idle => continue,
            Waited::Failed(err) => {
                log::error!("worker {index}: {err}");
                std::thread::sleep(WAIT);
                continue;
            }
            Waited::TunGone(why) => {
                log::info!("worker {index}: {why}; interface gone");
                shared.tun_gone.store(true, Ordering::Relaxed);
                return;
            }
        }
        // After the wait, not before it: a listen-port change while we slept must not
        // send this round's answers from the old socket (the peer would roam to a port
        // that is about to close). The top of the loop picks up the new socket.
        if shared.sockets.generation() != gen {
            continue;
        }
        let cx = Cx {
            dev: &shared.device,
            table: cache.get(&shared.device),
            tcp: tcp.as_deref(),
        };
        let d = round(e, p, &cx);
        if d.handled > 0 {
            hot_until = Instant::now() + ADAPTIVE_SPIN;
        }
        let dropped = e.take_dropped();
        if dropped > 0 {
            dropped_total += dropped;
            log::debug!("worker {index}: {dropped} packets dropped (no free buffer, ring slot or socket room; {dropped_total} total)");
        }
        if let Some(why) = d.tun_gone {
            // EBADFD/EIO: the interface was deleted under us (wg-quick down).
            log::info!("worker {index}: {why}; interface gone");
            shared.tun_gone.store(true, Ordering::Relaxed);
            return;
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::device::Device;
    use crate::driver::dataplane::backend::GSO_BUF;
    use crate::driver::dataplane::backend::{Dst, TunSink};
    use crate::driver::dataplane::heartbeat::Heartbeats;
    use crate::driver::dataplane::sockets::SocketSet;
    use crate::sys::tun::TunOffload;
    use std::collections::VecDeque;
    use std::net::SocketAddr;
    use std::sync::atomic::AtomicBool;

    /// A backend that lends vectors and records what it was asked to do.
    #[derive(Default)]
    struct FakeExec {
        sent: usize,
        submits: usize,
    }

    impl TunSink for &mut FakeExec {
        type Buf = Vec<u8>;
        fn alloc(&mut self) -> Option<Vec<u8>> {
            Some(vec![0; GSO_BUF])
        }
        fn bytes<'b>(&'b self, b: &'b mut Vec<u8>) -> &'b mut [u8] {
            b
        }
        fn release(&mut self, _: Vec<u8>) {}
        fn write_tun(&mut self, _: Vec<u8>, _: usize) {}
    }

    impl Backend for &mut FakeExec {
        fn max_segments(&self, _: SocketAddr) -> usize {
            64
        }
        fn send(&mut self, _: Vec<u8>, _: usize, _: Dst, _: usize) {
            self.sent += 1;
        }
        fn dropped(&self) -> u64 {
            0
        }
        fn submit(&mut self) {
            self.submits += 1;
        }
    }

    /// What the loop sees each round, in order.
    enum Step {
        /// The wait says ready; the drain reports `handled` events and `dropped` drops.
        Ready {
            handled: usize,
            dropped: u64,
        },
        Idle,
        Failed,
        /// The listen port changes while the engine waits.
        SocketChangesDuringWait,
        /// The drain finds the TUN gone.
        GoneInDrain,
    }

    struct FakeEngine<'s> {
        shared: &'s Shared,
        script: VecDeque<Step>,
        current: Option<Step>,
        exec: FakeExec,
        arms: usize,
        waits: Vec<Duration>,
        drains: usize,
        sockets_set: usize,
        dropped: u64,
    }

    impl Engine for FakeEngine<'_> {
        type Buf = Vec<u8>;
        type Exec<'e>
            = &'e mut FakeExec
        where
            Self: 'e;

        fn set_socket(&mut self, _: &Arc<UdpSocket>) -> Result<(), String> {
            self.sockets_set += 1;
            Ok(())
        }
        fn arm(&mut self) {
            self.arms += 1;
        }
        fn wait(&mut self, timeout: Duration) -> Waited {
            self.waits.push(timeout);
            let Some(step) = self.script.pop_front() else {
                self.shared.stop.store(true, Ordering::Relaxed);
                return Waited::Idle;
            };
            let w = match &step {
                Step::Idle => Waited::Idle,
                Step::Failed => Waited::Failed("test failure".into()),
                Step::SocketChangesDuringWait => {
                    let (_, socks) = self.shared.sockets.get();
                    self.shared.sockets.replace(socks.to_vec(), 0);
                    Waited::Ready
                }
                _ => Waited::Ready,
            };
            self.current = Some(step);
            w
        }
        fn drain(&mut self, _: &mut Pipeline<Vec<u8>>, _: &Cx<'_>) -> Drained {
            self.drains += 1;
            match self.current.take() {
                Some(Step::Ready { handled, dropped }) => {
                    self.dropped += dropped;
                    Drained {
                        handled,
                        tun_gone: None,
                    }
                }
                Some(Step::GoneInDrain) => Drained {
                    handled: 0,
                    tun_gone: Some("TUN read failed (test)".into()),
                },
                _ => Drained::default(),
            }
        }
        fn exec(&mut self) -> &mut FakeExec {
            &mut self.exec
        }
        fn take_dropped(&mut self) -> u64 {
            std::mem::take(&mut self.dropped)
        }
    }

    fn shared() -> Shared {
        let opts = crate::sys::udp::UdpOptions {
            reuse_port: false,
            gro: false,
            ..crate::sys::udp::UdpOptions::default()
        };
        let s = UdpSocket::bind("127.0.0.1:0".parse().expect("addr"), &opts).expect("bind");
        Shared {
            device: Arc::new(Device::new(Box::new(rand_core::OsRng))),
            sockets: Arc::new(SocketSet::new(vec![Arc::new(s)], 0)),
            stop: Arc::new(AtomicBool::new(false)),
            tcp: None,
            tun_gone: Arc::new(AtomicBool::new(false)),
            heartbeats: Arc::new(Heartbeats::new(1)),
            spread: None,
        }
    }

    fn run_script(shared: &Shared, mode: PollMode, script: Vec<Step>) -> FakeEngine<'_> {
        let mut e = FakeEngine {
            shared,
            script: script.into(),
            current: None,
            exec: FakeExec::default(),
            arms: 0,
            waits: Vec::new(),
            drains: 0,
            sockets_set: 0,
            dropped: 0,
        };
        let mut p = Pipeline::new(TunOffload::default(), false, Arc::default());
        let gen = shared.sockets.generation();
        run_loop(0, &mut e, &mut p, mode, shared, gen);
        e
    }

    /// The one loop: every round beats and re-arms; an idle wait or a failed one drains
    /// nothing; a listen-port change during the wait skips that round's drain and the
    /// next round serves the new socket; every drained round is flushed (submitted);
    /// a gone TUN ends the loop and says so.
    #[test]
    fn the_loop_drives_any_engine() {
        let sh = shared();
        let e = run_script(
            &sh,
            PollMode::Sleep,
            vec![
                Step::Ready {
                    handled: 3,
                    dropped: 2,
                },
                Step::Idle,
                Step::SocketChangesDuringWait,
                Step::Ready {
                    handled: 0,
                    dropped: 0,
                },
                Step::Failed,
                Step::GoneInDrain,
            ],
        );
        assert_eq!(e.waits.len(), 6);
        assert_eq!(e.arms, 6, "armed before every wait");
        assert_eq!(e.drains, 3, "not after idle, failed or a socket change");
        assert_eq!(e.exec.submits, 3, "each drained round flushed once");
        assert_eq!(e.sockets_set, 1, "the new socket taken up once");
        assert_eq!(sh.heartbeats.snapshot(), [6], "a beat per round");
        assert!(sh.tun_gone.load(Ordering::Relaxed));
        assert!(
            e.waits.iter().all(|w| *w == WAIT),
            "Poll = sleep never spins"
        );
    }

    #[test]
    fn busy_never_sleeps_adaptive_sleeps_when_idle() {
        let sh = shared();
        let e = run_script(&sh, PollMode::Busy, vec![Step::Idle, Step::Idle]);
        assert!(e.waits.iter().all(|w| w.is_zero()), "{:?}", e.waits);
        assert!(!sh.tun_gone.load(Ordering::Relaxed));

        // Adaptive: asleep before any traffic (spinning after it is a matter of time,
        // which a test does not assert; `spin_now` is checked with times far apart).
        let sh = shared();
        let e = run_script(
            &sh,
            PollMode::Adaptive,
            vec![
                Step::Idle,
                Step::Ready {
                    handled: 1,
                    dropped: 0,
                },
            ],
        );
        assert_eq!(e.waits[0], WAIT, "idle: sleeps");
        assert!(!spin_now(PollMode::Adaptive, Instant::now()));
        assert!(spin_now(
            PollMode::Adaptive,
            Instant::now() + Duration::from_secs(60)
        ));
        assert!(spin_now(PollMode::Busy, Instant::now()));
        assert!(!spin_now(PollMode::Sleep, Instant::now() + WAIT));
    }
}
