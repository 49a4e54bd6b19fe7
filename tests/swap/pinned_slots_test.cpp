// pinned_slots (swap/pinned_slots.hpp) on a real backend: its makers pin chunks ahead of
// need, hold new chunks and registrations back while the owner maps device memory
// (owner_mapping), catch up once it is done, and still make progress, a bounded wait at a
// time, for an owner that maps without pause. Every slot made is real pinned memory that
// holds what is written to it.
#include "swap/pinned_slots.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/status.hpp"
#include "support/backends.hpp"
#include "support/random_bytes.hpp"

namespace vramswap::detail {
namespace {

using clock_type = std::chrono::steady_clock;
constexpr size_t k_slot = 2u << 20;
constexpr size_t k_chunk_slots = 2;

class PinnedSlots : public ::testing::TestWithParam<backend_kind> {
 protected:
  void SetUp() override {
    std::string why;
    be = test::shared_backend(GetParam(), &why);
    if (be == nullptr) GTEST_SKIP() << "backend " << backend_kind_name(GetParam()) << " unavailable here: " << why;
  }
  // Waits up to `limit` for `slots` slots to be pinned; true once they are.
  static bool pinned_within(const pinned_slots& s, size_t slots, std::chrono::milliseconds limit) {
    const auto until = clock_type::now() + limit;
    while (s.bytes_pinned() < slots * k_slot) {
      if (clock_type::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }
  backend* be = nullptr;
};

TEST_P(PinnedSlots, MakersWaitForTheOwnersMappingAndCatchUpAfterIt) {
  pinned_slots s(*be, k_slot, k_chunk_slots, 0, "pinned slots test");
  s.owner_mapping(true);
  s.owner_mapping(true);  // nested: the first end is not the end
  s.make_ahead(8);
  std::this_thread::sleep_for(std::chrono::milliseconds(pinned_slots::k_max_hold_back_ms / 3));
  EXPECT_EQ(s.bytes_pinned(), 0u) << "a chunk was made while the owner mapped";
  s.owner_mapping(false);
  std::this_thread::sleep_for(std::chrono::milliseconds(pinned_slots::k_max_hold_back_ms / 3));
  EXPECT_LT(s.bytes_pinned(), 8 * k_slot) << "all of it was made while the owner still mapped";
  s.owner_mapping(false);
  EXPECT_TRUE(pinned_within(s, 8, std::chrono::seconds(20))) << s.bytes_pinned() << " bytes pinned, 8 slots asked for";
  // The slots are real pinned memory, each its own.
  std::vector<char*> taken;
  for (int i = 0; i < 8; ++i) {
    char* slot = nullptr;
    ASSERT_EQ(s.take(false, &slot), ok) << last_error();
    test::fill_random(slot, k_slot, 500 + i);
    taken.push_back(slot);
  }
  for (int i = 0; i < 8; ++i) EXPECT_EQ(test::first_mismatch(taken[i], k_slot, 500 + i), k_slot) << "slot " << i;
  EXPECT_EQ(s.slots_committed(), 8u) << "made past the target";
  for (char* slot : taken) s.give_back(slot);
}

TEST_P(PinnedSlots, AnOwnerThatMapsWithoutPauseStillGetsItsSlotsPinned) {
  pinned_slots s(*be, k_slot, k_chunk_slots, 0, "pinned slots test");
  s.owner_mapping(true);
  s.make_ahead(4);
  // Each wait is bounded: two chunks need a few of them, never an end of the mapping.
  EXPECT_TRUE(pinned_within(s, 4, std::chrono::seconds(20))) << s.bytes_pinned() << " bytes pinned while the owner mapped";
  s.owner_mapping(false);
}

INSTANTIATE_TEST_SUITE_P(Backends, PinnedSlots, ::testing::Values(backend_kind::host, backend_kind::cuda), test::param_name);

}  // namespace
}  // namespace vramswap::detail
