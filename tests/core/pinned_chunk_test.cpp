// fault_in_writable, which every pinned chunk and the daemon's shared host pool go through:
// a range large enough to be faulted in by several threads ends with every page committed,
// private memory zeroed, shared memory's bytes as they were, and a piece that cannot be
// faulted in reported whichever thread met it; a pause point that waits holds every thread
// within a step of where it was.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "core/fd_guard.hpp"
#include "core/pinned_chunk.hpp"

namespace vramswap::detail {
namespace {

constexpr size_t MiB = size_t{1} << 20;
// Large enough for more than one piece (pieces are at least 64 MiB), not a multiple of 2 MiB
// pieces' rounding, so that the last piece is a short one.
constexpr size_t k_range = 290 * MiB;

size_t resident_pages(void* base, size_t bytes) {
  std::vector<unsigned char> v(bytes / 4096);
  if (::mincore(base, bytes, v.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

TEST(FaultInWritable, CommitsEveryPageOfALargePrivateRangeAndLeavesItZero) {
  char* p = static_cast<char*>(::mmap(nullptr, k_range, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(resident_pages(p, k_range), 0u);
  ASSERT_EQ(fault_in_writable(p, k_range, populate_fallback::touch), 0);
  EXPECT_EQ(resident_pages(p, k_range), k_range / 4096) << "every piece, the short last one included, is committed";
  for (size_t off = 0; off < k_range; off += 4096) {
    ASSERT_EQ(p[off] | p[off + 4095], 0) << "byte " << off;
  }
  ::munmap(p, k_range);
}

TEST(FaultInWritable, LeavesTheBytesOfSharedMemoryAsTheyWere) {
  fd_guard fd(::memfd_create("pinned_chunk_test", MFD_CLOEXEC));
  ASSERT_GE(fd.fd, 0);
  ASSERT_EQ(::ftruncate(fd.fd, k_range), 0);
  std::vector<uint64_t> pattern(k_range / sizeof(uint64_t));
  std::mt19937_64 rng(20261203);
  for (auto& w : pattern) w = rng();
  {
    void* w = ::mmap(nullptr, k_range, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
    ASSERT_NE(w, MAP_FAILED);
    std::memcpy(w, pattern.data(), k_range);
    ::munmap(w, k_range);
  }
  // A second mapping of the same memory, as a client maps the daemon's pool: faulting it in
  // must not write a byte of what is there.
  char* p = static_cast<char*>(::mmap(nullptr, k_range, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0));
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(fault_in_writable(p, k_range, populate_fallback::leave_to_pin), 0);
  EXPECT_EQ(std::memcmp(p, pattern.data(), k_range), 0);
  ::munmap(p, k_range);
}

TEST(FaultInWritable, APieceThatCannotBeFaultedInFailsTheWholeRange) {
  if (!kernel_populates()) GTEST_SKIP() << "this kernel lacks MADV_POPULATE_WRITE (Linux < 5.14): failures are the touch's";
  char* p = static_cast<char*>(::mmap(nullptr, k_range, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  // The last 2 MiB, in the last piece (a helper thread's), cannot be written.
  ASSERT_EQ(::mprotect(p + k_range - 2 * MiB, 2 * MiB, PROT_READ), 0);
  const int e = fault_in_writable(p, k_range, populate_fallback::touch);
  EXPECT_NE(e, 0) << "the failure of one piece is the range's";
  ::munmap(p, k_range);
  // And the first piece, this thread's own.
  p = static_cast<char*>(::mmap(nullptr, k_range, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(::mprotect(p, 2 * MiB, PROT_READ), 0);
  EXPECT_NE(fault_in_writable(p, k_range, populate_fallback::touch), 0);
  ::munmap(p, k_range);
}

TEST(FaultInWritable, WithAPausePointAStepThatCannotBeFaultedInFailsTheWholeRange) {
  if (!kernel_populates()) GTEST_SKIP() << "this kernel lacks MADV_POPULATE_WRITE (Linux < 5.14): failures are the touch's";
  // The same failures as above, met in a later step of a thread's piece rather than its
  // first: the steps after it are not faulted in, and the range fails.
  std::atomic<int> pauses{0};
  auto pause_point = [&] { ++pauses; };
  char* p = static_cast<char*>(::mmap(nullptr, k_range, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(::mprotect(p + k_range - 2 * MiB, 2 * MiB, PROT_READ), 0);
  EXPECT_NE(fault_in_writable(p, k_range, populate_fallback::touch, pause_point), 0) << "the failure of one step is the range's";
  EXPECT_GT(pauses.load(), 0);
  ::munmap(p, k_range);
  p = static_cast<char*>(::mmap(nullptr, k_range, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(::mprotect(p + 40 * MiB, 2 * MiB, PROT_READ), 0);  // the third step of the first piece
  EXPECT_NE(fault_in_writable(p, k_range, populate_fallback::touch, pause_point), 0);
  ::munmap(p, k_range);
}

TEST(FaultInWritable, APausePointThatWaitsHoldsEveryThreadWithinAStep) {
  char* p = static_cast<char*>(::mmap(nullptr, k_range, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  std::atomic<int> pauses{0}, waiting{0};
  auto pause_point = [&] {
    ++pauses;
    std::unique_lock<std::mutex> lock(m);
    ++waiting;
    cv.wait(lock, [&] { return open; });
    --waiting;
  };
  std::atomic<bool> done{false};
  int rc = -1;
  std::thread faulting([&] {
    rc = fault_in_writable(p, k_range, populate_fallback::touch, pause_point);
    done = true;
  });
  for (int i = 0; i < 10000 && waiting.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_GT(waiting.load(), 0) << "no thread reached a pause point in 10 s";
  // Whatever the number of threads (at most eight), none goes past its second step while
  // the pause waits: at most eight steps of 16 MiB are committed, of 290 MiB.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(done.load()) << "faulting in finished while its pause point waited";
  EXPECT_LE(resident_pages(p, k_range), 8 * 16 * MiB / 4096);
  {
    std::lock_guard<std::mutex> lock(m);
    open = true;
  }
  cv.notify_all();
  faulting.join();
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(resident_pages(p, k_range), k_range / 4096);
  // A step is 16 MiB: a thread's piece of n steps pauses n - 1 times, and the pieces of at
  // most eight threads cover 290 MiB in at least 19 steps.
  EXPECT_GE(pauses.load(), 19 - 8);
  ::munmap(p, k_range);
}

}  // namespace
}  // namespace vramswap::detail
