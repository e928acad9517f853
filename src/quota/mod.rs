//! Per-process memory accounting.
//! - `tracker`: what each live allocation counted
//! - `overhead`: context and library memory, reconciled against NVML

pub mod overhead;
pub mod tracker;
