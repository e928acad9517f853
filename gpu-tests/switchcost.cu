// What a turn between two CUDA contexts costs on this GPU (issue 29).
//
//   switchcost solo  SECONDS KERNEL_US
//   switchcost free  SECONDS KERNEL_US ROLE SHM        two processes, no turns
//   switchcost turns SECONDS KERNEL_US ROLE SHM TURN_US
//   switchcost threads SECONDS KERNEL_US 0 - TURN_US  the same turns between
//                                                    two threads of one context
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
#include <thread>
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

struct Turns {
  long kernels = 0;
  std::vector<double> gaps;
};

// Takes turns with the other role until SECS pass or the other stops.
static void take_turns(Shared *sh, int role, int sms, unsigned long long kns, double turn_us, double secs,
                       Turns *out) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  unsigned long long *first, *gt, *big;
  cudaMalloc(&first, 8);
  cudaMallocHost(&gt, 8);
  cudaMallocHost(&big, 8);
  *big = ~0ull;
  int per_turn = std::max(1, (int)(turn_us * 1000 / kns));
  double t0 = now();
  while (now() - t0 < secs && !sh->stop.load()) {
    while (sh->turn.load(std::memory_order_acquire) != role) {
      if (sh->stop.load()) break;
    }
    if (sh->stop.load()) break;
    cudaMemcpyAsync(first, big, 8, cudaMemcpyHostToDevice, s);
    for (int i = 0; i < per_turn; i++) spin<<<sms, 32, 0, s>>>(kns, i == 0 ? first : nullptr);
    out->kernels += per_turn;
    cudaMemcpyAsync(gt + 0, first, 8, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    unsigned long long f = *gt;
    stamp<<<1, 1, 0, s>>>(gt);
    cudaStreamSynchronize(s);
    unsigned long long h = sh->handed_gt.load();
    if (h && f > h) out->gaps.push_back((f - h) / 1000.0);
    sh->handed_gt.store(*gt);
    sh->turn.store(1 - role, std::memory_order_release);
  }
  sh->stop.store(1);
  cudaStreamSynchronize(s);
}

static void report(const char *mode, int role, unsigned long long kns, double turn_us, double wall, Turns &t) {
  double work = t.kernels * kns / 1e9;
  std::sort(t.gaps.begin(), t.gaps.end());
  double p50 = t.gaps.empty() ? 0 : t.gaps[t.gaps.size() / 2];
  double p99 = t.gaps.empty() ? 0 : t.gaps[t.gaps.size() * 99 / 100];
  printf("mode=%s role=%d kernel_us=%.1f turn_us=%.1f wall=%.4f work=%.4f frac=%.4f turns=%zu gap_p50_us=%.1f "
         "gap_p99_us=%.1f\n",
         mode, role, kns / 1000.0, turn_us, wall, work, work / wall, t.gaps.size(), p50, p99);
}

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
  spin<<<sms, 32>>>(1000, nullptr);
  cudaDeviceSynchronize();

  if (strcmp(mode, "threads") == 0) {
    static Shared local;
    Turns a, b;
    double t0 = now();
    std::thread other(take_turns, &local, 1, sms, kns, turn_us, secs, &b);
    take_turns(&local, 0, sms, kns, turn_us, secs, &a);
    other.join();
    double wall = now() - t0;
    report(mode, 0, kns, turn_us, wall, a);
    report(mode, 1, kns, turn_us, wall, b);
    return 0;
  }
  Shared *sh = nullptr;
  if (strcmp(mode, "solo") != 0) {
    int fd = open(argv[5], O_RDWR | O_CREAT, 0666);
    if (ftruncate(fd, 4096) != 0) return 2;
    sh = (Shared *)mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    sh->ready.fetch_add(1);
    while (sh->ready.load() < 2) usleep(100);
  }
  Turns t;
  double t0 = now();
  if (strcmp(mode, "turns") == 0) {
    take_turns(sh, role, sms, kns, turn_us, secs, &t);
  } else {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    while (now() - t0 < secs) {
      for (int i = 0; i < 16; i++) spin<<<sms, 32, 0, s>>>(kns, nullptr);
      t.kernels += 16;
      // Keep the queue short so the end is prompt.
      cudaStreamSynchronize(s);
    }
  }
  report(mode, role, kns, turn_us, now() - t0, t);
  return 0;
}
