//! Helpers shared by the gateway crate's unit tests: the core's (a one-peer device, an
//! `Io` sink, a seeded RNG, packet builders) and [`not_run`] for a test whose kernel
//! feature is missing here.

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
