//! NVML: the hooked memory-info calls (`hooks.rs`) and vgpu's own NVML
//! client (`client.rs`), which reads per-process memory and utilisation.

pub mod client;
pub mod hooks;
pub mod sys;

/// Every NVML hook family, for the table.
pub(crate) static FAMILIES: &[&[crate::interpose::table::Hook]] = &[hooks::HOOKS];
