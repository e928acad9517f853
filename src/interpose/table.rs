//! The hook table: one [`hooks!`] invocation per driver library
//! (`cuda/exports.rs`, `nvml/exports.rs`) declares, for each hooked symbol,
//! the exported C function, its lazily resolved real slot, and the table
//! entry that `dlsym` and `cuGetProcAddress` consult. The three entry paths
//! therefore cannot drift apart. The table and the two export lists import
//! each other (with `cuda/proc_address.rs`, which consults the table): the
//! one import circle the layers allow (`tests/layers.rs`).
//!
//! [`hooks!`]: crate::interpose::table::hooks

use std::ffi::c_void;

use super::real::{Lib, Real};

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

/// One hooked symbol: an entry of the table (`table.rs`).
pub struct Hook {
    /// Its real function.
    pub real: &'static Real,
    /// Our exported wrapper.
    pub wrapper: *const (),
}

// SAFETY: `wrapper` is the address of a function (immutable code); `real`
// is a Sync slot of atomics.
unsafe impl Sync for Hook {}

impl Hook {
    /// What a lookup of this hook answers: libvgpu.so's export of the name
    /// (which jumps to `wrapper`) when the stub loaded us, else `wrapper`.
    pub fn exported(&self) -> *mut std::ffi::c_void {
        super::stub::export_of(self.real.name()).unwrap_or(self.wrapper as *mut std::ffi::c_void)
    }
}

/// Declares a driver library's hooks. For each `fn name(args) -> R =>
/// handler;`:
/// - `name`: the exported C function (feature `interpose`), shaped
///   export → `ffi_boundary` → `handler(args)`, falling back to
///   `real::name(args)` if `handler` panics. Without the real function
///   nothing of vgpu runs (no region, no thread): the answer is `missing`,
///   or [`NO_LIBRARY`](super::real::NoLibrary::NO_LIBRARY) without the driver library, as for a
///   process with no driver that calls one of our exports by accident;
/// - its entry in `HOOKS`, which `dlsym` and `cuGetProcAddress` consult.
///
/// This is where the program's pointers cross into vgpu: each argument
/// reaches the handler as the handler's parameter type says ([`Arg`]):
/// unchanged, or a pointer the handler reads or writes as an
/// [`In`]/[`Out`], which the driver API makes NULL or valid for one value
/// for the call. A handler whose real function is `unsafe` (its pointers'
/// extent is the driver's business: a kernel's parameters, a host buffer)
/// is named `handler [real]`, and gets first the real call with the
/// program's own arguments, unchanged, as `&impl Fn() -> R`. So handlers
/// hold no `unsafe` code.
///
/// `enter` runs before every handler (not for our own internal calls):
/// an Err is the hook's answer instead (the CUDA side restores a process
/// that oversubscription suspended, `oversub::enter`; NVML's is [`open`]).
///
/// A hook may name an `idle` test (`=> handler, idle: test;`): while it
/// holds, `enter` and the handler would only call the real function, so
/// the hook calls it at once, without the boundary (nothing of ours runs
/// that could panic): the launch hooks with nothing to do (`duty.rs`).
/// Inside our own code the boundary calls the real function too.
///
/// `real` names the module that `reals!` (`reals.rs`) filled with the
/// library's real functions: a hook whose signature differs from its real
/// function's does not compile.
///
/// [`Arg`]: crate::ffi::Arg
/// [`In`]: crate::ffi::In
/// [`Out`]: crate::ffi::Out
macro_rules! hooks {
    (
        lib: $lib:expr, missing: $missing:expr, real: $real:ident, enter: $enter:path;
        $( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty => $imp:path $([$with:ident])? $(, idle: $idle:path)?; )*
    ) => {
        $(
            #[doc = concat!("`", stringify!($name), "`, exported: vgpu's hook, then the driver's.")]
            #[doc = ""]
            #[doc = "# Safety"]
            #[doc = "The program's own arguments, valid as the driver API's contract for this function says."]
            #[cfg_attr(all(feature = "interpose", not(test)), unsafe(no_mangle))]
            #[allow(non_snake_case, clippy::too_many_arguments)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                /// # Safety
                /// The arguments are the program's own to this driver
                /// function, which its API contract makes valid.
                #[inline(always)]
                unsafe fn whole($($arg: $ty),*) -> $ret {
                    if $real::slot::$name.get().is_none() {
                        return match $crate::interpose::real::handle($lib) {
                            Some(_) => $missing,
                            None => <$ret as $crate::interpose::real::NoLibrary>::NO_LIBRARY,
                        };
                    }
                    // The real call with the program's arguments, exactly.
                    // (A hook with no arguments and a safe real function
                    // needs no `unsafe` here.)
                    #[allow(unused_unsafe)]
                    let real = || {
                        // SAFETY: the program's own arguments to this very
                        // function, unchanged (whole's contract), each as
                        // the real function declares it (`ffi::Arg`).
                        unsafe { $real::$name($($crate::ffi::Arg::arg($arg)),*) }
                    };
                    $crate::guard::ffi_boundary(
                        stringify!($name),
                        || match $enter(stringify!($name)) {
                            Ok(_inside) => $imp(
                                $( { _ = stringify!($with); &real }, )?
                                $(
                                    // SAFETY: the program's own argument:
                                    // the driver API makes a pointer NULL
                                    // or valid for its one value for the
                                    // call (`ffi::Arg`, whole's contract).
                                    unsafe { $crate::ffi::Arg::arg($arg) }
                                ),*
                            ),
                            Err(rc) => rc,
                        },
                        &real,
                    )
                }
                // Out of line behind an idle test, and with the hook's own
                // convention: the test needs no frame of its own.
                #[inline(never)]
                unsafe extern "C" fn whole_out_of_line($($arg: $ty),*) -> $ret {
                    // SAFETY: the program's own arguments, passed on.
                    unsafe { whole($($arg),*) }
                }
                let idle: Option<fn() -> bool> = None $(.or(Some($idle)))?;
                if let Some(idle) = idle {
                    type F = unsafe extern "C" fn($($ty),*) -> $ret;
                    // SAFETY: the slot resolves exactly this symbol, whose
                    // C signature is this hook's.
                    let real = unsafe { $real::slot::$name.resolved::<F>() };
                    // One call either way, through a pointer: the compiler
                    // makes it a jump with the caller's arguments in place.
                    let f: F = match real {
                        Some(f) if idle() => f,
                        _ => whole_out_of_line,
                    };
                    // SAFETY: the caller's own arguments, to the function
                    // it meant to call or to the whole path.
                    return unsafe { f($($arg),*) };
                }
                // SAFETY: the program's own arguments (this export's
                // contract: it is the driver function the program called).
                unsafe { whole($($arg),*) }
            }
        )*

        /// Every hook of this library, for the table.
        pub(crate) static HOOKS: &[$crate::interpose::table::Hook] = &[
            $( $crate::interpose::table::Hook {
                real: &$real::slot::$name,
                wrapper: $name as *const (),
            }, )*
        ];
    };
}

/// The `enter` of hooks that nothing ever holds back.
#[inline]
pub fn open<R>(_hook: &'static str) -> Result<(), R> {
    Ok(())
}

pub(crate) use hooks;
