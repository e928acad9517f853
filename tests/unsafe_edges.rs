//! `unsafe` stays at the FFI edges, and the edges say what they need.
//!
//! - Every file of the core and of vgpu-shm is under
//!   `#![forbid(unsafe_code)]` (its own, or a parent module's, which
//!   covers its children), except the edges listed here. The list can only
//!   shrink: a file missing from it fails, and so does an entry that is
//!   forbidden now or gone.
//! - In the real-function lists (`reals!`), a function taking a raw pointer
//!   (or writing at a `CUdeviceptr`, which may be host memory) is `unsafe
//!   fn`, and an `unsafe fn` does: the safe ones take
//!   numbers, handles and `In`/`Out` only, so code under forbid cannot
//!   reach a raw pointer's memory through them.
//! - `ffi::get`/`ffi::put`, which dereference what they are given, are
//!   `unsafe fn`.
//!
//! Pure Rust text reading: nothing is built.

mod source;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// The core's FFI edges: the only files that may hold `unsafe` code.
const CORE_EDGES: &[&str] = &[
    "clock.rs",
    "cuda/exports.rs",
    "cuda/mod.rs",
    "cuda/real.rs",
    "ffi.rs",
    "fork.rs",
    "init.rs",
    "interpose/dlsym.rs",
    "interpose/elf.rs",
    "interpose/mod.rs",
    "interpose/real.rs",
    "interpose/reals.rs",
    "interpose/stub.rs",
    "interpose/table.rs",
    "interpose/trampoline.rs",
    "lib.rs",
    "lock.rs",
    "nvml/exports.rs",
    "nvml/fresh.rs",
    "nvml/mod.rs",
    "nvml/real.rs",
    "unwind.rs",
];

/// vgpu-shm's: the mapping, the region file, its locks and signals (and,
/// not yet forbidden, some files with no `unsafe` at all).
const SHM_EDGES: &[&str] = &[
    "adopt.rs",
    "adopt_tests.rs",
    "board.rs",
    "board_dir.rs",
    "copy_tests.rs",
    "file.rs",
    "hami/fill.rs",
    "hami/mod.rs",
    "hami/monitor.rs",
    "hami/tests.rs",
    "lib.rs",
    "lock.rs",
    "private.rs",
    "procinfo.rs",
    "region.rs",
    "sigbus.rs",
    "sm_board.rs",
    "space.rs",
    "survival_tests.rs",
    "tests.rs",
];

/// Real functions that take no raw pointer but write memory at a
/// `CUdeviceptr`, which under unified addressing may be host memory.
const WRITES_THROUGH_ADDRESSES: &[&str] = &[
    "cuMemcpy",
    "cuMemcpyAsync",
    "cuMemcpyAsync_ptsz",
    "cuMemcpyDtoD_v2",
    "cuMemsetD8_v2",
    "cuMemsetD32_v2",
    "cuMemsetD8Async",
    "cuMemsetD32Async",
];

#[test]
fn core_unsafe_only_at_its_edges() {
    check_edges(Path::new("src"), &["shm"], CORE_EDGES);
}

#[test]
fn shm_unsafe_only_at_its_edges() {
    check_edges(Path::new("src/shm"), &[], SHM_EDGES);
}

#[test]
fn real_functions_taking_raw_pointers_are_unsafe() {
    for file in ["src/cuda/real.rs", "src/nvml/real.rs"] {
        let bad = pointer_mismatches(&fs::read_to_string(file).unwrap());
        assert!(bad.is_empty(), "{file}: {bad:?}");
    }
}

#[test]
fn ffi_get_and_put_are_unsafe() {
    let text = fs::read_to_string("src/ffi.rs").unwrap();
    for name in ["get", "put"] {
        assert!(
            text.contains(&format!("pub unsafe fn {name}<")),
            "src/ffi.rs: `{name}` dereferences its pointer, so it must be `unsafe fn`"
        );
    }
}

#[test]
fn the_checks_see_what_they_look_for() {
    let list = "type Args = *mut *mut c_void;\nreals! {\n    fn a(x: *mut u8) -> R;\n    unsafe fn b(x: Out<u8>) -> R;\n    fn c(s: CUstream, o: Out<u8>) -> R;\n    fn d(p: Args) -> R;\n    unsafe fn e(p: *const u8) -> R;\n}\n";
    assert_eq!(pointer_mismatches(list), ["a", "b", "d"]);
    assert!(forbids("//! doc\n#![forbid(unsafe_code)]\n"));
    assert!(!forbids("// #![forbid(unsafe_code)]\n"));
}

/// Every file under `root` (except `skip` dirs) not under forbid must be
/// listed in `edges`, and every entry of `edges` must be such a file.
fn check_edges(root: &Path, skip: &[&str], edges: &[&str]) {
    let files = source::rust_files(root, skip);
    let forbidden: BTreeSet<&String> = files
        .iter()
        .filter(|f| {
            ancestors(f)
                .iter()
                .any(|a| files.contains(a) && forbids_file(root, a))
        })
        .collect();
    let open: BTreeSet<&str> = files
        .iter()
        .filter(|f| !forbidden.contains(f))
        .map(String::as_str)
        .collect();
    let listed: BTreeSet<&str> = edges.iter().copied().collect();
    let unlisted: Vec<_> = open.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&open).collect();
    assert!(
        unlisted.is_empty(),
        "{}: {unlisted:?} may hold `unsafe` but are not FFI edges: add `#![forbid(unsafe_code)]` \
         (and keep pointers at the edge), or, for a new edge, list it here",
        root.display()
    );
    assert!(
        stale.is_empty(),
        "{}: {stale:?} are listed as edges but are forbidden or gone: drop them from the list",
        root.display()
    );
}

/// The file itself and the files of its parent modules (`a/b/c.rs`:
/// `a/b/c.rs`, `a/b.rs`, `a/b/mod.rs`, `a.rs`, `a/mod.rs`, `lib.rs`).
fn ancestors(file: &str) -> Vec<String> {
    let mut out = vec![file.to_string()];
    let stem = file.trim_end_matches(".rs").trim_end_matches("/mod");
    let mut parts: Vec<&str> = stem.split('/').collect();
    while parts.len() > 1 {
        parts.pop();
        let dir = parts.join("/");
        out.push(format!("{dir}.rs"));
        out.push(format!("{dir}/mod.rs"));
    }
    out.push("lib.rs".into());
    out
}

fn forbids_file(root: &Path, rel: &str) -> bool {
    forbids(&fs::read_to_string(root.join(rel)).unwrap())
}

fn forbids(text: &str) -> bool {
    text.lines()
        .any(|l| l.trim_start().starts_with("#![forbid(unsafe_code)]"))
}

/// Declarations in a `reals!` list whose `unsafe` does not match whether
/// they take a raw pointer (`*mut`, `*const`, or a `type` alias of one).
fn pointer_mismatches(text: &str) -> Vec<String> {
    let aliases: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("type "))
        .filter_map(|l| l.split_once(" = "))
        .filter(|(_, ty)| ty.starts_with('*'))
        .map(|(name, _)| name.to_string())
        .collect();
    let mut bad = Vec::new();
    for line in text.lines().map(str::trim) {
        let (is_unsafe, rest) = match line.strip_prefix("unsafe fn ") {
            Some(r) => (true, r),
            None => match line.strip_prefix("fn ") {
                Some(r) => (false, r),
                None => continue,
            },
        };
        // Only the list's one-line declarations, not code around it.
        let Some((name, rest)) = rest.split_once('(') else {
            continue;
        };
        if !line.ends_with(';') {
            continue;
        }
        let args = rest.rsplit_once(") ->").map_or("", |(a, _)| a);
        let raw = args.split(',').any(|a| {
            let ty = a.split_once(':').map_or("", |(_, t)| t.trim());
            ty.starts_with('*') || aliases.iter().any(|x| x == ty)
        }) || WRITES_THROUGH_ADDRESSES.contains(&name);
        if raw != is_unsafe {
            bad.push(name.to_string());
        }
    }
    bad
}

/// Safe functions at the edges that take a raw pointer and never read or
/// write through it: they compare, store or pass on the address only
/// (`dlsym`'s handle, a code address, a mapping's start).
const ADDRESS_ONLY: &[&str] = &[
    "src/interpose/dlsym.rs: decide_hooked",
    "src/interpose/dlsym.rs: unhooked",
    "src/interpose/real.rs: resolve_libc",
    "src/interpose/real.rs: dlsym",
    "src/interpose/real.rs: dlvsym",
    "src/interpose/stub.rs: owns",
    "src/interpose/table.rs: wrapper_for",
    "src/interpose/trampoline.rs: wrap",
    "src/unwind.rs: fill",
    "src/shm/sigbus.rs: new",
    "src/shm/sigbus.rs: chain",
];

#[test]
fn safe_edge_functions_do_not_take_raw_pointers() {
    let mut bad = Vec::new();
    for (root, edges) in [("src", CORE_EDGES), ("src/shm", SHM_EDGES)] {
        for file in edges {
            let text = fs::read_to_string(Path::new(root).join(file)).unwrap();
            for name in safe_fns_taking_pointers(&text) {
                let at = format!("{root}/{file}: {name}");
                if !ADDRESS_ONLY.contains(&at.as_str()) {
                    bad.push(at);
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{bad:?} are safe but take a raw pointer: make each `unsafe fn` with a `# Safety` \
         section, or, if it only compares or stores the address, list it in ADDRESS_ONLY"
    );
}

#[test]
fn the_pointer_scan_sees_multi_line_signatures() {
    let text = "pub fn a(x: *const u8) {}\npub(crate) unsafe extern \"C\" fn b(x: *mut u8) {}\n\
                extern \"C\" fn c(\n    h: *mut c_void,\n    s: u32,\n) -> u8 {}\nfn d(x: &u8, f: fn(*mut u8)) {}\n\
                fn e(p: *mut u8) -> R => handler;\n";
    assert_eq!(safe_fns_taking_pointers(text), ["a", "c"]);
}

/// Names of functions not declared `unsafe` whose own parameters include a
/// raw pointer. A hook table's one-line declarations (`fn name(..) -> R =>
/// handler;`) are not functions: the table's `unsafe fn` converts their
/// pointers at the edge.
fn safe_fns_taking_pointers(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("fn ") {
        let line_start = rest[..at].rfind('\n').map_or(0, |i| i + 1);
        let head = &rest[line_start..at];
        let after = &rest[at + 3..];
        rest = after;
        // Only declarations: `fn` as a word, after nothing but qualifiers.
        let qualifiers_only = head.split_whitespace().all(|w| {
            matches!(w, "pub" | "unsafe" | "extern" | "\"C\"" | "const" | "async")
                || w.starts_with("pub(")
        });
        if !qualifiers_only || head.split_whitespace().any(|w| w == "unsafe") {
            continue;
        }
        let Some(open) = after.find('(') else {
            continue;
        };
        let name = after[..open].trim();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '<' || c == '>')
        {
            continue;
        }
        // The parameter list up to its matching ')'; a nested `fn(..)`
        // type's own parameters are skipped.
        let mut depth = 0;
        let mut params = String::new();
        let mut nested = 0;
        for (i, ch) in after[open..].char_indices() {
            match ch {
                '(' => {
                    depth += 1;
                    if depth > 1 && after[open..open + i].trim_end().ends_with("fn") {
                        nested = depth;
                    }
                }
                ')' => {
                    if depth == nested {
                        nested = 0;
                    }
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ if nested == 0 => params.push(ch),
                _ => {}
            }
        }
        let tail = after[open..].lines().next().unwrap_or("");
        if tail.contains("=>") && tail.trim_end().ends_with(';') {
            continue;
        }
        if params.contains("*const") || params.contains("*mut") {
            out.push(name.split('<').next().unwrap_or(name).to_string());
        }
    }
    out
}
