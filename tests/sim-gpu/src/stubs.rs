//! Entry points that exist so that every name the real driver resolves also
//! resolves here (see procaddr.rs). None of them is used by vgpu or by the
//! test programs; each returns CUDA_ERROR_NOT_SUPPORTED.
#![allow(non_snake_case)]

use crate::ffi::{CUresult, NOT_SUPPORTED};

macro_rules! stubs {
    ($($name:ident),* $(,)?) => {
        $(
            #[unsafe(no_mangle)]
            pub extern "C" fn $name() -> CUresult {
                NOT_SUPPORTED
            }
        )*
        /// (name, address) of every stub.
        pub fn stub_exports() -> &'static [(&'static str, usize)] {
            static LIST: std::sync::OnceLock<Vec<(&'static str, usize)>> = std::sync::OnceLock::new();
            LIST.get_or_init(|| vec![$((stringify!($name), $name as *const () as usize)),*])
        }
    };
}

stubs! {
    cuMemAlloc, cuMemAllocPitch, cuMemFree, cuArrayCreate, cuArray3DCreate, cuMemGetInfo,
    cuMemcpy, cuMemcpy_ptds, cuMemcpyHtoD, cuMemcpyHtoD_v2_ptds, cuMemcpyDtoH,
    cuMemcpyDtoH_v2_ptds, cuMemcpyAsync, cuMemcpyAsync_ptsz, cuMemcpyHtoDAsync,
    cuMemcpyHtoDAsync_v2_ptsz, cuMemsetD8, cuMemsetD8_v2_ptds,
    cuMemsetD32Async, cuMemsetD32Async_ptsz, cuMemPrefetchAsync, cuMemPrefetchAsync_ptsz,
    cuMemPrefetchAsync_v2, cuMemPrefetchAsync_v2_ptsz, cuMemAdvise, cuMemAdvise_v2,
    cuMemGetAddressRange, cuMemHostRegister,
    cuLaunchHostFunc, cuLaunchHostFunc_ptsz, cuStreamWaitEvent, cuStreamWaitEvent_ptsz,
    cuStreamGetCaptureInfo_v2, cuStreamGetCaptureInfo_v2_ptsz, cuStreamGetCaptureInfo_v3,
    cuStreamGetCaptureInfo_v3_ptsz, cuStreamGetCtx_ptsz, cuStreamGetCtx_v2,
    cuStreamGetCtx_v2_ptsz, cuLibraryLoadData, cuEventDestroy, cuStreamDestroy,
    cuMemHostGetDevicePointer,
}
