// Description: range_allocator, the arena's sub-allocator: placement rules (alignment, page
// alignment, page sharing, no straddling), best fit, coalescing, errors that change nothing,
// page 0->1 / 1->0 reports, and a seeded randomized run against a shadow model.
//
// Environment: VRAMSWAP_FUZZ_STEPS (default 20000) steps per fuzz configuration,
// VRAMSWAP_FUZZ_SEED (default fixed) to replay a failure; the seed is printed on failure.
#include "core/range_allocator.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/status.hpp"

namespace vramswap::detail {
namespace {

constexpr uint64_t KiB = 1ull << 10;
constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t GiB = 1ull << 30;
constexpr uint64_t kBase = 0x7f0000000000ull;  // a plausible VA, page-aligned for 32 MiB

static_assert(!std::is_copy_constructible_v<range_allocator>);
static_assert(!std::is_copy_assignable_v<range_allocator>);
static_assert(std::is_nothrow_move_constructible_v<range_allocator>);
static_assert(std::is_nothrow_move_assignable_v<range_allocator>);

bool contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

range_allocator make(uint64_t base, uint64_t size, uint64_t page) {
  range_allocator r;
  EXPECT_EQ(r.init(base, size, page), ok) << last_error();
  return r;
}

// What an error must leave unchanged.
struct snapshot {
  uint64_t allocated, free_bytes, largest, allocations, blocks;
  std::vector<uint64_t> counts;
  explicit snapshot(const range_allocator& r)
      : allocated(r.bytes_allocated()),
        free_bytes(r.bytes_free()),
        largest(r.largest_free_block()),
        allocations(r.allocation_count()),
        blocks(r.free_block_count()) {
    for (uint64_t p = 0; p < r.page_count(); ++p) counts.push_back(r.page_live_count(p));
  }
  bool operator==(const snapshot&) const = default;
};

TEST(RangeAllocatorInit, RejectsBadParameters) {
  range_allocator r;
  EXPECT_EQ(r.init(kBase + 8, 64 * MiB, 2 * MiB), err_invalid_argument);
  EXPECT_TRUE(contains(last_error(), "base")) << last_error();
  EXPECT_EQ(r.init(kBase, 64 * MiB, 3 * MiB), err_invalid_argument);
  EXPECT_TRUE(contains(last_error(), "page size")) << last_error();
  EXPECT_EQ(r.init(kBase, 64 * MiB, 128), err_invalid_argument);
  EXPECT_EQ(r.init(kBase, 0, 2 * MiB), err_invalid_argument);
  EXPECT_EQ(r.init(kBase, 65 * MiB, 32 * MiB), err_invalid_argument);
  EXPECT_TRUE(contains(last_error(), "multiple of the page size")) << last_error();
  EXPECT_EQ(r.init(~0ull - 1023, 2 * MiB, 2 * MiB), err_invalid_argument);
  EXPECT_TRUE(contains(last_error(), "overflows")) << last_error();
  EXPECT_EQ(r.size(), 0u);

  uint64_t addr = 42;
  EXPECT_EQ(r.allocate(256, &addr, nullptr), err_invalid_argument);
  EXPECT_TRUE(contains(last_error(), "not initialized")) << last_error();
  EXPECT_EQ(addr, 42u);
  EXPECT_EQ(r.check_invariants(), ok) << last_error();

  ASSERT_EQ(r.init(kBase, 64 * MiB, 2 * MiB), ok) << last_error();
  EXPECT_EQ(r.page_count(), 32u);
  EXPECT_EQ(r.bytes_free(), 64 * MiB);
  EXPECT_EQ(r.largest_free_block(), 64 * MiB);
  EXPECT_EQ(r.init(kBase, 64 * MiB, 2 * MiB), err_invalid_argument);
  EXPECT_TRUE(contains(last_error(), "already initialized")) << last_error();
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
}

TEST(RangeAllocator, RoundsTo256AndAligns) {
  auto r = make(kBase, 64 * MiB, 2 * MiB);
  const uint64_t sizes[] = {1, 255, 256, 257, 1000, 4096, 100000};
  const uint64_t rounded[] = {256, 256, 256, 512, 1024, 4096, 100096};
  uint64_t expect_addr = kBase, total = 0;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    uint64_t addr = 0;
    ASSERT_EQ(r.allocate(sizes[i], &addr, nullptr), ok) << last_error();
    EXPECT_EQ(addr % 256, 0u);
    EXPECT_EQ(addr, expect_addr) << "small allocations are packed from the base";
    range_allocation a;
    ASSERT_EQ(r.find(addr, &a), ok) << last_error();
    EXPECT_EQ(a, (range_allocation{addr, rounded[i]}));
    expect_addr += rounded[i];
    total += rounded[i];
  }
  EXPECT_EQ(r.bytes_allocated(), total);
  EXPECT_EQ(r.bytes_free(), 64 * MiB - total);
  EXPECT_EQ(r.allocation_count(), std::size(sizes));
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
}

TEST(RangeAllocator, LargeAllocationsStartOnAPageBoundary) {
  // base is 256-aligned but not 32 MiB-aligned: pages count from base.
  const uint64_t base = kBase + 768;
  auto r = make(base, 1 * GiB, 32 * MiB);
  uint64_t small = 0, big = 0, exact = 0;
  std::vector<page_range> live;
  ASSERT_EQ(r.allocate(1000, &small, &live), ok) << last_error();
  EXPECT_EQ(small, base);
  ASSERT_EQ(r.allocate(64 * MiB, &big, &live), ok) << last_error();
  EXPECT_EQ(big, base + 32 * MiB) << "64 MiB must start on the next page boundary";
  ASSERT_EQ(r.allocate(32 * MiB, &exact, &live), ok) << last_error();
  EXPECT_EQ(exact, base + 96 * MiB);
  EXPECT_EQ(live, (std::vector<page_range>{{0, 1}, {1, 2}, {3, 1}}))
      << "the 64 MiB allocation touches exactly pages 1 and 2";
  EXPECT_EQ(r.page_live_count(0), 1u);
  EXPECT_EQ(r.page_live_count(1), 1u);
  EXPECT_EQ(r.page_live_count(2), 1u);
  EXPECT_EQ(r.page_live_count(3), 1u);
  EXPECT_EQ(r.page_live_count(4), 0u);
  EXPECT_EQ(r.page_live_count(1000), 0u) << "past the end";
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
}

TEST(RangeAllocator, SmallAllocationsSharePages) {
  auto r = make(kBase, 64 * MiB, 2 * MiB);
  std::vector<page_range> live;
  for (int i = 0; i < 100; ++i) {
    uint64_t addr = 0;
    ASSERT_EQ(r.allocate(10 * KiB, &addr, &live), ok) << last_error();
    EXPECT_EQ(addr, kBase + i * 10 * KiB);
  }
  EXPECT_EQ(live, (std::vector<page_range>{{0, 1}})) << "only the first one needed a frame";
  EXPECT_EQ(r.page_live_count(0), 100u);
  EXPECT_EQ(r.page_live_count(1), 0u);
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
}

TEST(RangeAllocator, SmallAllocationsAvoidStraddlingUnlessUnavoidable) {
  auto r = make(kBase, 8 * KiB, 4 * KiB);  // two pages of 4 KiB
  uint64_t a1 = 0, a2 = 0, a3 = 0, a4 = 0;
  ASSERT_EQ(r.allocate(3 * KiB, &a1, nullptr), ok);
  EXPECT_EQ(a1, kBase);
  ASSERT_EQ(r.allocate(2 * KiB, &a2, nullptr), ok);
  EXPECT_EQ(a2, kBase + 4 * KiB) << "at base+3K it would straddle pages 0 and 1";
  ASSERT_EQ(r.allocate(1 * KiB, &a3, nullptr), ok);
  EXPECT_EQ(a3, kBase + 3 * KiB) << "the 1 KiB hole left behind is the best fit";
  ASSERT_EQ(r.allocate(2 * KiB, &a4, nullptr), ok);
  EXPECT_EQ(a4, kBase + 6 * KiB);
  EXPECT_EQ(r.bytes_free(), 0u);
  ASSERT_EQ(r.deallocate(a3, nullptr), ok);
  ASSERT_EQ(r.deallocate(a2, nullptr), ok);
  ASSERT_EQ(r.free_block_count(), 1u);
  EXPECT_EQ(r.largest_free_block(), 3 * KiB);  // [3K, 6K): straddles the boundary at 4K

  uint64_t b = 0;
  ASSERT_EQ(r.allocate(2 * KiB, &b, nullptr), ok);
  EXPECT_EQ(b, kBase + 4 * KiB) << "2 KiB fits inside page 1 of the block";
  ASSERT_EQ(r.deallocate(b, nullptr), ok);
  std::vector<page_range> live;
  ASSERT_EQ(r.allocate(3 * KiB, &b, &live), ok);
  EXPECT_EQ(b, kBase + 3 * KiB) << "the only fit straddles, and is taken";
  EXPECT_TRUE(live.empty()) << "both pages were already live";
  EXPECT_EQ(r.page_live_count(0), 2u);
  EXPECT_EQ(r.page_live_count(1), 2u);
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
}

TEST(RangeAllocator, BestFitPicksTheSmallestHoleThatFits) {
  auto r = make(kBase, 64 * MiB, 2 * MiB);
  uint64_t a = 0, b = 0, c = 0, sep = 0;
  ASSERT_EQ(r.allocate(4 * KiB, &a, nullptr), ok);
  ASSERT_EQ(r.allocate(256, &sep, nullptr), ok);
  ASSERT_EQ(r.allocate(16 * KiB, &b, nullptr), ok);
  ASSERT_EQ(r.allocate(256, &sep, nullptr), ok);
  ASSERT_EQ(r.allocate(8 * KiB, &c, nullptr), ok);
  ASSERT_EQ(r.allocate(256, &sep, nullptr), ok);
  ASSERT_EQ(r.deallocate(a, nullptr), ok);
  ASSERT_EQ(r.deallocate(b, nullptr), ok);
  ASSERT_EQ(r.deallocate(c, nullptr), ok);
  ASSERT_EQ(r.free_block_count(), 4u);  // three holes and the tail
  uint64_t x = 0;
  ASSERT_EQ(r.allocate(6 * KiB, &x, nullptr), ok);
  EXPECT_EQ(x, c) << "the 8 KiB hole is the best fit for 6 KiB";
  ASSERT_EQ(r.allocate(12 * KiB, &x, nullptr), ok);
  EXPECT_EQ(x, b) << "the 16 KiB hole is the best fit for 12 KiB";
  ASSERT_EQ(r.allocate(4 * KiB, &x, nullptr), ok);
  EXPECT_EQ(x, a) << "the 4 KiB hole fits exactly";
  ASSERT_EQ(r.allocate(2 * KiB, &x, nullptr), ok);
  EXPECT_EQ(x, c + 6 * KiB) << "what is left of the 8 KiB hole";
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
}

TEST(RangeAllocator, FreeingEverythingInRandomOrderCoalescesToOneBlock) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto r = make(kBase, 256 * MiB, 2 * MiB);
    std::mt19937_64 rng(seed);
    std::vector<uint64_t> addrs;
    for (int i = 0; i < 300; ++i) {
      uint64_t size = rng() % 4 == 0 ? 1 + rng() % (5 * MiB) : 1 + rng() % (64 * KiB);
      uint64_t addr = 0;
      if (r.allocate(size, &addr, nullptr) == ok) addrs.push_back(addr);
    }
    ASSERT_GT(addrs.size(), 100u);
    std::shuffle(addrs.begin(), addrs.end(), rng);
    for (uint64_t addr : addrs) {
      ASSERT_EQ(r.deallocate(addr, nullptr), ok) << last_error();
      ASSERT_EQ(r.check_invariants(), ok) << last_error();
    }
    EXPECT_EQ(r.free_block_count(), 1u);
    EXPECT_EQ(r.largest_free_block(), 256 * MiB);
    EXPECT_EQ(r.bytes_free(), 256 * MiB);
    EXPECT_EQ(r.bytes_allocated(), 0u);
    EXPECT_EQ(r.allocation_count(), 0u);
    for (uint64_t p = 0; p < r.page_count(); ++p) EXPECT_EQ(r.page_live_count(p), 0u) << p;
  }
}

TEST(RangeAllocator, ReportsPageTransitions) {
  const uint64_t P = 4 * KiB;
  auto r = make(kBase, 8 * P, P);
  std::vector<page_range> v;
  uint64_t s1 = 0, s2 = 0, big = 0, tail = 0;
  ASSERT_EQ(r.allocate(100, &s1, &v), ok);
  EXPECT_EQ(v, (std::vector<page_range>{{0, 1}}));
  v.clear();
  ASSERT_EQ(r.allocate(100, &s2, &v), ok);
  EXPECT_TRUE(v.empty()) << "page 0 is already live";
  ASSERT_EQ(r.allocate(2 * P + 256, &big, &v), ok);
  EXPECT_EQ(big, kBase + P);
  EXPECT_EQ(v, (std::vector<page_range>{{1, 3}})) << "pages 1, 2 and the tail page 3";
  v.clear();
  ASSERT_EQ(r.allocate(P - 256, &tail, &v), ok);
  EXPECT_EQ(tail, kBase + 3 * P + 256) << "fills the rest of the big allocation's tail page";
  EXPECT_TRUE(v.empty()) << "page 3 is already live";
  EXPECT_EQ(r.page_live_count(2), 1u) << "interior page of the big allocation";
  EXPECT_EQ(r.page_live_count(3), 2u);

  ASSERT_EQ(r.deallocate(big, &v), ok);
  EXPECT_EQ(v, (std::vector<page_range>{{1, 2}})) << "page 3 still holds the tail allocation";
  v.clear();
  ASSERT_EQ(r.deallocate(tail, &v), ok);
  EXPECT_EQ(v, (std::vector<page_range>{{3, 1}}));
  v.clear();
  ASSERT_EQ(r.deallocate(s1, &v), ok);
  EXPECT_TRUE(v.empty()) << "s2 still lives in page 0";
  ASSERT_EQ(r.deallocate(s2, &v), ok);
  EXPECT_EQ(v, (std::vector<page_range>{{0, 1}}));

  // An allocation spanning thousands of pages is reported as one range.
  auto huge = make(kBase, 1024 * GiB, 32 * MiB);
  v.clear();
  uint64_t h = 0;
  ASSERT_EQ(huge.allocate(64 * GiB + 1, &h, &v), ok) << last_error();
  EXPECT_EQ(v, (std::vector<page_range>{{0, 2049}}));
  v.clear();
  ASSERT_EQ(huge.deallocate(h, &v), ok);
  EXPECT_EQ(v, (std::vector<page_range>{{0, 2049}}));
  EXPECT_EQ(huge.check_invariants(), ok) << last_error();
}

TEST(RangeAllocator, FindReturnsTheContainingAllocation) {
  auto r = make(kBase, 64 * MiB, 2 * MiB);
  uint64_t a = 0, b = 0;
  ASSERT_EQ(r.allocate(1000, &a, nullptr), ok);
  ASSERT_EQ(r.allocate(3 * MiB, &b, nullptr), ok);
  range_allocation got;
  for (uint64_t p : {a, a + 1, a + 1023}) {
    ASSERT_EQ(r.find(p, &got), ok) << hex(p) << ": " << last_error();
    EXPECT_EQ(got, (range_allocation{a, 1024}));
  }
  for (uint64_t p : {b, b + 2 * MiB + 5, b + 3 * MiB - 1}) {
    ASSERT_EQ(r.find(p, &got), ok) << hex(p) << ": " << last_error();
    EXPECT_EQ(got, (range_allocation{b, 3 * MiB}));
  }
  got = {7, 7};
  EXPECT_EQ(r.find(a + 1024, &got), err_invalid_argument) << "free space between a and b";
  EXPECT_TRUE(contains(last_error(), "free space")) << last_error();
  EXPECT_EQ(r.find(b + 3 * MiB, &got), err_invalid_argument);
  EXPECT_EQ(r.find(kBase - 1, &got), err_invalid_argument);
  EXPECT_TRUE(contains(last_error(), "outside the arena")) << last_error();
  EXPECT_EQ(r.find(kBase + 64 * MiB, &got), err_invalid_argument);
  EXPECT_EQ(got, (range_allocation{7, 7})) << "a failed find must not write its output";
}

TEST(RangeAllocatorErrors, SizeZeroOverflowAndTooLarge) {
  auto r = make(kBase, 64 * MiB, 2 * MiB);
  uint64_t keep = 0;
  ASSERT_EQ(r.allocate(5000, &keep, nullptr), ok);
  const snapshot before(r);
  std::vector<page_range> v{{99, 1}};
  uint64_t addr = 12345;

  EXPECT_EQ(r.allocate(0, &addr, &v), err_invalid_argument);
  EXPECT_TRUE(contains(last_error(), "size 0")) << last_error();
  EXPECT_EQ(r.allocate(~0ull, &addr, &v), err_invalid_argument);
  EXPECT_TRUE(contains(last_error(), "overflows")) << last_error();
  EXPECT_TRUE(contains(last_error(), std::to_string(~0ull))) << last_error();
  EXPECT_EQ(r.allocate(~0ull - 255, &addr, &v), err_out_of_memory) << "rounds without overflow";
  EXPECT_EQ(r.allocate(64 * MiB + 1, &addr, &v), err_out_of_memory);
  EXPECT_TRUE(contains(last_error(), std::to_string(64 * MiB + 1))) << last_error();
  EXPECT_TRUE(contains(last_error(), "whole reservation")) << last_error();
  EXPECT_EQ(r.allocate(256, nullptr, &v), err_invalid_argument);

  EXPECT_EQ(addr, 12345u);
  EXPECT_EQ(v, (std::vector<page_range>{{99, 1}}));
  EXPECT_EQ(snapshot(r), before);
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
}

TEST(RangeAllocatorErrors, NoFittingBlockNamesSizeFreeBytesAndLargestBlock) {
  const uint64_t P = 2 * MiB;
  auto r = make(kBase, 8 * P, P);
  // Small allocations at the start of every page: 7.75 pages free, no free page whole.
  std::vector<uint64_t> addrs;
  for (int i = 0; i < 8; ++i) {
    uint64_t a = 0, filler = 0;
    ASSERT_EQ(r.allocate(256, &a, nullptr), ok);
    ASSERT_EQ(r.allocate(P - 256, &filler, nullptr), ok);
    addrs.push_back(filler);
  }
  for (size_t i = 0; i < addrs.size(); ++i) ASSERT_EQ(r.deallocate(addrs[i], nullptr), ok);
  ASSERT_EQ(r.free_block_count(), 8u);
  ASSERT_EQ(r.largest_free_block(), P - 256);
  const snapshot before(r);
  uint64_t addr = 1;
  std::vector<page_range> v;
  EXPECT_EQ(r.allocate(P, &addr, &v), err_out_of_memory) << "no whole page is free";
  const std::string msg = last_error();
  EXPECT_TRUE(contains(msg, std::to_string(P))) << msg;
  EXPECT_TRUE(contains(msg, std::to_string(8 * (P - 256)) + " bytes free")) << msg;
  EXPECT_TRUE(contains(msg, "largest free block " + std::to_string(P - 256))) << msg;
  EXPECT_EQ(r.allocate(P - 255, &addr, &v), err_out_of_memory);
  EXPECT_EQ(addr, 1u);
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(snapshot(r), before);
  EXPECT_EQ(r.allocate(P - 256, &addr, &v), ok) << "an exact fit still works";
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
}

TEST(RangeAllocatorErrors, BadFreesNameThePointerAndChangeNothing) {
  auto r = make(kBase, 64 * MiB, 2 * MiB);
  uint64_t a = 0, b = 0, gone = 0;
  ASSERT_EQ(r.allocate(4096, &a, nullptr), ok);
  ASSERT_EQ(r.allocate(4096, &gone, nullptr), ok);
  ASSERT_EQ(r.allocate(3 * MiB, &b, nullptr), ok);
  ASSERT_EQ(r.deallocate(gone, nullptr), ok);
  const snapshot before(r);
  std::vector<page_range> v{{5, 5}};

  EXPECT_EQ(r.deallocate(b + 256, &v), err_invalid_argument);
  std::string msg = last_error();
  EXPECT_TRUE(contains(msg, "interior")) << msg;
  EXPECT_TRUE(contains(msg, hex(b + 256))) << msg;
  EXPECT_TRUE(contains(msg, hex(b))) << "names the allocation: " << msg;
  EXPECT_TRUE(contains(msg, std::to_string(3 * MiB))) << msg;

  EXPECT_EQ(r.deallocate(gone, &v), err_invalid_argument) << "double free";
  msg = last_error();
  EXPECT_TRUE(contains(msg, hex(gone))) << msg;
  EXPECT_TRUE(contains(msg, "already freed")) << msg;

  EXPECT_EQ(r.deallocate(kBase + 32 * MiB, &v), err_invalid_argument) << "never allocated";
  EXPECT_TRUE(contains(last_error(), "not a live allocation")) << last_error();
  EXPECT_EQ(r.deallocate(kBase + 64 * MiB, &v), err_invalid_argument);
  EXPECT_TRUE(contains(last_error(), "outside the arena")) << last_error();
  EXPECT_EQ(r.deallocate(0, &v), err_invalid_argument);
  EXPECT_TRUE(contains(last_error(), "0x0 is outside")) << last_error();

  EXPECT_EQ(v, (std::vector<page_range>{{5, 5}}));
  EXPECT_EQ(snapshot(r), before);
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
  ASSERT_EQ(r.deallocate(a, nullptr), ok);
  ASSERT_EQ(r.deallocate(b, nullptr), ok);
  EXPECT_EQ(r.free_block_count(), 1u);
}

TEST(RangeAllocator, MovesLeaveTheSourceEmpty) {
  auto r = make(kBase, 64 * MiB, 2 * MiB);
  uint64_t a = 0;
  ASSERT_EQ(r.allocate(1 * MiB, &a, nullptr), ok);
  range_allocator m(std::move(r));
  EXPECT_EQ(r.size(), 0u);
  EXPECT_EQ(r.allocation_count(), 0u);
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
  uint64_t x = 0;
  EXPECT_EQ(r.allocate(256, &x, nullptr), err_invalid_argument);
  EXPECT_EQ(m.allocation_count(), 1u);
  range_allocation got;
  EXPECT_EQ(m.find(a + 5, &got), ok);

  range_allocator n;
  n = std::move(m);
  EXPECT_EQ(m.size(), 0u);
  EXPECT_EQ(n.bytes_allocated(), 1 * MiB);
  EXPECT_EQ(n.deallocate(a, nullptr), ok);
  EXPECT_EQ(n.check_invariants(), ok) << last_error();
  ASSERT_EQ(m.init(kBase, 2 * MiB, 2 * MiB), ok) << "a moved-from allocator can be reused";
}

// ---- randomized run against a shadow model -------------------------------------------------

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::strtoull(v, nullptr, 0);
}

struct fuzz_config {
  const char* name;
  uint64_t page;
  uint64_t pages;
};

class RangeAllocatorFuzz : public ::testing::TestWithParam<fuzz_config> {};

// Expand reported ranges into a sorted page list (ranges must be non-empty and in range).
std::vector<uint64_t> expand(const std::vector<page_range>& v, uint64_t pages) {
  std::vector<uint64_t> out;
  for (const auto& r : v) {
    EXPECT_GT(r.count, 0u);
    EXPECT_LE(r.first + r.count, pages);
    for (uint64_t p = r.first; p < r.first + r.count && p < pages; ++p) out.push_back(p);
  }
  return out;
}

TEST_P(RangeAllocatorFuzz, MatchesShadowModel) {
  const fuzz_config cfg = GetParam();
  const uint64_t steps = env_u64("VRAMSWAP_FUZZ_STEPS", 20000);
  const uint64_t seed = env_u64("VRAMSWAP_FUZZ_SEED", 0x5eed'2024'a11cull);
  SCOPED_TRACE("replay with VRAMSWAP_FUZZ_SEED=" + std::to_string(seed) + " (" + cfg.name + ")");
  std::mt19937_64 rng(seed);
  const uint64_t P = cfg.page, size = cfg.page * cfg.pages;
  const uint64_t base = kBase + 256 * (rng() % 64);  // pages need not be VA-aligned
  auto r = make(base, size, P);

  std::map<uint64_t, uint64_t> shadow;        // addr -> rounded size
  std::vector<uint64_t> counts(cfg.pages, 0);  // live allocations overlapping each page
  std::vector<uint64_t> freed;                 // recently freed addresses
  uint64_t shadow_bytes = 0, allocs = 0, frees = 0, ooms = 0, bad = 0, straddles = 0;

  auto random_size = [&]() -> uint64_t {
    switch (rng() % 10) {
      case 0: return P * (1 + rng() % 4) + (rng() % 3 == 0 ? 0 : rng() % P);  // large
      case 1: return P / 2 + rng() % P;                                        // near a page
      case 2: case 3: return 1 + rng() % 256;                                  // tiny
      default: return 1 + rng() % (P / 8);                                     // small
    }
  };

  for (uint64_t step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const double fill = static_cast<double>(shadow_bytes) / static_cast<double>(size);
    const uint64_t roll = rng() % 100;
    // Alternate calm phases (about half full) with pressure phases (nearly full, fragmented)
    // so that out-of-memory and forced-straddle paths are exercised too.
    const double free_weight = (step / 2000) % 2 == 0 ? 90.0 : 12.0;
    if (roll < 3 && !shadow.empty()) {
      // Bad input: an interior pointer or a stale pointer; must fail and change nothing.
      const snapshot before(r);
      auto it = std::next(shadow.begin(), static_cast<long>(rng() % shadow.size()));
      uint64_t target = it->first + 256 * (1 + rng() % (it->second / 256));
      bool expect_fail = target < it->first + it->second;  // interior
      if (!expect_fail && !freed.empty()) {
        target = freed[rng() % freed.size()];
        expect_fail = shadow.count(target) == 0;
      }
      if (expect_fail) {
        std::vector<page_range> v;
        ASSERT_EQ(r.deallocate(target, &v), err_invalid_argument) << hex(target);
        ASSERT_TRUE(v.empty());
        ASSERT_EQ(snapshot(r), before);
        ++bad;
      }
    } else if (!shadow.empty() && (roll < 3 + static_cast<uint64_t>(free_weight * fill) ||
                                   roll >= 97)) {
      auto it = std::next(shadow.begin(), static_cast<long>(rng() % shadow.size()));
      const uint64_t a = it->first, s = it->second;
      std::vector<page_range> v{{777, 1}};
      ASSERT_EQ(r.deallocate(a, &v), ok) << hex(a) << ": " << last_error();
      ASSERT_FALSE(v.empty());
      ASSERT_EQ(v.front(), (page_range{777, 1})) << "appends, never overwrites";
      v.erase(v.begin());
      ASSERT_LE(v.size(), 1u);
      std::vector<uint64_t> expect;
      for (uint64_t p = (a - base) / P; p <= (a + s - 1 - base) / P; ++p) {
        if (--counts[p] == 0) expect.push_back(p);
      }
      ASSERT_EQ(expand(v, cfg.pages), expect) << "pages 1 -> 0 freeing " << hex(a);
      shadow.erase(it);
      shadow_bytes -= s;
      if (freed.size() < 64) freed.push_back(a); else freed[rng() % 64] = a;
      ++frees;
    } else {
      const uint64_t want = random_size();
      const uint64_t s = (want + 255) / 256 * 256;
      const uint64_t largest = r.largest_free_block();
      const snapshot before(r);
      uint64_t a = 0;
      std::vector<page_range> v;
      const int rc = r.allocate(want, &a, &v);
      if (rc == err_out_of_memory) {
        // Only when truly nothing fits: no block holds s (small), or s page-aligned (large).
        if (s < P) {
          ASSERT_LT(largest, s);
        } else {
          ASSERT_LT(largest, s + P - 256);
        }
        ASSERT_TRUE(v.empty());
        ASSERT_EQ(snapshot(r), before);
        ++ooms;
      } else {
        ASSERT_EQ(rc, ok) << last_error();
        ASSERT_EQ(a % 256, 0u);
        ASSERT_GE(a, base);
        ASSERT_LE(a + s, base + size);
        if (s >= P) {
          ASSERT_EQ((a - base) % P, 0u) << "large allocation off a page boundary";
        }
        // No overlap with any live allocation.
        auto next = shadow.lower_bound(a);
        if (next != shadow.end()) {
          ASSERT_GE(next->first, a + s) << "overlaps " << hex(next->first);
        }
        if (next != shadow.begin()) {
          auto prev = std::prev(next);
          ASSERT_LE(prev->first + prev->second, a) << "overlaps " << hex(prev->first);
        }
        if (s < P && (a - base) / P != (a + s - 1 - base) / P) {
          // A straddling small allocation: no free gap may have held it inside one page.
          uint64_t gap = base;
          auto fits_in_a_page = [&](uint64_t lo, uint64_t hi) {  // gap [lo, hi)
            if (hi - lo < s) return false;
            if ((lo - base) / P == (lo + s - 1 - base) / P) return true;
            const uint64_t b = base + ((lo - base) / P + 1) * P;
            return b < hi && hi - b >= s;
          };
          for (const auto& [la, ls] : shadow) {
            ASSERT_FALSE(fits_in_a_page(gap, la)) << hex(a) << " straddles but " << hex(gap)
                                                  << " could hold " << s << " bytes in one page";
            gap = la + ls;
          }
          ASSERT_FALSE(fits_in_a_page(gap, base + size)) << hex(a) << " straddles needlessly";
          ++straddles;
        }
        ASSERT_LE(v.size(), 1u);
        std::vector<uint64_t> expect;
        for (uint64_t p = (a - base) / P; p <= (a + s - 1 - base) / P; ++p) {
          if (counts[p]++ == 0) expect.push_back(p);
        }
        ASSERT_EQ(expand(v, cfg.pages), expect) << "pages 0 -> 1 allocating " << hex(a);
        range_allocation got;
        ASSERT_EQ(r.find(a + s - 1, &got), ok) << last_error();
        ASSERT_EQ(got, (range_allocation{a, s}));
        shadow.emplace(a, s);
        shadow_bytes += s;
        ++allocs;
      }
    }
    ASSERT_EQ(r.check_invariants(), ok) << last_error();
    ASSERT_EQ(r.bytes_allocated(), shadow_bytes);
    ASSERT_EQ(r.allocation_count(), shadow.size());
    for (uint64_t p = 0; p < cfg.pages; ++p) ASSERT_EQ(r.page_live_count(p), counts[p]) << p;
  }
  // Drain: everything coalesces back into one block.
  for (const auto& [a, s] : shadow) ASSERT_EQ(r.deallocate(a, nullptr), ok) << last_error();
  EXPECT_EQ(r.free_block_count(), 1u);
  EXPECT_EQ(r.largest_free_block(), size);
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
  // The run must have exercised every path, or it proves little.
  EXPECT_GT(allocs, steps / 4);
  EXPECT_GT(frees, steps / 4);
  EXPECT_GT(ooms, 0u);
  EXPECT_GT(bad, 0u);
  std::printf("[ fuzz     ] %s: %llu steps, %llu allocations, %llu frees, %llu OOM, "
              "%llu bad frees, %llu forced straddles\n",
              cfg.name, static_cast<unsigned long long>(steps),
              static_cast<unsigned long long>(allocs), static_cast<unsigned long long>(frees),
              static_cast<unsigned long long>(ooms), static_cast<unsigned long long>(bad),
              static_cast<unsigned long long>(straddles));
}

INSTANTIATE_TEST_SUITE_P(Configs, RangeAllocatorFuzz,
                         ::testing::Values(fuzz_config{"4KiB_pages_x64", 4 * KiB, 64},
                                           fuzz_config{"2MiB_pages_x48", 2 * MiB, 48},
                                           fuzz_config{"32MiB_pages_x16", 32 * MiB, 16}),
                         [](const auto& param_info) { return std::string(param_info.param.name); });


// --- reservations: the driver's virtual memory API under the shim ---------------------------

TEST(RangeAllocatorReservations, HoldAddressesWithoutMakingPagesLive) {
  auto r = make(kBase, 64 * MiB, 2 * MiB);
  uint64_t res = 0;
  ASSERT_EQ(r.reserve(16 * MiB, 0, &res), ok) << last_error();
  EXPECT_EQ((res - kBase) % (2 * MiB), 0u);
  for (uint64_t p = 0; p < r.page_count(); ++p) EXPECT_EQ(r.page_live_count(p), 0u) << p;
  EXPECT_EQ(r.bytes_allocated(), 0u);
  EXPECT_EQ(r.bytes_reserved(), 16 * MiB);
  EXPECT_EQ(r.bytes_free(), 48 * MiB);
  // Ordinary allocations never land in it.
  std::vector<uint64_t> got;
  for (int i = 0; i < 24; ++i) {
    uint64_t a = 0;
    ASSERT_EQ(r.allocate(2 * MiB, &a, nullptr), ok) << last_error();
    EXPECT_TRUE(a + 2 * MiB <= res || a >= res + 16 * MiB) << hex(a) << " in the reservation at " << hex(res);
    got.push_back(a);
  }
  uint64_t a = 0;
  EXPECT_EQ(r.allocate(2 * MiB, &a, nullptr), err_out_of_memory);
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
  for (uint64_t g : got) ASSERT_EQ(r.deallocate(g, nullptr), ok);
  ASSERT_EQ(r.unreserve(res), ok) << last_error();
  EXPECT_EQ(r.free_block_count(), 1u);
  EXPECT_EQ(r.largest_free_block(), 64 * MiB);
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
}

TEST(RangeAllocatorReservations, AllocationsAtChosenAddressesCountTheirPages) {
  // 8 MiB pages and 2 MiB maps, as a VMM program's granules on the pager's larger pages.
  auto r = make(kBase, 64 * MiB, 8 * MiB);
  uint64_t res = 0;
  ASSERT_EQ(r.reserve(32 * MiB, 0, &res), ok);
  const uint64_t page0 = (res - kBase) / (8 * MiB);
  std::vector<page_range> live;
  ASSERT_EQ(r.allocate_at(res + 2 * MiB, 2 * MiB, &live), ok) << last_error();
  EXPECT_EQ(live, (std::vector<page_range>{{page0, 1}}));
  live.clear();
  ASSERT_EQ(r.allocate_at(res + 4 * MiB, 2 * MiB, &live), ok);
  EXPECT_TRUE(live.empty()) << "the page is live already";
  EXPECT_EQ(r.page_live_count(page0), 2u);
  // Across page boundaries: pages 1 and 2 of the reservation become live, the first one's
  // count goes up.
  live.clear();
  ASSERT_EQ(r.allocate_at(res + 6 * MiB, 12 * MiB, &live), ok);
  EXPECT_EQ(live, (std::vector<page_range>{{page0 + 1, 2}}));
  EXPECT_EQ(r.page_live_count(page0), 3u);
  EXPECT_EQ(r.bytes_allocated(), 16 * MiB);
  EXPECT_EQ(r.allocation_count(), 3u);
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
  range_allocation found;
  ASSERT_EQ(r.find(res + 5 * MiB, &found), ok);
  EXPECT_EQ(found, (range_allocation{res + 4 * MiB, 2 * MiB}));
  // The reservation is busy while memory is in it, and names that memory.
  EXPECT_EQ(r.unreserve(res), err_busy);
  EXPECT_TRUE(contains(last_error(), hex(res + 2 * MiB))) << last_error();
  std::vector<page_range> dead;
  ASSERT_EQ(r.deallocate(res + 6 * MiB, &dead), ok);
  EXPECT_EQ(dead, (std::vector<page_range>{{page0 + 1, 2}}));
  ASSERT_EQ(r.deallocate(res + 2 * MiB, nullptr), ok);
  dead.clear();
  ASSERT_EQ(r.deallocate(res + 4 * MiB, &dead), ok);
  EXPECT_EQ(dead, (std::vector<page_range>{{page0, 1}}));
  // Freed bytes stay the reservation's: the arena has no more free than before.
  EXPECT_EQ(r.bytes_free(), 32 * MiB);
  ASSERT_EQ(r.unreserve(res), ok);
  EXPECT_EQ(r.bytes_free(), 64 * MiB);
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
}

TEST(RangeAllocatorReservations, MisuseFailsAndChangesNothing) {
  auto r = make(kBase, 64 * MiB, 2 * MiB);
  uint64_t res = 0, a = 0;
  ASSERT_EQ(r.reserve(8 * MiB, 0, &res), ok);
  ASSERT_EQ(r.allocate(1 * MiB, &a, nullptr), ok);
  ASSERT_EQ(r.allocate_at(res, 4 * MiB, nullptr), ok);
  const snapshot before(r);
  EXPECT_EQ(r.allocate_at(res + 2 * MiB, 2 * MiB, nullptr), err_invalid_argument) << "overlaps";
  EXPECT_TRUE(contains(last_error(), "overlaps")) << last_error();
  EXPECT_EQ(r.allocate_at(res + 6 * MiB, 4 * MiB, nullptr), err_invalid_argument) << "runs past the reservation";
  EXPECT_EQ(r.allocate_at(a, 256, nullptr), err_invalid_argument) << "outside any reservation";
  EXPECT_EQ(r.allocate_at(res + 4 * MiB + 7, 256, nullptr), err_invalid_argument) << "misaligned";
  EXPECT_EQ(r.reserve(0, 0, &res), err_invalid_argument);
  EXPECT_EQ(r.reserve(2 * MiB, 3 * MiB, &res), err_invalid_argument) << "alignment not a power of two";
  uint64_t huge = 0;
  EXPECT_EQ(r.reserve(128 * MiB, 0, &huge), err_out_of_memory);
  EXPECT_EQ(r.unreserve(res + 2 * MiB), err_invalid_argument) << "not a reservation's start";
  EXPECT_EQ(r.unreserve(a), err_invalid_argument);
  EXPECT_EQ(snapshot(r), before);
  EXPECT_EQ(r.bytes_reserved(), 8 * MiB);
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
}

TEST(RangeAllocatorReservations, HonourAnAlignmentLargerThanAPage) {
  auto r = make(kBase + 2 * MiB, 256 * MiB, 2 * MiB);  // base aligned to 2 MiB only
  uint64_t a = 0, res = 0;
  ASSERT_EQ(r.allocate(6 * MiB, &a, nullptr), ok);
  ASSERT_EQ(r.reserve(32 * MiB, 64 * MiB, &res), ok) << last_error();
  EXPECT_EQ(res % (64 * MiB), 0u) << hex(res);
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
  ASSERT_EQ(r.unreserve(res), ok);
  ASSERT_EQ(r.deallocate(a, nullptr), ok);
  EXPECT_EQ(r.free_block_count(), 1u);
}

// Reservations, allocations at chosen addresses in them and ordinary allocations, mixed at
// random, against a shadow of every page's live count.
TEST(RangeAllocatorReservations, RandomMixMatchesShadowModel) {
  const uint64_t P = 8 * MiB, pages = 32, G = 2 * MiB;
  std::mt19937_64 rng(env_u64("VRAMSWAP_FUZZ_SEED", 0x7e5e'7e5eull));
  auto r = make(kBase, P * pages, P);
  std::vector<uint64_t> counts(pages, 0);
  std::map<uint64_t, uint64_t> plain, inside, holds;  // addr -> size
  uint64_t maps = 0, unreserved = 0;
  auto count = [&](uint64_t a, uint64_t s, int d) {
    for (uint64_t p = (a - kBase) / P; p <= (a + s - 1 - kBase) / P; ++p) counts[p] += d;
  };
  for (int step = 0; step < 4000; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const uint64_t roll = rng() % 100;
    if (roll < 10) {
      uint64_t a = 0;
      const uint64_t s = G * (1 + rng() % 12);
      if (r.reserve(s, rng() % 4 == 0 ? 4 * P : 0, &a) == ok) holds.emplace(a, s);
    } else if (roll < 15 && !holds.empty()) {
      auto it = std::next(holds.begin(), static_cast<long>(rng() % holds.size()));
      const auto in = inside.lower_bound(it->first);
      const bool busy = in != inside.end() && in->first < it->first + it->second;
      ASSERT_EQ(r.unreserve(it->first), busy ? err_busy : ok) << last_error();
      if (!busy) {
        holds.erase(it);
        ++unreserved;
      }
    } else if (roll < 55 && !holds.empty()) {
      auto it = std::next(holds.begin(), static_cast<long>(rng() % holds.size()));
      const uint64_t at = it->first + G * (rng() % (it->second / G)), s = G * (1 + rng() % 3);
      auto next = inside.lower_bound(at);
      const bool fits = at + s <= it->first + it->second && (next == inside.end() || next->first >= at + s) &&
                        (next == inside.begin() || std::prev(next)->first + std::prev(next)->second <= at);
      ASSERT_EQ(r.allocate_at(at, s, nullptr), fits ? ok : err_invalid_argument) << hex(at) << " " << last_error();
      if (fits) {
        inside.emplace(at, s);
        count(at, s, 1);
        ++maps;
      }
    } else if (roll < 75 && !inside.empty()) {
      auto it = std::next(inside.begin(), static_cast<long>(rng() % inside.size()));
      ASSERT_EQ(r.deallocate(it->first, nullptr), ok) << last_error();
      count(it->first, it->second, -1);
      inside.erase(it);
    } else if (roll < 88) {
      uint64_t a = 0;
      const uint64_t s = rng() % 2 ? 256 * (1 + rng() % 64) : G * (1 + rng() % 4);
      if (r.allocate(s, &a, nullptr) == ok) {
        plain.emplace(a, (s + 255) / 256 * 256);
        count(a, s, 1);
      }
    } else if (!plain.empty()) {
      auto it = std::next(plain.begin(), static_cast<long>(rng() % plain.size()));
      ASSERT_EQ(r.deallocate(it->first, nullptr), ok) << last_error();
      count(it->first, it->second, -1);
      plain.erase(it);
    }
    if (step % 50 == 0) {
      ASSERT_EQ(r.check_invariants(), ok) << last_error();
    }
    for (uint64_t p = 0; p < pages; ++p) ASSERT_EQ(r.page_live_count(p), counts[p]) << "page " << p;
  }
  EXPECT_GT(maps, 200u);
  EXPECT_GT(unreserved, 20u);
  for (const auto& [a, s] : inside) ASSERT_EQ(r.deallocate(a, nullptr), ok);
  for (const auto& [a, s] : plain) ASSERT_EQ(r.deallocate(a, nullptr), ok);
  for (const auto& [a, s] : holds) ASSERT_EQ(r.unreserve(a), ok);
  EXPECT_EQ(r.free_block_count(), 1u);
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
}

}  // namespace
}  // namespace vramswap::detail
