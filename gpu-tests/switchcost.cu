// What a turn between two CUDA contexts costs on this GPU (issue 29).
//
//   switchcost solo  SECONDS KERNEL_US
//   switchcost free  SECONDS KERNEL_US ROLE SHM        two processes, no turns
//   switchcost turns SECONDS KERNEL_US ROLE SHM TURN_US
//
// Each process launches spin kernels of KERNEL_US on every SM. In `free`
// both submit all the time and the GPU time-slices them; in `turns` a
// process submits TURN_US of work only while a shared word says it is its
// turn, drains its stream, and hands the turn over, so the GPU runs one
// context at a time and switches when the other's queue is empty. Each
// prints its GPU work and the wall time; the GPU's efficiency is the sum
// of both works over the wall time. `turns` also prints the p50/p99 of the
// gap between handing the turn over and the other's first kernel starting.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <vector>

__device__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin(unsigned long long ns, unsigned long long *first) {
  unsigned long long t0 = gtimer();
  if (first && blockIdx.x == 0 && threadIdx.x == 0) atomicMin(first, t0);
  while (gtimer() - t0 < ns) {
  }
}

__global__ void stamp(unsigned long long *out) { *out = gtimer(); }

static double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

struct Shared {
  std::atomic<int> turn;
  std::atomic<int> ready;
  std::atomic<int> stop;
  std::atomic<unsigned long long> handed_gt;  // globaltimer at hand-over
};

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: see source\n");
    return 2;
  }
  const char *mode = argv[1];
  double secs = atof(argv[2]);
  unsigned long long kns = (unsigned long long)(atof(argv[3]) * 1000);
  int role = argc > 4 ? atoi(argv[4]) : 0;
  double turn_us = argc > 6 ? atof(argv[6]) : 0;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  unsigned long long *first, *gt;
  cudaMalloc(&first, 8);
  cudaMallocHost(&gt, 8);
  spin<<<sms, 32, 0, s>>>(1000, nullptr);
  cudaStreamSynchronize(s);

  Shared *sh = nullptr;
  if (strcmp(mode, "solo") != 0) {
    int fd = open(argv[5], O_RDWR | O_CREAT, 0666);
    if (ftruncate(fd, 4096) != 0) return 2;
    sh = (Shared *)mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    sh->ready.fetch_add(1);
    while (sh->ready.load() < 2) usleep(100);
  }
  long kernels = 0;
  std::vector<double> gaps;
  double t0 = now();
  if (strcmp(mode, "turns") != 0) {
    while (now() - t0 < secs) {
      for (int i = 0; i < 16; i++) spin<<<sms, 32, 0, s>>>(kns, nullptr);
      kernels += 16;
      // Keep the queue short so the end is prompt.
      cudaStreamSynchronize(s);
    }
  } else {
    int per_turn = std::max(1, (int)(turn_us * 1000 / kns));
    unsigned long long big = ~0ull;
    while (now() - t0 < secs && !sh->stop.load()) {
      while (sh->turn.load(std::memory_order_acquire) != role) {
        if (sh->stop.load()) break;
      }
      if (sh->stop.load()) break;
      cudaMemcpyAsync(first, &big, 8, cudaMemcpyHostToDevice, s);
      for (int i = 0; i < per_turn; i++) spin<<<sms, 32, 0, s>>>(kns, i == 0 ? first : nullptr);
      kernels += per_turn;
      unsigned long long f = 0;
      cudaMemcpyAsync(&f, first, 8, cudaMemcpyDeviceToHost, s);
      stamp<<<1, 1, 0, s>>>(gt);
      cudaStreamSynchronize(s);
      unsigned long long h = sh->handed_gt.load();
      if (h && f > h) gaps.push_back((f - h) / 1000.0);
      sh->handed_gt.store(*gt);
      sh->turn.store(1 - role, std::memory_order_release);
    }
    sh->stop.store(1);
  }
  cudaStreamSynchronize(s);
  double wall = now() - t0;
  double work = kernels * kns / 1e9;
  std::sort(gaps.begin(), gaps.end());
  double p50 = gaps.empty() ? 0 : gaps[gaps.size() / 2];
  double p99 = gaps.empty() ? 0 : gaps[gaps.size() * 99 / 100];
  printf("mode=%s role=%d kernel_us=%.1f turn_us=%.1f wall=%.4f work=%.4f frac=%.4f turns=%zu gap_p50_us=%.1f gap_p99_us=%.1f\n",
         mode, role, kns / 1000.0, turn_us, wall, work, work / wall, gaps.size(), p50, p99);
  return 0;
}
