//! The CUDA driver API hooks. `exports.rs` lists every hooked symbol and
//! the handler it goes to, one family per file:
//! - `memory`: every allocation family and its frees (counted)
//! - `context`: context create/destroy/primary reset (overhead, release)
//! - `info`: `cuInit` and the virtual view of memory
//! - `proc_address`: `cuGetProcAddress(_v2)`, swap by returned pointer
//! - `launch`: every launch family, through the compute bucket
//! - `graph`: graph instantiation (cost) and stream capture
//!
//! and the helpers they share: `sys` (types), `driver` (calls vgpu makes
//! itself), `device` (ordinal to device entry).

pub mod context;
pub mod device;
pub mod driver;
pub mod exports;
pub mod graph;
pub mod info;
pub mod launch;
pub mod memory;
pub mod proc_address;
pub mod sys;
