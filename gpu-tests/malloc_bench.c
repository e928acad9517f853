/* cudaMalloc + cudaFree of 1 MiB through the CUDA runtime (which reaches
 * the driver through cuGetProcAddress): microseconds per pair, best and
 * median of REPS repetitions of N pairs.
 *
 *   gcc -O2 -I/usr/local/cuda/include malloc_bench.c -L/usr/local/cuda/lib64 -lcudart
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2000, reps = argc > 2 ? atoi(argv[2]) : 9;
    void *p;
    if (cudaFree(0) != cudaSuccess) return 2;
    for (int i = 0; i < 200; i++) {
        cudaMalloc(&p, 1 << 20);
        cudaFree(p);
    }
    double us[64];
    for (int r = 0; r < reps && r < 64; r++) {
        double t = now_s();
        for (int i = 0; i < n; i++) {
            if (cudaMalloc(&p, 1 << 20) != cudaSuccess) return 3;
            cudaFree(p);
        }
        us[r] = (now_s() - t) * 1e6 / n;
    }
    qsort(us, reps, sizeof *us, cmp);
    printf("malloc_free_us_median=%.3f malloc_free_us_best=%.3f\n", us[reps / 2], us[0]);
    return 0;
}
