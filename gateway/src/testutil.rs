//! Helpers shared by the gateway crate's unit tests: the core's (a one-peer device, an
//! `Io` sink, a seeded RNG, packet builders), the sys crate's for tests that need the
//! kernel ([`not_run`] for a missing kernel feature, `in_new_netns`, `ip`), and a
//! temporary directory.

pub use riceguard_core::testutil::*;
pub use riceguard_sys::testutil::{in_new_netns, ip, not_run};

/// A fresh empty directory under the system temp dir, removed when dropped.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "riceguard-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A DHCP lease of 192.168.77.2/24 from 192.168.77.1 (router and DNS), 120 s long,
/// `obtained` 1000.
pub fn lease() -> riceguard_core::dhcp::Lease {
    use std::net::Ipv4Addr;
    riceguard_core::dhcp::Lease {
        address: Ipv4Addr::new(192, 168, 77, 2),
        prefix: 24,
        router: Some(Ipv4Addr::new(192, 168, 77, 1)),
        dns: vec![Ipv4Addr::new(192, 168, 77, 1)],
        ntp: vec![],
        server: Ipv4Addr::new(192, 168, 77, 1),
        lease_secs: 120,
        t1_secs: 60,
        t2_secs: 105,
        obtained: 1000,
    }
}
