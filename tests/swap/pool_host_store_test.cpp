// The shared host pool's slot table (pool/pool_layout.hpp, slot_word) and the page store on
// top of it (swap/pool_host_store.hpp), in one process: two stores stand for two members of
// one pool segment. The multi-process story (real clients of vramswapd, SIGKILL) is in
// tests/cpp_api/host_pool_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/options.hpp"
#include "core/status.hpp"
#include "swap/pool_host_store.hpp"
#include "swap/pool_slots.hpp"
#include "pool/pool_segment.hpp"
#include "support/random_bytes.hpp"

namespace vramswap::detail {
namespace {
using namespace pool_layout;
using clock_type = std::chrono::steady_clock;

constexpr uint64_t k_slot = 4096;
constexpr uint32_t k_slots = 4;

class PoolHostStore : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = "vshs" + std::to_string(::getpid()) + "-";
    option_set(option_id::shm_prefix, prefix_.c_str());
    ASSERT_EQ(pool_segment::create("host-77", 2, k_slot, k_slots, ::getpid(), 0, &pool_), ok) << last_error();
    memory_.assign(k_slots * k_slot, 0);
  }
  void TearDown() override {
    pool_.reset();
    pool_segment::remove("host-77");
    option_set(option_id::shm_prefix, nullptr);
  }
  std::unique_ptr<pool_host_store> store(uint32_t member, uint64_t timeout_ns = 2'000'000'000) {
    return std::make_unique<pool_host_store>(*pool_, member, memory_.data(), timeout_ns, nullptr);
  }
  uint32_t used_by(uint32_t member) const { return pool_->count_slots(slot_used, member); }
  slot_word word_of(const void* slot) const {
    return slot_word::decode(pool_->read_slot(static_cast<uint32_t>((static_cast<const char*>(slot) - memory_.data()) / k_slot)));
  }
  bool all_zero(const void* slot) const {
    const char* c = static_cast<const char*>(slot);
    for (uint64_t i = 0; i < k_slot; ++i) {
      if (c[i] != 0) return false;
    }
    return true;
  }
  // Waits (at most 2 s) until every slot is free.
  bool all_free_soon() const {
    for (int i = 0; i < 200; ++i) {
      if (pool_->count_slots(slot_free) == k_slots) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  std::string prefix_;
  std::unique_ptr<pool_segment> pool_;
  std::vector<char> memory_;
};

TEST(SlotWord, EncodesEveryFieldAndCarriesTheGeneration) {
  const slot_word w{slot_used, 255, (uint64_t{1} << 40) - 1};
  const slot_word d = slot_word::decode(w.encode());
  EXPECT_EQ(d.state, slot_used);
  EXPECT_EQ(d.owner, 255u);
  EXPECT_EQ(d.generation, (uint64_t{1} << 40) - 1);
  const slot_word f = slot_word::decode(slot_word{slot_free, k_no_member, 7}.encode());
  EXPECT_EQ(f.state, slot_free);
  EXPECT_EQ(f.owner, k_no_member);
  EXPECT_EQ(f.generation, 7u);
}

TEST_F(PoolHostStore, SegmentOpensWithItsSlotTableAndEverySlotFree) {
  std::string name;
  ASSERT_EQ(pool_segment::name_for("host-77", &name), ok);
  std::unique_ptr<pool_segment> again;
  ASSERT_EQ(pool_segment::open(name, &again), ok) << last_error();
  EXPECT_EQ(again->host_slot_count(), k_slots);
  EXPECT_EQ(again->host_slot_size(), k_slot);
  EXPECT_EQ(again->count_slots(slot_free), k_slots);
  // The two mappings share the table.
  const uint64_t seen = pool_->read_slot(2);
  ASSERT_TRUE(pool_->move_slot(2, seen, slot_used, 5));
  EXPECT_EQ(slot_word::decode(again->read_slot(2)).owner, 5u);
}

TEST_F(PoolHostStore, CompareAndSwapFailsOnAStaleWordEvenWhenTheStateCameBack) {
  const uint64_t first = pool_->read_slot(0);
  ASSERT_TRUE(pool_->move_slot(0, first, slot_used, 1));   // free -> used(1)
  const uint64_t second = pool_->read_slot(0);
  ASSERT_TRUE(pool_->move_slot(0, second, slot_free, k_no_member));  // used(1) -> free: state as at `first`
  EXPECT_EQ(slot_word::decode(pool_->read_slot(0)).state, slot_free);
  // free again, but two transitions later: a CAS from the first read must not succeed (ABA).
  EXPECT_FALSE(pool_->move_slot(0, first, slot_used, 2));
  EXPECT_FALSE(pool_->move_slot(0, second, slot_used, 2));
  EXPECT_EQ(slot_word::decode(pool_->read_slot(0)).generation, slot_word::decode(first).generation + 2);
  EXPECT_EQ(pool_->count_slots(slot_free), k_slots);
}

TEST_F(PoolHostStore, SlotsAreTakenReleasedAndReusedAndEachWakesWaiters) {
  auto a = store(0);
  void* p0 = nullptr;
  void* again = nullptr;
  ASSERT_EQ(a->slot_for_write(10, k_slot, &p0), ok) << last_error();
  ASSERT_EQ(a->slot_for_write(10, k_slot, &again), ok);
  EXPECT_EQ(p0, again) << "asking again for a key that has a slot returns the same memory";
  EXPECT_EQ(used_by(0), 1u);
  EXPECT_TRUE(a->holds(10));
  EXPECT_EQ(a->bytes_held(), k_slot);
  std::memset(p0, 0x42, k_slot);
  void* r = nullptr;
  ASSERT_EQ(a->slot_for_read(10, &r), ok);
  EXPECT_EQ(r, p0);
  EXPECT_EQ(static_cast<char*>(r)[k_slot - 1], 0x42);
  EXPECT_EQ(a->slot_for_read(11, &r), err_invalid_argument);
  const uint32_t before = pool_->header()->slots_freed.load();
  ASSERT_EQ(a->release(10), ok);
  EXPECT_EQ(pool_->header()->slots_freed.load(), before + 1) << "a give-back must bump the futex";
  EXPECT_EQ(used_by(0), 0u);
  EXPECT_FALSE(a->holds(10));
  EXPECT_EQ(a->release(10), ok) << "releasing a key without a slot is a no-op";
  EXPECT_EQ(a->slot_for_write(12, k_slot + 1, &r), err_invalid_argument) << "larger than a slot";
}

TEST_F(PoolHostStore, FullPoolMakesTrySlotBusyAndAWaiterGetsTheNextSlotFreed) {
  auto a = store(0);
  auto b = store(1);
  void* p = nullptr;
  for (uint64_t k = 0; k < k_slots; ++k) ASSERT_EQ(a->slot_for_write(k, k_slot, &p), ok) << last_error();
  EXPECT_EQ(pool_->count_slots(slot_free), 0u);
  EXPECT_EQ(b->try_slot_for_write(100, k_slot, &p), err_busy);
  EXPECT_FALSE(b->holds(100));
  // b waits; a gives one back 100 ms later; b must get exactly that slot, long before its timeout.
  int rc = -1;
  void* got = nullptr;
  const auto t0 = clock_type::now();
  std::thread waiter([&] { rc = b->slot_for_write(100, k_slot, &got); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  void* freed = nullptr;
  ASSERT_EQ(a->slot_for_read(2, &freed), ok);
  ASSERT_EQ(a->release(2), ok);
  waiter.join();
  EXPECT_EQ(rc, ok) << last_error();
  EXPECT_EQ(got, freed);
  EXPECT_LT(clock_type::now() - t0, std::chrono::milliseconds(1500));
  EXPECT_EQ(used_by(1), 1u);
  EXPECT_EQ(used_by(0), k_slots - 1);
}

TEST_F(PoolHostStore, ExhaustedPoolIsAClearErrorNamingWhoHoldsIt) {
  auto a = store(0);
  auto b = store(1, 200'000'000);
  pool_->member(0).pid = 4242;
  void* p = nullptr;
  for (uint64_t k = 0; k < k_slots; ++k) ASSERT_EQ(a->slot_for_write(k, k_slot, &p), ok);
  const auto t0 = clock_type::now();
  EXPECT_EQ(b->slot_for_write(100, k_slot, &p), err_out_of_memory);
  EXPECT_GE(clock_type::now() - t0, std::chrono::milliseconds(200));
  const std::string why = last_error();
  EXPECT_NE(why.find("host pool exhausted"), std::string::npos) << why;
  EXPECT_NE(why.find("member 0 (pid 4242) 4"), std::string::npos) << why;
  EXPECT_NE(why.find("VRAMSWAP_HOST_POOL"), std::string::npos) << why;
  EXPECT_FALSE(b->holds(100));
}

TEST_F(PoolHostStore, ServerRepairFreesOnlyTheDeadMembersSlotsAndWakesWaiters) {
  auto a = store(0);
  auto b = store(1);
  void* p = nullptr;
  ASSERT_EQ(a->slot_for_write(1, k_slot, &p), ok);
  ASSERT_EQ(a->slot_for_write(2, k_slot, &p), ok);
  ASSERT_EQ(b->slot_for_write(1, k_slot, &p), ok);
  const uint32_t before = pool_->header()->slots_freed.load();
  EXPECT_EQ(pool_->free_slots_of(0), 2u);
  EXPECT_EQ(pool_->header()->slots_freed.load(), before + 1);
  EXPECT_EQ(used_by(0), 0u);
  EXPECT_EQ(used_by(1), 1u);
  EXPECT_EQ(pool_->free_slots_of(0), 0u) << "nothing left to free";
  // The member taken for dead releasing later must not free what another now holds.
  auto c = store(2);
  for (uint64_t k = 0; k < 3; ++k) ASSERT_EQ(c->slot_for_write(k, k_slot, &p), ok);
  EXPECT_EQ(a->release(1), ok);
  EXPECT_EQ(a->release(2), ok);
  EXPECT_EQ(used_by(2), 3u);
  EXPECT_EQ(used_by(1), 1u);
}

// A slot given back is dirty (its owner's bytes, takeable by any member) until its owner's
// scrubber zeroes and frees it, a moment later: never free with bytes in it.
TEST_F(PoolHostStore, ASlotGivenBackIsZeroedAndFreedAMomentLater) {
  auto a = store(0);
  void* p = nullptr;
  ASSERT_EQ(a->slot_for_write(1, k_slot, &p), ok) << last_error();
  test::fill_random(p, k_slot, 11);
  ASSERT_EQ(a->release(1), ok);
  const slot_word w = word_of(p);
  EXPECT_TRUE(w.state == slot_dirty || w.state == slot_free) << "state " << int{w.state};
  EXPECT_EQ(used_by(0), 0u);
  ASSERT_TRUE(all_free_soon()) << pool_->count_slots(slot_dirty) << " slots still dirty after 2 s";
  EXPECT_TRUE(all_zero(p)) << "a free slot still holds its last owner's bytes";
}

// The handoff this is for: a restores (gives slots back) while b evicts (waits for slots).
// b takes what a gives back at once, dirty, and writes a whole page over it; a's scrubber,
// coming to that slot a moment later, must leave b's page alone. Many rounds, b taking its
// slot from just before to just after the scrub is due, so that the two meet.
TEST_F(PoolHostStore, AnotherMemberTakesASlotGivenBackAndTheOwnersScrubLeavesItsPageAlone) {
  auto a = store(0);
  auto b = store(1);
  std::mt19937 rng(7);
  const auto due = std::chrono::duration_cast<std::chrono::microseconds>(pool_slots::k_scrub_after).count();
  std::uniform_int_distribution<long> delay_us(0, 2 * due);
  void* p = nullptr;
  for (uint64_t k = 0; k < k_slots; ++k) {
    ASSERT_EQ(a->slot_for_write(k, k_slot, &p), ok) << last_error();
    test::fill_random(p, k_slot, 100 + k);
  }
  int taken_dirty = 0;
  for (uint64_t round = 0; round < 60; ++round) {
    // a gives one slot back; b, whose pool is full, takes it after a while.
    const uint64_t key = round % k_slots;
    ASSERT_EQ(a->release(key), ok);
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    taken_dirty += pool_->count_slots(slot_dirty) > 0;  // the only slot b can take: dirty still, or zeroed
    void* mine = nullptr;
    ASSERT_EQ(b->slot_for_write(round, k_slot, &mine), ok) << last_error();
    test::fill_random(mine, k_slot, 5000 + round);
    // Past the scrub's time: whatever a's scrubber did, b's page is whole and b's.
    std::this_thread::sleep_for(pool_slots::k_scrub_after * 2);
    void* back = nullptr;
    ASSERT_EQ(b->slot_for_read(round, &back), ok);
    ASSERT_EQ(test::first_mismatch(back, k_slot, 5000 + round), k_slot) << "round " << round << ": b's page was overwritten";
    EXPECT_EQ(word_of(back).state, slot_used);
    EXPECT_EQ(word_of(back).owner, 1u);
    // Hand the slot back to a for the next round: b gives it back, a takes it for its key again.
    ASSERT_EQ(b->release(round), ok);
    ASSERT_EQ(a->slot_for_write(key, k_slot, &p), ok) << last_error();
    test::fill_random(p, k_slot, 100 + key);
  }
  EXPECT_GT(taken_dirty, 0) << "b never came before a's scrub: the hand-over of dirty slots was not exercised";
  // a's pages that never moved are intact.
  for (uint64_t k = 0; k < k_slots; ++k) {
    void* r = nullptr;
    ASSERT_EQ(a->slot_for_read(k, &r), ok);
    EXPECT_EQ(test::first_mismatch(r, k_slot, 100 + k), k_slot) << "a's page " << k;
  }
}

// A store that goes zeroes what it gave back and its scrubber had not come to yet.
TEST_F(PoolHostStore, DestroyingAStoreZeroesTheSlotsItLeftDirty) {
  auto a = store(0);
  std::vector<void*> slots;
  for (uint64_t k = 0; k < k_slots; ++k) {
    void* p = nullptr;
    ASSERT_EQ(a->slot_for_write(k, k_slot, &p), ok) << last_error();
    test::fill_random(p, k_slot, 300 + k);
    slots.push_back(p);
  }
  for (uint64_t k = 0; k < k_slots; ++k) ASSERT_EQ(a->release(k), ok);
  a.reset();
  EXPECT_EQ(pool_->count_slots(slot_free), k_slots);
  for (void* p : slots) EXPECT_TRUE(all_zero(p));
}

// The server's repair of a dead member: its dirty slots are claimed back as used by it (so no
// member takes one while the server zeroes it) before they are zeroed and freed; freeing
// alone never frees a dirty slot, which holds bytes.
TEST_F(PoolHostStore, RepairClaimsADeadMembersDirtySlotsBeforeFreeingThem) {
  auto dirty = [&](uint32_t s, uint32_t owner) {
    ASSERT_TRUE(pool_->move_slot(s, pool_->read_slot(s), slot_used, owner));
    ASSERT_TRUE(pool_->move_slot(s, pool_->read_slot(s), slot_dirty, owner));
  };
  dirty(0, 5);
  dirty(1, 5);
  dirty(2, 6);
  EXPECT_EQ(pool_->free_slots_of(5), 0u) << "a dirty slot is not freed unzeroed";
  EXPECT_EQ(pool_->count_slots(slot_dirty, 5), 2u);
  EXPECT_EQ(pool_->claim_dirty_slots_of(5), 2u);
  EXPECT_EQ(pool_->count_slots(slot_used, 5), 2u);
  EXPECT_EQ(pool_->count_slots(slot_dirty, 6), 1u) << "another member's dirty slot is left alone";
  EXPECT_EQ(pool_->free_slots_of(5), 2u);
  EXPECT_EQ(pool_->count_slots(slot_free), 3u);
  // A member may take the other dead member's dirty slot before the server claims it: then it is not the server's.
  auto b = store(1);
  void* p = nullptr;
  for (uint64_t k = 10; k < 10 + k_slots; ++k) ASSERT_EQ(b->slot_for_write(k, k_slot, &p), ok) << last_error();
  EXPECT_EQ(pool_->count_slots(slot_used, 1), k_slots);
  EXPECT_EQ(pool_->claim_dirty_slots_of(6), 0u);
  EXPECT_EQ(pool_->free_slots_of(6), 0u);
}

TEST_F(PoolHostStore, DestroyingAStoreGivesBackEverySlotItHeld) {
  auto a = store(0);
  void* p = nullptr;
  ASSERT_EQ(a->slot_for_write(1, k_slot, &p), ok);
  ASSERT_EQ(a->slot_for_write(5, k_slot, &p), ok);
  EXPECT_EQ(used_by(0), 2u);
  a.reset();
  EXPECT_EQ(pool_->count_slots(slot_free), k_slots);
}

}  // namespace
}  // namespace vramswap::detail
