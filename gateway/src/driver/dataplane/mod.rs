//! The per-core workers and everything a packet crosses between the TUN, the device and
//! the UDP socket: one loop (`worker`) over an engine — `uring` (default) or `poll` —
//! each beside its executor; the `pipeline` both run with its batches (`tx_batch`,
//! `tun_batch`), the sticky sources (`sticky`), deferred sends (`outbox`), the sockets
//! (`sockets`) and what the threads share (`shared`, `heartbeat`). Imports nothing else
//! of `driver`.

pub mod backend;
pub mod heartbeat;
pub mod outbox;
pub mod pipeline;
pub mod poll;
pub mod shared;
pub mod sockets;
pub mod spread;
pub mod sticky;
pub mod tun_batch;
pub mod tx_batch;
pub mod uring;
pub mod worker;

#[cfg(test)]
mod tests;
