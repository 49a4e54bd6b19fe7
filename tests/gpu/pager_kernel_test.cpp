// The pager under real kernels (cuda backend only): a kernel writes, everything is evicted
// and restored, a kernel checks every word; a pointer captured before eviction, including
// one baked into a captured CUDA graph, still works afterwards. Skips, saying why, where no
// GPU is usable.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include <memory>
#include <string>

#include "core/pager.hpp"
#include "core/status.hpp"
#include "support/backends.hpp"
#include "swap/host_tier.hpp"
#include "kernels.hpp"

namespace vramswap::detail {
namespace {

constexpr uint64_t MiB = 1ull << 20;

#define CUDA_OK(expr)                                                                         \
  do {                                                                                        \
    const cudaError_t e_ = (expr);                                                            \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorName(e_) << " " << cudaGetErrorString(e_); \
  } while (0)

class PagerKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    be = test::shared_backend(backend_kind::cuda, &why);
    if (be == nullptr) GTEST_SKIP() << "cuda backend unavailable here: " << why;
    tier = std::make_unique<host_tier>(*be, 32 * MiB, 8);
    frames = std::make_unique<local_frame_source>(*be);
    pager_config cfg;
    cfg.frame_size = 32 * MiB;
    cfg.arena_size = 8ull << 30;
    ASSERT_EQ(pager::create(*be, 0, *tier, *frames, cfg, &pg), ok) << last_error();
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_OK(cudaMalloc(&bad, sizeof(unsigned long long)));
  }
  void TearDown() override {
    if (be == nullptr) return;
    cudaFree(bad);
    cudaStreamDestroy(stream);
    pg.reset();
    tier.reset();
  }
  unsigned long long mismatches(const uint64_t* p, uint64_t n, uint64_t seed, uint64_t plus) {
    unsigned long long host = ~0ull;
    if (cudaMemsetAsync(bad, 0, sizeof *bad, stream) != cudaSuccess) return host;
    if (gpu_test::count_mismatches(p, n, seed, plus, bad, stream) != cudaSuccess) return host;
    if (cudaMemcpyAsync(&host, bad, sizeof host, cudaMemcpyDeviceToHost, stream) != cudaSuccess) return ~0ull;
    if (cudaStreamSynchronize(stream) != cudaSuccess) return ~0ull;
    return host;
  }

  backend* be = nullptr;
  std::unique_ptr<host_tier> tier;
  std::unique_ptr<local_frame_source> frames;
  std::unique_ptr<pager> pg;
  cudaStream_t stream = nullptr;
  unsigned long long* bad = nullptr;
};

TEST_F(PagerKernelTest, KernelDataSurvivesEvictionAndRestore) {
  const uint64_t bytes = 1ull << 30;
  device_ptr big = 0, small = 0;
  ASSERT_EQ(pg->malloc(bytes, &big), ok) << last_error();
  ASSERT_EQ(pg->malloc(1000 * 8, &small), ok) << last_error();
  auto* p = reinterpret_cast<uint64_t*>(big);
  auto* q = reinterpret_cast<uint64_t*>(small);
  CUDA_OK(gpu_test::fill(p, bytes / 8, 1, stream));
  CUDA_OK(gpu_test::fill(q, 1000, 2, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  ASSERT_EQ(mismatches(p, bytes / 8, 1, 0), 0u);

  size_t free_before = 0, free_evicted = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_before, &total));
  ASSERT_EQ(pg->evict_all(), ok) << last_error();
  CUDA_OK(cudaMemGetInfo(&free_evicted, &total));
  EXPECT_GE(free_evicted, free_before + bytes) << "evicted frames go back to the device";
  EXPECT_EQ(pg->state_of(big), page_state::host);
  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  EXPECT_EQ(mismatches(p, bytes / 8, 1, 0), 0u) << "every word of the 1 GiB buffer";
  EXPECT_EQ(mismatches(q, 1000, 2, 0), 0u) << "the small buffer sharing a page";
  const pager_stats s = pg->stats();
  std::printf("[ info     ] evicted %.2f GiB in %.1f ms, restored in %.1f ms\n", s.bytes_out / 1073741824.0, s.evict_seconds * 1e3,
              s.restore_seconds * 1e3);
}

TEST_F(PagerKernelTest, PointerBakedIntoACapturedGraphStillWorks) {
  const uint64_t bytes = 256 * MiB;
  device_ptr buf = 0;
  ASSERT_EQ(pg->malloc(bytes, &buf), ok) << last_error();
  auto* p = reinterpret_cast<uint64_t*>(buf);
  CUDA_OK(gpu_test::fill(p, bytes / 8, 7, stream));
  CUDA_OK(cudaStreamSynchronize(stream));

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CUDA_OK(gpu_test::add(p, bytes / 8, 1, stream));
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  ASSERT_EQ(mismatches(p, bytes / 8, 7, 1), 0u);

  for (int round = 2; round <= 4; ++round) {
    ASSERT_EQ(pg->evict_all(), ok) << last_error();
    ASSERT_EQ(pg->restore_all(), ok) << last_error();
    CUDA_OK(cudaGraphLaunch(exec, stream));  // the pointer inside the graph was never updated
    CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_EQ(mismatches(p, bytes / 8, 7, round), 0u) << "round " << round;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST_F(PagerKernelTest, DiscardableBuffersComeBackZeroedUnderKernels) {
  device_ptr scratch = 0;
  ASSERT_EQ(pg->malloc(64 * MiB, &scratch), ok);
  CUDA_OK(gpu_test::fill(reinterpret_cast<uint64_t*>(scratch), 64 * MiB / 8, 9, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  ASSERT_EQ(pg->advise(scratch, 64 * MiB, advice::discardable), ok);
  ASSERT_EQ(pg->evict_all(), ok);
  EXPECT_EQ(pg->stats().bytes_out, 0u);
  ASSERT_EQ(pg->restore_all(), ok);
  std::vector<uint64_t> host(1024, 1);
  CUDA_OK(cudaMemcpy(host.data(), reinterpret_cast<void*>(scratch), host.size() * 8, cudaMemcpyDeviceToHost));
  for (uint64_t v : host) ASSERT_EQ(v, 0u);
}

// Kernels read and write a host frame (host memory mapped into the device's address space,
// what oversubscription will put past the pool) as they do device memory, side by side.
TEST_F(PagerKernelTest, KernelsUseAHostFrameMappedBesideADeviceFrame) {
  constexpr size_t size = 64 * MiB;
  device_ptr va = 0;
  ASSERT_EQ(be->reserve(0, 2 * size, 0, &va), ok) << last_error();
  frame_id dev = 0, host = 0;
  ASSERT_EQ(be->create_frame(0, size, &dev), ok) << last_error();
  ASSERT_EQ(be->create_host_frame(0, size, &host), ok) << last_error();
  ASSERT_EQ(be->map(va, size, dev, 0), ok) << last_error();
  ASSERT_EQ(be->map(va + size, size, host, 0), ok) << last_error();
  ASSERT_EQ(be->set_access(va, 2 * size, access_flags::read_write), ok) << last_error();
  // One kernel over both: it crosses from device memory into host memory mid-buffer.
  auto* words = reinterpret_cast<uint64_t*>(va);
  const uint64_t n = 2 * size / 8;
  CUDA_OK(gpu_test::fill(words, n, 31, stream));
  EXPECT_EQ(mismatches(words, n, 31, 0), 0u);
  CUDA_OK(gpu_test::add(words, n, 5, stream));
  EXPECT_EQ(mismatches(words, n, 31, 5), 0u);
  // The host half really is the host frame: written on its own, unmapped, mapped again at
  // another address, its words are there.
  auto* host_words = reinterpret_cast<uint64_t*>(va + size);
  CUDA_OK(gpu_test::fill(host_words, size / 8, 77, stream));
  EXPECT_EQ(mismatches(host_words, size / 8, 77, 0), 0u);
  ASSERT_EQ(be->unmap(va + size, size), ok) << last_error();
  ASSERT_EQ(be->unmap(va, size), ok) << last_error();
  ASSERT_EQ(be->map(va, size, host, 0), ok) << last_error();
  ASSERT_EQ(be->set_access(va, size, access_flags::read_write), ok) << last_error();
  EXPECT_EQ(mismatches(words, size / 8, 77, 0), 0u);
  ASSERT_EQ(be->unmap(va, size), ok);
  ASSERT_EQ(be->release_frame(host), ok);
  ASSERT_EQ(be->release_frame(dev), ok);
  ASSERT_EQ(be->unreserve(va, 2 * size), ok);
}

}  // namespace
}  // namespace vramswap::detail
