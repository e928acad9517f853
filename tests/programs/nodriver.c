/* A process with no CUDA driver that reaches vgpu's exports by accident:
 * through dlsym(RTLD_DEFAULT) and through weak references the loader binds
 * to whatever defines them (with vgpu preloaded, vgpu's exports). Prints
 * what it found and what the calls returned, and how many threads it has.
 *
 *   nodriver          key=value lines
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>

typedef int CUresult;
typedef void *nvmlDevice_t;
struct nvml_memory { unsigned long long total, free, used; };

extern CUresult cuInit(unsigned flags) __attribute__((weak));
extern CUresult cuMemGetInfo_v2(size_t *free, size_t *total) __attribute__((weak));
extern int nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, struct nvml_memory *m) __attribute__((weak));

static int threads(void) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("driver_loadable=%d\n", dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD) != NULL ||
                                       dlopen("libcuda.so.1", RTLD_LAZY) != NULL);
    void *d = dlsym(RTLD_DEFAULT, "cuInit");
    printf("default_cuInit=%d dlerror_set=%d\n", d != NULL, d == NULL && dlerror() != NULL);
    printf("default_nvml=%d\n", dlsym(RTLD_DEFAULT, "nvmlDeviceGetMemoryInfo") != NULL);
    printf("next_cuInit=%d\n", dlsym(RTLD_NEXT, "cuMemAlloc_v2") != NULL);
    printf("weak_bound=%d\n", cuInit != NULL);
    if (cuInit) printf("cuInit_rc=%d\n", cuInit(0));
    if (cuMemGetInfo_v2) {
        size_t f = 0, t = 0;
        printf("meminfo_rc=%d\n", cuMemGetInfo_v2(&f, &t));
    }
    if (nvmlDeviceGetMemoryInfo) {
        struct nvml_memory m;
        printf("nvml_rc=%d\n", nvmlDeviceGetMemoryInfo(NULL, &m));
    }
    printf("threads=%d\n", threads());
    return 0;
}
