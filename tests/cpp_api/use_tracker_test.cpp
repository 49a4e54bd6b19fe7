// use_tracker (runtime/use_tracker.hpp): which words of a launch's arguments count as uses,
// and how a start's count covers the block behind it. No process, no pool: the tracker is
// plain memory, and the launch path's entry is called the way the shim calls it.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/status.hpp"
#include "runtime/use_tracker.hpp"

namespace vramswap::detail {
namespace {
constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t k_page = 2 * MiB;
constexpr device_ptr k_base = 0x7f1200000000ull;  // where an arena might be reserved
constexpr uint64_t k_pages = 64;

std::vector<uint32_t> counts_of(use_tracker& t) {
  std::vector<uint32_t> c;
  t.take_counts(&c);
  return c;
}

TEST(UseTracker, CountsWordsThatPointIntoTheArenaAndNothingElse) {
  use_tracker t(k_base, k_pages * k_page, k_page);
  ASSERT_EQ(t.start(), ok) << last_error();
  const uint64_t words[] = {
      k_base + 3 * k_page + 4096,       // into page 3
      k_base,                           // page 0, its first byte
      k_base + k_pages * k_page - 1,    // the last byte of the last page
      k_base + k_pages * k_page,        // one past the arena: not a use
      k_base - 8,                       // just below it: not a use
      0, 1, 8192, 33554432,             // sizes, counts, flags
      0xffffffffffffffffull,            // -1
  };
  EXPECT_EQ(use_tracking::record_launch_words(words, std::size(words)), 3u);
  const std::vector<uint32_t> c = counts_of(t);
  ASSERT_EQ(c.size(), k_pages);
  for (uint64_t p = 0; p < k_pages; ++p) {
    const uint32_t expected = p == 0 || p == 3 || p == k_pages - 1 ? 1 : 0;
    EXPECT_EQ(c[p], expected) << "page " << p;
  }
}

TEST(UseTracker, ScansAStructOfPointersPassedByValueWhereverItsHostCopyLies) {
  // The shape of a foreach kernel's argument: a count, then tensor addresses, then their sizes.
  struct tensor_list {
    int32_t count;
    int32_t pad;
    uint64_t addresses[5];
    int64_t numel[5];
  } list{};
  list.count = 5;
  for (int i = 0; i < 5; ++i) {
    list.addresses[i] = k_base + (10 + 2 * i) * k_page + 512 * i;
    list.numel[i] = 67108864;  // 256 MiB of floats: a size, not an address
  }
  use_tracker t(k_base, k_pages * k_page, k_page);
  ASSERT_EQ(t.start(), ok) << last_error();
  unsigned char buffer[sizeof list + 1];
  std::memcpy(buffer + 1, &list, sizeof list);  // a parameter's host copy need not be 8-byte aligned
  EXPECT_EQ(use_tracking::record_argument_bytes(buffer + 1, sizeof list, 16), 5u);
  const std::vector<uint32_t> c = counts_of(t);
  for (uint64_t p = 0; p < k_pages; ++p) {
    const bool start = p >= 10 && p <= 18 && p % 2 == 0;
    EXPECT_EQ(c[p], start ? 16u : 0u) << "page " << p;  // each use weighs the launches it stands for
  }
}

TEST(UseTracker, CountsDecayByHalfEachTimeTheyAreTaken) {
  use_tracker t(k_base, k_pages * k_page, k_page);
  ASSERT_EQ(t.start(), ok);
  const uint64_t w = k_base + 5 * k_page;
  for (int i = 0; i < 100; ++i) use_tracking::record_launch_words(&w, 1);
  EXPECT_EQ(counts_of(t)[5], 100u);
  EXPECT_EQ(counts_of(t)[5], 50u);
  use_tracking::record_launch_words(&w, 1);
  EXPECT_EQ(counts_of(t)[5], 26u);
}

TEST(UseTracker, NothingIsRecordedOrSampledWithoutARegisteredTracker) {
  use_tracker t(k_base, k_pages * k_page, k_page);
  const uint64_t w = k_base + k_page;
  EXPECT_EQ(use_tracking::record_launch_words(&w, 1), 0u);
  EXPECT_FALSE(use_tracking::sample_this_launch());
  ASSERT_EQ(t.start(), ok);
  unsigned sampled = 0;
  for (uint32_t i = 0; i < 10 * use_tracking::k_sample_every; ++i) sampled += use_tracking::sample_this_launch();
  EXPECT_EQ(sampled, 10u);
  t.stop();
  EXPECT_EQ(use_tracking::record_launch_words(&w, 1), 0u);
  EXPECT_EQ(counts_of(t)[1], 0u);
}

TEST(UseTracker, AStartCoversTheBlockUpToTheNextStartInTheSameAllocation) {
  std::vector<uint32_t> starts(16, 0);
  // Allocation A: pages 0..7, tensors starting in pages 0 (used 10 times) and 5 (twice).
  // Allocation B: pages 8..11, never observed. Allocation C: pages 12..13, started in 12.
  starts[0] = 10;
  starts[5] = 2;
  starts[12] = 7;
  const std::vector<range_allocation> allocations = {
      {k_base, 8 * k_page}, {k_base + 8 * k_page, 4 * k_page}, {k_base + 12 * k_page, 2 * k_page}};
  std::vector<uint32_t> heat;
  use_tracker::attribute(starts, allocations, k_base, k_page, &heat);
  const std::vector<uint32_t> expected = {10, 10, 10, 10, 10, 10, 2, 2, 0, 0, 0, 0, 7, 7, 0, 0};
  // Page 5 holds the first tensor's tail and the second's start: the larger count.
  EXPECT_EQ(heat, expected);
}

TEST(UseTracker, AStartDoesNotRunIntoFreeSpaceOrAnotherAllocation) {
  std::vector<uint32_t> starts(8, 0);
  starts[1] = 4;
  // An allocation of pages 1..2 and one of page 5; pages 3, 4 and 6.. are free.
  const std::vector<range_allocation> allocations = {{k_base + k_page, 2 * k_page - 256}, {k_base + 5 * k_page, 4096}};
  std::vector<uint32_t> heat;
  use_tracker::attribute(starts, allocations, k_base, k_page, &heat);
  EXPECT_EQ(heat, (std::vector<uint32_t>{0, 4, 4, 0, 0, 0, 0, 0}));
}

}  // namespace
}  // namespace vramswap::detail
