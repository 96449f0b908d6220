//! RiceGuard's OS-facing layer (crate `riceguard-sys`, re-exported by the gateway as
//! `riceguard::sys`): every `unsafe` block and raw kernel interface of the firmware lives
//! here, each block with a `// SAFETY:` line saying why it holds, each `unsafe fn` with a
//! `# Safety` section. The gateway crate above says `#![forbid(unsafe_code)]`; this crate
//! depends on `riceguard-core` for the types it fills in and never on the gateway.

pub mod cmsg;
pub mod ethtool;
pub mod hugepage;
pub mod kernel_clocks;
pub mod netlink;
pub mod nftables;
pub mod nic;
pub mod offload;
pub mod os;
pub mod probe;
pub mod process;
pub mod tcp;
#[cfg(any(test, feature = "testutil"))]
pub mod testutil;
pub mod tun;
pub mod udp;
pub mod uring;

/// `SO_MARK` on any socket, UDP or TCP (`None`: no mark). Setting a mark needs
/// `CAP_NET_ADMIN`; clearing one that was never set is skipped, so it needs nothing.
pub fn set_mark(fd: &impl std::os::fd::AsFd, mark: Option<u32>) -> std::io::Result<()> {
    use nix::sys::socket::{getsockopt, setsockopt, sockopt::Mark};
    let m = mark.unwrap_or(0);
    if m == 0 && getsockopt(fd, Mark)? == 0 {
        return Ok(());
    }
    Ok(setsockopt(fd, Mark, &m)?)
}

/// Every `unsafe` block, `unsafe fn` and `unsafe impl` says why it holds: a `// SAFETY:`
/// line (or an `unsafe fn`'s `# Safety` section) at most 8 lines above. Clippy's
/// `undocumented_unsafe_blocks` checks blocks and impls; this also covers private
/// `unsafe fn`s, which `missing_safety_doc` skips.
#[cfg(test)]
mod safety_comments {
    fn files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read the sources") {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    fn undocumented(src: &str) -> Vec<usize> {
        let lines: Vec<&str> = src.lines().collect();
        let mut bad = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            let code = l.trim_start();
            if code.starts_with("//") {
                continue;
            }
            // A keyword in code, not in a string (this file's own needles).
            let is_code = |k: &str| code.contains(k) && !code.contains(&format!("\"{k}"));
            if !["unsafe {", "unsafe fn", "unsafe impl"]
                .into_iter()
                .any(is_code)
            {
                continue;
            }
            let said = lines[i.saturating_sub(8)..=i]
                .iter()
                .any(|l| l.contains("SAFETY:") || l.contains("# Safety"));
            if !said {
                bad.push(i + 1);
            }
        }
        bad
    }

    #[test]
    fn every_unsafe_says_why() {
        let mut list = Vec::new();
        files(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut list,
        );
        let mut bad = Vec::new();
        let mut seen = 0;
        for f in &list {
            let src = std::fs::read_to_string(f).expect("a source file");
            seen += src.matches("unsafe {").count();
            bad.extend(
                undocumented(&src)
                    .into_iter()
                    .map(|n| format!("{}:{n}", f.display())),
            );
        }
        assert!(seen > 20, "the sources were found ({seen} unsafe blocks)");
        assert!(
            bad.is_empty(),
            "unsafe without a SAFETY: comment above: {bad:?}"
        );
    }

    #[test]
    fn the_check_sees_a_missing_comment() {
        // In two pieces, so that this line is no block for the check above.
        let block = ["    unsafe", " { g(x) }"].concat();
        let src = ["fn f() {", "    let x = 1;", &block, "}"].join("\n");
        assert_eq!(undocumented(&src), vec![3]);
    }
}
