//! vgpu: per-container GPU quotas, as one preload library.
//!
//! Loaded into every process of a container (`LD_PRELOAD` or
//! `/etc/ld.so.preload`), it caps the container's device memory
//! (`CUDA_DEVICE_MEMORY_LIMIT`) and compute (`CUDA_DEVICE_SM_LIMIT`), shows
//! the capped memory to `nvidia-smi`, and keeps every process of the
//! container in one shared accounting region. It keeps HAMi-core's
//! interface.
//!
//! This crate is the core, `libvgpu_core.so`. What is preloaded is the
//! stub `libvgpu.so` (`preload/stub.c`), which exports the same hooks and
//! loads this library `RTLD_LOCAL` on the first driver call, so processes
//! that never use CUDA do not even load it (`interpose/stub.rs`).
//!
//! Data flow: the program calls the driver (linked, through `dlsym`, or
//! through `cuGetProcAddress`) → our hook (`interpose`, `cuda`, `nvml`) →
//! accounting (`quota`: `quota/grant.rs` decides whether an allocation is
//! granted) in the shared region (`vgpu_shm`) → the real driver. Launches
//! draw from the compute bucket (`limiter`); a watcher thread per process
//! reads NVML (overhead, utilisation) and steers the bucket.
//!
//! Layers, from the top: a file imports only from its own layer or below.
//! Policy gets what it needs from above passed in (an `&'static Attach`)
//! or installed by `init` at start (as `attach::OnSlot` is), never by
//! calling up. `tests/layers.rs` reads this list and checks every import;
//! a module path names its files, and the longest path wins. The largest
//! circle allowed: the hook table (`interpose/table.rs`), the two export
//! lists it holds, and `cuda/proc_address.rs`, which consults the table.
//! It is the only one, named in the test, which fails on any other.
//! 1. entry: interpose, cuda::exports, cuda::proc_address, nvml
//! 2. hooks: cuda
//! 3. boot: init, fork, watcher
//! 4. policy: quota, limiter, oversub, hami
//! 5. process: attach, process, hostpid, view, numbering, tamper,
//!    quota::counters, limiter::credit
//! 6. driver: cuda::sys, cuda::real, cuda::driver, nvml::sys, nvml::real,
//!    nvml::client, nvml::fresh
//! 7. base: config, lock, guard, duty, clock, ffi, log, unwind, loaded,
//!    interpose::real, interpose::reals, interpose::elf, interpose::stub,
//!    interpose::trampoline
//!
//! What each module does:
//! - `interpose`: the three entry paths and the hook table (`hooks!`);
//!   below them, the real symbols (`reals!`) and the stub's handoff
//! - `cuda`: driver hooks (`exports.rs` lists them), one family per file,
//!   translating driver calls into `quota` and `limiter` calls
//! - `nvml`: NVML hooks and our own NVML client
//! - `init`: lazy start: environment, region lookup, attach, fork handlers
//! - `fork`: `pthread_atfork` handlers and the list of every lock
//! - `watcher`: the background thread
//! - `hami`: the HAMi part of the region: the launch gate of HAMi's
//!   priority time-sharing, and the elected writer that keeps what node
//!   monitors read true
//! - `quota`: per-process memory accounting (grant, charges, frees,
//!   contexts, overhead, the allocation table)
//! - `limiter`: compute bucket, cost estimates, credit, controller, leader
//! - `oversub`: memory oversubscription: admission when the card is full,
//!   idle processes suspended whole (checkpoint API) and restored
//! - `hostpid`: this process's pid as NVML sees it
//! - `view`: the virtual memory view shared by CUDA and NVML
//! - `attach`, `tamper`: our slot and device entries; the region file
//!   checked before it is touched
//! - `numbering`: which device `_N` names (the container's N-th)
//! - `process`: this process's own state, one record per device, reset in
//!   one step after fork
//! - `config`: the environment, typed
//! - `lock`: our mutexes, safe across fork
//! - `guard`: reentrancy flag and the panic-proof `extern "C"` boundary
//! - `duty`: the launch path's one word: whether vgpu has anything to do
//!   for a launch in this process (limits, HAMi's gate, oversubscription)
//! - `unwind`: the unwinder, loaded from libgcc_s only once CUDA is used
//! - `loaded`: the one line saying what this process enforces
//! - `ffi`: a program's pointers as `In`/`Out`, the one unsafe step at
//!   the hook table (docs/architecture.md, "Where `unsafe` lives")
//! - `clock`, `log`: small edges

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
mod duty;
mod ffi;
mod fork;
mod guard;
mod hami;
mod hostpid;
mod init;
mod interpose;
mod limiter;
mod loaded;
mod numbering;
mod nvml;
mod oversub;
mod process;
mod quota;
mod tamper;
mod unwind;
mod view;
mod watcher;
