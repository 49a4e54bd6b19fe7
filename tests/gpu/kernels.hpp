// Test kernels, compiled by nvcc (kernels.cu), callable from C++20 tests compiled by g++.
// Each launches on `stream` and returns the launch's cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace vramswap::detail::gpu_test {

// p[i] = pattern(i, seed): splitmix64 of i and seed, never zero.
cudaError_t fill(uint64_t* p, uint64_t n, uint64_t seed, cudaStream_t stream);
// p[i] += k
cudaError_t add(uint64_t* p, uint64_t n, uint64_t k, cudaStream_t stream);
// *bad += number of i with p[i] != pattern(i, seed) + plus
cudaError_t count_mismatches(const uint64_t* p, uint64_t n, uint64_t seed, uint64_t plus, unsigned long long* bad,
                             cudaStream_t stream);

}  // namespace vramswap::detail::gpu_test
