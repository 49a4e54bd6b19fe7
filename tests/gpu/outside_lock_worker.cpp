// A client process for tests/gpu/outside_lock_test.cpp, on the cuda backend, using only the
// public API (and test kernels): CUDA work on memory allocated outside the lock.
//
// usage: outside_lock_worker write <bytes> <seed> <ready-file> <go-file>
//   without the lock: allocate <bytes>, fill them with a kernel, synchronize; create
//   <ready-file>; wait for <go-file>; then under the lock check every word with a kernel.
//   Prints "wrong <n>"; exit 0 when n is 0, 3 otherwise.
// usage: outside_lock_worker fill <bytes> <ready-file> <release-file>
//   under the lock: allocate <bytes> (frames taken from idle processes) and fill them;
//   create <ready-file>; hold the lock until <release-file> exists.
// usage: outside_lock_worker fault <bytes>
//   while another process holds the whole pool: malloc_async outside the lock must fail
//   (prints "malloc_async <code> <message>"); then a plain allocation (left unbacked) is
//   written by a kernel anyway: the device faults (prints "kernel <cuda error name>"), and
//   the process exits normally, so that the teardown after a device fault is what is seen.
// Exit: 0 ok, 2 a vramswap::error or CUDA error (printed), 3 wrong words, 4 a file never
// appeared, 64 bad usage.
#include <cuda_runtime.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "kernels.hpp"
#include "vramswap/vramswap.h"
#include "support/signal_files.hpp"
#include "vramswap/vramswap.hpp"

namespace {

void create(const char* path) { vramswap::detail::test::create_signal_file(path); }
bool wait_for(const char* path) { return vramswap::detail::test::wait_for_signal_file(path, 300, "outside_lock_worker"); }

bool cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "outside_lock_worker: %s: %s (%s)\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 64;
  const std::string mode = argv[1];
  const uint64_t bytes = std::strtoull(argv[2], nullptr, 10);
  const uint64_t words = bytes / 8;
  try {
    if (mode == "write" && argc == 6) {
      const uint64_t seed = std::strtoull(argv[3], nullptr, 10);
      auto* p = static_cast<uint64_t*>(vramswap::malloc(bytes));
      if (!cuda_ok(vramswap::detail::gpu_test::fill(p, words, seed, nullptr), "fill outside the lock") ||
          !cuda_ok(cudaDeviceSynchronize(), "synchronize after the fill")) {
        return 2;
      }
      create(argv[4]);
      if (!wait_for(argv[5])) return 4;
      vramswap::gpu_lock lock(0);
      unsigned long long* bad = nullptr;
      unsigned long long wrong = ~0ull;
      if (!cuda_ok(cudaMalloc(&bad, sizeof *bad), "cudaMalloc") || !cuda_ok(cudaMemset(bad, 0, sizeof *bad), "cudaMemset") ||
          !cuda_ok(vramswap::detail::gpu_test::count_mismatches(p, words, seed, 0, bad, nullptr), "count_mismatches") ||
          !cuda_ok(cudaMemcpy(&wrong, bad, sizeof wrong, cudaMemcpyDeviceToHost), "cudaMemcpy")) {
        return 2;
      }
      cudaFree(bad);
      std::printf("wrong %llu\n", wrong);
      return wrong == 0 ? 0 : 3;
    }
    if (mode == "fill" && argc == 5) {
      vramswap::gpu_lock lock(0);
      auto* p = static_cast<uint64_t*>(vramswap::malloc(bytes));
      if (!cuda_ok(vramswap::detail::gpu_test::fill(p, words, 7, nullptr), "fill") || !cuda_ok(cudaDeviceSynchronize(), "synchronize")) return 2;
      create(argv[3]);
      const bool released = wait_for(argv[4]);
      vramswap::free(p);
      return released ? 0 : 4;
    }
    if (mode == "fault" && argc == 3) {
      void* q = nullptr;
      const int rc = vramswap_malloc_async(&q, bytes, 0, nullptr);
      std::printf("malloc_async %d %s\n", rc, vramswap_last_error());
      auto* p = static_cast<uint64_t*>(vramswap::malloc(bytes));
      std::printf("resident %llu\n", static_cast<unsigned long long>(vramswap::get_stats(0).resident_bytes));
      cudaError_t e = vramswap::detail::gpu_test::fill(p, words, 1, nullptr);
      if (e == cudaSuccess) e = cudaDeviceSynchronize();
      std::printf("kernel %s\n", cudaGetErrorName(e));
      std::fflush(stdout);
      return 0;  // exit normally: the sessions and the backend are torn down after the fault
    }
  } catch (const vramswap::error& e) {
    std::fprintf(stderr, "outside_lock_worker: %s\n", e.what());
    return 2;
  }
  return 64;
}
