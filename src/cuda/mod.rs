//! The CUDA driver API hooks. `exports.rs` lists every hooked symbol and
//! the handler it goes to, one family per file:
//! - `memory`: every allocation family and its frees (counted)
//! - `context`: context create/destroy/primary reset (overhead, release)
//! - `info`: `cuInit` and the virtual view of memory
//! - `proc_address`: `cuGetProcAddress(_v2)`, swap by returned pointer
//! - `launch`: every launch family, through the compute bucket
//! - `graph`: graph instantiation (cost) and stream capture
//! - `wake`: synchronisation and copies, passed through once a suspended
//!   process is restored (oversubscription)
//!
//! and the helpers they share: `sys` (types), `real` (the driver's own
//! functions, typed), `driver` (questions vgpu asks the driver), `device`
//! (ordinal to device entry). The limiter's timings (`limiter/events.rs`,
//! `limiter/probes.rs`) call `real` from there.

pub mod context;
pub mod device;
pub mod driver;
pub mod exports;
pub mod graph;
pub mod info;
pub mod launch;
pub mod memory;
pub mod proc_address;
pub mod real;
pub mod sys;
pub mod wake;
