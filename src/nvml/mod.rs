//! NVML: the hooked memory-info calls (`memory_info.rs`, exported from
//! `exports.rs`) and vgpu's own NVML client (`client.rs`), which reads
//! per-process memory and utilisation.

pub mod client;
pub mod exports;
pub mod memory_info;
pub mod real;
pub mod sys;
