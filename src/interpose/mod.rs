//! How the three entry paths meet one table.
//!
//! A program reaches the driver by linking `-lcuda` (our exported symbols
//! interpose on libcuda's), by `dlopen` + `dlsym` (our exported `dlsym`
//! hands back our wrapper for the real pointer), or, as cudart and PyTorch
//! do, through `cuGetProcAddress(_v2)` (we call the real one, then swap the
//! pointer it returned for our wrapper). All three consult one table
//! (`table.rs`) of the hooks that its `hooks!` declares (invoked in
//! `cuda/exports.rs` and `nvml/exports.rs`), and every wrapper calls the
//! real function through a slot `reals!` declares (`reals.rs`), resolved with
//! libc's own `dlsym` (`real.rs`), found without calling `dlsym` at all
//! (`elf.rs`). With oversubscription, functions without a hook reached
//! through `cuGetProcAddress` get a trampoline that restores a suspended
//! process first (`trampoline.rs`).
//!
//! The exports themselves live in `libvgpu.so`, a small C stub
//! (`preload/stub.c`) that loads this library on first use and jumps to
//! our functions of the same names; `stub.rs` is our side of that.

mod dlsym;
pub mod elf;
pub mod real;
pub mod reals;
pub mod stub;
pub mod table;
pub mod trampoline;
