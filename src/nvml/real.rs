//! Every real NVML function vgpu calls, typed, in one list: the hooked
//! ones (`exports.rs`) and those our own client calls (`client.rs`,
//! `memory_info.rs`). Each answers `NVML_ERROR_FUNCTION_NOT_FOUND` when
//! the library lacks it.

use std::ffi::{c_char, c_uint};

use super::sys::*;
use crate::interpose::real::Lib;

crate::interpose::reals::reals! {
    lib: Lib::Nvml, missing: NvmlReturn::ERROR_FUNCTION_NOT_FOUND;
    fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory: *mut Memory) -> NvmlReturn;
    fn nvmlDeviceGetMemoryInfo_v2(device: NvmlDevice, memory: *mut MemoryV2) -> NvmlReturn;
    // called, not hooked
    fn nvmlInit_v2() -> NvmlReturn;
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut NvmlDevice) -> NvmlReturn;
    fn nvmlDeviceGetUUID(device: NvmlDevice, uuid: *mut c_char, len: c_uint) -> NvmlReturn;
    fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut NvmlIndex) -> NvmlReturn;
    fn nvmlDeviceGetComputeRunningProcesses_v3(device: NvmlDevice, count: *mut c_uint, infos: *mut ProcessInfo) -> NvmlReturn;
    fn nvmlDeviceGetComputeRunningProcesses_v2(device: NvmlDevice, count: *mut c_uint, infos: *mut ProcessInfo) -> NvmlReturn;
    fn nvmlDeviceGetComputeRunningProcesses(device: NvmlDevice, count: *mut c_uint, infos: *mut ProcessInfoV1) -> NvmlReturn;
    fn nvmlDeviceGetProcessUtilization(device: NvmlDevice, samples: *mut UtilSample, count: *mut c_uint, since: u64) -> NvmlReturn;
}
