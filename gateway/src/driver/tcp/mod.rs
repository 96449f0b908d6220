//! WireGuard over TCP: the transport (`transport`: listener, connections, epoll thread),
//! its link to the device and the fallback client (`link`), and the `udp2tcp`/`tcp2udp`
//! relays (`relay`). The admission policy it applies is `core::tcp_admission`.

pub mod fallback;
pub mod link;
pub mod relay;
pub mod transport;
