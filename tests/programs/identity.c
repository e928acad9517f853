/* One address per hook, whichever way a program asks: the symbol a -lcuda
 * program binds to, dlsym on RTLD_DEFAULT, on the driver's handle and on
 * RTLD_NEXT, and cuGetProcAddress (tests/preload.rs). Prints key=value. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

typedef int CUresult;
extern CUresult cuInit(unsigned flags);
extern CUresult cuMemAlloc_v2(unsigned long long *p, size_t n);
extern CUresult cuGetProcAddress(const char *s, void **pfn, int version, unsigned long long flags);

int main(void) {
    void *linked = (void *)cuMemAlloc_v2;
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    void *proc = NULL;
    int rc = cuInit(0);
    int prc = cuGetProcAddress("cuMemAlloc", &proc, 12000, 0);
    printf("init_rc=%d proc_rc=%d\n", rc, prc);
    printf("default_same=%d\n", dlsym(RTLD_DEFAULT, "cuMemAlloc_v2") == linked);
    printf("handle_same=%d\n", h && dlsym(h, "cuMemAlloc_v2") == linked);
    printf("next_same=%d\n", dlsym(RTLD_NEXT, "cuMemAlloc_v2") == linked);
    printf("proc_same=%d\n", proc == linked);
    return 0;
}
