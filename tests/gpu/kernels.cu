#include "kernels.hpp"

namespace vramswap::detail::gpu_test {
namespace {

__device__ uint64_t pattern(uint64_t i, uint64_t seed) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return (x ^ (x >> 31)) | 1;
}

__global__ void fill_kernel(uint64_t* p, uint64_t n, uint64_t seed) {
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x) p[i] = pattern(i, seed);
}

__global__ void add_kernel(uint64_t* p, uint64_t n, uint64_t k) {
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x) p[i] += k;
}

__global__ void count_kernel(const uint64_t* p, uint64_t n, uint64_t seed, uint64_t plus, unsigned long long* bad) {
  unsigned long long local = 0;
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x) {
    local += p[i] != pattern(i, seed) + plus;
  }
  if (local != 0) atomicAdd(bad, local);
}

constexpr int k_blocks = 264;  // two blocks per SM on the largest current GPUs (132 SMs)
constexpr int k_threads = 512;

}  // namespace

cudaError_t fill(uint64_t* p, uint64_t n, uint64_t seed, cudaStream_t stream) {
  fill_kernel<<<k_blocks, k_threads, 0, stream>>>(p, n, seed);
  return cudaGetLastError();
}

cudaError_t add(uint64_t* p, uint64_t n, uint64_t k, cudaStream_t stream) {
  add_kernel<<<k_blocks, k_threads, 0, stream>>>(p, n, k);
  return cudaGetLastError();
}

cudaError_t count_mismatches(const uint64_t* p, uint64_t n, uint64_t seed, uint64_t plus, unsigned long long* bad,
                             cudaStream_t stream) {
  count_kernel<<<k_blocks, k_threads, 0, stream>>>(p, n, seed, plus, bad);
  return cudaGetLastError();
}

}  // namespace vramswap::detail::gpu_test
