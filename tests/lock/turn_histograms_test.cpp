// Description: the lock segment's turn histograms (lock/turn_histograms.hpp): a bucket's
// bound is inclusive; each grant counts one wait and each handed-on hold one hold, across
// processes (a forked holder, the test as waiter), with re-entries, refused tries and a
// holder SIGKILLed while holding counted as the header says: not at all.
#include "lock/turn_histograms.hpp"

#include <atomic>

#include "lock/device_lock.hpp"
#include "lock/segment_layout.hpp"
#include "lock_test_support.hpp"

namespace vramswap::detail::lock_test {
namespace {

using namespace std::chrono_literals;
using lock_layout::k_turn_bucket_le_ns;
using lock_layout::k_turn_buckets;
using lock_layout::turn_counts;

class TurnHistograms : public lock_fixture {};

// Observations above `seconds` (a bucket bound), from the buckets.
uint64_t above(const turn_counts& c, double seconds) {
  uint64_t n = 0;
  for (size_t i = 1; i < k_turn_buckets; ++i) {
    if (k_turn_bucket_le_ns[i - 1] >= static_cast<uint64_t>(seconds * 1e9)) n += c.count[i];
  }
  return n;
}

TEST(TurnHistogram, ABoundIsInclusiveAndTheLastBucketTakesTheRest) {
  lock_layout::turn_histogram h{};
  h.observe(0);
  h.observe(k_turn_bucket_le_ns[0]);      // le is inclusive: still the first bucket
  h.observe(k_turn_bucket_le_ns[0] + 1);  // the second
  h.observe(k_turn_bucket_le_ns[k_turn_buckets - 2] + 1);  // above every bound: +Inf
  const turn_counts c = lock_layout::read_counts(h);
  EXPECT_EQ(c.count[0], 2u);
  EXPECT_EQ(c.count[1], 1u);
  EXPECT_EQ(c.count[k_turn_buckets - 1], 1u);
  EXPECT_EQ(c.total(), 4u);
  EXPECT_EQ(c.sum_ns, 2 * k_turn_bucket_le_ns[0] + 1 + k_turn_bucket_le_ns[k_turn_buckets - 2] + 1);
  for (size_t i = 1; i + 1 < k_turn_buckets; ++i) EXPECT_LT(k_turn_bucket_le_ns[i - 1], k_turn_bucket_le_ns[i]) << "bounds ascend";
}

// A forked child holds the lock for 600 ms; the test waits for it, re-enters, holds 60 ms.
TEST_F(TurnHistograms, EachGrantCountsAWaitAndEachReleaseAHoldAcrossProcesses) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok) << last_error();
  ASSERT_NE(lock.turns(), nullptr);
  EXPECT_EQ(lock_layout::read_counts(lock.turns()->wait).total(), 0u) << "a new segment starts from zero";
  auto* held = shared_object<std::atomic<int>>();
  const pid_t child = spawn([&] {
    device_lock mine;
    if (device_lock::open(key_, &mine) != ok || mine.acquire() != ok) return 2;
    held->store(1);
    std::this_thread::sleep_for(600ms);
    return mine.release() == ok ? 0 : 3;
  });
  while (held->load() == 0) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(lock.try_acquire(), err_busy) << "the child holds it";
  ASSERT_EQ(lock.acquire(), ok) << last_error();
  ASSERT_EQ(lock.acquire(), ok) << "re-entry";
  std::this_thread::sleep_for(60ms);
  ASSERT_EQ(lock.release(), ok);
  ASSERT_EQ(lock.release(), ok);
  EXPECT_EQ(reap(child), 0);
  free_shared_object(held);

  const turn_counts wait = lock_layout::read_counts(lock.turns()->wait);
  const turn_counts hold = lock_layout::read_counts(lock.turns()->hold);
  EXPECT_EQ(wait.total(), 2u) << "two grants (the child's, ours); a refused try and a re-entry count none";
  EXPECT_EQ(above(wait, 0.25), 1u) << "ours waited for most of the child's 600 ms hold";
  EXPECT_EQ(hold.total(), 2u) << "two holds handed on (the re-entry's release hands nothing on)";
  EXPECT_EQ(above(hold, 0.5), 1u) << "the child's 600 ms hold";
  EXPECT_EQ(above(hold, 0.05), 2u) << "and ours of 60 ms";
  EXPECT_GE(hold.sum_ns, 660'000'000u);
  EXPECT_EQ(lock_layout::read_counts(lock.turns()->switching).total(), 0u) << "the lock alone records no switch";
}

// A holder killed while holding: its hold is not counted (nothing hands the lock on); the
// grant to the next waiter is.
TEST_F(TurnHistograms, AHolderKilledWhileHoldingCountsNoHold) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok) << last_error();
  auto* held = shared_object<std::atomic<int>>();
  const pid_t child = spawn([&] {
    device_lock mine;
    if (device_lock::open(key_, &mine) != ok || mine.acquire() != ok) return 2;
    held->store(1);
    for (;;) ::pause();
  });
  while (held->load() == 0) std::this_thread::sleep_for(1ms);
  ::kill(child, SIGKILL);
  EXPECT_EQ(reap(child), 128 + SIGKILL);
  free_shared_object(held);
  acquire_info info;
  ASSERT_EQ(lock.acquire(lock_priority::normal, 10'000'000'000, &info), ok) << last_error();
  EXPECT_TRUE(info.previous_holder_died);
  ASSERT_EQ(lock.release(), ok);
  EXPECT_EQ(lock_layout::read_counts(lock.turns()->wait).total(), 2u) << "the child's grant and ours";
  EXPECT_EQ(lock_layout::read_counts(lock.turns()->hold).total(), 1u) << "only our hold: the dead child's ended in a repair";
}

}  // namespace
}  // namespace vramswap::detail::lock_test
