//! Helpers for tests that need the kernel (this crate's and the gateway's, feature
//! `testutil`): [`not_run`] for a test whose kernel feature is missing here, a private
//! network namespace for a test's thread, and `ip`.

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
