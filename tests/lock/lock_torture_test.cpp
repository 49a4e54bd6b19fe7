// Description: SIGKILL torture. Each round starts three worker processes that take and
// release the lock in a tight loop, then kills one of them (the current holder half of
// the time, otherwise any worker: waiting, enqueueing, releasing, or between iterations)
// at a random moment, checks that the lock still grants (and measures how long the first
// grant after the kill took), then kills the other workers too, also at random moments.
// Every 50 rounds and at the end it checks that the queue is empty and that the grant
// order is exactly FIFO. Mutual exclusion is checked on every grant.
//
// Random kill times reach the lock's few-instruction internal critical sections only
// sometimes; lock_process_test's CrashPoint suite kills at each of them on purpose.
//
// Environment: VRAMSWAP_TORTURE_ROUNDS (default 1000), VRAMSWAP_TORTURE_SEED (default 1).
#include <signal.h>

#include <algorithm>
#include <random>

#include "lock_test_support.hpp"

namespace vramswap::detail::lock_test {
namespace {

struct torture_page {
  std::atomic<pid_t> cs_owner{0};     // who is inside the lock now (0: nobody)
  std::atomic<pid_t> victim{0};       // killed this round: may be found in cs_owner
  std::atomic<int> violations{0};     // a grant found another live process inside
  std::atomic<uint64_t> kill_ns{0};   // when the victim was killed (0: not yet)
  std::atomic<uint64_t> first_grant_after_kill_ns{0};
  std::atomic<uint64_t> grants{0};
  std::atomic<int> fifo_count{0};
  int fifo_order[16];
};

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 10) : fallback;
}

// Called by whoever was just granted the lock.
void enter(torture_page* page) {
  const pid_t me = ::getpid();
  const pid_t previous = page->cs_owner.exchange(me);
  if (previous != 0 && previous != page->victim.load()) page->violations.fetch_add(1);
  page->grants.fetch_add(1);
  const uint64_t kill_ns = page->kill_ns.load();
  if (kill_ns != 0) {
    uint64_t expected = 0;
    page->first_grant_after_kill_ns.compare_exchange_strong(expected, monotonic_ns());
  }
}

void leave(torture_page* page) { page->cs_owner.store(0); }

void spin_for_ns(uint64_t ns) {
  const uint64_t end = monotonic_ns() + ns;
  while (monotonic_ns() < end) {
  }
}

class LockTorture : public lock_fixture {};

TEST_F(LockTorture, SigkillAtRandomMomentsNeverBreaksTheLock) {
  const uint64_t rounds = env_or("VRAMSWAP_TORTURE_ROUNDS", 1000);
  const uint64_t seed = env_or("VRAMSWAP_TORTURE_SEED", 1);
  constexpr int k_workers = 3;
  std::mt19937_64 rng(seed);
  option_set(option_id::log_level, "error");  // thousands of "holder died" warnings otherwise
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok) << last_error();
  auto* page = shared_object<torture_page>();
  uint64_t holder_kills = 0, other_kills = 0, fifo_checks = 0;
  uint64_t max_recovery_ns = 0, max_holder_recovery_ns = 0;

  auto check_fifo_and_empty_queue = [&](uint64_t round) {
    ASSERT_EQ(lock.repair_now(), ok) << last_error();
    std::vector<lock_queue_entry> q;
    ASSERT_EQ(lock.snapshot(&q), ok);
    ASSERT_TRUE(q.empty()) << "round " << round << ": " << q.size() << " entries left after every worker died";
    ASSERT_EQ(lock.acquire(lock_priority::normal, 2'000'000'000), ok) << last_error();
    page->fifo_count.store(0);
    std::vector<pid_t> children;
    for (int i = 0; i < 6; ++i) {
      children.push_back(spawn([&, i] {
        if (lock.acquire() != ok) return 10;
        page->fifo_order[page->fifo_count.fetch_add(1)] = i;
        return lock.release() == ok ? 0 : 11;
      }));
      ASSERT_TRUE(wait_for_queue(lock, [&](const auto& queue) { return queue_has_waiters(queue, children.size()); }));
    }
    ASSERT_EQ(lock.release(), ok);
    for (pid_t c : children) ASSERT_EQ(reap(c), 0);
    ASSERT_EQ(page->fifo_count.load(), 6);
    for (int i = 0; i < 6; ++i) ASSERT_EQ(page->fifo_order[i], i) << "round " << round << ": grant order not FIFO";
    ++fifo_checks;
  };

  for (uint64_t round = 0; round < rounds; ++round) {
    page->cs_owner.store(0);
    page->victim.store(0);
    page->kill_ns.store(0);
    page->first_grant_after_kill_ns.store(0);
    const uint64_t hold_ns = 20'000 + rng() % 200'000;
    std::vector<pid_t> workers;
    for (int w = 0; w < k_workers; ++w) {
      workers.push_back(spawn([&] {
        for (;;) {  // the child inherits `lock` but not its ownership: it queues like anyone
          if (lock.acquire(lock_priority::normal, 10'000'000'000) != ok) return 10;
          enter(page);
          spin_for_ns(hold_ns);
          leave(page);
          if (lock.release() != ok) return 11;
        }
      }));
    }
    // Let the workers get going (forks are slow on a busy machine), then pick a moment.
    const uint64_t grants_before = page->grants.load();
    while (page->grants.load() < grants_before + k_workers) std::this_thread::sleep_for(std::chrono::microseconds(50));
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1'000));
    // Half the time kill whoever is inside the lock; otherwise any worker, wherever it is.
    pid_t victim = workers[rng() % k_workers];
    bool aim_at_holder = false;
    if ((rng() & 1) != 0) {
      const uint64_t give_up_ns = monotonic_ns() + 5'000'000;
      pid_t inside = 0;
      while ((inside = page->cs_owner.load()) == 0 && monotonic_ns() < give_up_ns) {
        std::this_thread::sleep_for(std::chrono::microseconds(10));
      }
      aim_at_holder = inside != 0;
      if (aim_at_holder) victim = inside;
    }
    page->victim.store(victim);
    page->kill_ns.store(monotonic_ns());
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    const uint64_t kill_ns = page->kill_ns.load();
    // The lock must still grant: we queue like anyone and must get it.
    ASSERT_EQ(lock.acquire(lock_priority::normal, 5'000'000'000), ok) << "round " << round << ": " << last_error();
    enter(page);
    const uint64_t recovery_ns = page->first_grant_after_kill_ns.load() - kill_ns;
    max_recovery_ns = std::max(max_recovery_ns, recovery_ns);
    if (aim_at_holder) {
      ++holder_kills;
      max_holder_recovery_ns = std::max(max_holder_recovery_ns, recovery_ns);
    } else {
      ++other_kills;
    }
    leave(page);
    ASSERT_EQ(lock.release(), ok);
    // The others die too, at whatever point they have reached.
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
    for (pid_t w : workers) {
      if (w != victim) ::kill(w, SIGKILL);
    }
    for (pid_t w : workers) {
      const int status = reap(w);
      ASSERT_EQ(status, 128 + SIGKILL) << "round " << round << ": worker exited by itself with " << status;
    }
    ASSERT_EQ(page->violations.load(), 0) << "round " << round << ": two live processes were inside the lock";
    if ((round + 1) % 50 == 0 || round + 1 == rounds) check_fifo_and_empty_queue(round);
  }
  std::printf(
      "torture: %llu rounds (seed %llu), %llu kills aimed at the holder + %llu at any worker + %llu follow-up kills, %llu FIFO "
      "checks, %llu repairs; longest time from a kill to the next grant: %.2f ms (kills aimed at the holder: %.2f ms)\n",
      static_cast<unsigned long long>(rounds), static_cast<unsigned long long>(seed),
      static_cast<unsigned long long>(holder_kills), static_cast<unsigned long long>(other_kills),
      static_cast<unsigned long long>(rounds * (k_workers - 1)), static_cast<unsigned long long>(fifo_checks),
      static_cast<unsigned long long>(lock.recoveries()), static_cast<double>(max_recovery_ns) / 1e6,
      static_cast<double>(max_holder_recovery_ns) / 1e6);
  EXPECT_LT(max_holder_recovery_ns, 100'000'000u) << "a holder's death took more than 100 ms to repair";
  free_shared_object(page);
}

}  // namespace
}  // namespace vramswap::detail::lock_test
