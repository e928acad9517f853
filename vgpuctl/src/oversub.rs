//! `vgpuctl oversub [DIR]`: the node's oversubscription board
//! (docs/oversubscription.md): every live process of an oversubscribed
//! container, its state, bytes on each card and on the host, what it waits
//! for, and its time suspended and restoring. DIR defaults to
//! `$VGPU_OVERSUBSCRIBE_DIR`, then `/tmp/vgpu-oversub`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use vgpu_shm::board::{BOARD_FILE, Board, monotonic_ns};
use vgpu_shm::format_uuid;

/// The board's report, or why there is none.
pub fn report(dir: Option<&Path>) -> Result<String, String> {
    let dir = dir
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("VGPU_OVERSUBSCRIBE_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/tmp/vgpu-oversub"));
    if !dir.join(BOARD_FILE).is_file() {
        return Err(format!(
            "no oversubscription board in {} (no process with CUDA_OVERSUBSCRIBE=true has started there)",
            dir.display()
        ));
    }
    let b = Board::open(&dir).map_err(|e| e.to_string())?;
    let now = monotonic_ns();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "board={} host_bytes={}",
        b.path().display(),
        b.host_bytes(None)
    );
    for (i, e) in b.others(None) {
        let cards: Vec<String> = e
            .cards()
            .iter()
            .map(|(u, bytes)| format!("{}:{bytes}", format_uuid(u)))
            .collect();
        let wants = e
            .wants()
            .map_or("-".to_string(), |(u, n)| format!("{}:{n}", format_uuid(&u)));
        let ms = |ns: u64| ns / 1_000_000;
        let since = e.since_ns.load(Ordering::Acquire);
        let _ = writeln!(
            out,
            "entry={i} pid={} state={} cards={} host_bytes={} wants={wants} idle_ms={} in_state_ms={} suspended_ms_total={} restoring_ms_total={} suspensions={} restores={}",
            e.pid.load(Ordering::Acquire),
            e.state().name(),
            if cards.is_empty() {
                "-".into()
            } else {
                cards.join(",")
            },
            e.host_bytes.load(Ordering::Acquire),
            ms(now.saturating_sub(e.last_active_ns.load(Ordering::Acquire))),
            ms(now.saturating_sub(since)),
            ms(e.suspended_total_ns.load(Ordering::Relaxed)),
            ms(e.restoring_total_ns.load(Ordering::Relaxed)),
            e.suspensions.load(Ordering::Relaxed),
            e.restores.load(Ordering::Relaxed),
        );
    }
    Ok(out)
}
