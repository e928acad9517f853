//! Reading the crate's own source, for the tests that check its shape
//! (`layers.rs`, `unsafe_edges.rs`): pure text, nothing is built.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// The `.rs` files under `root`, relative and `/`-separated, skipping the
/// directories named in `skip` (relative too).
pub fn rust_files(root: &Path, skip: &[&str]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.unwrap().path();
            let rel = p
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            if p.is_dir() {
                if !skip.contains(&rel.as_str()) {
                    stack.push(p);
                }
            } else if rel.ends_with(".rs") {
                out.insert(rel);
            }
        }
    }
    out
}
