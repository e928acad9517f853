//! The import graph keeps its layers: no file imports from a layer above
//! its own, no import circle spans more than four files, and every circle
//! is one named here (the list can only shrink). And every
//! lock is a `lock::Lock`, defined in `src/lock.rs` alone.
//!
//! The layer order is written once, in the crate's `lib.rs` (the lines
//! `//! N. name: module, module`); this test reads it from there. It parses
//! every file's `crate::`, `$crate::`, `super::` and `self::` paths (use
//! trees included) and the paths through its own child modules, resolves
//! each to the file that defines the module, and checks the edges. Pure
//! Rust text reading: nothing is built.

mod source;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Up-edges still standing, each named so the list can only shrink: the
/// test fails on an up-edge missing here, and on an entry here that no
/// longer exists.
const CORE_ALLOWED_UP: &[(&str, &str, &str)] = &[];

/// The largest import circle allowed: the hook table and its exports.
const MAX_CIRCLE: usize = 4;

/// The circles still standing, each named (modules sorted) so the list can
/// only shrink: the test fails on a circle missing here, and on an entry
/// that is no longer a circle.
const CORE_CIRCLES: &[&[&str]] = &[
    // The hook table, the two export lists it holds, and the lookup that
    // consults it (`cuGetProcAddress`).
    &[
        "cuda::exports",
        "cuda::proc_address",
        "interpose::table",
        "nvml::exports",
    ],
];

/// vgpu-shm's: none.
const SHM_CIRCLES: &[&[&str]] = &[];

#[test]
fn core_imports_keep_their_layers() {
    check(
        Path::new("src"),
        "lib.rs",
        &["shm"],
        CORE_ALLOWED_UP,
        CORE_CIRCLES,
    );
}

#[test]
fn shm_imports_keep_their_layers() {
    check(Path::new("src/shm"), "lib.rs", &[], &[], SHM_CIRCLES);
}

#[test]
fn vgpuctl_has_no_import_circle() {
    // (No layer order there: a tool, not a library others build on; but
    // a circle among its modules, as `serve` had, fails.)
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("vgpuctl/src");
    let g = graph(&root, "lib.rs", &[]);
    assert!(g.edges.len() > 10, "vgpuctl's modules not found");
    let cs = circles(&g);
    assert!(cs.is_empty(), "import circles in vgpuctl/src: {cs:?}");
}

/// Words that make a lock the fork handlers would not know of.
const LOCK_WORDS: &[&str] = &["Mutex", "Condvar", "RwLock", "ReentrantLock", "parking_lot"];

/// Every lock is a `lock::Lock` (or `CondLock`), which the fork handlers
/// take and renew (`fork.rs`): no mutex, condition variable or rwlock
/// outside `src/lock.rs` (vgpu-shm's own in `src/shm/lock.rs`), static or
/// in a value, outside tests.
#[test]
fn every_lock_lives_in_lock_rs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for (dir, allowed) in [("src", "src/lock.rs"), ("src/shm", "src/shm/lock.rs")] {
        let skip: &[&str] = if dir == "src" { &["shm"] } else { &[] };
        for file in modules(&root.join(dir), "lib.rs", skip).into_values() {
            let rel = file
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if rel == allowed {
                continue;
            }
            let text = strip(&fs::read_to_string(&file).unwrap());
            for word in lock_words(&text) {
                found.push(format!("{rel}: {word}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "locks outside src/lock.rs, which fork.rs cannot take before a fork (make them lock::Lock):\n  {}",
        found.join("\n  ")
    );
}

/// Every `Lock`/`CondLock` static is on its module's `locks()` list, which
/// `fork.rs` joins (tests/fork.rs checks each module's list is joined): a
/// lock left off would be held by another thread at a fork.
#[test]
fn every_lock_static_is_on_its_modules_list() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    for file in modules(&root.join("src"), "lib.rs", &["shm"]).into_values() {
        let text = strip(&fs::read_to_string(&file).unwrap());
        let listed = text.find("fn locks(").map_or("", |at| &text[at..]);
        for name in lock_statics(&text) {
            if !listed.contains(&format!("&{name}")) {
                missing.push(format!("{}: {name}", file.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "lock statics not on their module's locks() list:\n  {}",
        missing.join("\n  ")
    );
}

/// Names of the `static NAME: Lock<..>` / `CondLock<..>` in `text`.
fn lock_statics(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim_start().split_once("static "))
        .filter_map(|(_, rest)| rest.split_once(':'))
        .filter(|(_, ty)| {
            let ty = ty.trim_start();
            ty.starts_with("Lock<") || ty.starts_with("CondLock<")
        })
        .map(|(name, _)| name.trim().to_string())
        .collect()
}

#[test]
fn lock_statics_are_found() {
    let text =
        "pub static A: Lock<u8> = x;\nstatic B: CondLock<()> = y;\nstatic C: OnceLock<u8> = z;\n";
    assert_eq!(lock_statics(text), ["A", "B"]);
}

/// The [`LOCK_WORDS`] used in `text` (whole identifiers).
fn lock_words(text: &str) -> Vec<&str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| LOCK_WORDS.contains(w))
        .collect()
}

#[test]
fn lock_words_are_seen_in_code_not_in_comments() {
    let text = "static A: std::sync::Mutex<u8> = x; // a Condvar\nstatic B: OnceLock<parking_lot::RwLock<()>>;\nlet g: MutexGuard<'_, ()>;\n";
    assert_eq!(lock_words(&strip(text)), ["Mutex", "parking_lot", "RwLock"]);
}

#[test]
fn the_parser_sees_grouped_super_and_macro_paths() {
    let text =
        "use super::{a::{self, B}, c};\nfn f() { $crate::d::e::f(); crate::g::H; }\n// crate::zz\n";
    let paths = paths_in(&strip(text));
    let mut got: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    got.sort();
    assert_eq!(
        got,
        [
            "crate::d::e::f",
            "crate::g::H",
            "super::a",
            "super::a::B",
            "super::c"
        ]
    );
}

/// One crate's files: module path (`a::b`) → file.
fn modules(root: &Path, lib: &str, skip: &[&str]) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    for rel in source::rust_files(root, skip) {
        let stem = rel.trim_end_matches(".rs");
        // Test-only files (`#[cfg(test)] mod tests;`) are not layers.
        if stem == lib.trim_end_matches(".rs") || stem.ends_with("tests") {
            continue;
        }
        let m = stem.trim_end_matches("/mod").replace('/', "::");
        out.insert(m, root.join(&rel));
    }
    out
}

/// `mod tests`, `pub(super) mod tests` and the like.
fn is_tests_mod(line: &str) -> bool {
    let l = line.strip_prefix("pub").map_or(line, |r| {
        r.strip_prefix(char::is_whitespace)
            .or_else(|| r.split_once(')').map(|(_, rest)| rest))
            .unwrap_or(r)
    });
    l.trim_start().starts_with("mod tests")
}

/// Text without comments, string and char literals, and test modules.
fn strip(text: &str) -> String {
    // Everything from a `#[cfg(test)]` (or `#[cfg(all(test, ...))]`)
    // `mod tests` on is test code.
    let mut at = 0;
    let mut cut = text.len();
    let mut lines = text.split_inclusive('\n').peekable();
    while let Some(line) = lines.next() {
        let l = line.trim_start();
        if l.starts_with("#[cfg(")
            && l.contains("test")
            && lines.peek().is_some_and(|n| is_tests_mod(n.trim_start()))
        {
            cut = at;
            break;
        }
        at += line.len();
    }
    let text = &text[..cut];
    let b = text.as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == b'r' && matches!(b.get(i + 1), Some(b'#') | Some(b'"')) && !ident(b, i) {
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            j += 1;
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            i = j + close.len();
            out.push_str("\"\"");
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\''), or a lifetime ('a).
            if b.get(i + 1) == Some(&b'\\') {
                i += 2;
                while i < b.len() && b[i] != b'\'' {
                    i += 1;
                }
                i += 1;
            } else if b.get(i + 2) == Some(&b'\'') {
                i += 3;
            } else {
                out.push('\'');
                i += 1;
            }
        } else {
            out.push(c as char);
            i += 1;
        }
    }
    out
}

/// Inside `macro_rules!` bodies, `super::` and `self::` mean the module
/// the macro expands in, not this file: they are dropped (`$crate::`
/// paths, absolute, stay).
fn macro_bodies_relative(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("macro_rules!") {
        let Some(open) = rest[i..].find('{').map(|o| i + o) else {
            break;
        };
        let mut depth = 0;
        let mut close = rest.len();
        for (k, c) in rest[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + k;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push_str(&rest[..open]);
        out.push_str(
            &rest[open..close]
                .replace("super::", "_::")
                .replace("self::", "_::"),
        );
        rest = &rest[close..];
    }
    out.push_str(rest);
    out
}

fn ident(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

fn is_id(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Every path that starts with `crate`, `super` or `self` (or one of
/// `extra`'s names), use trees expanded.
fn paths_in(text: &str) -> Vec<Vec<String>> {
    paths_from(text, &[])
}

fn paths_from(text: &str, extra: &[String]) -> Vec<Vec<String>> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !is_id(b[i]) || (i > 0 && (is_id(b[i - 1]) || b[i - 1] == b'.')) {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && is_id(b[j]) {
            j += 1;
        }
        let word = &text[i..j];
        // `a::b` preceded by `::` is a continuation, not a start.
        let after_colons = i >= 2 && &b[i - 2..i] == b"::";
        let starts = matches!(word, "crate" | "super" | "self") || extra.iter().any(|e| e == word);
        if starts && !after_colons && text[j..].starts_with("::") {
            let (trees, end) = tree(b, j + 2);
            for t in trees {
                let mut p = vec![word.to_string()];
                p.extend(t);
                out.push(p);
            }
            i = end.max(j);
        } else {
            i = j;
        }
    }
    out
}

/// Parses the rest of a path from `i` (after `::`): segments, a `{...}`
/// group, or `*`. Returns the expanded tails and where it stopped.
fn tree(b: &[u8], mut i: usize) -> (Vec<Vec<String>>, usize) {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    if i >= b.len() {
        return (vec![vec![]], i);
    }
    if b[i] == b'{' {
        let mut all = Vec::new();
        i += 1;
        loop {
            while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
                i += 1;
            }
            if i >= b.len() || b[i] == b'}' {
                return (all, i + 1);
            }
            let (t, end) = tree(b, i);
            all.extend(t);
            // Skip an `as name` and anything else up to `,` or `}`.
            i = end;
            while i < b.len() && b[i] != b',' && b[i] != b'}' {
                i += 1;
            }
        }
    }
    if b[i] == b'*' {
        return (vec![vec![]], i + 1);
    }
    let s = i;
    while i < b.len() && is_id(b[i]) {
        i += 1;
    }
    if s == i {
        return (vec![vec![]], i);
    }
    let seg = String::from_utf8_lossy(&b[s..i]).into_owned();
    if b[i..].starts_with(b"::") {
        let (rest, end) = tree(b, i + 2);
        let out = rest
            .into_iter()
            .map(|mut r| {
                if r.first().map(String::as_str) == Some("self") {
                    r.remove(0);
                }
                let mut p = vec![seg.clone()];
                p.extend(r);
                p
            })
            .collect();
        return (out, end);
    }
    if seg == "self" {
        return (vec![vec![]], i);
    }
    (vec![vec![seg]], i)
}

/// Child modules a file declares (`mod x;`), which it may name bare.
fn children(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let l = line.trim_start();
        let l = l
            .strip_prefix("pub(crate) ")
            .or_else(|| l.strip_prefix("pub "))
            .unwrap_or(l);
        if let Some(rest) = l.strip_prefix("mod ")
            && let Some(name) = rest.strip_suffix(';')
        {
            out.push(name.trim().to_string());
        }
    }
    out
}

/// The crate root's `pub use a::b::{X, Y}`: name → module path it names.
fn root_reexports(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for stmt in text.split(';') {
        let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        for p in paths_from(&format!("self::{rest}"), &[]) {
            if let Some(name) = p.last() {
                out.insert(name.clone(), p[1..].to_vec());
            }
        }
    }
    out
}

struct Graph {
    /// file module → modules it imports from (other files of the crate).
    edges: BTreeMap<String, BTreeSet<String>>,
}

fn graph(root: &Path, lib: &str, skip: &[&str]) -> Graph {
    let mods = modules(root, lib, skip);
    let lib_text = strip(&fs::read_to_string(root.join(lib)).unwrap());
    let reexp = root_reexports(&lib_text);
    let top: Vec<String> = children(&lib_text);
    let mut edges = BTreeMap::new();
    for (m, file) in &mods {
        let raw = fs::read_to_string(file).unwrap();
        let text = macro_bodies_relative(&strip(&raw.replace("$crate::", "crate::")));
        let here: Vec<String> = m.split("::").map(String::from).collect();
        let is_dir_mod = file.ends_with("mod.rs");
        // `self` of a file is its module; `super` is its parent.
        let parent: Vec<String> = here[..here.len() - 1].to_vec();
        let kids = children(&text);
        let mut out = BTreeSet::new();
        for p in paths_from(&text, &kids) {
            let abs: Vec<String> = match p[0].as_str() {
                "crate" => p[1..].to_vec(),
                "super" => {
                    let mut base = parent.clone();
                    let mut rest = &p[1..];
                    while rest.first().map(String::as_str) == Some("super") {
                        base.pop();
                        rest = &rest[1..];
                    }
                    base.iter().chain(rest).cloned().collect()
                }
                "self" => here.iter().chain(&p[1..]).cloned().collect(),
                _ => here.iter().chain(&p).cloned().collect(),
            };
            let _ = is_dir_mod;
            let abs = match abs.first() {
                Some(first) if !top.contains(first) => match reexp.get(first) {
                    Some(target) => target.clone(),
                    None => continue,
                },
                Some(_) => abs,
                None => continue,
            };
            // The longest prefix that is a file of this crate.
            let target = (1..=abs.len())
                .rev()
                .map(|n| abs[..n].join("::"))
                .find(|k| mods.contains_key(k));
            if let Some(t) = target
                && &t != m
            {
                out.insert(t);
            }
        }
        edges.insert(m.clone(), out);
    }
    Graph { edges }
}

/// The layer order from `lib.rs`: lines `//! N. name: a, b::c, d`, each
/// list going on over indented `//!    e, f` lines.
fn layers(lib_text: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut open = false;
    for line in lib_text.lines() {
        let Some(l) = line.strip_prefix("//!") else {
            open = false;
            continue;
        };
        let list = |t: &str| -> Vec<String> {
            t.split(',')
                .map(|s| s.trim().trim_matches('`').to_string())
                .filter(|s| !s.is_empty())
                .collect()
        };
        if open && l.starts_with("    ") {
            if let Some(last) = out.last_mut() {
                last.1.extend(list(l));
            }
            continue;
        }
        open = false;
        let Some((num, rest)) = l.trim_start().split_once(". ") else {
            continue;
        };
        if num.parse::<u32>().is_err() {
            continue;
        }
        let Some((name, mods)) = rest.split_once(": ") else {
            continue;
        };
        out.push((name.to_string(), list(mods)));
        open = true;
    }
    out
}

/// The layer of a module: its longest prefix named in the order (0 = top).
fn layer_of(order: &[(String, Vec<String>)], m: &str) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (i, (_, mods)) in order.iter().enumerate() {
        for p in mods {
            if (m == p || m.starts_with(&format!("{p}::")))
                && best.is_none_or(|(len, _)| p.len() > len)
            {
                best = Some((p.len(), i));
            }
        }
    }
    best.map(|(_, i)| i)
}

/// Strongly connected components of more than one file (Tarjan).
fn circles(g: &Graph) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        for w in &t.g.edges[v] {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut c = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                c.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if c.len() > 1 {
                c.sort();
                t.out.push(c);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: vec![],
        on: BTreeSet::new(),
        out: vec![],
    };
    for v in g.edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn check(root: &Path, lib: &str, skip: &[&str], allowed: &[(&str, &str, &str)], named: &[&[&str]]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(root);
    let lib_text = fs::read_to_string(root.join(lib)).unwrap();
    let order = layers(&lib_text);
    assert!(
        order.len() >= 2,
        "{}: no layer order (`//! 1. name: modules`)",
        root.join(lib).display()
    );
    let g = graph(&root, lib, skip);
    let mut problems = Vec::new();
    let mut up = BTreeSet::new();
    for (from, tos) in &g.edges {
        let Some(lf) = layer_of(&order, from) else {
            problems.push(format!("{from}: in no layer of {lib}'s order"));
            continue;
        };
        for to in tos {
            let Some(lt) = layer_of(&order, to) else {
                continue;
            };
            if lt < lf {
                up.insert((from.clone(), to.clone()));
                if !allowed.iter().any(|(f, t, _)| f == from && t == to) {
                    problems.push(format!(
                        "{from} ({}) imports {to} ({}), a layer above it",
                        order[lf].0, order[lt].0
                    ));
                }
            }
        }
    }
    for (_, mods) in &order {
        for p in mods {
            if !g
                .edges
                .keys()
                .any(|m| m == p || m.starts_with(&format!("{p}::")))
            {
                problems.push(format!("{lib}'s layer order names {p}, which is no file"));
            }
        }
    }
    for (f, t, why) in allowed {
        if !up.contains(&(f.to_string(), t.to_string())) {
            problems.push(format!(
                "allowed up-edge {f} -> {t} ({why}) is gone: remove it from the list"
            ));
        }
    }
    let cs = circles(&g);
    if std::env::var_os("LAYERS_DUMP").is_some() {
        for (from, tos) in &g.edges {
            eprintln!(
                "  {from} -> {}",
                tos.iter().cloned().collect::<Vec<_>>().join(", ")
            );
        }
    }
    let edges: usize = g.edges.values().map(BTreeSet::len).sum();
    eprintln!(
        "{}: {} files, {} edges, {} up, circles of {:?} files",
        root.display(),
        g.edges.len(),
        edges,
        up.len(),
        cs.iter().map(Vec::len).collect::<Vec<_>>()
    );
    let mut seen = Vec::new();
    for c in cs {
        eprintln!("  circle: {}", c.join(", "));
        let mut sorted: Vec<&str> = c.iter().map(String::as_str).collect();
        sorted.sort();
        if c.len() > MAX_CIRCLE {
            problems.push(format!(
                "an import circle of {} files: {}",
                c.len(),
                c.join(", ")
            ));
        } else if !named.contains(&sorted.as_slice()) {
            problems.push(format!(
                "a new import circle: {} (cut it, or name it in this test's list)",
                sorted.join(", ")
            ));
        }
        seen.push(sorted.join(","));
    }
    for c in named {
        if !seen.contains(&c.join(",")) {
            problems.push(format!(
                "{} is no longer a circle: drop it from this test's list",
                c.join(", ")
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{}:\n  {}",
        root.display(),
        problems.join("\n  ")
    );
}
