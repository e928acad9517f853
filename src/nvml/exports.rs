//! The exported NVML hooks: `hooks!` makes each an exported C function
//! and a table entry for `dlsym`, falling back to its real function
//! (`real.rs`). With `sys.rs` and `real.rs`, the NVML side's FFI edge.

use super::memory_info;
use super::real;
use super::sys::*;
use crate::interpose::real::Lib;

crate::interpose::table::hooks! {
    lib: Lib::Nvml, missing: NvmlReturn::ERROR_FUNCTION_NOT_FOUND, real: real, enter: crate::interpose::table::open;
    fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory: *mut Memory) -> NvmlReturn => memory_info::memory_info;
    fn nvmlDeviceGetMemoryInfo_v2(device: NvmlDevice, memory: *mut MemoryV2) -> NvmlReturn => memory_info::memory_info_v2;
}
