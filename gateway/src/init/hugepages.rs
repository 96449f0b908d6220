//! Hugepages for the packet buffer pools: what the configured workers need (`Cores` x
//! `Buffers`), within the board's budget, reserved before the gateway starts.

use crate::core::config::GatewayConfig;

use super::board::Board;

/// Hugepages the gateway's buffer pools take: one pool per worker (`Cores`, else every
/// online core), `Buffers` buffers each; none when io_uring or hugepages are off. Without
/// a loadable configuration the board's number stands.
pub(super) fn hugepages_needed(gw: Option<&GatewayConfig>, board: &Board) -> u32 {
    let Some(g) = gw else {
        return board.hugepages;
    };
    let workers = if g.cores.is_empty() {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        g.cores.len()
    };
    let page = crate::sys::hugepage::huge_info()
        .map(|h| h.page_size)
        .filter(|&p| p > 0)
        .unwrap_or(2 << 20);
    pool_hugepages(g, workers, page)
}

/// The arithmetic of [`hugepages_needed`], apart for tests.
pub(super) fn pool_hugepages(g: &GatewayConfig, workers: usize, page_size: usize) -> u32 {
    if !g.io_uring || !g.hugepages {
        return 0;
    }
    let pool = crate::driver::dataplane::uring::engine::UringWorkerConfig::from_gateway(g).pool;
    let n = pool.hugepages_needed(page_size) * workers as u64;
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Reserve `need` hugepages, at most the board's budget `cap` (0: no cap).
pub(super) fn reserve_hugepages(need: u32, cap: u32) {
    let n = if cap > 0 && need > cap {
        say!("hugepages: the configured pools need {need}, the board allows {cap}; the rest of the pools use ordinary pages");
        cap
    } else {
        need
    };
    if n == 0 {
        return;
    }
    let p = "/proc/sys/vm/nr_hugepages";
    if let Err(e) = std::fs::write(p, n.to_string()) {
        say!("hugepages: cannot reserve {n}: {e}");
        return;
    }
    let got = std::fs::read_to_string(p).unwrap_or_default();
    say!(
        "hugepages: {} of {n} reserved (the gateway's buffer pools)",
        got.trim()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reservation follows Cores and Buffers: 1024 buffers of 68 KiB are 34 pages of
    /// 2 MiB per worker (the qemu board's fixed 32 was short by 2 for one worker).
    #[test]
    fn hugepages_follow_cores_and_buffers() {
        let mut g = GatewayConfig::default();
        let two_mib = 2 << 20;
        assert_eq!(pool_hugepages(&g, 1, two_mib), 34);
        assert_eq!(pool_hugepages(&g, 2, two_mib), 68);
        g.buffers = 256;
        assert_eq!(pool_hugepages(&g, 2, two_mib), 18);
        g.hugepages = false;
        assert_eq!(pool_hugepages(&g, 2, two_mib), 0);
        g.hugepages = true;
        g.io_uring = false;
        assert_eq!(
            pool_hugepages(&g, 2, two_mib),
            0,
            "the poll loop has no pool"
        );
        let b = Board {
            hugepages: 7,
            ..Board::default()
        };
        assert_eq!(
            hugepages_needed(None, &b),
            7,
            "no config: the board's number"
        );
    }
}
