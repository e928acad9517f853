/* What nvidia-smi would show, through NVML loaded the way nvidia-smi loads
 * it (dlopen + dlsym). key=value output.
 *
 *   smi                       devices, memory (v1 and v2), processes
 *   smi watch DEV MS SECONDS  samples memory used; prints the maximum
 *                             (at the end, or at SIGTERM)
 *   smi putil DEV SINCE_MS    per-process SM utilisation over the last SINCE_MS
 */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } nvmlProcessInfo_t;
typedef struct { unsigned gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned pid; unsigned long long ts; unsigned sm, mem, enc, dec; } nvmlProcessUtilizationSample_t;

#define NVML_MEMORY_V2 ((unsigned)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

static void *lib;
static volatile sig_atomic_t g_term;
static void on_term(int sig) {
    (void)sig;
    g_term = 1;
}
#define SYM(name, params) nvmlReturn_t(*name) params = (nvmlReturn_t(*) params)dlsym(lib, #name)

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) {
        printf("error=dlopen\n");
        return 2;
    }
    SYM(nvmlInit_v2, (void));
    SYM(nvmlDeviceGetCount_v2, (unsigned *));
    SYM(nvmlDeviceGetHandleByIndex_v2, (unsigned, nvmlDevice_t *));
    SYM(nvmlDeviceGetName, (nvmlDevice_t, char *, unsigned));
    SYM(nvmlDeviceGetUUID, (nvmlDevice_t, char *, unsigned));
    SYM(nvmlDeviceGetMemoryInfo, (nvmlDevice_t, nvmlMemory_t *));
    SYM(nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t, nvmlMemory_v2_t *));
    SYM(nvmlDeviceGetComputeRunningProcesses_v3, (nvmlDevice_t, unsigned *, nvmlProcessInfo_t *));
    SYM(nvmlDeviceGetUtilizationRates, (nvmlDevice_t, nvmlUtilization_t *));
    SYM(nvmlDeviceGetProcessUtilization, (nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned *,
                                          unsigned long long));
    if (!nvmlInit_v2 || nvmlInit_v2()) {
        printf("error=init\n");
        return 2;
    }
    unsigned n = 0;
    nvmlDeviceGetCount_v2(&n);
    if (argc > 1 && !strcmp(argv[1], "watch")) {
        unsigned dev = argc > 2 ? (unsigned)atoi(argv[2]) : 0;
        int ms = argc > 3 ? atoi(argv[3]) : 10;
        double secs = argc > 4 ? atof(argv[4]) : 1;
        nvmlDevice_t d;
        nvmlDeviceGetHandleByIndex_v2(dev, &d);
        signal(SIGTERM, on_term);
        unsigned long long max_used = 0;
        long samples = 0;
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do {
            nvmlMemory_t m;
            if (!nvmlDeviceGetMemoryInfo(d, &m)) {
                if (m.used > max_used) max_used = m.used;
                samples++;
            }
            usleep(ms * 1000);
            clock_gettime(CLOCK_MONOTONIC, &t);
        } while (!g_term && (t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) * 1e-9 < secs);
        printf("max_used=%llu samples=%ld\n", max_used, samples);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "putil")) {
        unsigned dev = argc > 2 ? (unsigned)atoi(argv[2]) : 0;
        long since_ms = argc > 3 ? atol(argv[3]) : 1000;
        nvmlDevice_t d;
        nvmlDeviceGetHandleByIndex_v2(dev, &d);
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        unsigned long long since = (unsigned long long)now.tv_sec * 1000000ULL + now.tv_nsec / 1000 - since_ms * 1000ULL;
        nvmlProcessUtilizationSample_t s[64];
        unsigned count = 64;
        int rc = nvmlDeviceGetProcessUtilization ? nvmlDeviceGetProcessUtilization(d, s, &count, since) : -1;
        printf("rc=%d\n", rc);
        for (unsigned i = 0; rc == 0 && i < count; i++) printf("pid=%u sm=%u\n", s[i].pid, s[i].sm);
        return 0;
    }
    printf("gpus=%u\n", n);
    for (unsigned i = 0; i < n; i++) {
        nvmlDevice_t d;
        char name[96] = "", uuid[96] = "";
        nvmlDeviceGetHandleByIndex_v2(i, &d);
        nvmlDeviceGetName(d, name, sizeof name);
        nvmlDeviceGetUUID(d, uuid, sizeof uuid);
        for (char *c = name; *c; c++)
            if (*c == ' ') *c = '_';
        nvmlMemory_t m = {0};
        nvmlReturn_t r1 = nvmlDeviceGetMemoryInfo(d, &m);
        nvmlMemory_v2_t m2 = {NVML_MEMORY_V2, 0, 0, 0, 0};
        nvmlReturn_t r2 = nvmlDeviceGetMemoryInfo_v2 ? nvmlDeviceGetMemoryInfo_v2(d, &m2) : -1;
        printf("gpu%u_name=%s gpu%u_uuid=%s\n", i, name, i, uuid);
        printf("gpu%u_v1_rc=%d gpu%u_v1_total=%llu gpu%u_v1_used=%llu gpu%u_v1_free=%llu\n", i, r1, i, m.total, i,
               m.used, i, m.free);
        printf("gpu%u_v2_rc=%d gpu%u_v2_total=%llu gpu%u_v2_used=%llu gpu%u_v2_free=%llu gpu%u_v2_reserved=%llu\n",
               i, r2, i, m2.total, i, m2.used, i, m2.free, i, m2.reserved);
        nvmlProcessInfo_t procs[64];
        unsigned np = 64;
        if (nvmlDeviceGetComputeRunningProcesses_v3 && !nvmlDeviceGetComputeRunningProcesses_v3(d, &np, procs)) {
            printf("gpu%u_procs=%u\n", i, np);
            for (unsigned p = 0; p < np; p++)
                printf("gpu%u_proc%u_pid=%u gpu%u_proc%u_used=%llu\n", i, p, procs[p].pid, i, p, procs[p].used);
        }
        nvmlUtilization_t u = {0};
        if (nvmlDeviceGetUtilizationRates && !nvmlDeviceGetUtilizationRates(d, &u))
            printf("gpu%u_util=%u\n", i, u.gpu);
    }
    return 0;
}
