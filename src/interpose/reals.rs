//! [`reals!`]: declares a driver library's real functions (`cuda/real.rs`,
//! `nvml/real.rs`: every real function vgpu calls, typed), each a lazily
//! resolved slot ([`Real`](super::real::Real)). Below the hook table: the
//! driver floor and the unwinder use it without reaching any hook.
//!
//! [`reals!`]: crate::interpose::reals::reals

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

pub(crate) use reals;
