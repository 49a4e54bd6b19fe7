// The chain of the shared host pool with a swap file behind it (swap/store_chain.hpp), in
// one process: two stores stand for two members of one pool segment whose host pool holds
// fewer pages than they save. Random bytes, every byte checked after the round trip through
// pool slots, the members' own staging slots and their swap files; ENOSPC on a real small
// ext4 filesystem (loop mounted by the test, skipped where mounting is not permitted).
#include "swap/store_chain.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "core/options.hpp"
#include "core/status.hpp"
#include "pool/pool_segment.hpp"
#include "support/backends.hpp"
#include "support/random_bytes.hpp"
#include "support/scratch_fs.hpp"
#include "support/store_pages.hpp"

namespace vramswap::detail {
namespace {
using namespace pool_layout;

constexpr uint64_t MiB = 1ull << 20;
constexpr size_t k_page = 2 * MiB;
constexpr uint32_t k_pool_slots = 12;

class PoolChain : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    be_ = test::shared_backend(backend_kind::host, &why);
    ASSERT_NE(be_, nullptr) << why;
    prefix_ = "vsch" + std::to_string(::getpid()) + "-";
    option_set(option_id::shm_prefix, prefix_.c_str());
    ASSERT_EQ(pool_segment::create("chain-5", 2, k_page, k_pool_slots, ::getpid(), 0, &pool_), ok) << last_error();
    // O_DIRECT transfers need page-aligned memory: a mapping, as the pool's memfd is.
    void* p = ::mmap(nullptr, k_pool_slots * k_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    memory_ = static_cast<char*>(p);
  }
  void TearDown() override {
    pool_.reset();
    pool_segment::remove("chain-5");
    option_set(option_id::shm_prefix, nullptr);
    if (memory_ != nullptr) ::munmap(memory_, k_pool_slots * k_page);
  }
  int chain(uint32_t member, const std::string& dir, std::unique_ptr<tiered_store>* out) {
    tiered_config tc;
    tc.slot_size = k_page;
    tc.swap_dir = dir;
    tc.queue_depth = 8;
    tc.block_size = 512 * 1024;
    tc.grow_step = 2 * k_page;
    tc.chunk_slots = 4;
    tc.write_window = 2;
    tc.spill_ahead = 2;
    tc.read_ahead = 2;
    tc.label = "member " + std::to_string(member);
    return make_pool_chain_with_swap_file(*be_, shared_host_pool{pool_.get(), member, memory_, 2'000'000'000, nullptr}, tc, out);
  }
  uint32_t used_by(uint32_t member) const { return pool_->count_slots(slot_used, member); }

  backend* be_ = nullptr;
  std::string prefix_;
  std::unique_ptr<pool_segment> pool_;
  char* memory_ = nullptr;
};

int put(tiered_store& s, uint64_t key, uint64_t seed) { return test::put_page(s, key, k_page, seed); }
::testing::AssertionResult read_back(tiered_store& s, uint64_t key, uint64_t seed) {
  return test::page_reads_back(s, key, k_page, seed);
}

TEST_F(PoolChain, PagesPastTheSharedPoolGoToEachMembersSwapFileAndComeBackExact) {
  std::unique_ptr<tiered_store> a, b;
  ASSERT_EQ(chain(0, "/var/tmp", &a), ok) << last_error();
  ASSERT_EQ(chain(1, "/var/tmp", &b), ok) << last_error();
  EXPECT_EQ(a->tier_count(), 2u);
  EXPECT_STREQ(a->tier_name(0), "host pool");
  EXPECT_STREQ(a->tier_name(1), "swap file");
  // Member 0 saves three times what the pool holds: the pool fills, the rest goes to disk.
  // Not all of the rest: a save that finds the pool full while the member's own writes to
  // disk are still in flight takes one of its own staging slots (fallback_slots), and the
  // page stays there; how many do depends on how fast the disk completes (under load, more).
  // At most the staging slots: write window + spill ahead + read ahead + one (store_chain.cpp).
  constexpr uint64_t n = 3 * k_pool_slots;
  constexpr uint64_t k_staging = 2 + 2 + 2 + 1;
  for (uint64_t k = 0; k < n; ++k) ASSERT_EQ(put(*a, k, 100 + k), ok) << last_error();
  ASSERT_EQ(a->flush(), ok) << last_error();
  EXPECT_EQ(a->bytes_held(), n * k_page);
  EXPECT_GE(a->bytes_in_tier(1), (n - k_pool_slots - k_staging) * k_page)
      << "what the pool and the member's staging slots cannot hold is on disk";
  EXPECT_EQ(a->bytes_in_tier(0) + a->bytes_in_tier(1), n * k_page);
  EXPECT_LE(a->bytes_in_tier(0) / k_page, used_by(0) + k_staging) << "in host memory: the pool's slots and the staging slots";
  EXPECT_EQ(a->tier_of(0), 1u) << "the oldest page went to disk first";
  EXPECT_LE(used_by(0), k_pool_slots);
  // Member 1, with the pool (nearly) all member 0's, still saves: through its own staging
  // slots to its own swap file, never waiting for member 0.
  for (uint64_t k = 0; k < n; ++k) ASSERT_EQ(put(*b, k, 900 + k), ok) << last_error();
  ASSERT_EQ(b->flush(), ok) << last_error();
  EXPECT_GE(b->bytes_in_tier(1), (n - k_pool_slots - k_staging) * k_page);
  // Both read back every byte, in turns, forward and backwards.
  for (uint64_t k = 0; k < n; ++k) ASSERT_TRUE(read_back(*a, k, 100 + k));
  for (uint64_t k = n; k-- > 0;) ASSERT_TRUE(read_back(*b, k, 900 + k));
  for (uint64_t k = n; k-- > 0;) ASSERT_TRUE(read_back(*a, k, 100 + k));
  for (uint64_t k = 0; k < n; ++k) ASSERT_TRUE(read_back(*b, k, 900 + k));
  // Releasing gives the pool's slots back to everyone.
  for (uint64_t k = 0; k < n; ++k) ASSERT_EQ(a->release(k), ok);
  EXPECT_EQ(used_by(0), 0u);
  EXPECT_EQ(a->bytes_held(), 0u);
  b.reset();
  // b's slots zeroed and freed as it went; a's given back dirty, zeroed by its scrubber a moment later.
  for (int i = 0; i < 200 && pool_->count_slots(slot_free) != k_pool_slots; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(pool_->count_slots(slot_free), k_pool_slots) << "every slot given back is free (zeroed) within moments";
}

TEST_F(PoolChain, TryNeverWaitsForOtherMembersWhenThereIsASwapFile) {
  std::unique_ptr<tiered_store> a, b;
  ASSERT_EQ(chain(0, "/var/tmp", &a), ok) << last_error();
  ASSERT_EQ(chain(1, "/var/tmp", &b), ok) << last_error();
  // Member 0 takes every slot of the pool (its newest pages may not go to disk yet).
  for (uint64_t k = 0; k < k_pool_slots; ++k) ASSERT_EQ(put(*a, k, k), ok) << last_error();
  void* slot = nullptr;
  ASSERT_EQ(b->try_slot_for_write(7, k_page, &slot), ok) << "a staging slot of its own, not err_busy: " << last_error();
  test::fill_random(slot, k_page, 77);
  EXPECT_TRUE(read_back(*b, 7, 77));
  for (uint64_t k = 0; k < k_pool_slots; ++k) EXPECT_TRUE(read_back(*a, k, k));
}

TEST_F(PoolChain, EnospcWhileSpillingPastThePoolLosesNothing) {
  test::scratch_image img;
  test::scratch_mount m;
  std::string why;
  if (!test::mount_small_ext4(m, img, &why)) GTEST_SKIP() << why;
  std::unique_ptr<tiered_store> a;
  ASSERT_EQ(chain(0, m.dir(), &a), ok) << last_error();
  // About 20 MiB of disk (10 pages) behind 12 pool slots: the save that finds no room fails.
  int rc = ok;
  uint64_t saved = 0;
  for (; saved < 64; ++saved) {
    if ((rc = put(*a, saved, 500 + saved)) != ok) break;
  }
  ASSERT_EQ(rc, err_no_space) << last_error();
  const std::string detail = last_error();
  EXPECT_NE(detail.find("full"), std::string::npos) << detail;
  EXPECT_NE(detail.find(m.dir()), std::string::npos) << "the error names the swap directory: " << detail;
  EXPECT_GT(saved, uint64_t{k_pool_slots});
  EXPECT_FALSE(a->holds(saved)) << "the page that found no room was not taken";
  // Every page saved before the failure is intact, in the pool or on disk.
  for (uint64_t k = 0; k < saved; ++k) ASSERT_TRUE(read_back(*a, k, 500 + k));
  // Room again after releases: the same saves succeed.
  for (uint64_t k = 0; k < saved; ++k) ASSERT_EQ(a->release(k), ok);
  for (uint64_t k = 0; k < saved; ++k) ASSERT_EQ(put(*a, 100 + k, 600 + k), ok) << k << ": " << last_error();
  ASSERT_EQ(a->flush(), ok) << last_error();
  for (uint64_t k = 0; k < saved; ++k) EXPECT_TRUE(read_back(*a, 100 + k, 600 + k));
  a.reset();  // closes the swap file before the unmount
}

}  // namespace
}  // namespace vramswap::detail
