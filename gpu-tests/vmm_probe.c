/* Facts for issue 27 (suspend by copying VMM-backed allocations ourselves):
 * pinned copy rates, the cost of pinning, the VMM calls' costs, whether the
 * checkpoint API copes with VMM mappings and bare reservations, pointer
 * attributes of VMM vs cuMemAlloc memory, and whether cuMemUnmap waits for
 * a running kernel. Driver API only; prints key=value lines. Every step has
 * an alarm so a hang ends the run with timeout_step=NAME. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define GiB (1ull << 30)
#define MiB (1ull << 20)
static const char *step = "start";
static void on_alarm(int s) {
    (void)s;
    char b[128];
    int n = snprintf(b, sizeof b, "timeout_step=%s\n", step);
    if (write(1, b, n) < 0) _exit(4);
    _exit(3);
}
static void STEP(const char *s, unsigned secs) {
    step = s;
    alarm(secs);
}
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
#define CK(x)                                                                 \
    do {                                                                      \
        CUresult r_ = (x);                                                    \
        if (r_) printf("error_rc=%d at=%s line=%d call=%s\n", r_, step, __LINE__, #x); \
    } while (0)

static CUdevice dev;
static CUcontext ctx;
static size_t gran_min, gran_rec;

/* NVML (dlopen) for the card's used memory without a context. */
typedef struct { unsigned long long total, free, used; } NvmlMem;
static int (*nvmlInit_v2)(void);
static int (*nvmlDeviceGetHandleByIndex_v2)(unsigned, void **);
static int (*nvmlDeviceGetMemoryInfo)(void *, NvmlMem *);
static void *nvdev;
static long long nvml_used_mib(void) {
    NvmlMem m;
    if (!nvdev || nvmlDeviceGetMemoryInfo(nvdev, &m)) return -1;
    return (long long)(m.used >> 20);
}

static uint64_t pat(uint64_t i) {
    uint64_t x = i * 0x9e3779b97f4a7c15ull;
    return x ^ (x >> 29);
}
static void fill(uint64_t *h, size_t bytes) {
    for (size_t i = 0; i < bytes / 8; i++) h[i] = pat(i);
}
static long check(const uint64_t *h, size_t bytes) {
    long bad = 0;
    for (size_t i = 0; i < bytes / 8; i++) bad += h[i] != pat(i);
    return bad;
}

/* Copies bytes in 256 MiB chunks round-robin over ns streams; GB/s. */
static CUstream streams[4];
static double copy(int out, CUdeviceptr d, void *h, size_t bytes, int ns) {
    double t = now();
    size_t ch = 256 * MiB;
    int k = 0;
    for (size_t off = 0; off < bytes; off += ch, k++) {
        size_t n = bytes - off < ch ? bytes - off : ch;
        if (out)
            CK(cuMemcpyDtoHAsync((char *)h + off, d + off, n, streams[k % ns]));
        else
            CK(cuMemcpyHtoDAsync(d + off, (char *)h + off, n, streams[k % ns]));
    }
    for (int i = 0; i < ns; i++) CK(cuStreamSynchronize(streams[i]));
    return bytes / 1e9 / (now() - t);
}

static CUmemAllocationProp prop(void) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    return p;
}
static CUresult vmm_back(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle *hd) {
    CUmemAllocationProp p = prop();
    CUresult r = cuMemCreate(hd, size, &p, 0);
    if (r) return r;
    if ((r = cuMemMap(va, size, 0, *hd, 0))) return r;
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = dev;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return cuMemSetAccess(va, size, &a, 1);
}
static size_t round_up(size_t n) { return (n + gran_min - 1) / gran_min * gran_min; }
static CUdeviceptr vmm_alloc(size_t size, CUmemGenericAllocationHandle *hd, double *ms) {
    CUdeviceptr va = 0;
    double t = now();
    size = round_up(size);
    CK(cuMemAddressReserve(&va, size, 0, 0, 0));
    CK(vmm_back(va, size, hd));
    if (ms) *ms = (now() - t) * 1e3;
    return va;
}

static const char *SPIN_PTX =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry spin(.param .u64 ns){\n"
    ".reg .u64 %rd<5>;\n.reg .pred %p;\n"
    "ld.param.u64 %rd1,[ns];\nmov.u64 %rd2,%globaltimer;\n"
    "L1: mov.u64 %rd3,%globaltimer;\nsub.u64 %rd4,%rd3,%rd2;\n"
    "setp.lt.u64 %p,%rd4,%rd1;\n@%p bra L1;\nret;\n}\n";

static void attrs(const char *who, CUdeviceptr base, size_t off) {
    CUdeviceptr p = base + off, rb = 0;
    size_t rs = 0;
    CUresult r = cuMemGetAddressRange(&rb, &rs, p);
    printf("%s addr_range_rc=%d base_off=%lld size=%zu\n", who, r, (long long)(rb - base), rs);
    unsigned long long v;
    struct { CUpointer_attribute a; const char *n; } at[] = {
        {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, "range_start_off"},
        {CU_POINTER_ATTRIBUTE_RANGE_SIZE, "range_size"},
        {CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, "legacy_ipc_capable"},
        {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, "memory_type"},
        {CU_POINTER_ATTRIBUTE_BUFFER_ID, "buffer_id"},
        {CU_POINTER_ATTRIBUTE_MAPPED, "mapped"},
        {CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, "allowed_handle_types"},
        {CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, "device_ordinal"},
        {CU_POINTER_ATTRIBUTE_CONTEXT, "context_is_ctx"},
        {CU_POINTER_ATTRIBUTE_IS_MANAGED, "is_managed"},
        {CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, "sync_memops"},
    };
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        v = 0;
        r = cuPointerGetAttribute(&v, at[i].a, p);
        if (at[i].a == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) v -= base;
        if (at[i].a == CU_POINTER_ATTRIBUTE_CONTEXT) v = (CUcontext)(uintptr_t)v == ctx;
        if (at[i].a == CU_POINTER_ATTRIBUTE_MEMORY_TYPE || at[i].a == CU_POINTER_ATTRIBUTE_MAPPED ||
            at[i].a == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL || at[i].a == CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE ||
            at[i].a == CU_POINTER_ATTRIBUTE_IS_MANAGED || at[i].a == CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)
            v &= 0xffffffffull; /* 4-byte attributes */
        printf("%s %s_rc=%d %s=%llu\n", who, at[i].n, r, at[i].n, v);
    }
    CUipcMemHandle ih;
    printf("%s ipc_get_mem_handle_rc=%d\n", who, cuIpcGetMemHandle(&ih, p));
}

static double ckpt_ms[2];
static int checkpoint_cycle(const char *who) {
    int pid = getpid();
    CUcheckpointLockArgs la;
    memset(&la, 0, sizeof la);
    la.timeoutMs = 20000;
    double t0 = now();
    CUresult l = cuCheckpointProcessLock(pid, &la);
    CUresult c = l ? -1 : cuCheckpointProcessCheckpoint(pid, NULL);
    double t1 = now();
    CUresult r = c ? -1 : cuCheckpointProcessRestore(pid, NULL);
    CUresult u = l ? -1 : cuCheckpointProcessUnlock(pid, NULL);
    double t2 = now();
    ckpt_ms[0] = (t1 - t0) * 1e3;
    ckpt_ms[1] = (t2 - t1) * 1e3;
    printf("%s lock_rc=%d checkpoint_rc=%d restore_rc=%d unlock_rc=%d lock_checkpoint_ms=%.1f restore_unlock_ms=%.1f\n",
           who, l, c, r, u, ckpt_ms[0], ckpt_ms[1]);
    return l || c || r || u;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGALRM, on_alarm);
    void *nh = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (nh) {
        *(void **)&nvmlInit_v2 = dlsym(nh, "nvmlInit_v2");
        *(void **)&nvmlDeviceGetHandleByIndex_v2 = dlsym(nh, "nvmlDeviceGetHandleByIndex_v2");
        *(void **)&nvmlDeviceGetMemoryInfo = dlsym(nh, "nvmlDeviceGetMemoryInfo");
        if (nvmlInit_v2 && nvmlInit_v2() == 0) nvmlDeviceGetHandleByIndex_v2(0, &nvdev);
    }
    STEP("init", 60);
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    int drv = 0;
    cuDriverGetVersion(&drv);
    char name[128] = "";
    cuDeviceGetName(name, sizeof name, dev);
    printf("device=\"%s\" cuda_driver_version=%d\n", name, drv);
    long long u0 = nvml_used_mib();
    double t = now();
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUdeviceptr tiny;
    CK(cuMemAlloc(&tiny, 1 * MiB)); /* makes the context real */
    double ctx_ms = (now() - t) * 1e3;
    long long u1 = nvml_used_mib();
    size_t fr, tot;
    CK(cuMemGetInfo(&fr, &tot));
    printf("ctx_create_ms=%.1f nvml_used_mib_before_ctx=%lld nvml_used_mib_after_ctx_plus_1mib=%lld ctx_cost_mib=%lld "
           "mem_free_mib=%zu mem_total_mib=%zu\n",
           ctx_ms, u0, u1, u1 - u0 - 1, fr >> 20, tot >> 20);
    for (int i = 0; i < 4; i++) CK(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING));

    /* 2. pinning */
    STEP("pin", 120);
    void *h1, *h4, *h16;
    t = now(); CK(cuMemHostAlloc(&h1, 1 * GiB, 0));
    double s1 = now() - t;
    t = now(); CK(cuMemHostAlloc(&h4, 4 * GiB, 0));
    double s4 = now() - t;
    t = now(); CK(cuMemHostAlloc(&h16, 16 * GiB, 0));
    double s16 = now() - t;
    printf("pin_hostalloc_1gib_s=%.3f pin_hostalloc_1gib_gbs=%.2f\n", s1, GiB / 1e9 / s1);
    printf("pin_hostalloc_4gib_s=%.3f pin_hostalloc_4gib_gbs=%.2f\n", s4, 4 * GiB / 1e9 / s4);
    printf("pin_hostalloc_16gib_s=%.3f pin_hostalloc_16gib_gbs=%.2f\n", s16, 16 * GiB / 1e9 / s16);
    t = now(); CK(cuMemFreeHost(h1)); CK(cuMemFreeHost(h4));
    printf("free_host_5gib_s=%.3f\n", now() - t);
    t = now();
    char *m = malloc(4 * GiB);
    memset(m, 1, 4 * GiB);
    double sm = now() - t;
    printf("malloc_memset_4gib_s=%.3f malloc_memset_4gib_gbs=%.2f\n", sm, 4 * GiB / 1e9 / sm);
    t = now(); CK(cuMemHostRegister(m, 4 * GiB, 0));
    double sr = now() - t;
    printf("host_register_touched_4gib_s=%.3f host_register_touched_4gib_gbs=%.2f\n", sr, 4 * GiB / 1e9 / sr);
    t = now(); CK(cuMemHostUnregister(m));
    printf("host_unregister_4gib_s=%.3f\n", now() - t);
    free(m);

    /* 1. pinned copy rates, 4 GiB */
    STEP("copy", 120);
    CUdeviceptr d4;
    CK(cuMemAlloc(&d4, 4 * GiB));
    copy(0, d4, h16, 4 * GiB, 1); /* warm */
    for (int ns = 1; ns <= 4; ns *= 2) {
        double o = copy(1, d4, h16, 4 * GiB, ns), b = copy(0, d4, h16, 4 * GiB, ns);
        printf("pinned_copy_streams=%d out_gbs=%.2f back_gbs=%.2f\n", ns, o, b);
    }
    CK(cuMemFree(d4));

    /* 3. VMM costs */
    STEP("vmm", 120);
    CUmemAllocationProp p = prop();
    CK(cuMemGetAllocationGranularity(&gran_min, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CK(cuMemGetAllocationGranularity(&gran_rec, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    printf("granularity_min=%zu granularity_recommended=%zu\n", gran_min, gran_rec);
    size_t sizes[] = {2 * MiB, 64 * MiB, 1 * GiB, 8 * GiB};
    CUmemGenericAllocationHandle hs[4];
    CUdeviceptr vs[4];
    for (int i = 0; i < 4; i++) {
        double ms;
        vs[i] = vmm_alloc(sizes[i], &hs[i], &ms);
        printf("vmm_reserve_create_map_access_bytes=%zu ms=%.2f\n", sizes[i], ms);
    }
    CUdeviceptr v8 = vs[3];
    size_t n8 = 8 * GiB;
    uint64_t *A = h16, *B = (uint64_t *)((char *)h16 + n8);
    fill(A, n8);
    copy(0, v8, A, n8, 1);
    CK(cuCtxSynchronize());
    double o_copy = now();
    copy(1, v8, B, n8, 1);
    double t_out_copy = now() - o_copy;
    t = now();
    CK(cuMemUnmap(v8, n8));
    CK(cuMemRelease(hs[3]));
    double t_rel = now() - t;
    t = now();
    CK(vmm_back(v8, n8, &hs[3]));
    double t_rec = now() - t;
    t = now();
    copy(0, v8, B, n8, 1);
    double t_in_copy = now() - t;
    memset(A, 0, n8);
    copy(1, v8, A, n8, 1);
    long bad = check(A, n8);
    printf("vmm_8gib_unmap_release_ms=%.2f vmm_8gib_recreate_map_access_ms=%.2f\n", t_rel * 1e3, t_rec * 1e3);
    printf("vmm_8gib_cycle_intact=%d bad_words=%ld\n", bad == 0, bad);
    printf("switch_out_8gib_s=%.3f switch_out_gbs=%.2f (copy %.3f s + unmap/release)\n", t_out_copy + t_rel,
           n8 / 1e9 / (t_out_copy + t_rel), t_out_copy);
    printf("switch_in_8gib_s=%.3f switch_in_gbs=%.2f (create/map/access + copy %.3f s)\n", t_rec + t_in_copy,
           n8 / 1e9 / (t_rec + t_in_copy), t_in_copy);

    /* 5. attributes, VMM vs cuMemAlloc */
    STEP("attrs", 60);
    size_t odd[] = {1000, 3 * MiB + 5, 100 * MiB};
    for (int i = 0; i < 3; i++) {
        CUmemGenericAllocationHandle hh;
        CUdeviceptr v = vmm_alloc(odd[i], &hh, NULL), c;
        CK(cuMemAlloc(&c, odd[i]));
        char w[64];
        snprintf(w, sizeof w, "attr_vmm_size=%zu", odd[i]);
        attrs(w, v, odd[i] / 2);
        snprintf(w, sizeof w, "attr_memalloc_size=%zu", odd[i]);
        attrs(w, c, odd[i] / 2);
        CK(cuMemFree(c));
        CK(cuMemUnmap(v, round_up(odd[i])));
        CK(cuMemRelease(hh));
        CK(cuMemAddressFree(v, round_up(odd[i])));
    }

    /* 6. unmap of another allocation while a kernel runs */
    STEP("unmap_during_kernel", 60);
    CUmodule mod;
    CUfunction spin;
    CUresult mr = cuModuleLoadData(&mod, SPIN_PTX);
    printf("spin_module_rc=%d\n", mr);
    if (!mr && !cuModuleGetFunction(&spin, mod, "spin")) {
        unsigned long long ns = 2000000000ull;
        void *args[] = {&ns};
        CUdeviceptr cm;
        CK(cuMemAlloc(&cm, 64 * MiB));
        t = now();
        CK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, streams[0], args, NULL));
        usleep(100000);
        double t1 = now();
        CUresult ur = cuMemUnmap(vs[1], sizes[1]);
        double t2 = now();
        CUresult rr = cuMemRelease(hs[1]);
        double t3 = now();
        CUresult qr = cuStreamQuery(streams[0]);
        double t4 = now();
        CUresult fr2 = cuMemFree(cm);
        double t5 = now();
        CK(cuStreamSynchronize(streams[0]));
        printf("during_kernel unmap_rc=%d unmap_ms=%.2f release_rc=%d release_ms=%.2f kernel_still_running=%d "
               "memfree_rc=%d memfree_ms=%.2f kernel_total_ms=%.1f\n",
               ur, (t2 - t1) * 1e3, rr, (t3 - t2) * 1e3, qr == CUDA_ERROR_NOT_READY, fr2, (t5 - t4) * 1e3,
               (now() - t) * 1e3);
        CK(cuMemAddressFree(vs[1], sizes[1]));
    }

    /* 4. checkpoint API with VMM: (a) mapped, with 8 GiB of data */
    STEP("ckpt_mapped", 180);
    int a = checkpoint_cycle("ckpt_a_vmm_mapped_8gib");
    memset(A, 0, n8);
    copy(1, v8, A, n8, 1);
    bad = check(A, n8);
    printf("ckpt_a_rc=%d ckpt_a_intact=%d bad_words=%ld\n", a, bad == 0, bad);
    /* (b) a bare reservation: unmap and release everything else */
    STEP("ckpt_reservation", 180);
    for (int i = 0; i < 4; i++) {
        if (i == 1) continue;
        CK(cuMemUnmap(vs[i], round_up(sizes[i])));
        CK(cuMemRelease(hs[i]));
    }
    CK(cuMemFree(tiny));
    CK(cuCtxSynchronize());
    size_t f2;
    CK(cuMemGetInfo(&f2, &tot));
    printf("before_ctx_only_ckpt nvml_used_mib=%lld mem_free_mib=%zu\n", nvml_used_mib(), f2 >> 20);
    int b = checkpoint_cycle("ckpt_b_ctx_plus_bare_reservation");
    for (int k = 0; k < 2; k++) checkpoint_cycle("ckpt_c_ctx_only_repeat");
    CUmemGenericAllocationHandle h8;
    CUresult br = vmm_back(v8, n8, &h8);
    printf("ckpt_b_rc=%d remap_after_restore_rc=%d\n", b, br);
    if (!br) {
        copy(0, v8, B, n8, 1);
        memset(A, 0, n8);
        copy(1, v8, A, n8, 1);
        bad = check(A, n8);
        printf("ckpt_b_remapped_usable=%d bad_words=%ld\n", bad == 0, bad);
    }
    alarm(0);
    printf("done=1\n");
    return 0;
}
