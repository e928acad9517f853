//! [`reals!`]: declares a driver library's real functions (`cuda/real.rs`,
//! `nvml/real.rs`: every real function vgpu calls, typed), each a lazily
//! resolved slot ([`Real`](super::real::Real)). Below the hook table: the
//! driver floor and the unwinder use it without reaching any hook.
//!
//! [`reals!`]: crate::interpose::reals::reals

/// Declares real functions: for each `fn name(args) -> R;` (or `unsafe fn
/// name(args) -> R;`), a lazily resolved slot `slot::name`, and `name(args)
/// -> R`, which calls it, or answers `missing` when the driver lacks the
/// symbol.
///
/// Safe or not is decided per function, by what its arguments let the
/// driver touch:
/// - `fn`: every argument is a number, a handle (`CUstream`, `NvmlDevice`:
///   the driver checks handles, as it checks a program's), or an
///   [`In`](crate::ffi::In)/[`Out`](crate::ffi::Out), which is NULL or
///   valid for the one `T` the driver reads or writes there. Nothing the
///   caller passes can make the driver touch memory it should not, so the
///   wrapper is safe, and the hooks' handlers and vgpu's own code call it
///   without `unsafe`;
/// - `unsafe fn`: some argument is a raw pointer whose extent the driver
///   learns elsewhere (an array and its count, a C string, a kernel's
///   parameters, a host buffer of `n` bytes, an options struct). The
///   wrapper's `# Safety`: each such pointer is what the driver's
///   documentation of that function requires, for the call. Only FFI edges
///   call these: the hook table (with the program's own arguments, which
///   is what the hook received) and the safe wrappers beside the lists.
macro_rules! reals {
    (
        lib: $lib:expr, missing: $missing:expr;
        $( $($head:ident)+ ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty; )*
    ) => {
        #[allow(non_upper_case_globals)]
        pub(crate) mod slot {
            #[allow(unused_imports)]
            use super::*;
            $( $crate::interpose::reals::real_slot! { $lib; $($head)+ } )*
        }

        $(
            $crate::interpose::reals::real_fn! {
                $missing; $($head)+ ( $($arg : $ty),* ) -> $ret
            }
        )*
    };
}

/// One slot of [`reals!`].
macro_rules! real_slot {
    ($lib:expr; $(unsafe)? fn $name:ident) => {
        pub(crate) static $name: $crate::interpose::real::Real = $crate::interpose::real::Real::new(
            match ::std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes())
            {
                Ok(c) => c,
                Err(_) => panic!("symbol name"),
            },
            $lib,
        );
    };
}

/// One function of [`reals!`].
macro_rules! real_fn {
    ($missing:expr; fn $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty) => {
        #[allow(non_snake_case, clippy::too_many_arguments)]
        pub(crate) fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the slot resolves exactly this symbol, whose C
            // signature is the one declared here.
            let f = unsafe { slot::$name.typed::<unsafe extern "C" fn($($ty),*) -> $ret>() };
            match f {
                // SAFETY: declared `fn`: the arguments are numbers,
                // handles and `In`/`Out`, each NULL or valid for the one
                // value the driver reads or writes there (the macro's docs).
                Some(f) => unsafe { f($($arg),*) },
                None => $missing,
            }
        }
    };
    ($missing:expr; unsafe fn $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty) => {
        /// The real function.
        ///
        /// # Safety
        /// Every pointer argument is NULL where the driver allows it, or
        /// valid for what the driver's documentation of this function
        /// reads and writes through it (given the other arguments), for
        /// the call.
        #[allow(non_snake_case, clippy::too_many_arguments)]
        pub(crate) unsafe fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the slot resolves exactly this symbol, whose C
            // signature is the one declared here.
            let f = unsafe { slot::$name.typed::<unsafe extern "C" fn($($ty),*) -> $ret>() };
            match f {
                // SAFETY: the pointers are as the driver requires (this
                // function's contract); the rest follows the signature.
                Some(f) => unsafe { f($($arg),*) },
                None => $missing,
            }
        }
    };
}

pub(crate) use {real_fn, real_slot, reals};
