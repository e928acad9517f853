// vLLM-style memory use under vgpu's oversubscription (issue 27): a
// program that maps its own memory through the VMM API (as vLLM's
// CuMemAllocator and SGLang's torch_memory_saver do), runs over it with a
// CUDA graph, and shares a cudaMalloc buffer with a second process through
// legacy IPC (as vLLM's custom all-reduce does).
//
//   vllm_style owner GIB HANDLE_FILE IDLE_S
//     maps GIB GiB by cuMemCreate + cuMemMap, fills it, bumps it by a
//     graph 10 times, exports a 64 MiB cudaMalloc buffer to HANDLE_FILE,
//     waits for HANDLE_FILE.done (the peer), idles IDLE_S s (a neighbour
//     may want its room meanwhile), then bumps 10 more times and checks
//     every word of both.
//   vllm_style peer HANDLE_FILE
//     opens the buffer, checks it, adds 1 to every word, writes .done.
//
// Prints key=value lines; every check is a count of wrong words.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SHARED_WORDS (16u << 20)  // 64 MiB of uint32

__device__ unsigned hash32(unsigned long long i) {
  unsigned x = (unsigned)(i * 2654435761ull) ^ (unsigned)(i >> 32);
  x ^= x >> 15;
  x *= 0x2c1b3c6dU;
  return x ^ (x >> 12);
}
__global__ void fill(unsigned *d, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    d[i] = hash32(i);
}
__global__ void bump(unsigned *d, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    d[i] += 1;
}
__global__ void check(const unsigned *d, size_t n, unsigned add, unsigned long long *bad) {
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    mine += d[i] != hash32(i) + add;
  if (mine) atomicAdd(bad, mine);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// Wrong words of d (n) against hash + add; ~0 if the check could not run.
static unsigned long long wrong(const unsigned *d, size_t n, unsigned add) {
  unsigned long long *bad = NULL, host = ~0ull;
  if (cudaMalloc(&bad, sizeof *bad)) return ~0ull;
  cudaMemset(bad, 0, sizeof *bad);
  check<<<1024, 256>>>(d, n, add, bad);
  if (cudaDeviceSynchronize() || cudaMemcpy(&host, bad, sizeof host, cudaMemcpyDeviceToHost)) host = ~0ull;
  cudaFree(bad);
  return host;
}

static int owner(double gib, const char *path, double idle) {
  cudaFree(0);
  CUdevice dev;
  cuDeviceGet(&dev, 0);
  // The program's own VMM memory, as CuMemAllocator maps it.
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  size_t bytes = ((size_t)(gib * (1 << 30)) + gran - 1) / gran * gran;
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  CUresult rc = cuMemAddressReserve(&va, bytes, 0, 0, 0);
  if (!rc) rc = cuMemCreate(&h, bytes, &prop, 0);
  if (!rc) rc = cuMemMap(va, bytes, 0, h, 0);
  CUmemAccessDesc acc = {};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (!rc) rc = cuMemSetAccess(va, bytes, &acc, 1);
  printf("vmm_rc=%d vmm_bytes=%zu\n", rc, bytes);
  if (rc) return 1;
  unsigned *d = (unsigned *)va;
  size_t n = bytes / 4;
  fill<<<1024, 256>>>(d, n);
  // Ten bumps, captured once and replayed as a graph.
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaGraph_t g;
  cudaGraphExec_t ge;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  bump<<<1024, 256, 0, s>>>(d, n);
  int grc = cudaStreamEndCapture(s, &g);
  if (!grc) grc = cudaGraphInstantiate(&ge, g, 0);
  for (int i = 0; !grc && i < 10; i++) grc = cudaGraphLaunch(ge, s);
  if (!grc) grc = cudaStreamSynchronize(s);
  printf("graph_rc=%d vmm_wrong_before=%llu\n", grc, wrong(d, n, 10));
  // A buffer shared through legacy IPC.
  unsigned *shared = NULL;
  int src = cudaMalloc(&shared, SHARED_WORDS * 4ull);
  if (!src) fill<<<1024, 256>>>(shared, SHARED_WORDS);
  cudaIpcMemHandle_t ipc;
  int irc = src ? src : cudaIpcGetMemHandle(&ipc, shared);
  cudaDeviceSynchronize();
  printf("ipc_export_rc=%d\n", irc);
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) return 1;
  fwrite(irc ? (const void *)"" : (const void *)&ipc, 1, irc ? 0 : sizeof ipc, f);
  fclose(f);
  rename(tmp, path);
  printf("ready=1\n");
  fflush(stdout);
  char done[4096];
  snprintf(done, sizeof done, "%s.done", path);
  double until = now_s() + 120;
  while (access(done, F_OK) && now_s() < until) usleep(50000);
  printf("peer_seen=%d shared_wrong_after_peer=%llu\n", !access(done, F_OK),
         src ? ~0ull : wrong(shared, SHARED_WORDS, 1));
  fflush(stdout);
  // Idle: a neighbour that wants room may suspend this process now.
  double t = now_s();
  until = t + idle;
  while (now_s() < until) usleep(10000);
  double w = now_s();
  for (int i = 0; !grc && i < 10; i++) grc = cudaGraphLaunch(ge, s);
  if (!grc) grc = cudaStreamSynchronize(s);
  printf("wake_ms=%.0f graph_after_rc=%d\n", (now_s() - w) * 1e3, grc);
  unsigned long long vw = wrong(d, n, 20), sw = src ? ~0ull : wrong(shared, SHARED_WORDS, 1);
  printf("vmm_wrong_after=%llu shared_wrong_after=%llu\n", vw, sw);
  int ok = !grc && !irc && vw == 0 && sw == 0;
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  if (!src) cudaFree(shared);
  rc = cuMemUnmap(va, bytes);
  if (!rc) rc = cuMemRelease(h);
  if (!rc) rc = cuMemAddressFree(va, bytes);
  printf("vmm_free_rc=%d intact=%d\n", rc, ok && !rc);
  // (Again: the lines before ready=1 are read by whoever waited for it.)
  printf("vmm_rc=0 graph_rc=%d ipc_export_rc=%d\n", grc, irc);
  return 0;
}

static int peer(const char *path) {
  cudaIpcMemHandle_t ipc;
  FILE *f = fopen(path, "rb");
  if (!f || fread(&ipc, 1, sizeof ipc, f) != sizeof ipc) {
    printf("peer_read=0\n");
    return 1;
  }
  fclose(f);
  unsigned *shared = NULL;
  int rc = cudaIpcOpenMemHandle((void **)&shared, ipc, cudaIpcMemLazyEnablePeerAccess);
  printf("ipc_open_rc=%d\n", rc);
  if (rc) return 1;
  unsigned long long before = wrong(shared, SHARED_WORDS, 0);
  bump<<<1024, 256>>>(shared, SHARED_WORDS);
  int brc = cudaDeviceSynchronize();
  printf("peer_wrong=%llu peer_bump_rc=%d ipc_close_rc=%d\n", before, brc, cudaIpcCloseMemHandle(shared));
  char done[4096];
  snprintf(done, sizeof done, "%s.done", path);
  FILE *d = fopen(done, "w");
  if (d) fclose(d);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 5 && !strcmp(argv[1], "owner")) return owner(atof(argv[2]), argv[3], atof(argv[4]));
  if (argc == 3 && !strcmp(argv[1], "peer")) return peer(argv[2]);
  fprintf(stderr, "usage: %s owner GIB HANDLE_FILE IDLE_S | peer HANDLE_FILE\n", argv[0]);
  return 2;
}
