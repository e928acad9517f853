/* Records how the real driver's cuGetProcAddress_v2 resolves
 * (symbol, cudaVersion, flags) to an exported entry point.
 *
 *   cc -O1 -o proc_address proc_address.c -ldl && ./proc_address > table.csv
 *
 * For every row it prints the result code, the symbolStatus, and every
 * exported name (base, _v2, _v3, _ptsz, _ptds, ...) whose dlsym() address
 * equals the returned pointer, joined by '|'.  "NULL" when the pointer is
 * NULL, "?" when it matches no exported name.  The same program runs against
 * the simulated GPU in CI (tests/proc_address.rs), and the two tables must
 * agree row for row.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*get_proc_v2_t)(const char *, void **, int, unsigned long long, int *);
typedef int (*get_proc_v1_t)(const char *, void **, int, unsigned long long);

static const char *SYMBOLS[] = {
    /* memory families the library hooks */
    "cuMemAlloc", "cuMemAllocPitch", "cuMemAllocManaged", "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync", "cuMemFree", "cuMemFreeAsync", "cuMemCreate",
    "cuMemRelease", "cuMemAddressReserve", "cuMemAddressFree", "cuMemMap",
    "cuMemUnmap", "cuMemSetAccess", "cuArrayCreate", "cuArray3DCreate",
    "cuArrayDestroy", "cuMipmappedArrayCreate", "cuMipmappedArrayDestroy",
    "cuMemGetInfo", "cuMemPoolCreate", "cuMemPoolDestroy", "cuMemPoolTrimTo",
    "cuMemGetAllocationGranularity",
    /* memory calls we pass through, for version coverage */
    "cuMemHostAlloc", "cuMemcpy", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyAsync",
    "cuMemcpyHtoDAsync", "cuMemsetD8", "cuMemsetD32Async", "cuMemPrefetchAsync",
    "cuMemAdvise", "cuMemGetAddressRange", "cuMemHostRegister",
    /* device and info */
    "cuInit", "cuDriverGetVersion", "cuDeviceGet", "cuDeviceGetCount",
    "cuDeviceGetName", "cuDeviceTotalMem", "cuDeviceGetUuid", "cuDeviceGetAttribute",
    "cuDeviceGetMemPool", "cuDeviceGetDefaultMemPool",
    /* contexts */
    "cuCtxCreate", "cuCtxDestroy", "cuCtxGetCurrent", "cuCtxSetCurrent",
    "cuCtxPushCurrent", "cuCtxPopCurrent", "cuCtxSynchronize", "cuCtxGetDevice",
    "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxReset",
    "cuDevicePrimaryCtxSetFlags", "cuDevicePrimaryCtxGetState",
    /* launches and graphs */
    "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
    "cuLaunchHostFunc", "cuGraphLaunch", "cuGraphInstantiate",
    "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams", "cuGraphCreate",
    "cuGraphAddKernelNode", "cuGraphExecDestroy", "cuGraphDestroy", "cuGraphUpload",
    "cuGraphGetNodes", "cuGraphNodeGetType", "cuGraphKernelNodeGetParams",
    /* streams and events */
    "cuStreamCreate", "cuStreamDestroy", "cuStreamSynchronize", "cuStreamQuery",
    "cuStreamWaitEvent", "cuStreamBeginCapture", "cuStreamEndCapture",
    "cuStreamIsCapturing", "cuStreamGetCaptureInfo", "cuStreamGetCtx",
    "cuEventCreate", "cuEventRecord", "cuEventQuery", "cuEventSynchronize",
    "cuEventElapsedTime", "cuEventDestroy",
    /* modules and misc */
    "cuModuleLoadData", "cuModuleGetFunction", "cuModuleUnload", "cuLibraryLoadData",
    "cuGetProcAddress", "cuGetErrorString", "cuFuncGetAttribute",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    /* not a driver symbol at all */
    "cuDoesNotExist",
};

static const int VERSIONS[] = {2000, 3020, 4000, 10000, 11030, 11070, 12000, 12050, 13000, 13010};
static const unsigned long long FLAGS[] = {0, 1, 2};
static const char *SUFFIXES[] = {"", "_v2", "_v3", "_v4", "_ptsz", "_ptds", "_v2_ptsz",
                                 "_v2_ptds", "_v3_ptsz", "_v3_ptds", "_v4_ptsz", "_v4_ptds"};

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* Every exported name built from `base` whose address is `p`, '|'-joined. */
static void names_at(void *lib, const char *base, void *p, char *out, size_t cap) {
    out[0] = 0;
    if (!p) {
        snprintf(out, cap, "NULL");
        return;
    }
    for (size_t i = 0; i < N(SUFFIXES); i++) {
        char name[160];
        snprintf(name, sizeof name, "%s%s", base, SUFFIXES[i]);
        if (dlsym(lib, name) == p) {
            if (out[0]) strncat(out, "|", cap - strlen(out) - 1);
            strncat(out, name, cap - strlen(out) - 1);
        }
    }
    if (!out[0]) snprintf(out, cap, "?");
}

int main(int argc, char **argv) {
    const char *libname = argc > 1 ? argv[1] : "libcuda.so.1";
    void *lib = dlopen(libname, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen %s: %s\n", libname, dlerror());
        return 1;
    }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
    get_proc_v2_t get_v2 = (get_proc_v2_t)dlsym(lib, "cuGetProcAddress_v2");
    get_proc_v1_t get_v1 = (get_proc_v1_t)dlsym(lib, "cuGetProcAddress");
    if (!init || !get_v2 || init(0) != 0) {
        fprintf(stderr, "cuInit or cuGetProcAddress_v2 missing/failed\n");
        return 1;
    }
    printf("api,symbol,version,flags,result,status,resolved\n");
    char names[1024];
    for (size_t s = 0; s < N(SYMBOLS); s++)
        for (size_t v = 0; v < N(VERSIONS); v++)
            for (size_t f = 0; f < N(FLAGS); f++) {
                void *p = NULL;
                int status = -1;
                int rc = get_v2(SYMBOLS[s], &p, VERSIONS[v], FLAGS[f], &status);
                names_at(lib, SYMBOLS[s], p, names, sizeof names);
                printf("v2,%s,%d,%llu,%d,%d,%s\n", SYMBOLS[s], VERSIONS[v], FLAGS[f], rc,
                       status, names);
            }
    /* The 4-argument export, for the versions cudart 11.x would ask for. */
    if (get_v1)
        for (size_t s = 0; s < N(SYMBOLS); s++)
            for (size_t f = 0; f < N(FLAGS); f++) {
                void *p = NULL;
                int rc = get_v1(SYMBOLS[s], &p, 11030, FLAGS[f]);
                names_at(lib, SYMBOLS[s], p, names, sizeof names);
                printf("v1,%s,11030,%llu,%d,-,%s\n", SYMBOLS[s], FLAGS[f], rc, names);
            }
    return 0;
}
