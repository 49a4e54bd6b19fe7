// The launch gate (core/launch_gate.hpp), the oversubscription safe point: closing waits for
// every thread inside, keeps new ones out until it reopens, and never waits for a thread on
// itself (re-entry, or a closer that is inside).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/launch_gate.hpp"

namespace vramswap::detail {
namespace {
using namespace std::chrono_literals;

TEST(LaunchGate, ClosingWaitsForThreadsInsideAndKeepsNewOnesOut) {
  std::atomic<bool> inside{false}, let_go{false}, second_entered{false};
  std::thread holder([&] {
    launch_gate::pass p;
    inside = true;
    while (!let_go) std::this_thread::sleep_for(1ms);
  });
  while (!inside) std::this_thread::sleep_for(1ms);

  std::atomic<bool> closed{false}, reopen{false};
  std::thread closer([&] {
    launch_gate::closed gate;
    closed = true;
    while (!reopen) std::this_thread::sleep_for(1ms);
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(closed) << "the gate closed while a thread was inside";
  let_go = true;
  holder.join();
  while (!closed) std::this_thread::sleep_for(1ms);

  std::thread late([&] {
    launch_gate::pass p;
    second_entered = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(second_entered) << "a thread entered a closed gate";
  reopen = true;
  closer.join();
  late.join();
  EXPECT_TRUE(second_entered);
}

TEST(LaunchGate, ReentryAndAClosingThreadInsideNeverWaitForThemselves) {
  {
    launch_gate::pass outer;
    launch_gate::pass inner;  // nested: counted once
    launch_gate::closed gate;  // this thread is inside: it does not wait for itself
    launch_gate::pass again;   // and passes its own closed gate
  }
  // Everything balanced: another thread can close and pass again at once.
  std::thread t([] {
    launch_gate::closed gate;
  });
  t.join();
  std::atomic<bool> passed{false};
  std::thread u([&] {
    launch_gate::pass p;
    passed = true;
  });
  u.join();
  EXPECT_TRUE(passed);
}

TEST(LaunchGate, ManyThreadsPassingWhileAnotherClosesRepeatedly) {
  std::atomic<bool> stop{false};
  std::atomic<int> inside{0};
  std::atomic<int> violations{0};
  std::atomic<long> passes{0};
  std::vector<std::thread> workers;
  std::atomic<bool> is_closed{false};
  for (int i = 0; i < 4; ++i) {
    workers.emplace_back([&] {
      while (!stop) {
        launch_gate::pass p;
        ++inside;
        if (is_closed) ++violations;  // nobody may be inside while the gate is closed
        --inside;
        ++passes;
      }
    });
  }
  for (int round = 0; round < 200; ++round) {
    launch_gate::closed gate;
    is_closed = true;
    if (inside.load() != 0) ++violations;
    std::this_thread::sleep_for(100us);
    is_closed = false;
  }
  stop = true;
  for (auto& w : workers) w.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_GT(passes.load(), 0);
}

// Yielding and closing are independent: a thread held back for a lock holder is not inside
// the gate, so a closer (the migration thread) closes and reopens without waiting for it;
// when the hold ends while the gate is closed, the thread waits for the reopening too.
std::atomic<uint32_t> g_holder{0};  // 0: nobody holds
bool claims_always(void*, uint32_t) { return true; }
void wait_a_little(void*, uint32_t seen, uint64_t timeout_ns) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
  while (g_holder.load() == seen && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(200us);
}

TEST(LaunchGate, AYieldingThreadNeitherBlocksNorWaitsForACloser) {
  static launch_gate::yield_source source;  // lives as long as the process, as sources must
  source.word = &g_holder;
  source.idle = 0;
  source.claims = claims_always;
  source.wait = wait_a_little;
  launch_gate::set_yield_policy(launch_gate::yield_policy::yield);
  const int handle = launch_gate::add_yield_source(source);
  ASSERT_GE(handle, 0);
  { launch_gate::pass p; }  // nobody holds: passes at once

  g_holder = 7;
  std::atomic<bool> passed{false};
  std::thread t([&] {
    launch_gate::pass p;
    passed = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(passed) << "a launch went on while a holder held";
  {
    const auto t0 = std::chrono::steady_clock::now();
    launch_gate::closed gate;  // must not wait for the yielding thread
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
    g_holder = 0;  // the hold ends while the gate is closed
    std::this_thread::sleep_for(50ms);
    EXPECT_FALSE(passed) << "a launch went through a closed gate";
  }
  t.join();
  EXPECT_TRUE(passed);
  const launch_gate::yield_totals y = launch_gate::yielded();
  EXPECT_GE(y.waits, 1u);
  EXPECT_GE(y.waited_ns, 40'000'000u);

  // Free: holders change nothing.
  launch_gate::set_yield_policy(launch_gate::yield_policy::free);
  g_holder = 7;
  { launch_gate::pass p; }
  // Removed: the same.
  launch_gate::set_yield_policy(launch_gate::yield_policy::yield);
  launch_gate::remove_yield_source(handle);
  { launch_gate::pass p; }
  g_holder = 0;
  launch_gate::set_yield_policy(launch_gate::yield_policy::free);
}

}  // namespace
}  // namespace vramswap::detail
