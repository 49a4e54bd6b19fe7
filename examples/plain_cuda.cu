// plain_cuda: an ordinary CUDA program that knows nothing of vramswap (plain cudaMalloc,
// kernels, cudaMemcpy), for running under the preload shim.
//
//   build: part of the CMake build where nvcc is found: target vramswap_plain_cuda (the CUDA
//          runtime linked as a shared library: nvcc -cudart shared) and
//          vramswap_plain_cuda_static (nvcc's default, the static runtime)
//   run:   VRAMSWAP_OVERSUBSCRIBE=1 VRAMSWAP_POOL_SIZE=4GiB \
//            LD_PRELOAD=build/preload/libvramswap_preload.so build/examples/vramswap_plain_cuda 6GiB 10
//
// usage: vramswap_plain_cuda <bytes> [seconds] [--host-mapped] [--context-first]
// Allocates <bytes> in cudaMalloc blocks of up to 1 GiB, fills every 32-bit word with a
// value derived from its index, then runs passes of a read-modify-write kernel over all of
// it (each word += 1) for [seconds] (default: 3 passes), checking every word on the device
// after each pass. --host-mapped allocates pinned, mapped host memory instead
// (cudaHostAlloc), the benchmark's baseline. --context-first starts the CUDA runtime and its
// context (cudaFree(0)) before the timed allocation, as context_s, so that alloc_s is the
// allocations alone. Prints one line of key=value numbers. Exit 0 when
// every word was right after every pass, 1 on a wrong word, 2 on a CUDA error.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

__device__ __host__ uint32_t seed_of(uint64_t index, uint32_t block) {
  uint64_t x = index * 0x9E3779B97F4A7C15ull + block;
  x ^= x >> 29;
  return static_cast<uint32_t>(x * 0xBF58476D1CE4E5B9ull >> 32);
}

__global__ void fill(uint32_t* w, uint64_t n, uint32_t block) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    w[i] = seed_of(i, block);
  }
}

__global__ void bump(uint32_t* w, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) w[i] += 1;
}

__global__ void check(const uint32_t* w, uint64_t n, uint32_t block, uint32_t passes, unsigned long long* wrong) {
  unsigned long long bad = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    bad += w[i] != seed_of(i, block) + passes;
  }
  if (bad != 0) atomicAdd(wrong, bad);
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "plain_cuda: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

uint64_t parse_bytes(const char* s) {
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  const char u = end != nullptr ? *end : 0;
  const double k = u == 'G' || u == 'g' ? 1ull << 30 : u == 'M' || u == 'm' ? 1ull << 20 : u == 'K' || u == 'k' ? 1ull << 10 : 1;
  return static_cast<uint64_t>(v * k);
}

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <bytes> [seconds] [--host-mapped]\n", argv[0]);
    return 64;
  }
  const uint64_t bytes = parse_bytes(argv[1]);
  const double seconds = argc > 2 && argv[2][0] != '-' ? std::atof(argv[2]) : 0;
  bool host_mapped = false;
  bool context_first = false;
  for (int i = 2; i < argc; ++i) {
    host_mapped |= std::strcmp(argv[i], "--host-mapped") == 0;
    context_first |= std::strcmp(argv[i], "--context-first") == 0;
  }
  double context_s = 0;
  if (context_first) {
    const auto t_context = std::chrono::steady_clock::now();
    if (!ok(cudaFree(nullptr), "cudaFree(0), starting the CUDA runtime")) return 2;
    context_s = since(t_context);
  }
  constexpr uint64_t k_block = 1ull << 30;

  struct block {
    uint32_t* ptr;
    uint64_t words;
  };
  std::vector<block> blocks;
  const auto t_alloc = std::chrono::steady_clock::now();
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = bytes - done < k_block ? bytes - done : k_block;
    void* p = nullptr;
    if (host_mapped) {
      void* h = nullptr;
      if (!ok(cudaHostAlloc(&h, n, cudaHostAllocMapped), "cudaHostAlloc")) return 2;
      if (!ok(cudaHostGetDevicePointer(&p, h, 0), "cudaHostGetDevicePointer")) return 2;
    } else if (!ok(cudaMalloc(&p, n), "cudaMalloc")) {
      return 2;
    }
    blocks.push_back({static_cast<uint32_t*>(p), n / 4});
    done += n;
  }
  const double alloc_s = since(t_alloc);
  size_t free_b = 0, total_b = 0;
  if (!ok(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo")) return 2;

  for (size_t b = 0; b < blocks.size(); ++b) fill<<<1024, 256>>>(blocks[b].ptr, blocks[b].words, static_cast<uint32_t>(b));
  if (!ok(cudaDeviceSynchronize(), "fill")) return 2;
  unsigned long long* wrong = nullptr;
  if (!ok(cudaMalloc(&wrong, sizeof *wrong), "cudaMalloc(counter)")) return 2;

  uint32_t passes = 0;
  double bump_s = 0;
  unsigned long long total_wrong = 0;
  const auto t0 = std::chrono::steady_clock::now();
  do {
    const auto tb = std::chrono::steady_clock::now();
    for (const block& b : blocks) bump<<<2048, 256>>>(b.ptr, b.words);
    if (!ok(cudaDeviceSynchronize(), "bump")) return 2;
    bump_s += since(tb);
    ++passes;
    if (!ok(cudaMemset(wrong, 0, sizeof *wrong), "cudaMemset")) return 2;
    for (size_t b = 0; b < blocks.size(); ++b) check<<<1024, 256>>>(blocks[b].ptr, blocks[b].words, static_cast<uint32_t>(b), passes, wrong);
    unsigned long long w = 0;
    if (!ok(cudaMemcpy(&w, wrong, sizeof w, cudaMemcpyDeviceToHost), "check")) return 2;
    total_wrong += w;
    if (w != 0) std::fprintf(stderr, "plain_cuda: pass %u: %llu words wrong\n", passes, w);
  } while (seconds > 0 ? since(t0) < seconds : passes < 3);

  // Read + write of every byte per pass.
  std::printf("bytes=%llu passes=%u wrong=%llu alloc_s=%.6f context_s=%.6f bump_gbps=%.2f meminfo_free=%zu meminfo_total=%zu\n",
              static_cast<unsigned long long>(bytes), passes, total_wrong, alloc_s, context_s, 2.0 * bytes * passes / bump_s / 1e9, free_b,
              total_b);
  std::fflush(stdout);
  for (const block& b : blocks) host_mapped ? cudaFreeHost(b.ptr) : cudaFree(b.ptr);
  cudaFree(wrong);
  return total_wrong == 0 ? 0 : 1;
}
