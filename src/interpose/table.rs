//! The hook table: one `hooks!` invocation per family declares, for each
//! hooked symbol, the exported C function, its lazily resolved real slot,
//! and the table entry that `dlsym` and `cuGetProcAddress` consult. The
//! three entry paths therefore cannot drift apart.

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

/// Every family's hooks.
fn families() -> impl Iterator<Item = &'static Hook> {
    crate::cuda::FAMILIES
        .iter()
        .chain(crate::nvml::FAMILIES)
        .flat_map(|f| f.iter())
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

/// Declares a family of hooks. For each `fn name(args) -> R => imp;`:
/// - `real::slot::name`: the lazily resolved real symbol;
/// - `real::name()`: it, typed (None when the driver lacks it);
/// - `name`: the exported C function (feature `interpose`), shaped
///   export → `ffi_boundary` → `imp(args)`, falling back to the real
///   function if `imp` panics. Without the real function nothing of vgpu
///   runs (no region, no thread): the answer is `missing`, or
///   [`NoLibrary::NO_LIBRARY`] without the driver library, as for a
///   process with no driver that calls one of our exports by accident;
/// - `HOOKS`: the family's table entries.
macro_rules! hooks {
    (
        lib: $lib:expr, missing: $missing:expr;
        $( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty => $imp:path; )*
    ) => {
        /// The real driver functions behind this family's hooks.
        pub(crate) mod real {
            #[allow(unused_imports)]
            use super::*;
            $crate::interpose::table::reals! {
                lib: $lib;
                $( fn $name($($arg: $ty),*) -> $ret; )*
            }
        }

        $(
            #[cfg_attr(all(feature = "interpose", not(test)), unsafe(no_mangle))]
            #[allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                let Some(real_fn) = real::$name() else {
                    return match $crate::interpose::real::handle($lib) {
                        Some(_) => $missing,
                        None => <$ret as $crate::interpose::table::NoLibrary>::NO_LIBRARY,
                    };
                };
                $crate::guard::ffi_boundary(
                    stringify!($name),
                    || $imp($($arg),*),
                    // SAFETY: the caller's arguments pass through unchanged.
                    || unsafe { real_fn($($arg),*) },
                )
            }
        )*

        /// This family's entries in the hook table.
        pub(crate) static HOOKS: &[$crate::interpose::table::Hook] = &[
            $( $crate::interpose::table::Hook {
                real: &real::slot::$name,
                wrapper: $name as *const (),
            }, )*
        ];
    };
}

/// Declares real driver functions we call without hooking them: for each
/// `fn name(args) -> R;`, a lazily resolved slot `slot::name` and a typed
/// accessor `name()` (None when the driver lacks the symbol).
macro_rules! reals {
    (
        lib: $lib:expr;
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
            #[allow(non_snake_case, dead_code, clippy::type_complexity)]
            pub(crate) fn $name() -> Option<unsafe extern "C" fn($($ty),*) -> $ret> {
                // SAFETY: the slot resolves exactly this symbol, whose C
                // signature is the one declared here.
                unsafe { slot::$name.typed() }
            }
        )*
    };
}

pub(crate) use {hooks, reals};
