// Probe for issue 9: what time-slicing between contexts of different
// processes costs, and whether running in turns on the shared clock
// (windows of a common period) gets the cost back.
//
//   timeslice N_FLOATS START_NS SECONDS MODE [ARGS]
//     free                 launch 10 kernels, synchronise, repeat
//     burst US             launch US microseconds of kernels (by COST_NS), synchronise, repeat
//     window P_MS PHASE_MS W_MS
//                          only inside [PHASE + kP, PHASE + kP + W): launch
//                          kernels that fit the window (COST_NS each), synchronise
//     calibrate            prints the kernel's cost in ns (alone)
// Prints "kernels K" (completed between START and START + SECONDS).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

__global__ void add1(float *x, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride) x[i] += 1.0f;
}

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void sleep_until(long long t) {
  struct timespec ts = {(time_t)(t / 1000000000LL), (long)(t % 1000000000LL)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
  }
}

int main(int argc, char **argv) {
  if (argc < 5) return 2;
  size_t n = strtoull(argv[1], 0, 10);
  long long start = atoll(argv[2]);
  double secs = atof(argv[3]);
  const char *mode = argv[4];
  long long cost = getenv("COST_NS") ? atoll(getenv("COST_NS")) : 1000000;
  float *x;
  if (cudaMalloc(&x, n * sizeof(float)) != cudaSuccess) return 3;
  cudaMemset(x, 0, n * sizeof(float));
  int blocks = 132 * 8, threads = 256;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (int i = 0; i < 5; i++) add1<<<blocks, threads, 0, s>>>(x, n);
  cudaStreamSynchronize(s);
  if (!strcmp(mode, "calibrate")) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a, s);
    for (int i = 0; i < 50; i++) add1<<<blocks, threads, 0, s>>>(x, n);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    printf("cost_ns %lld\n", (long long)(ms * 1e6 / 50));
    return 0;
  }
  if (start == 0) start = now_ns() + 200000000LL;
  long long end = start + (long long)(secs * 1e9);
  sleep_until(start);
  long long done = 0;
  if (!strcmp(mode, "free")) {
    while (now_ns() < end) {
      for (int i = 0; i < 10; i++) add1<<<blocks, threads, 0, s>>>(x, n);
      cudaStreamSynchronize(s);
      done += 10;
    }
  } else if (!strcmp(mode, "burst")) {
    long long k = (atoll(argv[5]) * 1000LL) / cost;
    if (k < 1) k = 1;
    while (now_ns() < end) {
      for (long long i = 0; i < k; i++) add1<<<blocks, threads, 0, s>>>(x, n);
      cudaStreamSynchronize(s);
      done += k;
    }
  } else if (!strcmp(mode, "window")) {
    long long p = (long long)(atof(argv[5]) * 1e6), ph = (long long)(atof(argv[6]) * 1e6),
              w = (long long)(atof(argv[7]) * 1e6);
    for (;;) {
      long long t = now_ns();
      long long k0 = (t - ph) / p;  // the current or last window's period
      long long ws = ph + k0 * p;
      if (t >= ws + w) ws += p;  // past this period's window: the next one
      if (ws >= end) break;
      sleep_until(ws);
      // Launch what fits the window, 10 at a time, synchronising.
      long long we = ws + w;
      while (now_ns() + 10 * cost <= we) {
        for (int i = 0; i < 10; i++) add1<<<blocks, threads, 0, s>>>(x, n);
        cudaStreamSynchronize(s);
        if (now_ns() <= end) done += 10;
      }
      long long left = (we - now_ns()) / cost;
      if (left > 0) {
        for (long long i = 0; i < left; i++) add1<<<blocks, threads, 0, s>>>(x, n);
        cudaStreamSynchronize(s);
        if (now_ns() <= end) done += left;
      }
    }
  } else {
    return 2;
  }
  printf("kernels %lld\n", done);
  return 0;
}
