//! NVML: the hooked memory-info calls (`memory_info.rs`, exported from
//! `exports.rs`) and vgpu's own NVML client (`client.rs`), which reads
//! per-process memory and utilisation, and `fresh.rs`, free memory as a
//! short-lived child process with its own NVML sees it.

pub mod client;
pub mod exports;
pub mod fresh;
pub mod memory_info;
pub mod real;
pub mod sys;
