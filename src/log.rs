//! Logging to stderr, level from `LIBCUDA_LOG_LEVEL` (HAMi-core's variable).
#![forbid(unsafe_code)]

use std::io::Write;

/// Installs our logger. Our copy of the `log` crate is private to this
/// library, so this never touches a host program's own logger.
pub fn init(level: log::LevelFilter) {
    let _ = env_logger::Builder::new()
        .filter_level(level)
        .target(env_logger::Target::Stderr)
        .format(|buf, record| {
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
