/* Reads off the real GPU the facts the limiter and the accounting rest on.
 *
 *   cc -O2 -I/usr/local/cuda/include -o calibrate calibrate.c -ldl -lpthread \
 *      -L/usr/local/cuda/lib64/stubs -lcuda -lnvidia-ml
 *
 * Prints: struct layouts from cuda.h/nvml.h, NVML call costs, per-process
 * context overhead, driver call costs on the launch path, and
 * nvmlDeviceGetProcessUtilization samples under known duty cycles.
 */
#include <cuda.h>
#include <nvml.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../tests/programs/spin_ptx.h"

#define CK(x)                                                              \
    do {                                                                   \
        int rc_ = (int)(x);                                                \
        if (rc_) {                                                         \
            fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, rc_); \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static nvmlDevice_t g_dev;
static volatile int g_stop;
static volatile const char *g_phase = "start";
static double g_t0;

static unsigned long long own_used(void) {
    nvmlProcessInfo_t procs[64];
    unsigned n = 64;
    if (nvmlDeviceGetComputeRunningProcesses(g_dev, &n, procs) != NVML_SUCCESS) return 0;
    for (unsigned i = 0; i < n; i++)
        if (procs[i].pid == (unsigned)getpid()) return procs[i].usedGpuMemory;
    return 0;
}

static void *sampler(void *arg) {
    (void)arg;
    unsigned long long last = 0;
    while (!g_stop) {
        nvmlProcessUtilizationSample_t s[64];
        unsigned n = 64;
        double t = now_s() - g_t0;
        nvmlReturn_t r = nvmlDeviceGetProcessUtilization(g_dev, s, &n, last);
        nvmlUtilization_t u;
        nvmlDeviceGetUtilizationRates(g_dev, &u);
        if (r == NVML_SUCCESS) {
            for (unsigned i = 0; i < n; i++) {
                if (s[i].timeStamp > last) last = s[i].timeStamp;
                printf("util t=%.3f phase=%s pid=%u self=%d sm=%u ts=%llu dev_gpu=%u\n", t,
                       (const char *)g_phase, s[i].pid, s[i].pid == (unsigned)getpid(), s[i].smUtil,
                       s[i].timeStamp, u.gpu);
            }
        } else {
            printf("util t=%.3f phase=%s rc=%d dev_gpu=%u\n", t, (const char *)g_phase, r, u.gpu);
        }
        fflush(stdout);
        usleep(100000);
    }
    return NULL;
}

static CUfunction g_spin, g_empty;
static int g_sms;

static void run_phase(const char *name, double secs, unsigned long long ns, int grid,
                      double sleep_frac) {
    g_phase = name;
    double end = now_s() + secs;
    long launched = 0;
    while (now_s() < end) {
        unsigned long long zero = 0;
        void *args[] = {&ns, &zero};
        CK(cuLaunchKernel(g_spin, grid, 1, 1, 128, 1, 1, 0, 0, args, 0));
        launched++;
        if (sleep_frac > 0) {
            CK(cuCtxSynchronize());
            usleep((useconds_t)(ns / 1000.0 * sleep_frac));
        } else if (launched % 64 == 0) {
            CK(cuCtxSynchronize());
        }
    }
    CK(cuCtxSynchronize());
    printf("phase %s launched=%ld\n", name, launched);
}

int main(void) {
    printf("layout CUDA_ARRAY_DESCRIPTOR size=%zu\n", sizeof(CUDA_ARRAY_DESCRIPTOR));
    printf("layout CUDA_ARRAY3D_DESCRIPTOR size=%zu\n", sizeof(CUDA_ARRAY3D_DESCRIPTOR));
    printf("layout CUmemAllocationProp size=%zu location=%zu\n", sizeof(CUmemAllocationProp),
           offsetof(CUmemAllocationProp, location));
    printf("layout CUmemPoolProps size=%zu location=%zu\n", sizeof(CUmemPoolProps),
           offsetof(CUmemPoolProps, location));
    printf("layout CUlaunchConfig size=%zu hStream=%zu attrs=%zu\n", sizeof(CUlaunchConfig),
           offsetof(CUlaunchConfig, hStream), offsetof(CUlaunchConfig, attrs));
    printf("layout CUDA_KERNEL_NODE_PARAMS size=%zu kernelParams=%zu\n",
           sizeof(CUDA_KERNEL_NODE_PARAMS), offsetof(CUDA_KERNEL_NODE_PARAMS, kernelParams));
    printf("layout nvmlProcessInfo_t size=%zu\n", sizeof(nvmlProcessInfo_t));
    printf("layout nvmlMemory_v2_t size=%zu version=%u\n", sizeof(nvmlMemory_v2_t),
           nvmlMemory_v2);
    printf("layout nvmlProcessUtilizationSample_t size=%zu\n",
           sizeof(nvmlProcessUtilizationSample_t));
    printf("layout CUctxCreateParams size=%zu\n", sizeof(CUctxCreateParams));

    double t = now_s();
    CK(nvmlInit_v2());
    printf("cost nvmlInit_v2 ms=%.3f\n", (now_s() - t) * 1e3);
    CK(nvmlDeviceGetHandleByIndex_v2(0, &g_dev));
    t = now_s();
    for (int i = 0; i < 20; i++) own_used();
    printf("cost nvmlDeviceGetComputeRunningProcesses ms=%.3f\n", (now_s() - t) * 1e3 / 20);

    t = now_s();
    CK(cuInit(0));
    printf("cost cuInit ms=%.3f\n", (now_s() - t) * 1e3);
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CK(cuDeviceGetAttribute(&g_sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    printf("device sms=%d\n", g_sms);
    printf("nvml own_used before ctx=%llu\n", own_used());
    CUcontext ctx;
    t = now_s();
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    printf("cost primary ctx ms=%.3f\n", (now_s() - t) * 1e3);
    t = now_s();
    unsigned long long u1 = own_used();
    printf("nvml own_used after ctx=%llu (MiB %.1f) query_ms=%.3f\n", u1, u1 / 1048576.0,
           (now_s() - t) * 1e3);
    CUmodule mod;
    CK(cuModuleLoadData(&mod, VGPU_SPIN_PTX));
    CK(cuModuleGetFunction(&g_spin, mod, "vgpu_spin"));
    CK(cuModuleGetFunction(&g_empty, mod, "vgpu_empty"));
    unsigned long long u2 = own_used();
    printf("nvml own_used after module=%llu (MiB %.1f)\n", u2, u2 / 1048576.0);
    CUdeviceptr p;
    CK(cuMemAlloc(&p, 1 << 20));
    unsigned long long u3 = own_used();
    printf("nvml own_used after 1MiB alloc=%llu delta=%lld\n", u3, (long long)(u3 - u2));
    CK(cuMemFree(p));
    CK(cuMemAlloc(&p, 64 << 20));
    unsigned long long u4 = own_used();
    printf("nvml own_used after 64MiB alloc=%llu delta=%lld\n", u4, (long long)(u4 - u2));
    CK(cuMemFree(p));
    size_t fr, tot;
    CK(cuMemGetInfo(&fr, &tot));
    printf("cuMemGetInfo free=%zu total=%zu\n", fr, tot);

    /* launch-path driver call costs */
    const int N = 200000;
    CUcontext c;
    t = now_s();
    for (int i = 0; i < N; i++) cuCtxGetCurrent(&c);
    printf("cost cuCtxGetCurrent ns=%.1f\n", (now_s() - t) * 1e9 / N);
    CUstreamCaptureStatus cs;
    t = now_s();
    for (int i = 0; i < N; i++) cuStreamIsCapturing(0, &cs);
    printf("cost cuStreamIsCapturing ns=%.1f\n", (now_s() - t) * 1e9 / N);
    CUevent e1, e2;
    CK(cuEventCreate(&e1, 0));
    CK(cuEventCreate(&e2, 0));
    for (int i = 0; i < 1000; i++) CK(cuLaunchKernel(g_empty, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0));
    CK(cuCtxSynchronize());
    t = now_s();
    for (int i = 0; i < N; i++) CK(cuLaunchKernel(g_empty, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0));
    CK(cuCtxSynchronize());
    printf("cost empty launch us=%.3f\n", (now_s() - t) * 1e6 / N);
    t = now_s();
    for (int i = 0; i < N / 10; i++) {
        CK(cuEventRecord(e1, 0));
        CK(cuLaunchKernel(g_empty, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0));
        CK(cuEventRecord(e2, 0));
    }
    CK(cuCtxSynchronize());
    printf("cost launch+2 events us=%.3f\n", (now_s() - t) * 1e6 / (N / 10));
    t = now_s();
    for (int i = 0; i < N; i++) cuEventQuery(e2);
    printf("cost cuEventQuery ns=%.1f\n", (now_s() - t) * 1e9 / N);

    /* event-timed kernel durations */
    unsigned long long durs[] = {50000, 1000000, 10000000};
    for (int k = 0; k < 3; k++) {
        unsigned long long zero = 0;
        void *args[] = {&durs[k], &zero};
        for (int rep = 0; rep < 3; rep++) {
            CK(cuEventRecord(e1, 0));
            CK(cuLaunchKernel(g_spin, g_sms, 1, 1, 128, 1, 1, 0, 0, args, 0));
            CK(cuEventRecord(e2, 0));
            CK(cuEventSynchronize(e2));
            float ms;
            CK(cuEventElapsedTime(&ms, e1, e2));
            printf("event spin ns=%llu grid=%d measured_ms=%.4f\n", durs[k], g_sms, ms);
        }
        /* back-to-back throughput */
        int reps = (int)(1e9 / durs[k]);
        double t1 = now_s();
        for (int i = 0; i < reps; i++)
            CK(cuLaunchKernel(g_spin, g_sms, 1, 1, 128, 1, 1, 0, 0, args, 0));
        CK(cuCtxSynchronize());
        printf("b2b spin ns=%llu per_s=%.1f\n", durs[k], reps / (now_s() - t1));
    }

    /* utilisation samples under known duty cycles */
    g_t0 = now_s();
    pthread_t th;
    pthread_create(&th, NULL, sampler, NULL);
    run_phase("full_1ms_100pct", 3.0, 1000000, g_sms, 0);
    run_phase("oneblock_1ms_100pct", 3.0, 1000000, 1, 0);
    run_phase("full_1ms_50pct", 3.0, 1000000, g_sms, 1.0);
    run_phase("full_1ms_25pct", 3.0, 1000000, g_sms, 3.0);
    run_phase("half_sms_1ms_100pct", 3.0, 1000000, g_sms / 2, 0);
    g_phase = "idle";
    sleep(2);
    g_stop = 1;
    pthread_join(th, NULL);
    return 0;
}
