//! Helpers shared by the gateway crate's unit tests: the core's (a one-peer device, an
//! `Io` sink, a seeded RNG, packet builders), [`not_run`] for a test whose kernel
//! feature is missing here, a private network namespace for a test's thread, `ip`, and
//! a temporary directory.

pub use riceguard_core::testutil::*;

/// A test cannot run here because the kernel lacks a feature (UDP GSO, io_uring, hugetlb,
/// IPv6...). It says so; with `RG_TEST_STRICT` set (`ci/test.sh unit` sets it: the CI
/// kernel has every feature) it fails instead, so a pass count in CI means the test ran.
/// Tests that need root are `#[ignore]`d with the reason instead.
pub fn not_run(why: &str) {
    if std::env::var_os("RG_TEST_STRICT").is_some() {
        panic!("not run: {why} (RG_TEST_STRICT is set: this machine must run it)");
    }
    eprintln!("not run: {why}");
}

/// Run `body` on a fresh thread inside its own, anonymous network namespace, which
/// vanishes when the thread ends. Commands spawned from that thread (`ip`) run in it.
pub fn in_new_netns<T: Send + 'static>(body: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare netns");
        body()
    })
    .join()
    .expect("netns thread")
}

/// Run `ip ARGS` (in the calling thread's namespace); a failure fails the test.
pub fn ip(args: &[&str]) {
    let st = std::process::Command::new("ip")
        .args(args)
        .status()
        .expect("run ip");
    assert!(st.success(), "ip {args:?} failed");
}

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
