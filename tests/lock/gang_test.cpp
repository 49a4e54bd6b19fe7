// Description: gang acquires (device_lock::acquire_gang): several devices' locks at once,
// all or none, across real processes. A gang waits in FIFO order on each of its devices and
// keeps its place there while another member is busy (the free device idles); it is never
// granted half; gangs and single-device users in random mixes never deadlock, never share a
// device, and every acquire is granted within a bound; a stream of single-device users does
// not starve a gang; a death at each named point of the gang's critical sections leaves
// every device working.
//
// Environment: VRAMSWAP_GANG_ROUNDS (rounds per worker of the random mix, default 500).
#include <signal.h>

#include <algorithm>
#include <random>

#include "lock/crash_points.hpp"
#include "lock_test_support.hpp"

namespace vramswap::detail::lock_test {
namespace {

using namespace std::chrono_literals;

constexpr int k_devices = 4;

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 10) : fallback;
}

class Gang : public lock_fixture {
 protected:
  void SetUp() override {
    lock_fixture::SetUp();
    for (int d = 0; d < k_devices; ++d) device_lock::remove(key(d));
  }
  void TearDown() override {
    for (int d = 0; d < k_devices; ++d) device_lock::remove(key(d));
    lock_fixture::TearDown();
  }
  static std::string key(int d) { return "host-" + std::to_string(d); }
  // Open the locks of devices `devs` into `out` (in that order).
  static int open_all(const std::vector<int>& devs, std::vector<device_lock>* out) {
    out->clear();
    out->resize(devs.size());
    for (size_t i = 0; i < devs.size(); ++i) {
      if (const int rc = device_lock::open(key(devs[i]), &(*out)[i]); rc != ok) return rc;
    }
    return ok;
  }
  static int gang_acquire(std::vector<device_lock>& locks, int64_t timeout_ns, lock_priority p = lock_priority::normal) {
    std::vector<device_lock*> ptrs;
    for (auto& l : locks) ptrs.push_back(&l);
    return device_lock::acquire_gang(ptrs.data(), ptrs.size(), p, timeout_ns);
  }
  static int release_all(std::vector<device_lock>& locks) {
    int rc = ok;
    for (auto& l : locks) {
      if (const int r = l.release(); r != ok) rc = r;
    }
    return rc;
  }
};

struct order_page {
  std::atomic<int> next{0};
  std::atomic<int> order[8];
  std::atomic<int> phase{0};
};

TEST_F(Gang, TakesAllTheDevicesAtOnceAndEachIsReleasedOnItsOwn) {
  std::vector<device_lock> locks;
  ASSERT_EQ(open_all({0, 1}, &locks), ok) << last_error();
  ASSERT_EQ(gang_acquire(locks, 2'000'000'000), ok) << last_error();
  EXPECT_TRUE(locks[0].held());
  EXPECT_TRUE(locks[1].held());
  std::vector<lock_queue_entry> q;
  ASSERT_EQ(locks[0].snapshot(&q), ok);
  ASSERT_EQ(q.size(), 1u);
  EXPECT_TRUE(q[0].holding);
  EXPECT_NE(q[0].gang_id, 0u) << "a gang member's slot names its gang for observers";
  // Re-entry of the whole gang is counted on each device.
  ASSERT_EQ(gang_acquire(locks, 0), ok) << last_error();
  ASSERT_EQ(locks[0].release(), ok);
  ASSERT_EQ(locks[1].release(), ok);
  EXPECT_TRUE(locks[0].held() && locks[1].held());
  // Device 0 goes to another process at its own release, while the gang's device 1 is held.
  ASSERT_EQ(locks[0].release(), ok);
  const pid_t single = spawn([&] {
    device_lock mine;
    if (device_lock::open(key(0), &mine) != ok) return 10;
    if (mine.acquire(lock_priority::normal, 2'000'000'000) != ok) return 11;
    return mine.release() == ok ? 0 : 12;
  });
  EXPECT_EQ(reap(single), 0);
  EXPECT_TRUE(locks[1].held());
  ASSERT_EQ(locks[1].release(), ok);
}

TEST_F(Gang, HoldingPartOfAGangIsRefusedAndATryTakesNothing) {
  std::vector<device_lock> locks;
  ASSERT_EQ(open_all({0, 1}, &locks), ok);
  ASSERT_EQ(locks[1].acquire(), ok);
  EXPECT_EQ(gang_acquire(locks, -1), err_invalid_argument);
  EXPECT_NE(std::string(last_error()).find("already holds"), std::string::npos) << last_error();
  ASSERT_EQ(locks[1].release(), ok);
  // A try while another process holds device 1: busy, and neither device keeps our slot.
  auto* page = shared_object<order_page>();
  const pid_t holder = spawn([&] {
    device_lock mine;
    if (device_lock::open(key(1), &mine) != ok || mine.acquire() != ok) return 10;
    page->phase.store(1);
    while (page->phase.load() != 2) std::this_thread::sleep_for(1ms);
    return mine.release() == ok ? 0 : 11;
  });
  while (page->phase.load() != 1) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(gang_acquire(locks, 0), err_busy);
  EXPECT_NE(std::string(last_error()).find("held by"), std::string::npos) << last_error();
  std::vector<lock_queue_entry> q;
  ASSERT_EQ(locks[0].snapshot(&q), ok);
  EXPECT_TRUE(q.empty());
  ASSERT_EQ(locks[1].snapshot(&q), ok);
  EXPECT_EQ(q.size(), 1u);
  // The same devices twice is refused.
  std::vector<device_lock> twice;
  ASSERT_EQ(open_all({0, 0}, &twice), ok);
  EXPECT_EQ(gang_acquire(twice, -1), err_invalid_argument);
  page->phase.store(2);
  EXPECT_EQ(reap(holder), 0);
  free_shared_object(page);
}

// A gang queued behind a holder of device 1 keeps its place on device 0, which is free: a
// single queued after the gang on device 0 waits (the device idles) and is served after it.
TEST_F(Gang, KeepsItsPlaceOnAFreeDeviceWhileAnotherIsBusy) {
  auto* page = shared_object<order_page>();
  std::vector<device_lock> locks;
  ASSERT_EQ(open_all({0, 1}, &locks), ok);
  ASSERT_EQ(locks[1].acquire(), ok);  // the test holds device 1
  const pid_t gang = spawn([&] {
    std::vector<device_lock> mine;
    if (open_all({1, 0}, &mine) != ok) return 10;
    if (gang_acquire(mine, 10'000'000'000) != ok) return 11;
    page->order[page->next.fetch_add(1)].store(1);
    std::this_thread::sleep_for(20ms);
    return release_all(mine) == ok ? 0 : 12;
  });
  ASSERT_TRUE(wait_for_queue(locks[0], [](const auto& q) { return queue_has_waiters(q, 1); }));
  const pid_t single = spawn([&] {
    device_lock mine;
    if (device_lock::open(key(0), &mine) != ok) return 10;
    if (mine.acquire(lock_priority::normal, 10'000'000'000) != ok) return 11;
    page->order[page->next.fetch_add(1)].store(2);
    return mine.release() == ok ? 0 : 12;
  });
  ASSERT_TRUE(wait_for_queue(locks[0], [](const auto& q) { return queue_has_waiters(q, 2); }));
  std::this_thread::sleep_for(50ms);  // device 0 is free all along: nobody may take it
  EXPECT_EQ(page->next.load(), 0) << "device 0 was granted past the gang queued ahead";
  std::vector<lock_queue_entry> q;
  ASSERT_EQ(locks[0].snapshot(&q), ok);
  for (const auto& e : q) EXPECT_FALSE(e.holding) << "a gang member was granted alone";
  ASSERT_EQ(locks[1].release(), ok);
  EXPECT_EQ(reap(gang), 0);
  EXPECT_EQ(reap(single), 0);
  ASSERT_EQ(page->next.load(), 2);
  EXPECT_EQ(page->order[0].load(), 1) << "the gang first (FIFO on device 0)";
  EXPECT_EQ(page->order[1].load(), 2);
  free_shared_object(page);
}

// A timed-out gang leaves every queue, and those behind it on a free device get it at once.
TEST_F(Gang, ATimeoutLeavesEveryQueueAndHandsTheFreeDeviceOn) {
  std::vector<device_lock> locks;
  ASSERT_EQ(open_all({0, 1}, &locks), ok);
  ASSERT_EQ(locks[1].acquire(), ok);
  auto* page = shared_object<order_page>();
  const pid_t gang = spawn([&] {
    std::vector<device_lock> mine;
    if (open_all({0, 1}, &mine) != ok) return 10;
    const int rc = gang_acquire(mine, 300'000'000);
    if (rc != err_timeout) return 11;
    return std::string(last_error()).find("not granted within") != std::string::npos ? 0 : 12;
  });
  ASSERT_TRUE(wait_for_queue(locks[0], [](const auto& q) { return queue_has_waiters(q, 1); }));
  const pid_t single = spawn([&] {
    device_lock mine;
    if (device_lock::open(key(0), &mine) != ok) return 10;
    if (mine.acquire(lock_priority::normal, 10'000'000'000) != ok) return 11;
    page->phase.store(1);
    return mine.release() == ok ? 0 : 12;
  });
  EXPECT_EQ(reap(gang), 0);
  EXPECT_EQ(reap(single), 0);
  EXPECT_EQ(page->phase.load(), 1);
  ASSERT_EQ(locks[1].release(), ok);
  std::vector<lock_queue_entry> q;
  for (auto& l : locks) {
    ASSERT_EQ(l.snapshot(&q), ok);
    EXPECT_TRUE(q.empty());
  }
  free_shared_object(page);
}

// --- the random mix -------------------------------------------------------------------

struct mix_page {
  std::atomic<pid_t> inside[k_devices];
  std::atomic<int> violations{0};
  std::atomic<int> half_grants{0};
  std::atomic<uint64_t> grants{0};
  std::atomic<uint64_t> gang_grants{0};
  std::atomic<uint64_t> max_wait_ns{0};
  std::atomic<int> stop{0};
};

void note_wait(mix_page* page, uint64_t waited) {
  uint64_t seen = page->max_wait_ns.load();
  while (waited > seen && !page->max_wait_ns.compare_exchange_weak(seen, waited)) {
  }
}

// Each worker takes random sets of 1 to 4 of the 4 devices (a single acquire for one, a gang
// for more, now and then a high one), checks that nobody else is inside any of them, holds
// them briefly and releases them in a random order. Every acquire has a generous timeout: a
// deadlock or a starved gang shows as a timeout.
TEST_F(Gang, RandomMixesOfGangsAndSinglesNeverDeadlockOrShareADevice) {
  const uint64_t rounds = env_or("VRAMSWAP_GANG_ROUNDS", 500);
  constexpr int k_workers = 6;
  auto* page = shared_object<mix_page>();
  std::vector<pid_t> workers;
  for (int w = 0; w < k_workers; ++w) {
    workers.push_back(spawn([&, w] {
      std::vector<device_lock> all;
      if (open_all({0, 1, 2, 3}, &all) != ok) return 10;
      std::mt19937 rng(static_cast<uint32_t>(1000 + w));
      const pid_t me = ::getpid();
      for (uint64_t r = 0; r < rounds; ++r) {
        std::vector<int> devs{0, 1, 2, 3};
        std::shuffle(devs.begin(), devs.end(), rng);
        devs.resize(1 + rng() % (w % 3 == 0 ? 2 : 4));  // some workers mostly single
        const lock_priority p = rng() % 16 == 0 ? lock_priority::high : lock_priority::normal;
        std::vector<device_lock*> ptrs;
        for (int d : devs) ptrs.push_back(&all[d]);
        const uint64_t t0 = monotonic_ns();
        const int rc = ptrs.size() == 1 ? ptrs[0]->acquire(p, 20'000'000'000)
                                        : device_lock::acquire_gang(ptrs.data(), ptrs.size(), p, 20'000'000'000);
        if (rc != ok) {
          std::fprintf(stderr, "worker %d round %llu: %s\n", w, static_cast<unsigned long long>(r), last_error());
          return 11;
        }
        note_wait(page, monotonic_ns() - t0);
        for (int d : devs) {
          if (!all[d].held()) page->half_grants.fetch_add(1);
          pid_t expected = 0;
          if (!page->inside[d].compare_exchange_strong(expected, me)) page->violations.fetch_add(1);
        }
        page->grants.fetch_add(1);
        if (devs.size() > 1) page->gang_grants.fetch_add(1);
        if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
        std::shuffle(devs.begin(), devs.end(), rng);
        for (int d : devs) {
          page->inside[d].store(0);
          if (all[d].release() != ok) return 12;
        }
      }
      return 0;
    }));
  }
  for (pid_t pid : workers) EXPECT_EQ(reap(pid), 0);
  EXPECT_EQ(page->violations.load(), 0) << "two processes were inside one device";
  EXPECT_EQ(page->half_grants.load(), 0) << "a gang was granted only part of its devices";
  EXPECT_EQ(page->grants.load(), rounds * k_workers);
  EXPECT_GT(page->gang_grants.load(), rounds);
  std::printf("%llu grants (%llu gangs), longest wait %.1f ms\n", static_cast<unsigned long long>(page->grants.load()),
              static_cast<unsigned long long>(page->gang_grants.load()), static_cast<double>(page->max_wait_ns.load()) / 1e6);
  std::vector<device_lock> all;
  ASSERT_EQ(open_all({0, 1, 2, 3}, &all), ok);
  std::vector<lock_queue_entry> q;
  for (auto& l : all) {
    ASSERT_EQ(l.repair_now(), ok);
    ASSERT_EQ(l.snapshot(&q), ok);
    EXPECT_TRUE(q.empty());
  }
  free_shared_object(page);
}

// Single-device users that keep both devices busy between them, one after another, never
// leaving both free at once: a gang that only took free devices would wait for ever. FIFO
// places make it wait only for those queued before it.
TEST_F(Gang, AStreamOfSinglesDoesNotStarveAGang) {
  auto* page = shared_object<mix_page>();
  std::vector<pid_t> singles;
  for (int w = 0; w < 4; ++w) {
    singles.push_back(spawn([&, w] {
      device_lock mine;
      if (device_lock::open(key(w % 2), &mine) != ok) return 10;
      while (page->stop.load() == 0) {
        if (mine.acquire(lock_priority::normal, 20'000'000'000) != ok) return 11;
        std::this_thread::sleep_for(std::chrono::microseconds(500));
        if (mine.release() != ok) return 12;
      }
      return 0;
    }));
  }
  std::vector<device_lock> locks;
  ASSERT_EQ(open_all({0, 1}, &locks), ok);
  std::this_thread::sleep_for(20ms);
  for (int i = 0; i < 20; ++i) {
    const uint64_t t0 = monotonic_ns();
    ASSERT_EQ(gang_acquire(locks, 10'000'000'000), ok) << last_error();
    note_wait(page, monotonic_ns() - t0);
    ASSERT_EQ(release_all(locks), ok);
  }
  page->stop.store(1);
  for (pid_t pid : singles) EXPECT_EQ(reap(pid), 0);
  std::printf("longest gang wait %.1f ms\n", static_cast<double>(page->max_wait_ns.load()) / 1e6);
  free_shared_object(page);
}

// --- a death at each named point of the gang's critical sections ------------------------

crash_point g_armed_point = crash_point::count_;
void kill_self_at_armed_point(crash_point point) {
  if (point == g_armed_point) ::raise(SIGKILL);
}

class GangCrashPoint : public Gang, public ::testing::WithParamInterface<crash_point> {};

// The victim gang-acquires devices 0 and 1 while the test holds device 1, so that it both
// queues and (at the test's release) is granted; it kills itself at the armed point. A
// single on device 0 and a second gang must then be served, and the queues end clean.
TEST_P(GangCrashPoint, DeathThereLeavesEveryDeviceWorking) {
  const crash_point point = GetParam();
  std::vector<device_lock> locks;
  ASSERT_EQ(open_all({0, 1}, &locks), ok);
  ASSERT_EQ(locks[1].acquire(), ok);
  const pid_t victim = spawn([&] {
    std::vector<device_lock> mine;
    if (open_all({0, 1}, &mine) != ok) return 10;
    g_armed_point = point;
    set_crash_hook(kill_self_at_armed_point);
    if (gang_acquire(mine, 10'000'000'000) != ok) return 11;
    return release_all(mine) == ok ? 0 : 12;
  });
  // Queued on device 0 (or dead already).
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  std::vector<lock_queue_entry> q;
  bool dead = false;
  int status = -1;
  while (std::chrono::steady_clock::now() < deadline) {
    int st = 0;
    if (::waitpid(victim, &st, WNOHANG) == victim) {
      dead = true;
      status = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
      break;
    }
    ASSERT_EQ(locks[0].snapshot(&q), ok);
    if (queue_has_waiters(q, 1)) break;
    std::this_thread::sleep_for(200us);
  }
  const pid_t single = spawn([&] {
    device_lock mine;
    if (device_lock::open(key(0), &mine) != ok) return 10;
    if (mine.acquire(lock_priority::normal, 10'000'000'000) != ok) return 11;
    return mine.release() == ok ? 0 : 12;
  });
  const pid_t gang = spawn([&] {
    std::vector<device_lock> mine;
    if (open_all({0, 1}, &mine) != ok) return 10;
    if (gang_acquire(mine, 10'000'000'000) != ok) return 11;
    return release_all(mine) == ok ? 0 : 12;
  });
  std::this_thread::sleep_for(20ms);
  ASSERT_EQ(locks[1].release(), ok);
  if (!dead) status = reap(victim);
  EXPECT_EQ(status, 128 + SIGKILL) << "the victim never reached " << crash_point_name(point);
  EXPECT_EQ(reap(single), 0) << "device 0 stuck after a death at " << crash_point_name(point);
  EXPECT_EQ(reap(gang), 0) << "the second gang was not served after a death at " << crash_point_name(point);
  ASSERT_EQ(gang_acquire(locks, 2'000'000'000), ok) << last_error();
  for (auto& l : locks) {
    ASSERT_EQ(l.repair_now(), ok);
    ASSERT_EQ(l.snapshot(&q), ok);
    EXPECT_EQ(q.size(), 1u) << "entries of the dead victim remain after a death at " << crash_point_name(point);
  }
  ASSERT_EQ(release_all(locks), ok);
}

INSTANTIATE_TEST_SUITE_P(EveryPoint, GangCrashPoint,
                         ::testing::Values(crash_point::enqueue_slot_filled, crash_point::gang_enqueued_one,
                                           crash_point::enqueue_published, crash_point::gang_reserved,
                                           crash_point::gang_granted_one),
                         [](const ::testing::TestParamInfo<crash_point>& param) { return crash_point_name(param.param); });

}  // namespace
}  // namespace vramswap::detail::lock_test
