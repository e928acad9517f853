//! The hook table: one `hooks!` invocation per driver library
//! (`cuda/exports.rs`, `nvml/exports.rs`) declares, for each hooked symbol,
//! the exported C function, its lazily resolved real slot, and the table
//! entry that `dlsym` and `cuGetProcAddress` consult. The three entry paths
//! therefore cannot drift apart.

use std::ffi::c_void;

use super::real::{Lib, Real};

/// The code a hook returns when its driver library cannot be loaded at
/// all: what NVIDIA's stub libraries answer where no driver is installed.
pub trait NoLibrary {
    const NO_LIBRARY: Self;
}

/// One hooked symbol.
pub struct Hook {
    pub real: &'static Real,
    /// Our exported wrapper.
    pub wrapper: *const (),
}

// SAFETY: `wrapper` is the address of a function (immutable code); `real`
// is a Sync slot of atomics.
unsafe impl Sync for Hook {}

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
        .map(|h| h.wrapper as *mut c_void)
}

/// Declares a driver library's hooks and the real functions vgpu calls.
///
/// For each `fn name(args) -> R => handler;` under `hooked`:
/// - `name`: the exported C function (feature `interpose`), shaped
///   export → `ffi_boundary` → `handler(args)`, falling back to the real
///   function if `handler` panics. Without the real function nothing of
///   vgpu runs (no region, no thread): the answer is `missing`, or
///   [`NoLibrary::NO_LIBRARY`] without the driver library, as for a
///   process with no driver that calls one of our exports by accident;
/// - its entry in `HOOKS`, which `dlsym` and `cuGetProcAddress` consult.
///
/// For every function under `hooked` and `called`, `real::name(args) -> R`
/// (see [`reals!`]).
macro_rules! hooks {
    (
        lib: $lib:expr, missing: $missing:expr;
        hooked {
            $( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty => $imp:path; )*
        }
        called {
            $( fn $cname:ident ( $($carg:ident : $cty:ty),* $(,)? ) -> $cret:ty; )*
        }
    ) => {
        /// The real functions of this library: each hooked one, and each
        /// one vgpu calls without hooking it.
        pub(crate) mod real {
            #[allow(unused_imports)]
            use super::*;
            $crate::interpose::table::reals! {
                lib: $lib, missing: $missing;
                $( fn $name($($arg: $ty),*) -> $ret; )*
                $( fn $cname($($carg: $cty),*) -> $cret; )*
            }
        }

        $(
            #[cfg_attr(all(feature = "interpose", not(test)), unsafe(no_mangle))]
            #[allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                if real::slot::$name.get().is_none() {
                    return match $crate::interpose::real::handle($lib) {
                        Some(_) => $missing,
                        None => <$ret as $crate::interpose::table::NoLibrary>::NO_LIBRARY,
                    };
                }
                $crate::guard::ffi_boundary(
                    stringify!($name),
                    || $imp($($arg),*),
                    || real::$name($($arg),*),
                )
            }
        )*

        /// Every hook of this library, for the table.
        pub(crate) static HOOKS: &[$crate::interpose::table::Hook] = &[
            $( $crate::interpose::table::Hook {
                real: &real::slot::$name,
                wrapper: $name as *const (),
            }, )*
        ];
    };
}

/// Declares real functions: for each `fn name(args) -> R;`, a lazily
/// resolved slot `slot::name`, and `name(args) -> R`, which calls it, or
/// answers `missing` when the driver lacks the symbol.
///
/// The wrappers are safe to call with what a program passed to the same
/// driver function (the driver, not vgpu, reads and writes through those
/// pointers, as it would without vgpu), or with pointers to live locals of
/// the declared types.
macro_rules! reals {
    (
        lib: $lib:expr, missing: $missing:expr;
        $( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty; )*
    ) => {
        #[allow(non_upper_case_globals)]
        pub(crate) mod slot {
            #[allow(unused_imports)]
            use super::*;
            $(
                pub(crate) static $name: $crate::interpose::real::Real =
                    $crate::interpose::real::Real::new(
                        match ::std::ffi::CStr::from_bytes_with_nul(
                            concat!(stringify!($name), "\0").as_bytes(),
                        ) {
                            Ok(c) => c,
                            Err(_) => panic!("symbol name"),
                        },
                        $lib,
                    );
            )*
        }

        $(
            #[allow(non_snake_case, clippy::too_many_arguments)]
            pub(crate) fn $name($($arg: $ty),*) -> $ret {
                // SAFETY: the slot resolves exactly this symbol, whose C
                // signature is the one declared here.
                let f = unsafe { slot::$name.typed::<unsafe extern "C" fn($($ty),*) -> $ret>() };
                match f {
                    // SAFETY: the arguments follow the declared C signature
                    // and come from the caller's own call or our locals (see
                    // the macro's docs).
                    Some(f) => unsafe { f($($arg),*) },
                    None => $missing,
                }
            }
        )*
    };
}

pub(crate) use {hooks, reals};
