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
//! - kernels that occupy simulated device time, queued per process and
//!   run the way a real GPU time-slices contexts of different processes
//!   (sched.rs): a context alone is never preempted; while several have
//!   work each runs a time slice in turn, and every switch costs device
//!   time. Stream, context and event synchronisation wait on that
//!   schedule, and an event takes its time when its context reaches it, so
//!   a timing can include other contexts' slices. A dead process's queued
//!   work is dropped;
//! - `cuGetProcAddress(_v2)` resolving (symbol, version, flags) the way the
//!   real driver does (checked against a table recorded on an H200);
//! - NVML memory info, process lists with used memory, per-process
//!   utilisation samples as the real NVML gives them under time-slicing
//!   (nvml_util.rs: each sample period goes to one process), and an option
//!   to report pids with an offset as a pid namespace would;
//! - like driver 580, NVML shows a caller in the host's pid namespace
//!   every process by its *host* pid, and a caller in another namespace
//!   only the processes of its own, by their pids there (run 18 in
//!   docs/benchmarks.md); the driver frees a process's memory when it
//!   dies, whatever its namespace. The host is the namespace of the
//!   `/proc` named by `SIM_GPU_HOST_PROC_FD` (an inherited directory fd,
//!   which survives `unshare --mount-proc`), else of the `/proc` the
//!   process sees. A process holds a POSIX lock
//!   on its own entry's byte of the state file for life (taken with its
//!   first context or memory): the kernel drops it at death, whatever the
//!   namespace, so liveness needs no pid at all; the scheduler drops a
//!   dead process's queued work the same way.
//!
//! Configuration (read by the process that creates the state file):
//! `SIM_GPU_STATE` (path of the state file), `SIM_GPU_COUNT`,
//! `SIM_GPU_MEMORY` (bytes, k/m/g), `SIM_GPU_SMS`, `SIM_GPU_CTX_OVERHEAD`,
//! `SIM_GPU_BLOCK_NS`, `SIM_GPU_TIMESLICE_NS` (2 ms), `SIM_GPU_SWITCH_NS`
//! (0.2 ms) and `SIM_GPU_NVML_PERIOD_US` (166667, 1/6 s); and per process
//! `SIM_GPU_PID_OFFSET`, `SIM_GPU_NVML_DELAY_US` (how stale a process
//! list is when it returns), `SIM_GPU_JITTER_PCT` (each kernel takes up
//! to that much longer than its work, a different amount each launch;
//! a graph's node, each time it is added), `SIM_GPU_WANDER_PCT` (every
//! kernel up to that much longer, by an amount that drifts with the time
//! of its launch, alike in every process: a power-bound clock),
//! `SIM_GPU_HOST_PROC_FD`, `SIM_GPU_NVML=0` (NVML fails to initialise,
//! as where the driver's NVML is missing),
//! `SIM_GPU_NVML_INIT_MS` (NVML starts this slowly in vgpu's fresh
//! NVML children, as on a node of many cards),
//! `SIM_GPU_NVML_ANSWER_MS` (their memory figure, read, reaches the parent
//! this much later, as a loaded host carries it),
//! `SIM_GPU_NO_FD_HANDLES=1` (`cuMemCreate` refuses memory exportable as a
//! file descriptor: `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`) and
//! `SIM_GPU_NVML_LOCKED=1` (NVML's memory queries wait while the process
//! is locked or checkpointed). The defaults are
//! an H200's, measured with driver 580: two processes that always have
//! 1 ms kernels queued get 0.456 of their solo throughput each (2 / 2.2 =
//! 0.909 together here), a kernel's completion waits 3.4 ms when the
//! other context's slice comes in between, and NVML hands each 1/6 s
//! period to one process.
//!
//! - the checkpoint API (checkpoint.rs) for a process acting on itself:
//!   lock blocks its other calls, checkpoint moves its device memory to a
//!   host file beside the state file (copies and memsets keep contents,
//!   data.rs, so tests can checksum them), restore takes the memory back
//!   on the card (out of memory while it does not fit), unlock lets calls
//!   through; a host copy goes when its process dies. `SIM_GPU_MEMORY` is
//!   the card's capacity, whatever the quotas say.
//!
//! Kernels: `vgpu_spin(ns, counter)` (tests/programs/spin_ptx.h) runs `ns`
//! per wave of blocks (one block per SM per wave), `vgpu_empty` 0.1 µs, any
//! other function `SIM_GPU_BLOCK_NS` per wave.
//!
//! Entry points that exist only so that names resolve return
//! `CUDA_ERROR_NOT_SUPPORTED` (stubs.rs).

/// Returns the error of a `Result<_, CUresult>` from the enclosing entry
/// point.
macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(rc) => return rc,
        }
    };
}

mod checkpoint;
mod config;
mod context;
mod cuda;
mod data;
mod ffi;
mod graph;
mod launch;
mod local;
mod memory;
mod nvml;
mod nvml_util;
mod procaddr;
mod queue;
mod sched;
mod state;
mod stream;
mod stubs;
mod vmm;
