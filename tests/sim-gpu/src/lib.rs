//! A simulated GPU for CI: one shared library that exports the CUDA driver
//! and NVML entry points vgpu relies on. Tests install it in a temp dir as
//! `libcuda.so.1` and `libnvidia-ml.so.1` and put that dir on
//! `LD_LIBRARY_PATH`.
//!
//! It behaves like the real driver where vgpu depends on it:
//! - devices with UUIDs, names, memory sizes and SM counts, honouring
//!   `CUDA_VISIBLE_DEVICES`;
//! - physical memory shared by every process through a state file, so one
//!   process's allocations are visible to the next and the card can run
//!   out; a dead process's memory returns, as the driver frees it at exit;
//! - kernels that occupy simulated SM time on a per-device timeline that all
//!   processes share; stream, context and event synchronisation wait on it;
//! - `cuGetProcAddress(_v2)` resolving (symbol, version, flags) the way the
//!   real driver does (checked against a table recorded on an H200);
//! - NVML memory info, process lists with used memory, per-process
//!   utilisation samples computed from the timeline, and an option to report
//!   pids with an offset as a pid namespace would;
//! - like the real driver, whatever pid namespace a process runs in, NVML
//!   lists it by its *host* pid and frees its memory when it dies. The
//!   host is the namespace of the `/proc` named by `SIM_GPU_HOST_PROC_FD`
//!   (an inherited directory fd, which survives `unshare --mount-proc`),
//!   else of the `/proc` the process sees. A process holds a POSIX lock
//!   on its own byte of the state file for life: the kernel drops it at
//!   death, whatever the namespace, so liveness needs no pid at all.
//!
//! Configuration (read by the process that creates the state file):
//! `SIM_GPU_STATE` (path of the state file), `SIM_GPU_COUNT`,
//! `SIM_GPU_MEMORY` (bytes, k/m/g), `SIM_GPU_SMS`, `SIM_GPU_CTX_OVERHEAD`,
//! `SIM_GPU_BLOCK_NS`; and per process `SIM_GPU_PID_OFFSET`,
//! `SIM_GPU_NVML_DELAY_US` (how stale a process list is when it returns)
//! and `SIM_GPU_HOST_PROC_FD`.
//!
//! Kernels: `vgpu_spin(ns, counter)` (tests/programs/spin_ptx.h) runs `ns`
//! per wave of blocks (one block per SM per wave), `vgpu_empty` 0.1 µs, any
//! other function `SIM_GPU_BLOCK_NS` per wave.
//!
//! Entry points that exist only so that names resolve return
//! `CUDA_ERROR_NOT_SUPPORTED` (stubs.rs).

mod config;
mod cuda;
mod ffi;
mod graph;
mod local;
mod nvml;
mod procaddr;
mod state;
mod stubs;
