/* Prototype of the limiter's pacing, measured on the real GPU before it was
 * built into the library: a GCRA on kernel GPU-time, with costs taken from
 * event timing, and the per-process NVML utilisation it produces.
 *
 *   cc -O2 -I/usr/local/cuda/include -o pacing pacing.c -lpthread \
 *      -L/usr/local/cuda/lib64/stubs -lcuda -lnvidia-ml
 */
#include <cuda.h>
#include <nvml.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "../../tests/programs/spin_ptx.h"

#define CK(x)                                                                 \
    do {                                                                      \
        int rc_ = (int)(x);                                                   \
        if (rc_) {                                                            \
            fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, rc_); \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static nvmlDevice_t g_dev;
static volatile int g_stop;
static const char *volatile g_phase = "start";

static void *sampler(void *arg) {
    (void)arg;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    unsigned long long last = tv.tv_sec * 1000000ULL + tv.tv_usec;
    static nvmlProcessUtilizationSample_t s[4096];
    int first = 1;
    while (!g_stop) {
        usleep(250000);
        unsigned n = 0;
        nvmlReturn_t r0 = nvmlDeviceGetProcessUtilization(g_dev, NULL, &n, last);
        unsigned cap = 4096;
        nvmlReturn_t r = nvmlDeviceGetProcessUtilization(g_dev, s, &cap, last);
        if (first) printf("sizing rc=%d n=%u\n", r0, n), first = 0;
        if (r != NVML_SUCCESS) {
            printf("util phase=%s rc=%d\n", g_phase, r);
            continue;
        }
        double sum = 0;
        unsigned mine = 0;
        for (unsigned i = 0; i < cap; i++) {
            if (s[i].timeStamp > last) last = s[i].timeStamp;
            if (s[i].pid == (unsigned)getpid()) sum += s[i].smUtil, mine++;
        }
        printf("util phase=%s samples=%u mine=%u mean_sm=%.1f last_ts=%llu\n", g_phase, cap, mine,
               mine ? sum / mine : -1.0, last);
        fflush(stdout);
    }
    return NULL;
}

static CUfunction g_spin;
static int g_sms;
static volatile unsigned long long *g_counter;
static CUdeviceptr g_counter_dev;

/* Launch spin kernels for `secs`, paced at `limit` (0 = unpaced) with cost
 * `cost_ns` per launch; returns completed kernels per second. */
static double paced(const char *name, double secs, unsigned long long ns, double limit,
                    double cost_ns, long long tau_ns) {
    g_phase = name;
    unsigned long long start = *g_counter;
    double t0 = now_s();
    long long tat = now_ns();
    double end = t0 + secs;
    unsigned long long launched = 0;
    while (now_s() < end) {
        while (launched - (*g_counter - start) > 8) /* keep the queue short */;
        if (limit > 0) {
            long long t = now_ns();
            if (tat - tau_ns > t) {
                struct timespec d = {0, (long)(tat - tau_ns - t)};
                nanosleep(&d, NULL);
                t = now_ns();
            }
            tat = (tat > t ? tat : t) + (long long)(cost_ns / limit);
        }
        void *args[] = {&ns, (void *)&g_counter_dev};
        CK(cuLaunchKernel(g_spin, g_sms, 1, 1, 128, 1, 1, 0, 0, args, 0));
        launched++;
    }
    CK(cuCtxSynchronize());
    double rate = (*g_counter - start) / (now_s() - t0);
    printf("phase %s kernel_ns=%llu limit=%.2f cost_ns=%.0f tau_ms=%.1f rate=%.1f\n", name, ns,
           limit, cost_ns, tau_ns / 1e6, rate);
    return rate;
}

int main(void) {
    CK(nvmlInit_v2());
    CK(nvmlDeviceGetHandleByIndex_v2(0, &g_dev));
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CK(cuDeviceGetAttribute(&g_sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUmodule mod;
    CK(cuModuleLoadData(&mod, VGPU_SPIN_PTX));
    CK(cuModuleGetFunction(&g_spin, mod, "vgpu_spin"));
    void *host;
    CK(cuMemHostAlloc(&host, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    g_counter = (volatile unsigned long long *)host;
    *g_counter = 0;
    CK(cuMemHostGetDevicePointer(&g_counter_dev, host, 0));

    /* isolated vs queued event timing of 50 us kernels */
    CUevent a, b;
    CK(cuEventCreate(&a, 0));
    CK(cuEventCreate(&b, 0));
    unsigned long long k50 = 50000, zero = 0;
    for (int queued = 0; queued < 2; queued++) {
        double sum = 0;
        for (int i = 0; i < 20; i++) {
            void *args[] = {&k50, &zero};
            if (queued) CK(cuLaunchKernel(g_spin, g_sms, 1, 1, 128, 1, 1, 0, 0, args, 0));
            CK(cuEventRecord(a, 0));
            CK(cuLaunchKernel(g_spin, g_sms, 1, 1, 128, 1, 1, 0, 0, args, 0));
            CK(cuEventRecord(b, 0));
            CK(cuEventSynchronize(b));
            float ms;
            CK(cuEventElapsedTime(&ms, a, b));
            sum += ms;
        }
        printf("event 50us queued=%d mean_us=%.2f\n", queued, sum / 20 * 1000);
    }

    pthread_t th;
    pthread_create(&th, NULL, sampler, NULL);
    unsigned long long durs[] = {50000, 1000000, 10000000};
    double costs[] = {57000, 1008000, 10020000};
    for (int k = 0; k < 3; k++) {
        char nm[64];
        snprintf(nm, sizeof nm, "free_%llu", durs[k]);
        double base = paced(nm, 2.5, durs[k], 0, 0, 0);
        double lims[] = {0.3, 0.6};
        for (int l = 0; l < 2; l++) {
            snprintf(nm, sizeof nm, "paced_%llu_%.0f", durs[k], lims[l] * 100);
            double r = paced(nm, 3.0, durs[k], lims[l], costs[k], 5000000);
            printf("fraction kernel_ns=%llu limit=%.2f achieved=%.4f\n", durs[k], lims[l],
                   r / base);
        }
    }
    g_phase = "idle";
    sleep(1);
    g_stop = 1;
    pthread_join(th, NULL);
    return 0;
}
