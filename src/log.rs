//! Logging to stderr, level from `LIBCUDA_LOG_LEVEL` (HAMi-core's variable),
//! and the byte sizes its lines print.
#![forbid(unsafe_code)]

use std::io::Write;

/// Installs our logger. Our copy of the `log` crate is private to this
/// library, so this never touches a host program's own logger.
pub fn init(level: log::LevelFilter) {
    let _ = env_logger::Builder::new()
        .filter_level(level)
        .target(env_logger::Target::Stderr)
        .format(|buf, record| {
            // Debug lines carry the monotonic clock (the same in every
            // process of the machine), to line up several processes'.
            if record.level() >= log::Level::Debug {
                let ms = crate::clock::monotonic_ns() / 1_000_000;
                return writeln!(
                    buf,
                    "[vgpu {} {}.{:03}] {}: {}",
                    std::process::id(),
                    ms / 1000,
                    ms % 1000,
                    record.level(),
                    record.args()
                );
            }
            writeln!(
                buf,
                "[vgpu {}] {}: {}",
                std::process::id(),
                record.level(),
                record.args()
            )
        })
        .try_init();
}

/// Bytes as people read them.
pub fn fmt_bytes(b: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (MIB * 1024.0))
    } else {
        format!("{:.1} MiB", b as f64 / MIB)
    }
}

/// `log::warn!` that fires once per call site.
#[macro_export]
macro_rules! warn_once {
    ($($arg:tt)*) => {{
        static ONCE: ::std::sync::atomic::AtomicBool = ::std::sync::atomic::AtomicBool::new(false);
        if !ONCE.swap(true, ::std::sync::atomic::Ordering::Relaxed) {
            ::log::warn!($($arg)*);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_readably() {
        assert_eq!(fmt_bytes(4 << 30), "4.00 GiB");
        assert_eq!(fmt_bytes(512 << 20), "512.0 MiB");
    }
}
