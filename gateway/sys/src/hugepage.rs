//! The per-worker packet buffer pool: one `mmap` region cut into N fixed-size buffers,
//! on 2 MiB hugepages when the system has them reserved (else ordinary pages, said once
//! in the log), populated and locked up front so the packet path never faults.
//!
//! The pool owns the memory; a [`BufId`] is the only way to reach one buffer. A `BufId`
//! is not `Clone`, so whoever holds it (a worker, or the io_uring in-flight table while
//! the kernel owns the buffer) is the one owner of that buffer. Allocation and release
//! are a pop/push on a preallocated index stack: nothing is allocated per packet.
//!
//! [`BufPool::iovecs`] gives one iovec per buffer for `IORING_REGISTER_BUFFERS`; the
//! registered index of a buffer is [`BufId::index`].

use std::cell::Cell;
use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

/// Room in front of and after a 64 KiB payload: virtio_net_hdr, WireGuard header and
/// tag, `io_uring_recvmsg_out` + address + cmsgs for multishot receives.
pub const HEADROOM: usize = 512;
/// Default buffer size: one 64 KiB GSO/GRO super-packet plus [`HEADROOM`].
pub const DEFAULT_BUF_SIZE: usize = 65536 + HEADROOM;
/// Most buffers one pool may have: the kernel's limit on registered buffers
/// (`IORING_MAX_REG_BUFFERS`), which also keeps every index in a `u16`.
pub const MAX_BUFFERS: u32 = 1 << 14;
/// Buffers are placed at multiples of this, so each starts page-aligned.
const STRIDE_ALIGN: usize = 4096;
/// Largest buffer we accept (the registered-buffer limit is 1 GiB; a packet never needs
/// more than a few 64 KiB).
const MAX_BUF_SIZE: usize = 1 << 20;

/// How the pool is to be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Number of buffers (1..=[`MAX_BUFFERS`]).
    pub count: u32,
    /// Usable bytes per buffer (rounded up to 4 KiB for placement).
    pub buf_size: usize,
    /// Use hugepages when reserved; `false` forces ordinary pages (`[Gateway] Hugepages = off`).
    pub hugepages: bool,
}

impl PoolConfig {
    /// `count` buffers of [`DEFAULT_BUF_SIZE`], hugepages when available.
    pub fn new(count: u32) -> PoolConfig {
        PoolConfig {
            count,
            buf_size: DEFAULT_BUF_SIZE,
            hugepages: true,
        }
    }

    /// Bytes the pool maps before rounding to hugepages (buffers are 4 KiB-aligned).
    pub fn bytes(&self) -> usize {
        self.buf_size.div_ceil(STRIDE_ALIGN) * STRIDE_ALIGN * self.count as usize
    }

    /// Hugepages of `page_size` bytes one such pool takes: what init should add to
    /// `vm.nr_hugepages` per worker.
    pub fn hugepages_needed(&self, page_size: usize) -> u64 {
        self.bytes().div_ceil(page_size.max(1)) as u64
    }
}

/// Why the pool is on ordinary pages.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NoHugepages {
    /// The configuration said so.
    Disabled,
    /// `vm.nr_hugepages` is 0.
    NoneReserved,
    /// Fewer free hugepages than the pool needs.
    NotEnoughFree { needed: u64, free: u64 },
    /// `/proc/meminfo` has no hugepage lines (kernel without HUGETLBFS) or could not be read.
    Unsupported(String),
    /// `mmap(MAP_HUGETLB)` itself failed (another process took the pages, cgroup limit).
    MapFailed(String),
}

impl fmt::Display for NoHugepages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disabled => f.write_str("hugepages are switched off in the configuration"),
            Self::NoneReserved => f.write_str("no hugepages are reserved (vm.nr_hugepages = 0)"),
            Self::NotEnoughFree { needed, free } => {
                write!(
                    f,
                    "it needs {needed} free hugepages but only {free} are free"
                )
            }
            Self::Unsupported(why) => write!(f, "hugepages are not available: {why}"),
            Self::MapFailed(e) => write!(f, "mmap(MAP_HUGETLB) failed: {e}"),
        }
    }
}

/// What backs the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// `pages` hugepages of `page_size` bytes.
    Huge { pages: u64, page_size: usize },
    /// Ordinary pages, and why.
    Normal(NoHugepages),
}

/// Why no pool could be built at all.
#[derive(Debug)]
#[non_exhaustive]
pub enum PoolError {
    /// Buffer count outside 1..=16384.
    BadCount(u32),
    /// Buffer size 0 or above 1 MiB.
    BadSize(usize),
    /// Even ordinary anonymous memory could not be mapped.
    Map { bytes: usize, source: io::Error },
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadCount(n) => {
                write!(
                    f,
                    "buffer pool: {n} buffers asked for; use 1 to {MAX_BUFFERS} (`Buffers =`)"
                )
            }
            Self::BadSize(n) => write!(f, "buffer pool: buffer size {n} must be 1 byte to 1 MiB"),
            Self::Map { bytes, source } => write!(
                f,
                "buffer pool: cannot map {} MiB: {source} (lower `Buffers =` or free memory)",
                bytes >> 20
            ),
        }
    }
}

impl std::error::Error for PoolError {}

/// One buffer of a [`BufPool`], owned by whoever holds this value. Not `Clone`: giving it
/// away (to the free list, to the kernel) gives the buffer away.
#[derive(Debug, PartialEq, Eq)]
pub struct BufId(u32);

impl BufId {
    /// Index of the buffer in the pool, also its registered-buffer index for
    /// `ReadFixed`/`WriteFixed` (always below [`MAX_BUFFERS`], so it fits a `u16`).
    pub fn index(&self) -> u32 {
        self.0
    }

    /// The registered-buffer index as the SQE field wants it.
    pub fn buf_index(&self) -> u16 {
        // MAX_BUFFERS is 1 << 14, so every index fits.
        self.0 as u16
    }
}

/// The pool. See the module documentation.
pub struct BufPool {
    base: NonNull<u8>,
    map_len: usize,
    stride: usize,
    buf_size: usize,
    count: u32,
    backing: Backing,
    locked: bool,
    /// LIFO stack of free indices (the most recently used buffer is the warmest);
    /// `free[..top]` is the stack. Cells so that `alloc`/`free` take `&self` and can be
    /// called while buffer slices are borrowed.
    free: Box<[Cell<u32>]>,
    top: Cell<usize>,
}

// SAFETY: the pool exclusively owns its mapping; moving it to another thread moves that
// ownership. It is not `Sync` (the free list uses `Cell`), so it is used by one thread
// at a time.
unsafe impl Send for BufPool {}

impl fmt::Debug for BufPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufPool")
            .field("count", &self.count)
            .field("buf_size", &self.buf_size)
            .field("backing", &self.backing)
            .field("free", &self.top.get())
            .finish()
    }
}

impl BufPool {
    /// Map the pool and log one line saying what backs it (and, on ordinary pages, why).
    pub fn new(cfg: &PoolConfig) -> Result<BufPool, PoolError> {
        if cfg.count == 0 || cfg.count > MAX_BUFFERS {
            return Err(PoolError::BadCount(cfg.count));
        }
        if cfg.buf_size == 0 || cfg.buf_size > MAX_BUF_SIZE {
            return Err(PoolError::BadSize(cfg.buf_size));
        }
        let stride = cfg.buf_size.div_ceil(STRIDE_ALIGN) * STRIDE_ALIGN;
        // At most 2^14 * 2^20 = 16 GiB: no overflow on 64-bit.
        let bytes = cfg.bytes();

        let (base, map_len, backing) = match try_huge(cfg, bytes) {
            Ok((base, map_len, pages, page_size)) => {
                (base, map_len, Backing::Huge { pages, page_size })
            }
            Err(why) => {
                let base = map(bytes, 0).map_err(|source| PoolError::Map { bytes, source })?;
                (base, bytes, Backing::Normal(why))
            }
        };
        // SAFETY: [base, base + map_len) is the mapping just created and owned by us.
        let locked = unsafe { libc::mlock(base.as_ptr().cast(), map_len) } == 0;

        let free: Box<[Cell<u32>]> = (0..cfg.count).rev().map(Cell::new).collect();
        let pool = BufPool {
            base,
            map_len,
            stride,
            buf_size: cfg.buf_size,
            count: cfg.count,
            backing,
            locked,
            top: Cell::new(free.len()),
            free,
        };
        let (mut level, line) = pool.summary();
        // Every worker builds a pool; the fallback warning is said once per process,
        // later pools repeat it only at debug level.
        static WARNED: AtomicBool = AtomicBool::new(false);
        if level == log::Level::Warn && WARNED.swap(true, Ordering::Relaxed) {
            level = log::Level::Debug;
        }
        log::log!(level, "{line}");
        Ok(pool)
    }

    /// The one log line about this pool: what backs it and, on ordinary pages, why
    /// (a warning unless the configuration asked for it).
    pub fn summary(&self) -> (log::Level, String) {
        let mib = self.map_len as f64 / f64::from(1u32 << 20);
        let (n, stride) = (self.count, self.stride);
        let unlocked = if self.locked {
            ""
        } else {
            "; memory not locked (RLIMIT_MEMLOCK)"
        };
        match &self.backing {
            Backing::Huge { pages, page_size } => (
                log::Level::Info,
                format!(
                    "buffer pool: {n} buffers x {stride} B ({mib:.1} MiB) on {pages} hugepages of {} KiB{unlocked}",
                    page_size >> 10
                ),
            ),
            Backing::Normal(NoHugepages::Disabled) => (
                log::Level::Info,
                format!("buffer pool: {n} buffers x {stride} B ({mib:.1} MiB) on ordinary pages: {}{unlocked}", NoHugepages::Disabled),
            ),
            Backing::Normal(why) => (
                log::Level::Warn,
                format!(
                    "buffer pool: {n} buffers x {stride} B ({mib:.1} MiB) on ordinary pages, not hugepages: {why} \
                     (reserve them with `sysctl vm.nr_hugepages=N`){unlocked}"
                ),
            ),
        }
    }

    /// Take a free buffer; `None` when all are in use (the caller drops the packet).
    pub fn alloc(&self) -> Option<BufId> {
        let top = self.top.get().checked_sub(1)?;
        self.top.set(top);
        self.free.get(top).map(|c| BufId(c.get()))
    }

    /// Give a buffer back.
    pub fn free(&self, id: BufId) {
        let top = self.top.get();
        // Cannot overflow: each of the `count` BufIds exists once, so at most `count`
        // are ever free. A BufId of another pool would be a caller bug; ignore it
        // rather than corrupt the stack.
        if id.0 < self.count {
            if let Some(c) = self.free.get(top) {
                c.set(id.0);
                self.top.set(top + 1);
            }
        }
    }

    /// Number of free buffers.
    pub fn available(&self) -> usize {
        self.top.get()
    }

    /// Number of buffers.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Usable bytes per buffer (what the caller asked for).
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// What backs the pool.
    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    /// Whether `mlock` succeeded.
    pub fn locked(&self) -> bool {
        self.locked
    }

    /// The buffer's bytes.
    pub fn buf<'a>(&'a self, id: &'a BufId) -> &'a [u8] {
        // SAFETY: `ptr` is inside the live mapping with `buf_size` bytes after it. The
        // memory is only reachable through this BufId, and the shared borrow of `id`
        // keeps `buf_mut` (which needs `&mut BufId`) and hand-over to the kernel (which
        // moves the BufId) away while the slice lives.
        unsafe { std::slice::from_raw_parts(self.ptr(id), self.buf_size) }
    }

    /// The buffer's bytes, writable.
    #[allow(clippy::mut_from_ref)] // exclusivity comes from `&mut BufId`, see SAFETY
    pub fn buf_mut<'a>(&'a self, id: &'a mut BufId) -> &'a mut [u8] {
        // SAFETY: as in `buf`; each buffer has exactly one BufId, so the exclusive
        // borrow of `id` makes this the only reference to these bytes while it lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(id), self.buf_size) }
    }

    /// Start of a buffer, for building SQEs. The caller must hand the `BufId` to the
    /// kernel-ownership table together with the SQE that uses this pointer.
    pub(crate) fn ptr(&self, id: &BufId) -> *mut u8 {
        let i = (id.0.min(self.count - 1)) as usize;
        // SAFETY: i < count, so i * stride + buf_size <= map_len: in bounds of the mapping.
        unsafe { self.base.as_ptr().add(i * self.stride) }
    }

    /// One iovec per buffer (index = [`BufId::index`]) for `IORING_REGISTER_BUFFERS`.
    /// They stay valid as long as the pool lives: unregister (or drop the ring) first.
    pub fn iovecs(&self) -> Vec<libc::iovec> {
        (0..self.count)
            .map(|i| libc::iovec {
                iov_base: self.ptr(&BufId(i)).cast(),
                iov_len: self.buf_size,
            })
            .collect()
    }
}

impl Drop for BufPool {
    fn drop(&mut self) {
        // SAFETY: the mapping was created by `map` with exactly this base and length,
        // and no BufId can outlive the pool in a way that reaches memory (all access
        // goes through `&self`).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len) };
    }
}

/// `mmap` anonymous, private, populated memory with `extra` flags.
fn map(len: usize, extra: libc::c_int) -> io::Result<NonNull<u8>> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE | extra;
    // SAFETY: anonymous mapping at a kernel-chosen address: touches no existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))
}

/// Hugepage counters from `/proc/meminfo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugeInfo {
    pub total: u64,
    pub free: u64,
    /// Default hugepage size in bytes (what `MAP_HUGETLB` without a size flag uses).
    pub page_size: usize,
}

/// Read the hugepage counters (`None`: no hugetlb support or no `/proc`).
pub fn huge_info() -> Option<HugeInfo> {
    parse_meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

fn parse_meminfo(text: &str) -> Option<HugeInfo> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        line[name.len()..].split_whitespace().next()?.parse().ok()
    };
    let kib = field("Hugepagesize:")?;
    Some(HugeInfo {
        total: field("HugePages_Total:")?,
        free: field("HugePages_Free:")?,
        page_size: usize::try_from(kib.checked_mul(1024)?).ok()?,
    })
}

fn try_huge(
    cfg: &PoolConfig,
    bytes: usize,
) -> Result<(NonNull<u8>, usize, u64, usize), NoHugepages> {
    if !cfg.hugepages {
        return Err(NoHugepages::Disabled);
    }
    let info = huge_info()
        .ok_or_else(|| NoHugepages::Unsupported("no HugePages lines in /proc/meminfo".into()))?;
    if info.total == 0 {
        return Err(NoHugepages::NoneReserved);
    }
    if info.page_size == 0 {
        return Err(NoHugepages::Unsupported("hugepage size 0".into()));
    }
    let pages = bytes.div_ceil(info.page_size) as u64;
    if info.free < pages {
        return Err(NoHugepages::NotEnoughFree {
            needed: pages,
            free: info.free,
        });
    }
    let len = pages as usize * info.page_size;
    // MAP_POPULATE with MAP_HUGETLB takes the pages now, so a shortage shows up as an
    // mmap error here rather than as SIGBUS on first touch.
    let base = map(len, libc::MAP_HUGETLB).map_err(|e| NoHugepages::MapFailed(e.to_string()))?;
    Ok((base, len, pages, info.page_size))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Tests that change `vm.nr_hugepages` or count free hugepages run one at a time.
    pub(crate) static HUGE_LOCK: Mutex<()> = Mutex::new(());

    pub(crate) fn set_nr_hugepages(n: u64) -> bool {
        std::fs::write("/proc/sys/vm/nr_hugepages", n.to_string()).is_ok()
    }

    pub(crate) fn nr_hugepages() -> Option<u64> {
        std::fs::read_to_string("/proc/sys/vm/nr_hugepages")
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Restores `vm.nr_hugepages` when dropped (also when the test panics).
    pub(crate) struct Restore(pub(crate) u64);
    impl Drop for Restore {
        fn drop(&mut self) {
            set_nr_hugepages(self.0);
        }
    }

    #[test]
    fn parses_meminfo() {
        let t = "MemTotal: 1 kB\nHugePages_Total:       8\nHugePages_Free:        5\nHugepagesize:       2048 kB\n";
        assert_eq!(
            parse_meminfo(t),
            Some(HugeInfo {
                total: 8,
                free: 5,
                page_size: 2 << 20
            })
        );
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
        assert_eq!(
            parse_meminfo("HugePages_Total: x\nHugePages_Free: 1\nHugepagesize: 2048 kB"),
            None
        );
    }

    #[test]
    fn hugepages_needed_per_pool() {
        // 4096 x 68 KiB = 272 MiB = 136 pages of 2 MiB.
        assert_eq!(PoolConfig::new(4096).hugepages_needed(2 << 20), 136);
        assert_eq!(PoolConfig::new(40).hugepages_needed(2 << 20), 2);
        assert_eq!(
            PoolConfig {
                count: 1,
                buf_size: 1,
                hugepages: true
            }
            .bytes(),
            4096
        );
    }

    #[test]
    fn rejects_bad_sizes() {
        let mut c = PoolConfig::new(0);
        assert!(matches!(BufPool::new(&c), Err(PoolError::BadCount(0))));
        c.count = MAX_BUFFERS + 1;
        assert!(matches!(BufPool::new(&c), Err(PoolError::BadCount(_))));
        c.count = 1;
        c.buf_size = 0;
        assert!(matches!(BufPool::new(&c), Err(PoolError::BadSize(0))));
        assert!(PoolError::BadCount(0).to_string().contains("Buffers ="));
    }

    #[test]
    fn forced_ordinary_pages_alloc_free_and_iovecs() {
        let pool = BufPool::new(&PoolConfig {
            count: 4,
            buf_size: 3000,
            hugepages: false,
        })
        .expect("pool");
        assert_eq!(pool.backing(), &Backing::Normal(NoHugepages::Disabled));
        assert_eq!(pool.available(), 4);
        let mut a = pool.alloc().expect("a");
        let b = pool.alloc().expect("b");
        assert_ne!(a.index(), b.index());
        pool.buf_mut(&mut a)[..5].copy_from_slice(b"hello");
        assert_eq!(&pool.buf(&a)[..5], b"hello");
        assert_eq!(pool.buf(&b).len(), 3000);
        let iov = pool.iovecs();
        assert_eq!(iov.len(), 4);
        assert_eq!(
            iov[a.index() as usize].iov_base as *const u8,
            pool.buf(&a).as_ptr()
        );
        // Buffers are page-aligned and do not overlap.
        assert!(iov
            .iter()
            .all(|v| (v.iov_base as usize).is_multiple_of(4096) && v.iov_len == 3000));
        let (c, d) = (pool.alloc().expect("c"), pool.alloc().expect("d"));
        assert!(pool.alloc().is_none(), "only 4 buffers");
        for id in [a, b, c, d] {
            pool.free(id);
        }
        assert_eq!(pool.available(), 4);
    }

    #[test]
    #[ignore = "needs root (sets vm.nr_hugepages): ci/test.sh unit runs it with --include-ignored"]
    fn hugepages_are_taken_while_the_pool_lives() {
        let _g = HUGE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let Some(old) = nr_hugepages() else {
            crate::testutil::not_run("no /proc/sys/vm/nr_hugepages (kernel without hugetlb)");
            return;
        };
        let _restore = Restore(old);
        if !set_nr_hugepages(old + 4) {
            crate::testutil::not_run("cannot write vm.nr_hugepages");
            return;
        }
        let before = huge_info().expect("meminfo");
        if before.free < 3 || before.page_size != 2 << 20 {
            crate::testutil::not_run(&format!(
                "the kernel reserved only {} free hugepages of {} B",
                before.free, before.page_size
            ));
            return;
        }
        // 40 buffers of 68 KiB = 2.7 MiB: two 2 MiB pages.
        let pool = BufPool::new(&PoolConfig::new(40)).expect("pool");
        assert_eq!(
            pool.backing(),
            &Backing::Huge {
                pages: 2,
                page_size: 2 << 20
            }
        );
        assert_eq!(pool.summary().0, log::Level::Info);
        assert!(
            pool.summary().1.contains("on 2 hugepages of 2048 KiB"),
            "{}",
            pool.summary().1
        );
        let during = huge_info().expect("meminfo");
        assert_eq!(
            before.free - during.free,
            2,
            "free hugepages {before:?} -> {during:?}"
        );
        let mut id = pool.alloc().expect("buf");
        pool.buf_mut(&mut id).fill(0xa5);
        assert!(pool.buf(&id).iter().all(|&b| b == 0xa5));
        pool.free(id);
        drop(pool);
        assert_eq!(huge_info().expect("meminfo").free, before.free);
    }

    #[test]
    #[ignore = "needs root (sets vm.nr_hugepages): ci/test.sh unit runs it with --include-ignored"]
    fn falls_back_when_no_hugepages_are_reserved() {
        let _g = HUGE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let Some(old) = nr_hugepages() else {
            crate::testutil::not_run("no /proc/sys/vm/nr_hugepages");
            return;
        };
        let _restore = Restore(old);
        if !set_nr_hugepages(0) || nr_hugepages() != Some(0) {
            crate::testutil::not_run("cannot set vm.nr_hugepages to 0 (pages in use elsewhere)");
            return;
        }
        let pool = BufPool::new(&PoolConfig::new(2)).expect("pool");
        assert_eq!(pool.backing(), &Backing::Normal(NoHugepages::NoneReserved));
        let (level, line) = pool.summary();
        assert_eq!(level, log::Level::Warn);
        assert!(
            line.contains("not hugepages") && line.contains("vm.nr_hugepages = 0"),
            "{line}"
        );
        assert!(NoHugepages::NoneReserved
            .to_string()
            .contains("vm.nr_hugepages"));
        // Too few free pages is its own reason.
        let msg = NoHugepages::NotEnoughFree { needed: 3, free: 1 }.to_string();
        assert!(msg.contains('3') && msg.contains('1'));
    }
}
