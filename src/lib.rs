//! vgpu: per-container GPU quotas, as one preload library.
//!
//! Loaded into every process of a container (`LD_PRELOAD` or
//! `/etc/ld.so.preload`), it caps the container's device memory
//! (`CUDA_DEVICE_MEMORY_LIMIT`) and compute (`CUDA_DEVICE_SM_LIMIT`), shows
//! the capped memory to `nvidia-smi`, and keeps every process of the
//! container in one shared accounting region. It keeps HAMi-core's
//! interface.
//!
//! Data flow: the program calls the driver (linked, through `dlsym`, or
//! through `cuGetProcAddress`) → our hook (`interpose`, `cuda`, `nvml`) →
//! accounting in the shared region (`vgpu_shm`) → the real driver. A
//! watcher thread per process reads NVML (overhead, utilisation) and
//! steers the compute bucket that launches draw from (`limiter`).
//!
//! Modules:
//! - `init`: lazy start: environment, region lookup, attach
//! - `config`: the environment, typed
//! - `attach`: our slot and our ordinals' device entries
//! - `interpose`: the three entry paths and the hook table
//! - `cuda`: driver hooks (memory, contexts, info, launches, graphs)
//! - `nvml`: NVML hooks and our own NVML client
//! - `limiter`: compute bucket, cost estimates, timing, controller
//! - `view`: the virtual memory view shared by CUDA and NVML
//! - `hostpid`: this process's pid as NVML sees it
//! - `watcher`: the background thread
//! - `guard`: reentrancy flag and the panic-proof `extern "C"` boundary
//! - `fork`: `pthread_atfork` handlers
//! - `tamper`: truncation checks before the region is touched
//! - `unwind`: the unwinder, loaded from libgcc_s only once CUDA is used
//! - `ffi`, `clock`, `log`: small edges

// Without exported hooks (unit tests, feature `interpose` off) nothing
// reaches most of the crate.
#![cfg_attr(any(test, not(feature = "interpose")), allow(dead_code))]

pub use vgpu_shm as shm;

pub mod config;
mod lock;
mod log;

mod attach;
mod clock;
mod cuda;
mod ffi;
mod fork;
mod guard;
mod hostpid;
mod init;
mod interpose;
mod limiter;
mod numbering;
mod nvml;
mod process;
mod quota;
mod tamper;
mod unwind;
mod view;
mod watcher;
