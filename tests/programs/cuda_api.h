/* The slice of the CUDA driver API the test programs use, declared here so
 * they build without cuda.h (CI has no CUDA toolkit), and a loader that
 * fills one table of entry points the way the program was built to reach
 * the driver:
 *
 *   -DVIA_LINK      linked against libcuda.so.1 (-lcuda)
 *   -DVIA_DLSYM     dlopen("libcuda.so.1") + dlsym
 *   -DVIA_PROCADDR  dlsym of cuGetProcAddress_v2, then every entry point
 *                   through it, as cudart does (CUDA 13.0 ABI; per-thread
 *                   default-stream variants when CU_PTDS=1 is set)
 */
#ifndef VGPU_CUDA_API_H
#define VGPU_CUDA_API_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent, *CUarray,
    *CUmipmappedArray, *CUmemoryPool, *CUgraph, *CUgraphNode, *CUgraphExec;

typedef struct { size_t Width, Height; unsigned Format, NumChannels; } CUDA_ARRAY_DESCRIPTOR;
typedef struct { size_t Width, Height, Depth; unsigned Format, NumChannels, Flags; } CUDA_ARRAY3D_DESCRIPTOR;
typedef struct { int type, id; } CUmemLocation;
typedef struct {
    int type, requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;
typedef struct {
    CUfunction func;
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void **kernelParams, **extra;
    void *kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_READY 600

/* X(name, symbol for cuGetProcAddress, version, return, params) */
#define CU_FUNCTIONS(X)                                                                       \
    X(cuInit, "cuInit", 13000, (unsigned))                                                    \
    X(cuDriverGetVersion, "cuDriverGetVersion", 13000, (int *))                              \
    X(cuDeviceGetCount, "cuDeviceGetCount", 13000, (int *))                                  \
    X(cuDeviceGet, "cuDeviceGet", 13000, (CUdevice *, int))                                  \
    X(cuDeviceGetName, "cuDeviceGetName", 13000, (char *, int, CUdevice))                    \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 13000, (size_t *, CUdevice))                  \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 13000, (CUcontext *, CUdevice))  \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 13000, (CUdevice))          \
    X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 13000, (CUdevice))              \
    X(cuCtxCreate_v4, "cuCtxCreate", 13000, (CUcontext *, void *, unsigned, CUdevice))       \
    X(cuCtxDestroy_v2, "cuCtxDestroy", 13000, (CUcontext))                                   \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", 13000, (CUcontext))                                \
    X(cuCtxGetCurrent, "cuCtxGetCurrent", 13000, (CUcontext *))                              \
    X(cuCtxSynchronize, "cuCtxSynchronize", 12080, (void))                                   \
    X(cuCtxSynchronize_v2, "cuCtxSynchronize", 13000, (CUcontext))                           \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 13000, (size_t *, size_t *))                          \
    X(cuMemAlloc_v2, "cuMemAlloc", 13000, (CUdeviceptr *, size_t))                           \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 13000,                                         \
      (CUdeviceptr *, size_t *, size_t, size_t, unsigned))                                  \
    X(cuMemAllocManaged, "cuMemAllocManaged", 13000, (CUdeviceptr *, size_t, unsigned))     \
    X(cuMemAllocAsync, "cuMemAllocAsync", 13000, (CUdeviceptr *, size_t, CUstream))         \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 13000,                            \
      (CUdeviceptr *, size_t, CUmemoryPool, CUstream))                                      \
    X(cuMemFreeAsync, "cuMemFreeAsync", 13000, (CUdeviceptr, CUstream))                      \
    X(cuMemFree_v2, "cuMemFree", 13000, (CUdeviceptr))                                       \
    X(cuMemGetAddressRange_v2, "cuMemGetAddressRange", 13000,                               \
      (CUdeviceptr *, size_t *, CUdeviceptr))                                               \
    X(cuIpcGetMemHandle, "cuIpcGetMemHandle", 13000, (void *, CUdeviceptr))                  \
    X(cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle", 13000, (CUdeviceptr *, CUipcMemHandle, unsigned)) \
    X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 13000, (CUdeviceptr))                      \
    X(cuPointerGetAttribute, "cuPointerGetAttribute", 13000, (void *, int, CUdeviceptr))      \
    X(cuPointerGetAttributes, "cuPointerGetAttributes", 13000,                              \
      (unsigned, int *, void **, CUdeviceptr))                                              \
    X(cuMemcpyHtoD_v2, "cuMemcpyHtoD", 13000, (CUdeviceptr, const void *, size_t))            \
    X(cuMemcpyDtoH_v2, "cuMemcpyDtoH", 13000, (void *, CUdeviceptr, size_t))                  \
    X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 13000, (CUmemoryPool *, CUdevice)) \
    X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", 13000,               \
      (size_t *, const CUmemAllocationProp *, int))                                         \
    X(cuMemCreate, "cuMemCreate", 13000,                                                    \
      (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long)) \
    X(cuMemRelease, "cuMemRelease", 13000, (CUmemGenericAllocationHandle))                   \
    X(cuMemAddressReserve, "cuMemAddressReserve", 13000,                                    \
      (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))                     \
    X(cuMemAddressFree, "cuMemAddressFree", 13000, (CUdeviceptr, size_t))                    \
    X(cuMemMap, "cuMemMap", 13000,                                                          \
      (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))      \
    X(cuMemUnmap, "cuMemUnmap", 13000, (CUdeviceptr, size_t))                                \
    X(cuMemSetAccess, "cuMemSetAccess", 13000, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t)) \
    X(cuMemGetAccess, "cuMemGetAccess", 13000, (unsigned long long *, const CUmemLocation *, CUdeviceptr)) \
    X(cuArrayCreate_v2, "cuArrayCreate", 13000, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *))  \
    X(cuArray3DCreate_v2, "cuArray3DCreate", 13000, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *)) \
    X(cuArrayDestroy, "cuArrayDestroy", 13000, (CUarray))                                    \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 13000,                              \
      (CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned))                      \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 13000, (CUmipmappedArray))         \
    X(cuMemHostAlloc, "cuMemHostAlloc", 13000, (void **, size_t, unsigned))                  \
    X(cuStreamCreate, "cuStreamCreate", 13000, (CUstream *, unsigned))                       \
    X(cuStreamSynchronize, "cuStreamSynchronize", 13000, (CUstream))                         \
    X(cuModuleLoadData, "cuModuleLoadData", 13000, (CUmodule *, const void *))               \
    X(cuModuleGetFunction, "cuModuleGetFunction", 13000, (CUfunction *, CUmodule, const char *)) \
    X(cuLaunchKernel, "cuLaunchKernel", 13000,                                              \
      (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,    \
       CUstream, void **, void **))                                                         \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", 13000,                                          \
      (const CUlaunchConfig *, CUfunction, void **, void **))                               \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 13000,                        \
      (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,    \
       CUstream, void **))                                                                  \
    X(cuEventCreate, "cuEventCreate", 13000, (CUevent *, unsigned))                          \
    X(cuEventRecord, "cuEventRecord", 13000, (CUevent, CUstream))                            \
    X(cuEventQuery, "cuEventQuery", 13000, (CUevent))                                        \
    X(cuEventSynchronize, "cuEventSynchronize", 13000, (CUevent))                            \
    X(cuEventDestroy_v2, "cuEventDestroy", 13000, (CUevent))                                 \
    X(cuGraphCreate, "cuGraphCreate", 13000, (CUgraph *, unsigned))                          \
    X(cuGraphAddKernelNode_v2, "cuGraphAddKernelNode", 13000,                               \
      (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const CUDA_KERNEL_NODE_PARAMS *)) \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 13000,                    \
      (CUgraphExec *, CUgraph, unsigned long long))                                         \
    X(cuGraphLaunch, "cuGraphLaunch", 13000, (CUgraphExec, CUstream))                        \
    X(cuGraphExecDestroy, "cuGraphExecDestroy", 13000, (CUgraphExec))                        \
    X(cuGraphDestroy, "cuGraphDestroy", 13000, (CUgraph))                                    \
    X(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 13000, (CUstream, int))               \
    X(cuStreamEndCapture, "cuStreamEndCapture", 13000, (CUstream, CUgraph *))

#define DECLARE_FIELD(name, sym, ver, params) CUresult(*name) params;
struct cu {
    CU_FUNCTIONS(DECLARE_FIELD)
};

#ifdef VIA_LINK
#define DECLARE_PROTO(name, sym, ver, params) CUresult name params;
CU_FUNCTIONS(DECLARE_PROTO)
#endif

/* Fills `cu`; returns the number of entry points that could not be found. */
static int cu_load(struct cu *cu) {
    int missing = 0;
#if defined(VIA_LINK)
#define LOAD(name, sym, ver, params) cu->name = name;
    CU_FUNCTIONS(LOAD)
#undef LOAD
#elif defined(VIA_DLSYM)
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return -1;
#define LOAD(name, sym, ver, params) \
    if (!(*(void **)&cu->name = dlsym(lib, #name))) missing++;
    CU_FUNCTIONS(LOAD)
#undef LOAD
#elif defined(VIA_PROCADDR)
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return -1;
    CUresult (*get)(const char *, void **, int, unsigned long long, int *) =
        (CUresult(*)(const char *, void **, int, unsigned long long, int *))dlsym(lib, "cuGetProcAddress_v2");
    if (!get) return -1;
    const char *ptds = getenv("CU_PTDS");
    unsigned long long flags = (ptds && *ptds == '1') ? 2 : 0;
#define LOAD(name, sym, ver, params)                                        \
    {                                                                       \
        int st = -1;                                                        \
        if (get(sym, (void **)&cu->name, ver, flags, &st) || !cu->name) missing++; \
    }
    CU_FUNCTIONS(LOAD)
#undef LOAD
#else
#error "build with -DVIA_LINK, -DVIA_DLSYM or -DVIA_PROCADDR"
#endif
    return missing;
}

#endif
