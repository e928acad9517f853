//! The exported NVML hooks and every other NVML function vgpu calls, in
//! one list: `hooks!` makes each hooked one an exported C function and a
//! table entry for `dlsym`, and each of them a typed real function
//! `real::name` (our own NVML client uses only those).
//!
//! This file and `sys.rs` are the NVML side's FFI edge; the handlers hold
//! no `unsafe` code.

use std::ffi::{c_char, c_uint};

use super::memory_info;
use super::sys::*;
use crate::interpose::real::Lib;

crate::interpose::table::hooks! {
    lib: Lib::Nvml, missing: NvmlReturn::ERROR_FUNCTION_NOT_FOUND;
    hooked {
        fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory: *mut Memory) -> NvmlReturn => memory_info::memory_info;
        fn nvmlDeviceGetMemoryInfo_v2(device: NvmlDevice, memory: *mut MemoryV2) -> NvmlReturn => memory_info::memory_info_v2;
    }
    called {
        fn nvmlInit_v2() -> NvmlReturn;
        fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut NvmlDevice) -> NvmlReturn;
        fn nvmlDeviceGetUUID(device: NvmlDevice, uuid: *mut c_char, len: c_uint) -> NvmlReturn;
        fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut NvmlIndex) -> NvmlReturn;
        fn nvmlDeviceGetComputeRunningProcesses_v3(device: NvmlDevice, count: *mut c_uint, infos: *mut ProcessInfo) -> NvmlReturn;
        fn nvmlDeviceGetComputeRunningProcesses_v2(device: NvmlDevice, count: *mut c_uint, infos: *mut ProcessInfo) -> NvmlReturn;
        fn nvmlDeviceGetComputeRunningProcesses(device: NvmlDevice, count: *mut c_uint, infos: *mut ProcessInfoV1) -> NvmlReturn;
        fn nvmlDeviceGetProcessUtilization(device: NvmlDevice, samples: *mut UtilSample, count: *mut c_uint, since: u64) -> NvmlReturn;
    }
}
