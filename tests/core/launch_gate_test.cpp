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

}  // namespace
}  // namespace vramswap::detail
