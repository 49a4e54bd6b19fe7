// Description: range_allocator when the standard library runs out of host memory. The global
// operator new of this executable (only) can be told to fail its k-th call from now; every
// k is tried until the operation succeeds, and each failure must return err_out_of_memory
// and leave the allocator exactly as it was. A separate executable because replacing
// operator new affects everything linked into it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>
#include <vector>

#include "core/range_allocator.hpp"
#include "core/status.hpp"

namespace {
long g_fail_in = -1;  // -1: never; k >= 0: the k-th operator new from now throws
}  // namespace

// The replacement pair is malloc/free by design; GCC cannot see that they match.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (g_fail_in == 0) {
    g_fail_in = -1;
    throw std::bad_alloc();
  }
  if (g_fail_in > 0) --g_fail_in;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace vramswap::detail {
namespace {

constexpr uint64_t P = 4096;
constexpr uint64_t kBase = 0x100000;

struct state {
  uint64_t allocated, blocks, allocations, largest;
  std::vector<uint64_t> counts;
  explicit state(const range_allocator& r)
      : allocated(r.bytes_allocated()),
        blocks(r.free_block_count()),
        allocations(r.allocation_count()),
        largest(r.largest_free_block()) {
    for (uint64_t p = 0; p < r.page_count(); ++p) counts.push_back(r.page_live_count(p));
  }
  bool operator==(const state&) const = default;
};

// Run op with the k-th allocation failing, for k = 0, 1, ... until it succeeds.
// Returns how many injected failures were seen.
template <class Op>
int exhaust(range_allocator& r, Op op) {
  for (long k = 0;; ++k) {
    const state before(r);
    std::vector<page_range> v;
    v.shrink_to_fit();
    g_fail_in = k;
    const int rc = op(&v);
    g_fail_in = -1;
    if (rc == ok) return static_cast<int>(k);
    EXPECT_EQ(rc, err_out_of_memory) << "k=" << k << ": " << last_error();
    EXPECT_TRUE(v.empty()) << "k=" << k;
    EXPECT_TRUE(state(r) == before) << "k=" << k << ": state changed by a failed call";
    EXPECT_EQ(r.check_invariants(), ok) << "k=" << k << ": " << last_error();
    if (k > 20) {
      ADD_FAILURE() << "operation never succeeded";
      return -1;
    }
  }
}

TEST(RangeAllocatorOom, EveryAllocationFailureLeavesStateUnchanged) {
  range_allocator r;
  // init: the page table and the first block.
  EXPECT_GE(exhaust(r, [&](std::vector<page_range>*) { return r.init(kBase, 16 * P, P); }), 2);
  uint64_t a = 0, b = 0, c = 0;
  // Allocation at a block's start: output reserve + live node.
  EXPECT_GE(exhaust(r, [&](auto* v) { return r.allocate(1000, &a, v); }), 2);
  ASSERT_EQ(r.allocate(P, &b, nullptr), ok);  // at P: leaves [1K, P) free
  ASSERT_EQ(r.deallocate(a, nullptr), ok);    // [0, P) free, [P, 2P) live, [2P, 16P) free
  ASSERT_EQ(r.allocate(256, &a, nullptr), ok);
  ASSERT_EQ(r.deallocate(b, nullptr), ok);    // [256, 16P) free
  // A large allocation in the middle of a block: prefix and suffix, so new suffix nodes.
  EXPECT_GE(exhaust(r, [&](auto* v) { return r.allocate(2 * P, &c, v); }), 4);
  EXPECT_EQ(c, kBase + P);
  // Freeing with no free neighbour needs a new size-index node.
  uint64_t d = 0, e = 0;
  ASSERT_EQ(r.allocate(P - 256, &e, nullptr), ok);  // exact fit of [256, P)
  EXPECT_EQ(e, kBase + 256);
  ASSERT_EQ(r.allocate(P, &d, nullptr), ok);
  EXPECT_EQ(d, kBase + 3 * P);
  EXPECT_GE(exhaust(r, [&](auto* v) { return r.deallocate(c, v); }), 2);
  // Freeing with neighbours reuses nodes: only the output reserve can fail.
  EXPECT_GE(exhaust(r, [&](auto* v) { return r.deallocate(d, v); }), 1);
  EXPECT_EQ(r.check_invariants(), ok) << last_error();
  EXPECT_EQ(r.allocation_count(), 2u);
}

}  // namespace
}  // namespace vramswap::detail
