//! The hook table: one `hooks!` invocation per driver library
//! (`cuda/exports.rs`, `nvml/exports.rs`) declares, for each hooked symbol,
//! the exported C function, its lazily resolved real slot, and the table
//! entry that `dlsym` and `cuGetProcAddress` consult. The three entry paths
//! therefore cannot drift apart.
#![forbid(unsafe_code)]

use std::ffi::c_void;

pub use super::macros::Hook;
use super::real::Lib;

/// Every hook, of both libraries.
fn families() -> impl Iterator<Item = &'static Hook> {
    crate::cuda::exports::HOOKS
        .iter()
        .chain(crate::nvml::exports::HOOKS)
}

/// The hook for an exported name.
pub fn by_name(name: &[u8]) -> Option<&'static Hook> {
    families().find(|h| h.real.name().to_bytes() == name)
}

/// Our wrapper for a real function pointer of `lib`, if we hook it.
/// Resolves the library's real slots on first use.
pub fn wrapper_for(lib: Lib, real: *mut c_void) -> Option<*mut c_void> {
    if real.is_null() {
        return None;
    }
    families()
        .filter(|h| h.real.lib() == lib)
        .find(|h| h.real.get().is_some_and(|p| p.as_ptr() == real))
        .map(Hook::exported)
}
