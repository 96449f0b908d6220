//! The check that the sources' imports have no circle: between the files of each crate
//! (this one, the core and sys), between their top-level folders, and, finer, between
//! `driver/`'s folders (`dataplane`, `tcp`, `daemon`, `appliance`); and that no file but a
//! test module imports its parent wholesale (`use super::*`). It reads the sources,
//! resolves every `crate::…`, `super::…` and `self::…` path (and each name of a `{…}`
//! group) to the file that defines the module, and looks for strongly connected
//! components. A path into an inline `mod tests { … }` that starts with `super::` first
//! leaves the inline module, as the compiler does. Test code (inline `mod tests`, a
//! `tests.rs`) and a parent publishing its child's items (`pub use child::…`) are not
//! imports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("the source folder is readable")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

fn module_of(root: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(root).expect("under the root");
    let mut m: Module = rel
        .with_extension("")
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    if m.last().is_some_and(|s| s == "mod") {
        m.pop();
    }
    m
}

fn strip_comments(src: &str) -> String {
    src.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The byte just past the `}` matching the `{` before `from`.
fn block_end(b: &[u8], from: usize) -> usize {
    let mut depth = 1;
    let mut i = from;
    while depth > 0 && i < b.len() {
        match b[i] {
            b'{' => depth += 1,
            b'}' => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    i
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The paths at `src`: each as its segments, with where it starts.
fn paths(src: &str, prefix: &str) -> Vec<(usize, Vec<String>)> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    for start in [prefix, "super::", "self::"]
        .iter()
        .flat_map(|p| src.match_indices(p).map(|(i, _)| i))
    {
        if start > 0 && (is_ident(b[start - 1]) || b[start - 1] == b':') {
            continue; // the tail of a longer path, counted from its head
        }
        let mut segs = Vec::new();
        let mut i = start;
        loop {
            let s = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            if i == s {
                break;
            }
            segs.push(src[s..i].to_string());
            if src[i..].starts_with("::") {
                i += 2;
            } else {
                break;
            }
        }
        let group = src[i..].starts_with('{');
        if group {
            // A group: each name, one level deep.
            let end = block_end(b, i + 1);
            let inner = &src[i + 1..end.saturating_sub(1)];
            let mut depth = 0;
            let mut item = String::new();
            for c in inner.chars().chain([',']) {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        let head: String = item
                            .trim()
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        if !head.is_empty() {
                            let mut p = segs.clone();
                            p.push(head);
                            out.push((start, p));
                        }
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
        }
        // A group names its items: `use super::{clock, mkdir}` imports the sibling
        // `clock` and the parent's `mkdir`, each counted above, not the parent as such.
        if !group {
            out.push((start, segs));
        }
    }
    out
}

/// The import graph of the files under `root`, whose modules `prefix` (`crate::driver::`,
/// `crate::`) names.
fn graph(root: &Path, prefix: &str) -> BTreeMap<Module, BTreeSet<Module>> {
    let skip = prefix.matches("::").count();
    let mut list = Vec::new();
    files(root, &mut list);
    let mods: BTreeSet<Module> = list.iter().map(|f| module_of(root, f)).collect();
    let resolve = |path: &[String]| -> Module {
        (0..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|m| mods.contains(m))
            .unwrap_or_default()
    };
    let mut edges = BTreeMap::new();
    for f in &list {
        let me = module_of(root, f);
        // A test module's file (`tests.rs`) may use anything, as an inline one may.
        if me.last().is_some_and(|m| m == "tests") {
            edges.insert(me, BTreeSet::new());
            continue;
        }
        let src = strip_comments(&std::fs::read_to_string(f).expect("a source file"));
        let b = src.as_bytes();
        let inline: Vec<(usize, usize)> =
            src.match_indices("mod ")
                .filter_map(|(i, _)| {
                    let rest = &src[i + 4..];
                    let name_len = rest.bytes().take_while(|&c| is_ident(c)).count();
                    let after = rest[name_len..].trim_start();
                    (name_len > 0 && after.starts_with('{') && (i == 0 || !is_ident(b[i - 1])))
                        .then(|| {
                            let open = src.len() - after.len();
                            (i, block_end(b, open + 1))
                        })
                })
                .collect();
        // Test code (an inline `mod tests { … }`) may use anything: its paths are not
        // the file's imports.
        let tests: Vec<(usize, usize)> = inline
            .iter()
            .filter(|(a, _)| src[*a..].starts_with("mod tests"))
            .copied()
            .collect();
        let in_tests = |i: usize| tests.iter().any(|(a, b)| *a <= i && i < *b);
        // A parent publishing its child's items (`pub use client::{…}` in a mod.rs) is
        // the module's shape, not an import of the child.
        let reexport = |i: usize| {
            let line = src[..i].rsplit('\n').next().unwrap_or("").trim_start();
            line.starts_with("pub use ") || line.starts_with("pub(crate) use ")
        };
        let mut out = BTreeSet::new();
        // Bare paths to a child module (`worker::run` in a mod.rs).
        for child in mods
            .iter()
            .filter(|c| c.len() == me.len() + 1 && c.starts_with(&me))
        {
            let name = format!("{}::", child[me.len()]);
            if src.match_indices(&name).any(|(i, _)| {
                (i == 0 || !(is_ident(b[i - 1]) || b[i - 1] == b':'))
                    && !in_tests(i)
                    && !reexport(i)
            }) {
                out.insert(child.clone());
            }
        }
        for (at, segs) in paths(&src, prefix) {
            if in_tests(at) {
                continue;
            }
            let target = if segs.first().is_some_and(|s| s == "crate") {
                resolve(&segs[skip..])
            } else {
                let mut inline_depth = inline.iter().filter(|(a, b)| *a <= at && at < *b).count();
                let mut base = me.clone();
                let mut rest = segs.as_slice();
                while let Some(s) = rest.first().filter(|s| *s == "super" || *s == "self") {
                    if s == "super" {
                        if inline_depth > 0 {
                            inline_depth -= 1;
                        } else {
                            base.pop();
                        }
                    }
                    rest = &rest[1..];
                }
                if inline_depth > 0 {
                    continue; // inside this file's own inline module
                }
                base.extend(rest.iter().cloned());
                resolve(&base)
            };
            if target != me {
                out.insert(target);
            }
        }
        edges.insert(me, out);
    }
    edges
}

/// Strongly connected components of more than one node (Tarjan).
fn circles<N: Ord + Clone>(edges: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    struct T<'a, N> {
        e: &'a BTreeMap<N, BTreeSet<N>>,
        index: BTreeMap<N, usize>,
        low: BTreeMap<N, usize>,
        stack: Vec<N>,
        on: BTreeSet<N>,
        out: Vec<Vec<N>>,
    }
    fn go<N: Ord + Clone>(t: &mut T<'_, N>, v: &N) {
        let i = t.index.len();
        t.index.insert(v.clone(), i);
        t.low.insert(v.clone(), i);
        t.stack.push(v.clone());
        t.on.insert(v.clone());
        for w in t.e.get(v).into_iter().flatten() {
            if !t.index.contains_key(w) {
                go(t, w);
                let l = t.low[v].min(t.low[w]);
                t.low.insert(v.clone(), l);
            } else if t.on.contains(w) {
                let l = t.low[v].min(t.index[w]);
                t.low.insert(v.clone(), l);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(&w);
                let done = &w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            if comp.len() > 1 {
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        e: edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            go(&mut t, v);
        }
    }
    t.out
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/driver")
}

#[test]
fn no_circle_between_driver_files() {
    let g = graph(&root(), "crate::driver::");
    assert!(g.len() > 20, "the sources were found: {:?}", g.keys());
    let c = circles(&g);
    assert!(c.is_empty(), "circles of imports between files: {c:?}");
}

#[test]
fn no_circle_between_driver_folders() {
    let mut folders: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in graph(&root(), "crate::driver::") {
        let Some(a) = from.first() else { continue };
        for b in to.iter().filter_map(|t| t.first()) {
            if a != b {
                folders.entry(a.clone()).or_default().insert(b.clone());
            }
        }
    }
    assert!(
        folders
            .get("daemon")
            .is_some_and(|d| d.contains("dataplane")),
        "the graph sees the daemon's imports: {folders:?}"
    );
    let c = circles(&folders);
    assert!(c.is_empty(), "circles of imports between folders: {c:?}");
}

#[test]
fn the_check_sees_a_circle() {
    let dir = crate::testutil::TempDir::new("rgd-import-graph");
    std::fs::create_dir_all(dir.0.join("a")).unwrap();
    std::fs::write(dir.0.join("mod.rs"), "pub mod a;\n").unwrap();
    std::fs::write(dir.0.join("a/mod.rs"), "pub mod x;\npub mod y;\n").unwrap();
    std::fs::write(
        dir.0.join("a/x.rs"),
        "use crate::driver::a::y::Y;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
    )
    .unwrap();
    std::fs::write(dir.0.join("a/y.rs"), "use super::{x::X, z};\n").unwrap();
    let g = graph(&dir.0, "crate::driver::");
    let x = vec!["a".to_string(), "x".to_string()];
    let y = vec!["a".to_string(), "y".to_string()];
    assert_eq!(
        g[&x],
        BTreeSet::from([y.clone()]),
        "the test module's super is x"
    );
    assert!(g[&y].contains(&x));
    assert_eq!(circles(&g).len(), 1);
}

fn crate_root(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The top-level folders (and files) of `g` and their imports of each other.
fn top_level(g: &BTreeMap<Module, BTreeSet<Module>>) -> BTreeMap<String, BTreeSet<String>> {
    let mut folders: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in g {
        let Some(a) = from.first() else { continue };
        for b in to.iter().filter_map(|t| t.first()) {
            if a != b {
                folders.entry(a.clone()).or_default().insert(b.clone());
            }
        }
    }
    folders
}

#[test]
fn no_circle_in_either_crate() {
    for rel in ["src", "core/src", "sys/src"] {
        let g = graph(&crate_root(rel), "crate::");
        assert!(
            g.len() > 20,
            "{rel}: the sources were found: {:?}",
            g.keys()
        );
        let c = circles(&g);
        assert!(
            c.is_empty(),
            "{rel}: circles of imports between files: {c:?}"
        );
        let c = circles(&top_level(&g));
        assert!(
            c.is_empty(),
            "{rel}: circles of imports between folders: {c:?}"
        );
    }
    // The whole-crate graph sees across folders.
    let g = top_level(&graph(&crate_root("src"), "crate::"));
    assert!(g.get("init").is_some_and(|d| d.contains("perm")), "{g:?}");
    assert!(
        !g.get("init").is_some_and(|d| d.contains("console")),
        "init imports console: {g:?}"
    );
}

#[test]
fn no_file_imports_its_parent_wholesale() {
    let mut bad = Vec::new();
    for rel in ["src", "core/src", "sys/src"] {
        let root = crate_root(rel);
        let mut list = Vec::new();
        files(&root, &mut list);
        for f in list.iter().filter(|f| !f.ends_with("tests.rs")) {
            let src = std::fs::read_to_string(f).expect("a source file");
            // At the file's top level (a test module's `use super::*` is indented).
            if src.lines().any(|l| l.trim_end() == "use super::*;") {
                bad.push(f.strip_prefix(&root).unwrap_or(f).display().to_string());
            }
        }
    }
    assert!(
        bad.is_empty(),
        "files with a top-level `use super::*;`: {bad:?}"
    );
}
