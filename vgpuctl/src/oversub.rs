//! `vgpuctl oversub [DIR]`: the node's oversubscription board
//! (docs/oversubscription.md): every live process of an oversubscribed
//! container, its state, bytes on each card and on the host, what it waits
//! for, and its time suspended and restoring (the current spell counted);
//! for turns between busy processes, its priority, quantum, time in its
//! current turn (or waiting for one) and the turns it took and gave.
//! DIR defaults to `$VGPU_OVERSUBSCRIBE_DIR`, then the library's default
//! (`/run/vgpu-oversub` for root, else `/tmp/vgpu-oversub`). The
//! board is read into private memory (`Board::read_copy`): nothing in it
//! changes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use vgpu_shm::board::{Board, ProcState, monotonic_ns};
use vgpu_shm::format_uuid;

/// The board's directory when none is named: `$VGPU_OVERSUBSCRIBE_DIR`,
/// else the library's default (`vgpu_shm::board::default_dir`).
pub fn default_dir() -> PathBuf {
    std::env::var_os("VGPU_OVERSUBSCRIBE_DIR")
        .filter(|v| !v.is_empty())
        .map_or_else(vgpu_shm::board::default_dir, PathBuf::from)
}

/// The board's report, or why there is none.
pub fn report(dir: Option<&Path>) -> Result<String, String> {
    let dir = dir.map_or_else(default_dir, Path::to_path_buf);
    let b = Board::read_copy(&dir)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            format!(
                "no oversubscription board in {} (no process with CUDA_OVERSUBSCRIBE=true has started there)",
                dir.display()
            )
        })?;
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
        let _ = writeln!(
            out,
            "entry={i} pid={} state={} cards={} host_bytes={} wants={wants} idle_ms={} in_state_ms={} suspended_ms_total={} restoring_ms_total={} suspensions={} restores={} priority={} quantum_ms={} turn_ms={} waiting_ms={} turns_taken={} turns_given={}",
            e.pid(),
            e.state().name(),
            if cards.is_empty() {
                "-".into()
            } else {
                cards.join(",")
            },
            e.host_bytes(),
            ms(now.saturating_sub(e.last_active_ns())),
            ms(e.in_state_ns(now)),
            ms(e.suspended_ns_at(now)),
            ms(e.restoring_ns_at(now)),
            e.suspensions(),
            e.restores(),
            e.priority(),
            e.quantum_ms(),
            if e.state() == ProcState::Running {
                ms(now.saturating_sub(e.turn_since_ns()))
            } else {
                0
            },
            match e.want_since_ns() {
                0 => 0,
                since => ms(now.saturating_sub(since)),
            },
            e.turns_taken(),
            e.turns_given(),
        );
    }
    Ok(out)
}
