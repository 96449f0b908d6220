//! Kernel modules: the board's list in order, each after its dependencies from
//! `modules.dep` (built-ins skipped), loaded with `finit_module`.

use std::path::PathBuf;

use crate::sys::os;

/// Load each module with its dependencies first, as `modules.dep` lists them.
pub(super) fn load_modules(names: &[String]) {
    let rel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let base = PathBuf::from(format!("/lib/modules/{rel}"));
    let dep = std::fs::read_to_string(base.join("modules.dep")).unwrap_or_default();
    let builtin = std::fs::read_to_string(base.join("modules.builtin")).unwrap_or_default();
    let db = ModDeps::parse(&dep);
    let mut loaded: Vec<String> = Vec::new();
    let mut failed = 0;
    let mut absent = 0;
    for name in names {
        let Some(order) = db.order(name) else {
            if ModDeps::is_builtin(&builtin, name) {
                continue;
            }
            say!("module {name}: not in this kernel's modules.dep (board MODULES?)");
            failed += 1;
            continue;
        };
        for path in order {
            if loaded.iter().any(|l| l == path) {
                continue;
            }
            match os::load_module(&base.join(path), "") {
                Ok(()) => loaded.push(path.to_string()),
                // A driver whose hardware is absent (a board lists every watchdog or
                // NIC it may have) refuses to load with ENODEV: not a fault.
                Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {
                    absent += 1;
                    loaded.push(path.to_string());
                }
                Err(e) => {
                    say!("module {path}: {e}");
                    failed += 1;
                }
            }
        }
    }
    say!(
        "{} modules loaded{}{}",
        loaded.len() - absent,
        if absent > 0 {
            format!(", {absent} without their hardware")
        } else {
            String::new()
        },
        if failed > 0 {
            format!(", {failed} failed")
        } else {
            String::new()
        }
    );
}

/// `modules.dep`: `kernel/x/y.ko: dep1.ko dep2.ko` (deps listed dependents-first).
pub(super) struct ModDeps<'a> {
    lines: Vec<(&'a str, Vec<&'a str>)>,
}

pub(super) fn mod_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

impl<'a> ModDeps<'a> {
    fn parse(text: &'a str) -> Self {
        let lines = text
            .lines()
            .take(100_000)
            .filter_map(|l| {
                let (m, deps) = l.split_once(':')?;
                Some((m.trim(), deps.split_whitespace().collect()))
            })
            .collect();
        ModDeps { lines }
    }

    /// Paths to load for `name`, dependencies first.
    fn order(&self, name: &str) -> Option<Vec<&'a str>> {
        let want = name.replace('-', "_");
        let (path, deps) = self.lines.iter().find(|(p, _)| mod_name(p) == want)?;
        let mut v: Vec<&str> = deps.iter().rev().copied().collect();
        v.push(path);
        Some(v)
    }

    fn is_builtin(builtin: &str, name: &str) -> bool {
        let want = name.replace('-', "_");
        builtin.lines().any(|l| mod_name(l) == want)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_dep_order() {
        let dep = "kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko\n\
                   kernel/net/core/failover.ko:\nkernel/fs/nls/nls_iso8859-1.ko:\n";
        let db = ModDeps::parse(dep);
        assert_eq!(
            db.order("virtio_net").unwrap(),
            [
                "kernel/net/core/failover.ko",
                "kernel/drivers/net/net_failover.ko",
                "kernel/drivers/net/virtio_net.ko"
            ]
        );
        assert_eq!(
            db.order("nls_iso8859_1").unwrap(),
            ["kernel/fs/nls/nls_iso8859-1.ko"]
        );
        assert!(db.order("nope").is_none());
        assert!(ModDeps::is_builtin(
            "kernel/drivers/virtio/virtio_pci.ko\n",
            "virtio_pci"
        ));
    }
}
