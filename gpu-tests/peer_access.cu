// Issue 27: a cudaMalloc block on GPU 0 (VMM-backed under vgpu's
// oversubscription) read and written by a kernel on GPU 1 after
// cudaDeviceEnablePeerAccess, and copied by cudaMemcpyPeer both ways.
// Peer access covers cuMemAlloc's blocks, never VMM memory, unless the
// block is mapped for the other GPU too (src/oversub/backing.rs).
// Prints key=value lines: kernel_ok, peer_copy_ok, and the CUDA errors.
#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void bump(const unsigned *src, unsigned *dst, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i] + 1;
}

__global__ void bump_in_place(unsigned *p, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] += 1;
}

#define TRY(x)                                                        \
    do {                                                              \
        cudaError_t e_ = (x);                                         \
        if (e_ != cudaSuccess) {                                      \
            printf("error=%s at %s\n", cudaGetErrorName(e_), #x);   \
            return 1;                                                 \
        }                                                             \
    } while (0)

int main() {
    int n = 0;
    TRY(cudaGetDeviceCount(&n));
    printf("devices=%d\n", n);
    if (n < 2) return 2;
    int can = 0;
    TRY(cudaDeviceCanAccessPeer(&can, 1, 0));
    printf("can_access_peer=%d\n", can);
    const size_t words = (64u << 20) / 4;
    std::vector<unsigned> host(words), back(words);
    for (size_t i = 0; i < words; i++) host[i] = (unsigned)(i * 2654435761u);
    unsigned *a = nullptr, *b = nullptr;
    TRY(cudaSetDevice(0));
    TRY(cudaMalloc(&a, words * 4));
    TRY(cudaMemcpy(a, host.data(), words * 4, cudaMemcpyHostToDevice));
    TRY(cudaSetDevice(1));
    TRY(cudaMalloc(&b, words * 4));
    TRY(cudaDeviceEnablePeerAccess(0, 0));
    // GPU 1 reads GPU 0's block and writes its own, then writes GPU 0's.
    bump<<<(words + 255) / 256, 256>>>(a, b, words);
    bump_in_place<<<(words + 255) / 256, 256>>>(a, words);
    TRY(cudaDeviceSynchronize());
    TRY(cudaMemcpy(back.data(), b, words * 4, cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t i = 0; i < words; i++) wrong += back[i] != host[i] + 1;
    TRY(cudaMemcpy(back.data(), a, words * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < words; i++) wrong += back[i] != host[i] + 1;
    printf("kernel_wrong=%zu\nkernel_ok=%d\n", wrong, wrong == 0);
    // Peer copies both ways: b <- a (both now host + 1), then a <- b.
    TRY(cudaMemcpy(b, host.data(), words * 4, cudaMemcpyHostToDevice));
    TRY(cudaMemcpyPeer(b, 1, a, 0, words * 4));
    TRY(cudaMemcpy(back.data(), b, words * 4, cudaMemcpyDeviceToHost));
    wrong = 0;
    for (size_t i = 0; i < words; i++) wrong += back[i] != host[i] + 1;
    TRY(cudaMemcpy(b, host.data(), words * 4, cudaMemcpyHostToDevice));
    TRY(cudaMemcpyPeer(a, 0, b, 1, words * 4));
    TRY(cudaMemcpy(back.data(), a, words * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < words; i++) wrong += back[i] != host[i];
    printf("peer_copy_wrong=%zu\npeer_copy_ok=%d\n", wrong, wrong == 0);
    TRY(cudaFree(b));
    TRY(cudaSetDevice(0));
    TRY(cudaFree(a));
    return 0;
}
