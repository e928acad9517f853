/* A driver-API client for vgpu's tests and GPU benchmarks. Built three
 * ways (see cuda_api.h); runs against the simulated GPU in CI and the real
 * one on the GPU machine. Every scenario prints key=value lines.
 *
 *   cuclient info
 *   cuclient alloc FAMILY BYTES            one allocation, then its free
 *   cuclient fill FAMILY CHUNK             allocate until refused, free, again
 *   cuclient hold BYTES SECONDS            allocate and hold
 *   cuclient ctx BYTES                     own context: allocate, destroy
 *   cuclient spin NS GRID SECONDS [MODE]   throughput of spin kernels (MODE paced:
 *                                          host-bound, a launch every 1.1 NS; synced:
 *                                          cuCtxSynchronize_v2 after every 10; streams:
 *                                          a second thread launches on its own stream too;
 *                                          twodev: a second thread launches on device 1,
 *                                          synchronising after every 10: side_rate)
 *   cuclient ticks NS SECONDS              launch NS-ns spin kernels (grid 1), 10 at a time,
 *                                          printing tick=<CLOCK_REALTIME s> after each 10
 *   cuclient launchcost N                  empty-kernel launch cost
 *   cuclient launchab N ROUNDS             the same, vgpu's entry point vs the driver's
 *   cuclient allocab N ROUNDS BYTES        cuMemAlloc+cuMemFree, vgpu's entry points vs the driver's
 *   cuclient threads THREADS KERNELS NS    threads one after another launch KERNELS NS-ns
 *                                          kernels each and exit; the events held after
 *                                          the first and after all (simulator only)
 *   cuclient race THREADS SECONDS BYTES [QUIET [PAUSE_MS]]
 *                                          threads allocate and free at once
 *                                          (after QUIET seconds with a context,
 *                                          PAUSE_MS between rounds)
 *   cuclient pairs ROUNDS BYTES            two processes race at the limit
 *   cuclient storm SECONDS MAXBYTES SEED   random allocate/free until SIGTERM
 *                                          ("started" once SIGTERM is handled)
 *   cuclient nulls                         NULL out-parameters
 *   cuclient badfree                       frees of things never allocated
 *   cuclient bypass BYTES [VERSION]        dlsym(RTLD_NEXT)/dlvsym routes
 *   cuclient idle SECONDS                  cuInit, one allocation without a
 *                                          context (refused), then sleep
 *   cuclient await BYTES SECONDS HOLD      retry an allocation until granted
 *                                          (or SECONDS), then hold it HOLD s
 *   cuclient keep DATA BALLAST SEED IDLE [RETRY] [LINGER]
 *                                          DATA bytes of a seeded pattern and BALLAST
 *                                          bytes of plain memory; idle IDLE s (no
 *                                          CUDA call), then read DATA back and compare
 *                                          (oversubscription: suspended meanwhile?);
 *                                          a read back refused with out of memory is
 *                                          tried again every 0.2 s for RETRY s; then
 *                                          stay LINGER s (no CUDA call) before exiting
 *   cuclient bursts DATA BALLAST SEED KERNELS IDLE BURSTS
 *                                          DATA bytes of a seeded pattern and BALLAST
 *                                          beside it, then BURSTS times: one 1 ms spin
 *                                          kernel timed (first_op_ms: after an idle
 *                                          spell it includes a restore), KERNELS more,
 *                                          DATA read back and compared; IDLE s without
 *                                          a CUDA call between (gpu-tests oversub, on
 *                                          the simulator: what oversub_jobs.py bursts
 *                                          does with PyTorch on a GPU)
 *   cuclient steps NS GRID SECS WARM [HOST_US]
 *                                          an inference-like loop: one NS spin kernel
 *                                          per step, synchronised, for SECS after WARM
 *                                          s of the same (not counted), HOST_US of host
 *                                          work after each; prints the step
 *                                          latency's p50_ms, p99_ms, max_ms, and the
 *                                          mean time in the launch and in the
 *                                          synchronisation (launch_ms, sync_ms)
 *   cuclient serve NS GRID SECS WARM RATE SERVICE_US [SEED]
 *                                          a server: requests of one NS spin kernel,
 *                                          synchronised, arriving at random (Poisson,
 *                                          RATE a second, SEED), served one at a time
 *                                          for SECS after WARM s (not counted); prints
 *                                          the response time's p50_ms, p99_ms, max_ms
 *                                          (arrival to completion) and the same for a
 *                                          GPU that serves each in SERVICE_US, on the
 *                                          same arrivals (ideal_p50_ms, ideal_p99_ms)
 *   cuclient ctxrace THREADS ROUNDS        threads race the first primary
 *                                          context retain, ROUNDS times
 *   cuclient owner                         first thing, dlopen the driver and dlsym
 *                                          cuMemAlloc_v2 from it: dlsym_driver=1
 *                                          if that is the driver's own function
 *   cuclient forkheld                      cuInit, fork; the child makes a context,
 *                                          allocates (buffer, pool) and exits; both
 *                                          report (with VGPU_TEST_HOLD_LOCK a thread
 *                                          of vgpu holds a lock at the fork)
 *
 * FAMILY: buffer pitch managed async pool vmm array array3d mipmap
 * MODE:   kernel (default) ex coop graph
 */
#define _GNU_SOURCE
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <elf.h>
#include <link.h>
#include <sys/auxv.h>
#include <sys/stat.h>

#include "cuda_api.h"
#include "spin_ptx.h"

static struct cu cu;
static CUdevice g_dev;
static CUcontext g_ctx;

#define CHECK(call)                                                                 \
    do {                                                                            \
        CUresult rc_ = (call);                                                      \
        if (rc_) {                                                                  \
            printf("error=%d call=%s line=%d\n", rc_, #call, __LINE__);             \
            fflush(stdout);                                                         \
            exit(3);                                                                \
        }                                                                           \
    } while (0)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void load_and_init(void) {
    int missing = cu_load(&cu);
    if (missing) {
        printf("error=load missing=%d\n", missing);
        exit(2);
    }
    CHECK(cu.cuInit(0));
    /* CUCLIENT_DEVICE=N: device N instead of the first. */
    const char *device = getenv("CUCLIENT_DEVICE");
    CHECK(cu.cuDeviceGet(&g_dev, device ? atoi(device) : 0));
}

static void setup(void) {
    load_and_init();
    CHECK(cu.cuDevicePrimaryCtxRetain(&g_ctx, g_dev));
    CHECK(cu.cuCtxSetCurrent(g_ctx));
}

static void print_meminfo(const char *tag) {
    size_t free = 0, total = 0;
    CUresult rc = cu.cuMemGetInfo_v2(&free, &total);
    printf("%s_rc=%d %s_free=%zu %s_total=%zu\n", tag, rc, tag, free, tag, total);
}

/* ---- allocation families ------------------------------------------------ */

struct held {
    int family;
    CUdeviceptr ptr;
    CUmemGenericAllocationHandle handle;
    CUarray array;
    size_t bytes;
};

static const char *FAMILIES[] = {"buffer", "pitch", "managed", "async", "pool",
                                 "vmm", "array", "array3d", "mipmap"};
#define NFAMILIES (sizeof FAMILIES / sizeof *FAMILIES)

static int family_of(const char *name) {
    for (size_t i = 0; i < NFAMILIES; i++)
        if (!strcmp(FAMILIES[i], name)) return (int)i;
    printf("error=unknown-family name=%s\n", name);
    exit(2);
}

static size_t granularity(void) {
    CUmemAllocationProp prop = {1, 0, {1, g_dev}, NULL, {0}};
    size_t g = 0;
    if (cu.cuMemGetAllocationGranularity(&g, &prop, 0) || !g) g = 2 << 20;
    return g;
}

/* Allocates about `bytes` of `family`; fills `h`; returns the CUresult. */
static CUresult allocate(int family, size_t bytes, struct held *h) {
    memset(h, 0, sizeof *h);
    h->family = family;
    h->bytes = bytes;
    CUmemoryPool pool;
    switch (family) {
    case 0:
        return cu.cuMemAlloc_v2(&h->ptr, bytes);
    case 1: { /* rows of 64 KiB */
        size_t pitch = 0, width = 65536, height = bytes / width ? bytes / width : 1;
        return cu.cuMemAllocPitch_v2(&h->ptr, &pitch, width, height, 16);
    }
    case 2:
        return cu.cuMemAllocManaged(&h->ptr, bytes, 1);
    case 3: {
        CUresult rc = cu.cuMemAllocAsync(&h->ptr, bytes, 0);
        if (!rc) rc = cu.cuCtxSynchronize();
        return rc;
    }
    case 4: {
        CUresult rc = cu.cuDeviceGetDefaultMemPool(&pool, g_dev);
        if (!rc) rc = cu.cuMemAllocFromPoolAsync(&h->ptr, bytes, pool, 0);
        if (!rc) rc = cu.cuCtxSynchronize();
        return rc;
    }
    case 5: {
        size_t g = granularity();
        bytes = (bytes + g - 1) / g * g;
        h->bytes = bytes;
        CUmemAllocationProp prop = {1, 0, {1, g_dev}, NULL, {0}};
        CUresult rc = cu.cuMemCreate(&h->handle, bytes, &prop, 0);
        if (rc) return rc;
        rc = cu.cuMemAddressReserve(&h->ptr, bytes, 0, 0, 0);
        if (!rc) rc = cu.cuMemMap(h->ptr, bytes, 0, h->handle, 0);
        CUmemAccessDesc access = {{1, g_dev}, 3};
        if (!rc) rc = cu.cuMemSetAccess(h->ptr, bytes, &access, 1);
        return rc;
    }
    case 6: { /* float4 rows of 4096 */
        CUDA_ARRAY_DESCRIPTOR d = {4096, bytes / (4096 * 16) ? bytes / (4096 * 16) : 1, 0x20, 4};
        return cu.cuArrayCreate_v2(&h->array, &d);
    }
    case 7: {
        CUDA_ARRAY3D_DESCRIPTOR d = {1024, 256, bytes / (1024 * 256 * 16) ? bytes / (1024 * 256 * 16) : 1,
                                     0x20, 4, 0};
        return cu.cuArray3DCreate_v2(&h->array, &d);
    }
    case 8: { /* four levels of a 4096-wide float4 image: about `bytes` in all */
        size_t height = bytes * 64 / (4096 * 16 * 85);
        if (height < 8) height = 8;
        h->bytes = 4096 * height * 16 * 85 / 64;
        CUDA_ARRAY3D_DESCRIPTOR d = {4096, height, 0, 0x20, 4, 0};
        return cu.cuMipmappedArrayCreate((CUmipmappedArray *)&h->array, &d, 4);
    }
    }
    return 1;
}

static CUresult release(struct held *h) {
    switch (h->family) {
    case 3:
    case 4: {
        CUresult rc = cu.cuMemFreeAsync(h->ptr, 0);
        if (!rc) rc = cu.cuCtxSynchronize();
        return rc;
    }
    case 5: {
        cu.cuMemUnmap(h->ptr, h->bytes);
        cu.cuMemAddressFree(h->ptr, h->bytes);
        return cu.cuMemRelease(h->handle);
    }
    case 6:
    case 7:
        return cu.cuArrayDestroy(h->array);
    case 8:
        return cu.cuMipmappedArrayDestroy((CUmipmappedArray)h->array);
    default:
        return cu.cuMemFree_v2(h->ptr);
    }
}

static int cmd_alloc(const char *family, size_t bytes) {
    printf("at_secure=%lu\n", getauxval(AT_SECURE));
    setup();
    struct held h;
    CUresult rc = allocate(family_of(family), bytes, &h);
    printf("alloc_rc=%d\n", rc);
    print_meminfo("during");
    if (!rc) printf("free_rc=%d\n", release(&h));
    print_meminfo("after");
    return 0;
}

static int cmd_fill(const char *family, size_t chunk) {
    setup();
    int f = family_of(family);
    static struct held held[4096];
    size_t n = 0, total = 0;
    CUresult rc = 0;
    while (n < 4096 && !(rc = allocate(f, chunk, &held[n]))) total += held[n++].bytes;
    printf("filled_chunks=%zu filled_bytes=%zu stop_rc=%d\n", n, total, rc);
    print_meminfo("full");
    for (size_t i = 0; i < n; i++) release(&held[i]);
    print_meminfo("emptied");
    struct held again;
    rc = allocate(f, chunk, &again);
    printf("refill_rc=%d\n", rc);
    if (!rc) release(&again);
    return 0;
}

static int cmd_hold(size_t bytes, double secs) {
    setup();
    struct held h;
    CUresult rc = allocate(0, bytes, &h);
    printf("hold_rc=%d\n", rc);
    print_meminfo("holding");
    fflush(stdout);
    double end = now_s() + secs;
    while (now_s() < end) usleep(10000);
    return 0;
}

static uint64_t pattern_sum(const uint32_t *w, size_t n) {
    uint64_t s = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) s = (s ^ w[i]) * 1099511628211ull;
    return s;
}

/* A seeded xorshift pattern: data a restore must bring back bit for bit. */
static void fill_pattern(uint32_t *w, size_t n, unsigned seed) {
    uint32_t x = seed | 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        w[i] = x;
    }
}

static int cmd_keep(size_t data, size_t ballast, unsigned seed, double idle, double retry,
                    double linger) {
    setup();
    CUdeviceptr d = 0, b = 0;
    CHECK(cu.cuMemAlloc_v2(&d, data));
    /* The pattern is written before the ballast is taken: a neighbour that
     * comes once the container holds the ballast (`Node::settle`) finds
     * the data on the card, not a write still to come (a loaded CI host
     * took over 0.5 s from the ballast to the write, and the write met
     * the neighbour's hold). */
    size_t n = data / 4;
    uint32_t *w = malloc(data), *back = malloc(data);
    if (!w || !back) return 1;
    fill_pattern(w, n, seed);
    CHECK(cu.cuMemcpyHtoD_v2(d, w, data));
    CUresult brc = ballast ? cu.cuMemAlloc_v2(&b, ballast) : CUDA_SUCCESS;
    printf("ballast_rc=%d\n", brc);
    /* CUCLIENT_KEEP_PITCH=N: N more bytes by cuMemAllocPitch (never
     * VMM-backed: what the checkpoint API moves beside VMM copies). */
    const char *pitched = getenv("CUCLIENT_KEEP_PITCH");
    if (pitched && *pitched) {
        CUdeviceptr pp = 0;
        size_t pitch = 0, rows = strtoull(pitched, 0, 0) >> 20;
        printf("pitch_rc=%d\n", cu.cuMemAllocPitch_v2(&pp, &pitch, 1 << 20, rows, 4));
    }
    /* CUCLIENT_KEEP_ARRAY=N: an array of about N bytes (never VMM-backed). */
    const char *arrayed = getenv("CUCLIENT_KEEP_ARRAY");
    CUarray arr = NULL;
    if (arrayed && *arrayed) {
        size_t rows = strtoull(arrayed, 0, 0) / (4096 * 16);
        CUDA_ARRAY_DESCRIPTOR ad = {4096, rows ? rows : 1, 0x20, 4};
        printf("array_rc=%d\n", cu.cuArrayCreate_v2(&arr, &ad));
    }
    /* CUCLIENT_KEEP_IPC=N: an N-byte block exported by legacy IPC, as a
     * process that shares memory with another does: tried on a fresh
     * block, and where that one cannot be exported (VMM-backed), on the
     * next one, which vgpu then serves ordinarily. Its own pattern is
     * checked after the idle spell too. */
    const char *shared = getenv("CUCLIENT_KEEP_IPC");
    size_t ipc_bytes = shared && *shared ? strtoull(shared, 0, 0) : 0;
    CUdeviceptr x = 0;
    uint32_t *xw = NULL, *xback = NULL;
    if (ipc_bytes) {
        unsigned char h[64];
        CHECK(cu.cuMemAlloc_v2(&x, ipc_bytes));
        CUresult first = cu.cuIpcGetMemHandle(h, x);
        CUresult rc = first;
        if (first) {
            CHECK(cu.cuMemAlloc_v2(&x, ipc_bytes));
            rc = cu.cuIpcGetMemHandle(h, x);
        }
        printf("ipc_first_rc=%d ipc_rc=%d\n", first, rc);
        xw = malloc(ipc_bytes);
        xback = malloc(ipc_bytes);
        if (!xw || !xback) return 1;
        fill_pattern(xw, ipc_bytes / 4, seed + 1);
        CHECK(cu.cuMemcpyHtoD_v2(x, xw, ipc_bytes));
    }
    /* CUCLIENT_KEEP_DEVICE1=N: an N-byte block with a pattern of its own on
     * device 1 too (its primary context), checked after the idle spell;
     * CUCLIENT_KEEP_CARDS=K: on each of devices 1..K (at most 7). */
    const char *second = getenv("CUCLIENT_KEEP_DEVICE1");
    size_t d1_bytes = second && *second ? strtoull(second, 0, 0) : 0;
    const char *cards_env = getenv("CUCLIENT_KEEP_CARDS");
    int cards = d1_bytes ? (cards_env && *cards_env ? atoi(cards_env) : 1) : 0;
    if (cards < 0 || cards > 7) return 1;
    CUcontext c1[7] = {0};
    CUdeviceptr y[7] = {0};
    uint32_t *yw[7] = {0}, *yback[7] = {0};
    for (int k = 0; k < cards; k++) {
        CUdevice dev1;
        CHECK(cu.cuDeviceGet(&dev1, 1 + k));
        CHECK(cu.cuDevicePrimaryCtxRetain(&c1[k], dev1));
        CHECK(cu.cuCtxSetCurrent(c1[k]));
        CHECK(cu.cuMemAlloc_v2(&y[k], d1_bytes));
        yw[k] = malloc(d1_bytes);
        yback[k] = malloc(d1_bytes);
        if (!yw[k] || !yback[k]) return 1;
        fill_pattern(yw[k], d1_bytes / 4, seed + 2 + k);
        CHECK(cu.cuMemcpyHtoD_v2(y[k], yw[k], d1_bytes));
        CHECK(cu.cuCtxSetCurrent(g_ctx));
    }
    /* CUCLIENT_WAKE_WITH_EVENT_QUERY=1: the first call after the idle spell
     * is cuEventQuery, which vgpu does not hook (oversubscription: the
     * driver blocks it while the process is suspended). */
    const char *wake = getenv("CUCLIENT_WAKE_WITH_EVENT_QUERY");
    CUevent ev = NULL;
    if (wake && *wake == '1') {
        CHECK(cu.cuEventCreate(&ev, 0));
        CHECK(cu.cuEventRecord(ev, NULL));
        CHECK(cu.cuEventSynchronize(ev));
    }
    printf("sum=%llu\nready=1\n", (unsigned long long)pattern_sum(w, n));
    fflush(stdout);
    double end = now_s() + idle;
    while (now_s() < end) usleep(10000);
    double t = now_s();
    if (ev) printf("wake_rc=%d wake_ms=%.1f\n", cu.cuEventQuery(ev), (now_s() - t) * 1e3);
    CUresult rc = cu.cuMemcpyDtoH_v2(back, d, data);
    printf("first_back_rc=%d first_back_ms=%.1f\n", rc, (now_s() - t) * 1e3);
    fflush(stdout);
    int tries = 1;
    double until = now_s() + retry;
    while (rc == CUDA_ERROR_OUT_OF_MEMORY && now_s() < until) {
        usleep(200000);
        rc = cu.cuMemcpyDtoH_v2(back, d, data);
        tries++;
    }
    printf("back_rc=%d back_ms=%.1f back_tries=%d\n", rc, (now_s() - t) * 1e3, tries);
    printf("back_sum=%llu\nintact=%d\n", (unsigned long long)pattern_sum(back, n),
           rc == CUDA_SUCCESS && !memcmp(w, back, data));
    if (ipc_bytes) {
        CUresult xrc = cu.cuMemcpyDtoH_v2(xback, x, ipc_bytes);
        printf("ipc_intact=%d\n", xrc == CUDA_SUCCESS && !memcmp(xw, xback, ipc_bytes));
    }
    if (arr) printf("array_destroy_rc=%d\n", cu.cuArrayDestroy(arr));
    if (cards) {
        int all = 1;
        for (int k = 0; k < cards; k++) {
            CHECK(cu.cuCtxSetCurrent(c1[k]));
            CUresult yrc = cu.cuMemcpyDtoH_v2(yback[k], y[k], d1_bytes);
            all &= yrc == CUDA_SUCCESS && !memcmp(yw[k], yback[k], d1_bytes);
        }
        /* (Every device past the first, 1..K.) */
        printf("device1_intact=%d\n", all);
        CHECK(cu.cuCtxSetCurrent(g_ctx));
    }
    fflush(stdout);
    end = now_s() + linger;
    while (now_s() < end) usleep(10000);
    return 0;
}

static int cmd_ctx(size_t bytes) {
    setup();
    CUcontext own;
    CHECK(cu.cuCtxCreate_v4(&own, NULL, 0, g_dev));
    CHECK(cu.cuCtxSetCurrent(own));
    CUdeviceptr p;
    printf("ctx_alloc_rc=%d\n", cu.cuMemAlloc_v2(&p, bytes));
    print_meminfo("in_ctx");
    CHECK(cu.cuCtxSetCurrent(g_ctx));
    printf("destroy_rc=%d\n", cu.cuCtxDestroy_v2(own));
    print_meminfo("after_destroy");
    /* The primary context: reset releases what it held. */
    printf("primary_alloc_rc=%d\n", cu.cuMemAlloc_v2(&p, bytes));
    print_meminfo("primary");
    printf("reset_rc=%d\n", cu.cuDevicePrimaryCtxReset_v2(g_dev));
    CHECK(cu.cuDevicePrimaryCtxRetain(&g_ctx, g_dev));
    CHECK(cu.cuCtxSetCurrent(g_ctx));
    print_meminfo("after_reset");
    return 0;
}

/* ---- kernels ---------------------------------------------------------------- */

static CUfunction g_spin, g_empty;

static void load_kernels(void) {
    CUmodule mod;
    CHECK(cu.cuModuleLoadData(&mod, VGPU_SPIN_PTX));
    CHECK(cu.cuModuleGetFunction(&g_spin, mod, "vgpu_spin"));
    CHECK(cu.cuModuleGetFunction(&g_empty, mod, "vgpu_empty"));
}

#define RING 4096
static CUevent g_ring[RING];
static volatile long g_recorded, g_done;
static volatile int g_stop_poll;
static double g_t0;
static long g_per_sec[3600];
static int g_batch;

/* Counts completions in order, attributing each batch to the second it
 * finished in. */
static void *poller(void *arg) {
    (void)arg;
    cu.cuCtxSetCurrent(g_ctx);
    while (!g_stop_poll || g_done < g_recorded) {
        if (g_done < g_recorded) {
            CUresult rc = cu.cuEventQuery(g_ring[g_done % RING]);
            if (rc == CUDA_SUCCESS) {
                int sec = (int)(now_s() - g_t0);
                if (sec >= 0 && sec < 3600) g_per_sec[sec] += g_batch;
                __atomic_add_fetch(&g_done, 1, __ATOMIC_RELEASE);
                continue;
            }
        }
        usleep(200);
    }
    return NULL;
}

static CUresult launch_one(const char *mode, unsigned long long ns, unsigned grid, CUgraphExec exec) {
    unsigned long long zero = 0;
    void *args[] = {&ns, &zero};
    if (!strcmp(mode, "ex")) {
        CUlaunchConfig c = {grid, 1, 1, 128, 1, 1, 0, 0, NULL, 0};
        return cu.cuLaunchKernelEx(&c, g_spin, args, NULL);
    }
    if (!strcmp(mode, "coop")) return cu.cuLaunchCooperativeKernel(g_spin, grid, 1, 1, 128, 1, 1, 0, 0, args);
    if (!strcmp(mode, "graph")) return cu.cuGraphLaunch(exec, 0);
    return cu.cuLaunchKernel(g_spin, grid, 1, 1, 128, 1, 1, 0, 0, args, NULL);
}

static int cmd_bursts(size_t data, size_t ballast, unsigned seed, long kernels, double idle,
                      int bursts) {
    double t0 = now_s();
    setup();
    load_kernels();
    CUdeviceptr d = 0, b = 0;
    CHECK(cu.cuMemAlloc_v2(&d, data));
    if (ballast) CHECK(cu.cuMemAlloc_v2(&b, ballast));
    size_t n = data / 4;
    uint32_t *w = malloc(data), *back = malloc(data);
    if (!w || !back) return 1;
    fill_pattern(w, n, seed);
    CHECK(cu.cuMemcpyHtoD_v2(d, w, data));
    printf("started=1 setup_s=%.1f\n", now_s() - t0);
    fflush(stdout);
    for (int r = 0; r < bursts; r++) {
        double t = now_s();
        CUresult rc = launch_one("kernel", 1000000ULL, 132, NULL);
        if (!rc) rc = cu.cuCtxSynchronize();
        double first = (now_s() - t) * 1e3;
        t = now_s();
        for (long k = 0; k < kernels && !rc; k++) {
            rc = launch_one("kernel", 1000000ULL, 132, NULL);
            if (!rc && k % 64 == 63) rc = cu.cuCtxSynchronize();
        }
        if (!rc) rc = cu.cuCtxSynchronize();
        double burst = now_s() - t;
        CUresult brc = cu.cuMemcpyDtoH_v2(back, d, data);
        printf("burst=%d first_op_ms=%.0f burst_s=%.2f rc=%d intact=%d\n", r, first, burst, rc ? rc : brc,
               !rc && !brc && !memcmp(w, back, data));
        fflush(stdout);
        double end = now_s() + (r + 1 < bursts ? idle : 0);
        while (now_s() < end) usleep(10000);
    }
    printf("done=1 total_s=%.1f\n", now_s() - t0);
    return 0;
}

/* A graph of `nodes` spin kernels in a chain. */
static CUgraphExec build_graph(unsigned long long ns, unsigned grid, int nodes) {
    CUgraph g;
    CHECK(cu.cuGraphCreate(&g, 0));
    static unsigned long long ns_arg, zero;
    ns_arg = ns;
    static void *args[] = {&ns_arg, &zero};
    CUgraphNode prev = NULL;
    for (int i = 0; i < nodes; i++) {
        CUDA_KERNEL_NODE_PARAMS p = {g_spin, grid, 1, 1, 128, 1, 1, 0, args, NULL, NULL, NULL};
        CUgraphNode node;
        CHECK(cu.cuGraphAddKernelNode_v2(&node, g, prev ? &prev : NULL, prev ? 1 : 0, &p));
        prev = node;
    }
    CUgraphExec exec;
    CHECK(cu.cuGraphInstantiateWithFlags(&exec, g, 0));
    return exec;
}

/* Mode "streams": a second thread launches the same kernels on its own
 * stream for as long, ten at a time, each ten waited for. */
struct side {
    unsigned long long ns;
    unsigned grid;
    double end;
    long launched;
};

static void *side_stream(void *arg) {
    struct side *s = arg;
    unsigned long long zero = 0;
    void *args[] = {&s->ns, &zero};
    CUstream st;
    cu.cuCtxSetCurrent(g_ctx);
    CHECK(cu.cuStreamCreate(&st, 1 /* CU_STREAM_NON_BLOCKING */));
    while (now_s() < s->end) {
        for (int i = 0; i < 10; i++) CHECK(cu.cuLaunchKernel(g_spin, s->grid, 1, 1, 128, 1, 1, 0, st, args, NULL));
        CHECK(cu.cuStreamSynchronize(st));
        s->launched += 10;
    }
    return NULL;
}

/* The second device's loop of `twodev`: the same kernels in its own
 * primary context, synchronised after every ten. */
static void *side_device(void *arg) {
    struct side *s = arg;
    unsigned long long zero = 0;
    void *args[] = {&s->ns, &zero};
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction spin;
    CHECK(cu.cuDeviceGet(&dev, 1));
    CHECK(cu.cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cu.cuCtxSetCurrent(ctx));
    CHECK(cu.cuModuleLoadData(&mod, VGPU_SPIN_PTX));
    CHECK(cu.cuModuleGetFunction(&spin, mod, "vgpu_spin"));
    while (now_s() < s->end) {
        for (int i = 0; i < 10; i++) CHECK(cu.cuLaunchKernel(spin, s->grid, 1, 1, 128, 1, 1, 0, 0, args, NULL));
        CHECK(cu.cuCtxSynchronize());
        s->launched += 10;
    }
    return NULL;
}

static int cmd_spin(unsigned long long ns, unsigned grid, double secs, const char *mode) {
    setup();
    load_kernels();
    int nodes = 4;
    CUgraphExec exec = NULL;
    if (!strcmp(mode, "graph")) exec = build_graph(ns, grid, nodes);
    int per_launch = exec ? nodes : 1;
    int paced = !strcmp(mode, "paced");
    int synced = !strcmp(mode, "synced");
    double next_launch = 0;
    /* An event every batch of about 1 ms of work, and at most ~20 ms or 64
     * launches queued, so the tail after the deadline stays short. */
    int every = (int)(1000000ULL / (ns * per_launch)) ? (int)(1000000ULL / (ns * per_launch)) : 1;
    g_batch = every * per_launch;
    long max_queued = (long)(20000000ULL / (ns * per_launch * every));
    if (max_queued < 2) max_queued = 2;
    if (max_queued > 64) max_queued = 64;
    for (int i = 0; i < RING; i++) CHECK(cu.cuEventCreate(&g_ring[i], 0));
    /* warm-up */
    CHECK(launch_one(mode, ns, grid, exec));
    CHECK(cu.cuCtxSynchronize());
    pthread_t th, side_th;
    g_t0 = now_s();
    pthread_create(&th, NULL, poller, NULL);
    long launched = 0;
    double end = g_t0 + secs;
    struct side side = {ns, grid, end, 0};
    int streams = !strcmp(mode, "streams");
    int twodev = !strcmp(mode, "twodev");
    if (streams) pthread_create(&side_th, NULL, side_stream, &side);
    if (twodev) pthread_create(&side_th, NULL, side_device, &side);
    while (now_s() < end) {
        while (g_recorded - __atomic_load_n(&g_done, __ATOMIC_ACQUIRE) >= max_queued && now_s() < end)
            usleep(100);
        for (int k = 0; k < every; k++) {
            CHECK(launch_one(mode, ns, grid, exec));
            launched++;
            if (paced) {
                /* Host-bound: a launch every 1.1 kernel times, so the
                 * GPU idles a tenth of a kernel between them. */
                while (now_s() < next_launch) {
                }
                next_launch = now_s() + ns * 1.1e-9;
            }
            /* cudaDeviceSynchronize of CUDA 13's runtime (PyTorch's
             * torch.cuda.synchronize) is cuCtxSynchronize_v2. */
            if (synced && launched % 10 == 0) CHECK(cu.cuCtxSynchronize_v2(NULL));
        }
        CHECK(cu.cuEventRecord(g_ring[g_recorded % RING], 0));
        g_recorded++;
    }
    g_stop_poll = 1;
    pthread_join(th, NULL);
    if (streams || twodev) {
        pthread_join(side_th, NULL);
        printf("side_rate=%.3f\n", side.launched / secs);
    }
    int whole = (int)secs;
    long in_window = 0;
    printf("per_sec=");
    for (int i = 0; i < whole; i++) {
        printf("%s%ld", i ? "," : "", g_per_sec[i]);
        in_window += g_per_sec[i];
    }
    printf("\nlaunched=%ld kernels_per_launch=%d rate=%.3f\n", launched, per_launch,
           in_window / (double)whole);
    return 0;
}

/* When each group of launches completed: a launch that stops (a blocked
 * container) shows as a gap between ticks. */
static int cmd_ticks(unsigned long long ns, double secs) {
    setup();
    load_kernels();
    unsigned long long zero = 0;
    void *args[] = {&ns, &zero};
    printf("ready=1\n");
    fflush(stdout);
    double end = now_s() + secs;
    while (now_s() < end) {
        for (int i = 0; i < 10; i++) CHECK(cu.cuLaunchKernel(g_spin, 1, 1, 1, 32, 1, 1, 0, 0, args, NULL));
        CHECK(cu.cuCtxSynchronize());
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        printf("tick=%.4f\n", t.tv_sec + t.tv_nsec * 1e-9);
        fflush(stdout);
    }
    return 0;
}

static int by_latency(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The next arrival after `t` of a Poisson process of `rate` a second
 * (0 < rate < 1e5): Bernoulli trials every 10 us (no libm here). */
static double next_arrival(double t, double rate, unsigned long long *seed) {
    const double tick = 1e-5;
    unsigned long long below = (unsigned long long)(rate * tick * 18446744073709551615.0);
    do {
        t += tick;
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
    } while (*seed >= below);
    return t;
}

/* A server, open loop: see the usage above. */
static int cmd_serve(unsigned long long ns, unsigned grid, double secs, double warm, double rate, double service_us,
                     unsigned long long seed) {
    if (!(rate > 0 && rate < 1e5)) {
        printf("error=rate rate=%g\n", rate);
        return 2;
    }
    setup();
    load_kernels();
    unsigned long long zero = 0;
    void *args[] = {&ns, &zero};
    if (seed == 0) seed = 88172645463325252ULL;
    size_t cap = 1 << 17, n = 0;
    double *lat = malloc(cap * sizeof *lat), *ideal = malloc(cap * sizeof *ideal);
    if (!lat || !ideal) {
        free(lat);
        free(ideal);
        return 1;
    }
    double t0 = now_s(), counted = t0 + warm, end = counted + secs;
    double arrival = next_arrival(t0, rate, &seed), ideal_done = 0;
    while (n < cap && arrival < end) {
        while (now_s() < arrival) {
            double left = arrival - now_s() - 2e-4;
            if (left > 1e-4) {
                struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
                nanosleep(&ts, NULL);
            }
        }
        CHECK(cu.cuLaunchKernel(g_spin, grid, 1, 1, 128, 1, 1, 0, 0, args, NULL));
        CHECK(cu.cuStreamSynchronize(0));
        double done = now_s();
        /* The same request on a GPU that serves each in service_us, first
         * come first served. */
        ideal_done = (ideal_done > arrival ? ideal_done : arrival) + service_us * 1e-6;
        if (arrival >= counted) {
            lat[n] = (done - arrival) * 1e3;
            ideal[n++] = (ideal_done - arrival) * 1e3;
        }
        arrival = next_arrival(arrival, rate, &seed);
    }
    if (n == 0) {
        free(lat);
        free(ideal);
        return 1;
    }
    qsort(lat, n, sizeof *lat, by_latency);
    qsort(ideal, n, sizeof *ideal, by_latency);
    size_t i99 = (size_t)(0.99 * (double)(n - 1));
    printf("requests=%zu requests_per_s=%.2f p50_ms=%.4f p99_ms=%.4f max_ms=%.4f ideal_p50_ms=%.4f "
           "ideal_p99_ms=%.4f\n",
           n, n / secs, lat[n / 2], lat[i99], lat[n - 1], ideal[n / 2], ideal[i99]);
    free(lat);
    free(ideal);
    return 0;
}

/* An inference-like loop: one spin kernel of `ns` per step, synchronised,
 * for `secs` after `warm` s of the same, with `host_us` of host work (a
 * spin) after each step, as a serving loop's own code between requests;
 * prints the step latency's p50, p99 and max (ms), and the mean ms a step
 * spent in its launch and in its synchronisation (launch_ms, sync_ms). */
static int cmd_steps(unsigned long long ns, unsigned grid, double secs, double warm, double host_us) {
    setup();
    load_kernels();
    unsigned long long zero = 0;
    void *args[] = {&ns, &zero};
    double warm_end = now_s() + warm;
    for (int i = 0; i < 3 || now_s() < warm_end; i++) {
        CHECK(cu.cuLaunchKernel(g_spin, grid, 1, 1, 128, 1, 1, 0, 0, args, NULL));
        CHECK(cu.cuStreamSynchronize(0));
        double b = now_s();
        while (now_s() - b < host_us * 1e-6) {
        }
    }
    size_t cap = 1 << 16, n = 0;
    double *lat = malloc(cap * sizeof *lat);
    double *at = malloc(cap * sizeof *at);
    double *order = malloc(cap * sizeof *order);
    if (!lat || !at || !order) {
        free(lat);
        free(at);
        free(order);
        return 1;
    }
    double t0 = now_s(), end = t0 + secs, in_launch = 0, in_sync = 0;
    while (n < cap) {
        double a = now_s();
        if (a >= end) break;
        CHECK(cu.cuLaunchKernel(g_spin, grid, 1, 1, 128, 1, 1, 0, 0, args, NULL));
        double l = now_s();
        CHECK(cu.cuStreamSynchronize(0));
        double b = now_s();
        in_launch += l - a;
        in_sync += b - l;
        at[n] = (a - t0) * 1e3;
        order[n] = (b - a) * 1e3;
        lat[n++] = (b - a) * 1e3;
        while (now_s() - b < host_us * 1e-6) {
        }
    }
    double took = now_s() - t0;
    if (n == 0) return 1;
    qsort(lat, n, sizeof *lat, by_latency);
    /* When the slow steps came (ms into the run: latency ms), the first
     * 100 over twice the median: one a period, or bunched at a start. */
    printf("slow=");
    for (size_t i = 0, shown = 0; i < n && shown < 100; i++) {
        if (order[i] > 2 * lat[n / 2]) {
            printf("%s%.1f:%.2f", shown++ ? "," : "", at[i], order[i]);
        }
    }
    printf("\n");
    free(at);
    free(order);
    size_t i99 = (size_t)(0.99 * (double)(n - 1));
    printf("steps=%zu steps_per_s=%.2f p50_ms=%.4f p99_ms=%.4f max_ms=%.4f launch_ms=%.4f sync_ms=%.4f\n", n,
           n / took, lat[n / 2], lat[i99], lat[n - 1], in_launch * 1e3 / n, in_sync * 1e3 / n);
    /* The tail's shape, for the logs: which percentile a slow kind of step
     * begins at (one a period, or several). */
    printf("p90_ms=%.4f p95_ms=%.4f p98_ms=%.4f p995_ms=%.4f p999_ms=%.4f\n", lat[(size_t)(0.90 * (double)(n - 1))],
           lat[(size_t)(0.95 * (double)(n - 1))], lat[(size_t)(0.98 * (double)(n - 1))],
           lat[(size_t)(0.995 * (double)(n - 1))], lat[(size_t)(0.999 * (double)(n - 1))]);
    free(lat);
    return 0;
}

static int cmd_launchcost(long n) {
    setup();
    load_kernels();
    for (int i = 0; i < 2000; i++) CHECK(cu.cuLaunchKernel(g_empty, 1, 1, 1, 32, 1, 1, 0, 0, NULL, NULL));
    CHECK(cu.cuCtxSynchronize());
    double best = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        double t = now_s();
        for (long i = 0; i < n; i++) CHECK(cu.cuLaunchKernel(g_empty, 1, 1, 1, 32, 1, 1, 0, 0, NULL, NULL));
        double us = (now_s() - t) * 1e6 / n;
        CHECK(cu.cuCtxSynchronize());
        printf("rep=%d launch_us=%.4f\n", rep, us);
        if (us < best) best = us;
    }
    printf("launch_us_best=%.4f\n", best);
    return 0;
}

/* The driver's own address of `name`, read from the library file's
 * .dynsym: no dlsym, so no interposer can answer instead of the driver. */
static void *driver_symbol(const char *name) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    struct link_map *lm = NULL;
    if (!h || dlinfo(h, RTLD_DI_LINKMAP, &lm) || !lm) return NULL;
    int fd = open(lm->l_name, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) return NULL;
    const unsigned char *map = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return NULL;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)map;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(map + eh->e_shoff);
    void *found = NULL;
    for (int i = 0; i < eh->e_shnum && !found; i++) {
        if (sh[i].sh_type != SHT_DYNSYM) continue;
        const Elf64_Sym *sym = (const Elf64_Sym *)(map + sh[i].sh_offset);
        const char *str = (const char *)(map + sh[sh[i].sh_link].sh_offset);
        for (size_t k = 0; k < sh[i].sh_size / sizeof *sym; k++)
            if (sym[k].st_value && sym[k].st_shndx && !strcmp(str + sym[k].st_name, name)) {
                found = (void *)(lm->l_addr + sym[k].st_value);
                break;
            }
    }
    munmap((void *)map, st.st_size);
    return found;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Launch cost of the entry point the program resolved (through vgpu when
 * it is loaded) against the driver's own, alternating batches of N empty
 * kernels in one process: the same GPU and queue state for both. */
static int cmd_launchab(long n, int rounds) {
    setup();
    load_kernels();
    typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, CUstream, void **, void **);
    launch_t hooked = cu.cuLaunchKernel, native = (launch_t)driver_symbol("cuLaunchKernel");
    if (!native) {
        printf("error=no-driver-symbol\n");
        return 2;
    }
    printf("distinct=%d\n", native != hooked);
    double t[2][64], drain[2][64];
    if (rounds > 64) rounds = 64;
    for (int i = 0; i < 2000; i++) CHECK(hooked(g_empty, 1, 1, 1, 32, 1, 1, 0, 0, NULL, NULL));
    CHECK(cu.cuCtxSynchronize());
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < 2; k++) {
            int which = (r + k) % 2; /* alternate which goes first */
            launch_t f = which ? hooked : native;
            double t0 = now_s();
            for (long i = 0; i < n; i++) CHECK(f(g_empty, 1, 1, 1, 32, 1, 1, 0, 0, NULL, NULL));
            double t1 = now_s();
            t[which][r] = (t1 - t0) * 1e6 / n;
            CHECK(cu.cuCtxSynchronize());
            /* What the GPU still had queued when the host was done: near 0
             * when the host is the bottleneck, not the GPU. */
            drain[which][r] = (now_s() - t1) * 1e6;
        }
    for (int w = 0; w < 2; w++) {
        qsort(t[w], rounds, sizeof(double), cmp_double);
        qsort(drain[w], rounds, sizeof(double), cmp_double);
    }
    double a = t[0][rounds / 2], b = t[1][rounds / 2];
    printf("native_us=%.4f hooked_us=%.4f overhead_pct=%.3f\n", a, b, (b / a - 1) * 100);
    printf("native_drain_us=%.1f hooked_drain_us=%.1f launches_hooked=%ld\n", drain[0][rounds / 2],
           drain[1][rounds / 2], n * rounds + 2000);
    return 0;
}

/* cuMemAlloc_v2 + cuMemFree_v2 of BYTES through the entry points the program
 * resolved against the driver's own, alternating batches of N pairs in one
 * process, as launchab does for launches. */
static int cmd_allocab(long n, int rounds, size_t bytes) {
    setup();
    typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
    typedef CUresult (*free_t)(CUdeviceptr);
    alloc_t alloc[2] = {(alloc_t)driver_symbol("cuMemAlloc_v2"), cu.cuMemAlloc_v2};
    free_t release_[2] = {(free_t)driver_symbol("cuMemFree_v2"), cu.cuMemFree_v2};
    if (!alloc[0] || !release_[0]) {
        printf("error=no-driver-symbol\n");
        return 2;
    }
    printf("distinct=%d\n", alloc[0] != alloc[1]);
    double t[2][64];
    if (rounds > 64) rounds = 64;
    CUdeviceptr p;
    for (int i = 0; i < 200; i++) {
        CHECK(alloc[1](&p, bytes));
        CHECK(release_[1](p));
    }
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < 2; k++) {
            int which = (r + k) % 2;
            double t0 = now_s();
            for (long i = 0; i < n; i++) {
                CHECK(alloc[which](&p, bytes));
                CHECK(release_[which](p));
            }
            t[which][r] = (now_s() - t0) * 1e6 / n;
        }
    qsort(t[0], rounds, sizeof(double), cmp_double);
    qsort(t[1], rounds, sizeof(double), cmp_double);
    double a = t[0][rounds / 2], b = t[1][rounds / 2];
    printf("native_us=%.4f hooked_us=%.4f overhead_pct=%.3f\n", a, b, (b / a - 1) * 100);
    return 0;
}

/* ---- races, storms ---------------------------------------------------------- */

struct racer {
    size_t bytes;
    double end;
    long granted, denied;
    useconds_t pause;
};

static void *race_thread(void *arg) {
    struct racer *r = arg;
    cu.cuCtxSetCurrent(g_ctx);
    while (now_s() < r->end) {
        CUdeviceptr p;
        if (cu.cuMemAlloc_v2(&p, r->bytes) == CUDA_SUCCESS) {
            r->granted++;
            cu.cuMemFree_v2(p);
        } else {
            r->denied++;
        }
        if (r->pause) usleep(r->pause);
    }
    return NULL;
}

/* Each of cmd_threads' threads: KERNELS spin kernels of NS ns, then exit
 * without a synchronisation. */
struct launcher {
    int kernels;
    unsigned long long ns;
};

static void *launch_thread(void *arg) {
    struct launcher *l = arg;
    unsigned long long zero = 0;
    void *args[] = {&l->ns, &zero};
    cu.cuCtxSetCurrent(g_ctx);
    for (int i = 0; i < l->kernels; i++) CHECK(cu.cuLaunchKernel(g_spin, 1, 1, 1, 32, 1, 1, 0, 0, args, NULL));
    return NULL;
}

/* The events this process holds: the simulated driver's count, -1 on a
 * real one. */
static long live_events(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    unsigned long long (*count)(void) = lib ? (unsigned long long (*)(void))dlsym(lib, "simLiveEvents") : NULL;
    return count ? (long)count() : -1;
}

/* THREADS threads, one after another, each launching KERNELS NS-ns
 * kernels and exiting; the events held after the first and after all
 * of them (what a thread that exits leaves behind). */
static int cmd_threads(int threads, int kernels, unsigned long long ns) {
    setup();
    load_kernels();
    struct launcher l = {kernels, ns};
    long after_first = 0;
    for (int i = 0; i < threads; i++) {
        pthread_t th;
        pthread_create(&th, NULL, launch_thread, &l);
        pthread_join(th, NULL);
        CHECK(cu.cuCtxSynchronize());
        if (i == 0) after_first = live_events();
    }
    printf("events_after_first=%ld events_after_all=%ld\n", after_first, live_events());
    return 0;
}

/* THREADS threads allocate and free BYTES for SECONDS, after QUIET seconds,
 * each pausing PAUSE ms after each round. */
static int cmd_race(int threads, double secs, size_t bytes, double quiet, double pause_ms) {
    setup();
    if (quiet > 0) usleep((useconds_t)(quiet * 1e6));
    struct racer r[64];
    pthread_t th[64];
    if (threads > 64) threads = 64;
    double end = now_s() + secs;
    for (int i = 0; i < threads; i++) {
        r[i] = (struct racer){bytes, end, 0, 0, (useconds_t)(pause_ms * 1e3)};
        pthread_create(&th[i], NULL, race_thread, &r[i]);
    }
    long g = 0, d = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        g += r[i].granted;
        d += r[i].denied;
    }
    printf("granted=%ld denied=%ld\n", g, d);
    return 0;
}

struct shared_pairs {
    pthread_barrier_t barrier;
    int granted[2];
    long overcommits, both_refused, one_granted;
};

static int cmd_pairs(long rounds, size_t bytes) {
    struct shared_pairs *sp = mmap(NULL, sizeof *sp, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pthread_barrierattr_t a;
    pthread_barrierattr_init(&a);
    pthread_barrierattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(&sp->barrier, &a, 2);
    pid_t child = fork();
    int me = child == 0;
    setup();
    pthread_barrier_wait(&sp->barrier);
    for (long r = 0; r < rounds; r++) {
        CUdeviceptr p = 0;
        int ok = cu.cuMemAlloc_v2(&p, bytes) == CUDA_SUCCESS;
        sp->granted[me] = ok;
        pthread_barrier_wait(&sp->barrier);
        if (!me) {
            int both = sp->granted[0] && sp->granted[1];
            sp->overcommits += both;
            sp->both_refused += !sp->granted[0] && !sp->granted[1];
            sp->one_granted += sp->granted[0] != sp->granted[1];
        }
        if (ok) cu.cuMemFree_v2(p);
        pthread_barrier_wait(&sp->barrier);
    }
    if (me) _exit(0);
    waitpid(child, NULL, 0);
    printf("rounds=%ld overcommits=%ld one_granted=%ld both_refused=%ld\n", rounds, sp->overcommits,
           sp->one_granted, sp->both_refused);
    return 0;
}

static volatile sig_atomic_t g_term;
static void on_term(int sig) {
    (void)sig;
    g_term = 1;
}

/* Allocates and frees at random until SIGTERM; then reports what it holds
 * and waits, holding it, until killed. */
static int cmd_storm(double secs, size_t max_bytes, unsigned seed) {
    signal(SIGTERM, on_term);
    printf("started\n"); /* a SIGTERM from now on ends with a report */
    fflush(stdout);
    load_and_init();
    /* A context is memory too: in a full container it waits for room. */
    while (!g_term && cu.cuDevicePrimaryCtxRetain(&g_ctx, g_dev) != CUDA_SUCCESS) usleep(20000);
    if (!g_term) CHECK(cu.cuCtxSetCurrent(g_ctx));
    static CUdeviceptr ptrs[256];
    static size_t sizes[256];
    size_t held = 0;
    srand(seed);
    double end = now_s() + secs;
    while (!g_term && now_s() < end) {
        int i = rand() % 256;
        if (ptrs[i]) {
            if (cu.cuMemFree_v2(ptrs[i]) == 0) {
                held -= sizes[i];
                ptrs[i] = 0;
            }
        } else {
            size_t b = ((size_t)rand() % (max_bytes >> 20) + 1) << 20;
            if (cu.cuMemAlloc_v2(&ptrs[i], b) == 0) {
                sizes[i] = b;
                held += b;
            } else {
                ptrs[i] = 0;
            }
        }
    }
    printf("holding=%zu\n", held);
    fflush(stdout);
    for (;;) pause();
    return 0;
}

/* ---- edge cases ------------------------------------------------------------- */

/* VMM hiding (VGPU_OVERSUBSCRIBE_VMM): a block of `bytes` answers its
 * asked size to cuMemGetAddressRange and to the range pointer attributes,
 * and whether legacy IPC can export it; legacy IPC of it, and a block
 * allocated after that can be exported. */
static int cmd_vmmhide(size_t bytes) {
    setup();
    CUdeviceptr a = 0, b = 0, base = 0;
    size_t size = 0;
    unsigned char h[64];
    CHECK(cu.cuMemAlloc_v2(&a, bytes));
    printf("range_rc=%d\n", cu.cuMemGetAddressRange_v2(&base, &size, a + bytes / 2));
    printf("range_base_ok=%d\nrange_size=%zu\n", base == a, size);
    /* The same range as pointer attributes (11: start, 12: size), one at a
     * time and together. */
    CUdeviceptr start = 0, start2 = 0;
    size_t span = 0, span2 = 0;
    int rc = cu.cuPointerGetAttribute(&start, 11, a + bytes / 2);
    rc = rc ? rc : cu.cuPointerGetAttribute(&span, 12, a + bytes / 2);
    printf("attr_rc=%d\nattr_start_ok=%d\nattr_size=%zu\n", rc, start == a, span);
    CUcontext mine = NULL, owner = NULL, owner2 = NULL;
    cu.cuCtxGetCurrent(&mine);
    int attrs[3] = {11, 12, 1};
    void *data[3] = {&start2, &span2, &owner2};
    printf("attrs_rc=%d\n", cu.cuPointerGetAttributes(3, attrs, data, a + bytes / 2));
    printf("attrs_start_ok=%d\nattrs_size=%zu\n", start2 == a, span2);
    printf("attrs_ctx_ok=%d\n", owner2 == mine && mine != NULL);
    /* Its context (1), as cuMemAlloc's block names it. */
    printf("ctx_rc=%d\n", cu.cuPointerGetAttribute(&owner, 1, a));
    printf("ctx_ok=%d\n", owner == mine && mine != NULL);
    /* Whether legacy IPC can export it (10, an int), written over a
     * sentinel: the word after it must stay. */
    int capable[2] = {0x7f7f7f7f, 0x7f7f7f7f};
    printf("capable_rc=%d\n", cu.cuPointerGetAttribute(capable, 10, a + bytes / 2));
    printf("capable=%d\ncapable_next_kept=%d\n", capable[0], capable[1] == 0x7f7f7f7f);
    /* Who may reach it, each GPU (VMM memory: rc/flags, 3 read-write). */
    int ndev = 0;
    CHECK(cu.cuDeviceGetCount(&ndev));
    for (int d = 0; d < ndev; d++) {
        unsigned long long f = 0;
        CUmemLocation loc = {1, d};
        int arc = cu.cuMemGetAccess(&f, &loc, a);
        printf("access_dev%d=%d/%llu\n", d, arc, f);
    }
    printf("ipc_rc=%d\n", cu.cuIpcGetMemHandle(h, a));
    CHECK(cu.cuMemAlloc_v2(&b, bytes));
    printf("ipc_after_rc=%d\n", cu.cuIpcGetMemHandle(h, b));
    CHECK(cu.cuMemFree_v2(a));
    CHECK(cu.cuMemFree_v2(b));
    return 0;
}

/* share BYTES SECS DONE: a BYTES block with a pattern, exported by legacy
 * IPC (its handle printed as hex), and blocks of its own beside it
 * (CUCLIENT_SHARE_BESIDE); then idle, with no CUDA call, until the file DONE
 * exists (a peer has opened the handle and written its own pattern) or
 * SECS pass; then whether the block holds the peer's pattern, and whether
 * the other block is intact. */
static int cmd_share(size_t bytes, double secs, const char *done) {
    setup();
    CUdeviceptr x = 0, y = 0;
    CHECK(cu.cuMemAlloc_v2(&x, bytes));
    size_t n = bytes / 4;
    uint32_t *w = malloc(bytes), *back = malloc(bytes);
    if (!w || !back) return 1;
    fill_pattern(w, n, 11);
    CHECK(cu.cuMemcpyHtoD_v2(x, w, bytes));
    /* CUCLIENT_SHARE_BESIDE=N: a 64 MiB block with a pattern of its own and
     * N bytes of ballast, both unshared (the simulator keeps no contents
     * past 256 MiB: the pattern is in its own block). */
    const char *beside = getenv("CUCLIENT_SHARE_BESIDE");
    size_t zbytes = beside && *beside ? strtoull(beside, 0, 0) : 0, ybytes = zbytes ? 64u << 20 : 0;
    CUdeviceptr z = 0;
    uint32_t *yw = NULL, *yback = NULL;
    if (ybytes) {
        CHECK(cu.cuMemAlloc_v2(&y, ybytes));
        CHECK(cu.cuMemAlloc_v2(&z, zbytes));
        yw = malloc(ybytes);
        yback = malloc(ybytes);
        if (!yw || !yback) return 1;
        fill_pattern(yw, ybytes / 4, 13);
        CHECK(cu.cuMemcpyHtoD_v2(y, yw, ybytes));
    }
    unsigned char h[64];
    CUresult rc = cu.cuIpcGetMemHandle(h, x);
    printf("share_rc=%d\nhandle=", rc);
    for (int i = 0; i < 64; i++) printf("%02x", h[i]);
    /* CUCLIENT_SHARE_FREE_FIRST=1: the block is freed at once (a peer's
     * open must then fail cleanly). */
    const char *free_first = getenv("CUCLIENT_SHARE_FREE_FIRST");
    if (free_first && *free_first == '1') {
        printf("\nfirst_free_rc=%d", cu.cuMemFree_v2(x));
        x = 0;
    }
    printf("\nready=1\n");
    fflush(stdout);
    double end = now_s() + secs;
    while (now_s() < end && access(done, F_OK) != 0) usleep(10000);
    printf("peer_done=%d\n", access(done, F_OK) == 0);
    if (!x) return 0;
    CUresult brc = cu.cuMemcpyDtoH_v2(back, x, bytes);
    fill_pattern(w, n, 12);
    printf("share_back_rc=%d\npeer_wrote=%d\n", brc, brc == CUDA_SUCCESS && !memcmp(w, back, bytes));
    if (ybytes) {
        CUresult yrc = cu.cuMemcpyDtoH_v2(yback, y, ybytes);
        printf("beside_intact=%d\n", yrc == CUDA_SUCCESS && !memcmp(yw, yback, ybytes));
    }
    printf("free_rc=%d\n", cu.cuMemFree_v2(x));
    fflush(stdout);
    return 0;
}

/* open HEX BYTES DONE: opens a legacy IPC handle (HEX, as `share` prints
 * it), checks the exporter's pattern, writes its own, closes the handle
 * and creates the file DONE. */
static int cmd_open(const char *hex, size_t bytes, const char *done) {
    setup();
    CUipcMemHandle h;
    memset(&h, 0, sizeof h);
    for (int i = 0; i < 64 && hex[2 * i] && hex[2 * i + 1]; i++) {
        unsigned v = 0;
        sscanf(hex + 2 * i, "%2x", &v);
        h.reserved[i] = (char)v;
    }
    CUdeviceptr p = 0;
    double t = now_s();
    CUresult rc = cu.cuIpcOpenMemHandle_v2(&p, h, 1);
    printf("open_rc=%d open_ms=%.1f\n", rc, (now_s() - t) * 1e3);
    if (rc) return 0;
    size_t n = bytes / 4;
    uint32_t *w = malloc(bytes), *back = malloc(bytes);
    if (!w || !back) return 1;
    fill_pattern(w, n, 11);
    CUresult rrc = cu.cuMemcpyDtoH_v2(back, p, bytes);
    printf("open_intact=%d\n", rrc == CUDA_SUCCESS && !memcmp(w, back, bytes));
    fill_pattern(w, n, 12);
    printf("write_rc=%d\n", cu.cuMemcpyHtoD_v2(p, w, bytes));
    printf("sync_rc=%d\n", cu.cuCtxSynchronize());
    /* Opened again, as the driver does: the same address, counted; the
     * first close leaves it mapped. */
    CUdeviceptr again = 0;
    CUresult arc = cu.cuIpcOpenMemHandle_v2(&again, h, 1);
    printf("reopen_rc=%d reopen_same=%d\n", arc, again == p);
    if (!arc) {
        printf("first_close_rc=%d\n", cu.cuIpcCloseMemHandle(p));
        printf("still_mapped=%d\n", cu.cuMemcpyDtoH_v2(back, p, 4096) == CUDA_SUCCESS);
    }
    printf("close_rc=%d\n", cu.cuIpcCloseMemHandle(p));
    FILE *f = fopen(done, "w");
    if (f) fclose(f);
    fflush(stdout);
    return 0;
}

static int cmd_nulls(void) {
    setup();
    size_t v = 0;
    printf("meminfo_null_free_rc=%d\n", cu.cuMemGetInfo_v2(NULL, &v));
    printf("meminfo_null_total_rc=%d\n", cu.cuMemGetInfo_v2(&v, NULL));
    printf("meminfo_null_both_rc=%d\n", cu.cuMemGetInfo_v2(NULL, NULL));
    printf("totalmem_null_rc=%d\n", cu.cuDeviceTotalMem_v2(NULL, g_dev));
    printf("alloc_null_rc=%d\n", cu.cuMemAlloc_v2(NULL, 1 << 20));
    printf("launchex_null_rc=%d\n", cu.cuLaunchKernelEx(NULL, NULL, NULL, NULL));
    return 0;
}

static int cmd_badfree(void) {
    setup();
    printf("free_unknown_rc=%d\n", cu.cuMemFree_v2(0xdead000ULL));
    printf("freeasync_unknown_rc=%d\n", cu.cuMemFreeAsync(0xbeef000ULL, 0));
    printf("release_unknown_rc=%d\n", cu.cuMemRelease(0x1234ULL));
    print_meminfo("after");
    return 0;
}

/* Reaches cuMemAlloc_v2 around the table: dlsym(RTLD_NEXT) and dlvsym. */
static int cmd_bypass(size_t bytes, const char *version) {
    setup();
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    CUresult (*next)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    CUresult (*vers)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlvsym(lib, "cuMemAlloc_v2", version);
    CUdeviceptr p;
    printf("rtld_next_found=%d rtld_next_rc=%d\n", next != NULL, next ? next(&p, bytes) : -1);
    printf("dlvsym_found=%d dlvsym_rc=%d\n", vers != NULL, vers ? vers(&p, bytes) : -1);
    return 0;
}

/* Before any other call: whose cuMemAlloc_v2 dlsym hands out for the
 * driver's handle (the driver's own, or vgpu's hook). */
static int cmd_owner(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    void *p = lib ? dlsym(lib, "cuMemAlloc_v2") : NULL;
    Dl_info info;
    int driver = p && dladdr(p, &info) && info.dli_fname && strstr(info.dli_fname, "libcuda");
    printf("dlsym_found=%d dlsym_driver=%d\n", p != NULL, driver);
    return 0;
}

/* A process that holds a slot and nothing else. */
static int cmd_idle(double secs) {
    load_and_init();
    CUdeviceptr p;
    printf("idle_alloc_rc=%d\n", cu.cuMemAlloc_v2(&p, 1 << 20));
    fflush(stdout);
    double end = now_s() + secs;
    while (now_s() < end) usleep(50000);
    return 0;
}

/* Waits for room: how long the quota took to come back. */
static int cmd_await(size_t bytes, double secs, double hold) {
    double t0 = now_s();
    setup();
    double t1 = now_s();
    CUdeviceptr p = 0;
    CUresult rc;
    while ((rc = cu.cuMemAlloc_v2(&p, bytes)) != CUDA_SUCCESS && now_s() < t0 + secs) usleep(50000);
    /* alloc_ms: the allocation alone (a wait for a verdict on a dead
       predecessor is in it), without the start-up. */
    printf("await_rc=%d await_ms=%.0f alloc_ms=%.0f\n", rc, (now_s() - t0) * 1e3, (now_s() - t1) * 1e3);
    fflush(stdout);
    double end = now_s() + hold;
    while (now_s() < end) usleep(10000);
    return 0;
}

struct ctxracer {
    pthread_barrier_t *start, *done;
    int rounds, refused;
};

static void *ctxrace_thread(void *arg) {
    struct ctxracer *r = arg;
    for (int i = 0; i < r->rounds; i++) {
        CUcontext c;
        pthread_barrier_wait(r->start);
        CUresult rc = cu.cuDevicePrimaryCtxRetain(&c, g_dev);
        r->refused += rc != CUDA_SUCCESS;
        pthread_barrier_wait(r->done);
        if (rc == CUDA_SUCCESS) cu.cuDevicePrimaryCtxRelease_v2(g_dev);
    }
    return NULL;
}

/* THREADS threads retain the primary context at once; all release it, so
 * every round races a first context again. */
static int cmd_ctxrace(int threads, int rounds) {
    load_and_init();
    if (threads > 256) threads = 256;
    pthread_barrier_t start, done;
    pthread_barrier_init(&start, NULL, threads);
    pthread_barrier_init(&done, NULL, threads);
    static struct ctxracer r[256];
    pthread_t th[256];
    for (int i = 0; i < threads; i++) {
        r[i] = (struct ctxracer){&start, &done, rounds, 0};
        pthread_create(&th[i], NULL, ctxrace_thread, &r[i]);
    }
    int refused = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        refused += r[i].refused;
    }
    printf("rounds=%d threads=%d refused=%d\n", rounds, threads, refused);
    return 0;
}

/* A forked child that hangs says where, when its parent sends SIGUSR1:
 * the frames of its one thread (library and offset), then exit 99. Not
 * async-signal-safe, but the child is stuck anyway; backtrace's unwinder
 * was loaded before the fork. */
static void child_stack(int sig) {
    (void)sig;
    void *frames[64];
    int n = backtrace(frames, 64);
    static const char head[] = "child_stack:\n";
    if (write(2, head, sizeof head - 1) < 0) _exit(98);
    backtrace_symbols_fd(frames, n, 2);
    _exit(99);
}

/* The child's CUDA calls after a fork: a context, a buffer, a pool
 * allocation, each freed. Exit status: 0, or the line of the first error. */
static void forked_child(void) {
    setup();
    CUdeviceptr p;
    if (cu.cuMemAlloc_v2(&p, 1 << 20) || cu.cuMemFree_v2(p)) _exit(10);
    CUmemoryPool pool;
    if (cu.cuDeviceGetDefaultMemPool(&pool, g_dev) || cu.cuMemAllocFromPoolAsync(&p, 1 << 20, pool, 0) ||
        cu.cuMemFreeAsync(p, 0) || cu.cuCtxSynchronize())
        _exit(11);
    _exit(0);
}

/* Forks right after cuInit and waits up to 30 s for the child; a child
 * still running then is hung (its stack printed, killed, reported). (At
 * 10 s, twice in some forty loaded CI runs a child was reported hung
 * whose stack, sampled, was running in a hook, not waiting on a lock; it
 * takes about 60 ms alone. Slowness or a rare livelock: a livelock still
 * fails at 30 s, and its stack says where.) */
static int cmd_forkheld(void) {
    load_and_init();
    void *warm[1];
    backtrace(warm, 1); /* loads the unwinder now, not in the child's handler */
    /* Before the fork, so that a child stuck in fork's own handlers has it. */
    struct sigaction sa = {0};
    sa.sa_handler = child_stack;
    sigaction(SIGUSR1, &sa, NULL);
    double t0 = now_s();
    pid_t child = fork();
    if (child == 0) forked_child();
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(child, &status, WNOHANG)) == 0 && now_s() < t0 + 30) usleep(2000);
    if (done == child)
        printf("child_exit=%d child_ms=%.0f\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status),
               (now_s() - t0) * 1e3);
    else {
        kill(child, SIGUSR1);
        double t1 = now_s();
        while ((done = waitpid(child, &status, WNOHANG)) == 0 && now_s() < t1 + 2) usleep(2000);
        if (done != child) {
            kill(child, SIGKILL);
            waitpid(child, NULL, 0);
        }
        printf("child_exit=hung\n");
    }
    setup();
    CUdeviceptr p;
    CUresult rc = cu.cuMemAlloc_v2(&p, 1 << 20);
    if (!rc) rc = cu.cuMemFree_v2(p);
    printf("parent_rc=%d\n", rc);
    return 0;
}

static int cmd_info(void) {
    setup();
    int n = 0, ver = 0;
    CHECK(cu.cuDeviceGetCount(&n));
    CHECK(cu.cuDriverGetVersion(&ver));
    printf("devices=%d driver=%d\n", n, ver);
    for (int i = 0; i < n; i++) {
        CUdevice d;
        char name[128];
        size_t total;
        CHECK(cu.cuDeviceGet(&d, i));
        CHECK(cu.cuDeviceGetName(name, sizeof name, d));
        CHECK(cu.cuDeviceTotalMem_v2(&total, d));
        printf("device=%d name=\"%s\" total=%zu\n", i, name, total);
    }
    print_meminfo("ctx");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *cmd = argc > 1 ? argv[1] : "info";
#define ARG(i, dflt) (argc > (i) ? argv[i] : (dflt))
    if (!strcmp(cmd, "info")) return cmd_info();
    if (!strcmp(cmd, "alloc")) return cmd_alloc(ARG(2, "buffer"), strtoull(ARG(3, "1048576"), 0, 0));
    if (!strcmp(cmd, "fill")) return cmd_fill(ARG(2, "buffer"), strtoull(ARG(3, "67108864"), 0, 0));
    if (!strcmp(cmd, "hold")) return cmd_hold(strtoull(ARG(2, "1048576"), 0, 0), atof(ARG(3, "1")));
    if (!strcmp(cmd, "keep"))
        return cmd_keep(strtoull(ARG(2, "1048576"), 0, 0), strtoull(ARG(3, "0"), 0, 0),
                        (unsigned)atoi(ARG(4, "1")), atof(ARG(5, "1")), atof(ARG(6, "0")),
                        atof(ARG(7, "0")));
    if (!strcmp(cmd, "bursts"))
        return cmd_bursts(strtoull(ARG(2, "1048576"), 0, 0), strtoull(ARG(3, "0"), 0, 0),
                          (unsigned)atoi(ARG(4, "1")), atol(ARG(5, "100")), atof(ARG(6, "1")),
                          atoi(ARG(7, "2")));
    if (!strcmp(cmd, "ctx")) return cmd_ctx(strtoull(ARG(2, "1048576"), 0, 0));
    if (!strcmp(cmd, "spin"))
        return cmd_spin(strtoull(ARG(2, "1000000"), 0, 0), (unsigned)atoi(ARG(3, "132")), atof(ARG(4, "2")),
                        ARG(5, "kernel"));
    if (!strcmp(cmd, "steps"))
        return cmd_steps(strtoull(ARG(2, "1000000"), 0, 0), (unsigned)atoi(ARG(3, "132")), atof(ARG(4, "5")),
                         atof(ARG(5, "0")), atof(ARG(6, "0")));
    if (!strcmp(cmd, "serve"))
        return cmd_serve(strtoull(ARG(2, "1000000"), 0, 0), (unsigned)atoi(ARG(3, "132")), atof(ARG(4, "5")),
                         atof(ARG(5, "1")), atof(ARG(6, "100")), atof(ARG(7, "1000")), strtoull(ARG(8, "0"), 0, 0));
    if (!strcmp(cmd, "launchcost")) return cmd_launchcost(atol(ARG(2, "200000")));
    if (!strcmp(cmd, "threads"))
        return cmd_threads(atoi(ARG(2, "8")), atoi(ARG(3, "2")), strtoull(ARG(4, "100000"), 0, 0));
    if (!strcmp(cmd, "ticks")) return cmd_ticks(strtoull(ARG(2, "1000000"), 0, 0), atof(ARG(3, "10")));
    if (!strcmp(cmd, "launchab")) return cmd_launchab(atol(ARG(2, "20000")), atoi(ARG(3, "21")));
    if (!strcmp(cmd, "allocab"))
        return cmd_allocab(atol(ARG(2, "2000")), atoi(ARG(3, "21")), strtoull(ARG(4, "1048576"), 0, 0));
    if (!strcmp(cmd, "race"))
        return cmd_race(atoi(ARG(2, "4")), atof(ARG(3, "2")), strtoull(ARG(4, "1048576"), 0, 0),
                        atof(ARG(5, "0")), atof(ARG(6, "0")));
    if (!strcmp(cmd, "pairs")) return cmd_pairs(atol(ARG(2, "1000")), strtoull(ARG(3, "1048576"), 0, 0));
    if (!strcmp(cmd, "storm"))
        return cmd_storm(atof(ARG(2, "60")), strtoull(ARG(3, "67108864"), 0, 0), (unsigned)atoi(ARG(4, "1")));
    if (!strcmp(cmd, "nulls")) return cmd_nulls();
    if (!strcmp(cmd, "vmmhide")) return cmd_vmmhide(strtoull(ARG(2, "3145733"), 0, 0));
    if (!strcmp(cmd, "badfree")) return cmd_badfree();
    if (!strcmp(cmd, "bypass")) return cmd_bypass(strtoull(ARG(2, "1048576"), 0, 0), ARG(3, "GLIBC_2.2.5"));
    if (!strcmp(cmd, "owner")) return cmd_owner();
    if (!strcmp(cmd, "idle")) return cmd_idle(atof(ARG(2, "10")));
    if (!strcmp(cmd, "await"))
        return cmd_await(strtoull(ARG(2, "1048576"), 0, 0), atof(ARG(3, "5")), atof(ARG(4, "0")));
    if (!strcmp(cmd, "ctxrace")) return cmd_ctxrace(atoi(ARG(2, "64")), atoi(ARG(3, "100")));
    if (!strcmp(cmd, "forkheld")) return cmd_forkheld();
    if (!strcmp(cmd, "share"))
        return cmd_share(strtoull(ARG(2, "67108864"), 0, 0), atof(ARG(3, "10")), ARG(4, "/tmp/cuclient-done"));
    if (!strcmp(cmd, "open"))
        return cmd_open(ARG(2, ""), strtoull(ARG(3, "67108864"), 0, 0), ARG(4, "/tmp/cuclient-done"));
    printf("error=unknown-command\n");
    return 2;
}
