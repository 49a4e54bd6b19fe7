// Description: gang acquires (device_lock::acquire_gang): several devices' locks at once,
// all or none, across real processes. A gang waits in FIFO order on each of its devices and
// keeps its place there while another member is busy (the free device idles); it is never
// granted half; gangs and single-device users in random mixes never deadlock, never share a
// device, and every acquire is granted within a bound; a stream of single-device users does
// not starve a gang; a death at each named point of the gang's critical sections leaves
// every device working.
//
// Gangs of processes (rank_gang): the ranks of a job, one process per device, granted
// together when every rank has joined; many rounds against another job and single users; a
// rank killed while its gang waits breaks it with an error naming it; a missing rank times
// out naming it; a death of the rank that queues the round leaves every device working.
//
// Environment: VRAMSWAP_GANG_ROUNDS (rounds per worker of the random mix, default 500).
#include <signal.h>

#include <algorithm>
#include <random>

#include "lock/crash_points.hpp"
#include "lock/futex.hpp"
#include "lock/rank_gang.hpp"
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

// Each device can be taken and let go, and nothing is left in its queue after a repair.
template <typename Locks>
void expect_devices_work_with_empty_queues(Locks& locks) {
  std::vector<lock_queue_entry> q;
  for (auto& l : locks) {
    ASSERT_EQ(l.acquire(lock_priority::normal, 2'000'000'000), ok) << last_error();
    ASSERT_EQ(l.release(), ok);
    ASSERT_EQ(l.repair_now(), ok);
    ASSERT_EQ(l.snapshot(&q), ok);
    EXPECT_TRUE(q.empty());
  }
}

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

// --- gangs of processes ------------------------------------------------------------------

struct rank_page {
  std::atomic<int> inside[k_devices];  // pid inside device d
  std::atomic<uint64_t> round_of[8];   // the round each rank process is in
  std::atomic<int> violations{0};
  std::atomic<int> apart{0};  // a rank held its device while a rank of its gang did not come
  std::atomic<int> joined{0};
  std::atomic<int> stop{0};
};

// Open the gang and run `rounds` rounds: acquire (rank `rank` of `world`, device `device`),
// check that nobody else is inside the device and that every other rank of this gang is
// inside its device too (within a bound), release. Returns an exit code.
int rank_rounds(const std::string& job, uint32_t rank, uint32_t world, int device, int rounds, rank_page* page, int slot0) {
  std::unique_ptr<rank_gang> gang;
  if (rank_gang::open(job, rank, world, &gang) != ok) {
    std::fprintf(stderr, "rank %u: %s\n", rank, last_error());
    return 20;
  }
  device_lock mine;
  if (device_lock::open("host-" + std::to_string(device), &mine) != ok) return 21;
  const pid_t me = ::getpid();
  for (int r = 1; r <= rounds; ++r) {
    if (gang->acquire(mine, lock_priority::normal, 20'000'000'000) != ok) {
      std::fprintf(stderr, "rank %u round %d: %s\n", rank, r, last_error());
      return 22;
    }
    pid_t nobody = 0;
    if (!page->inside[device].compare_exchange_strong(nobody, me)) page->violations.fetch_add(1);
    page->round_of[slot0 + rank].store(static_cast<uint64_t>(r));
    // Granted together: every peer reaches this round while we hold ours.
    const uint64_t until = monotonic_ns() + 5'000'000'000ull;
    for (uint32_t p = 0; p < world; ++p) {
      while (page->round_of[slot0 + p].load() < static_cast<uint64_t>(r) && monotonic_ns() < until) cpu_relax();
      if (page->round_of[slot0 + p].load() < static_cast<uint64_t>(r)) page->apart.fetch_add(1);
    }
    page->inside[device].store(0);
    if (mine.release() != ok) return 23;
  }
  return 0;
}

TEST_F(Gang, RanksOfAJobAreGrantedTogetherWhenAllHaveJoined) {
  auto* page = shared_object<rank_page>();
  std::vector<device_lock> locks;
  ASSERT_EQ(open_all({0, 1}, &locks), ok);
  ASSERT_EQ(locks[1].acquire(), ok);  // the test holds device 1: the gang cannot be granted yet
  const std::string job = "job-" + prefix_;
  const pid_t rank0 = spawn([&] { return rank_rounds(job, 0, 2, 0, 1, page, 0); });
  // Rank 0 alone is not in device 0's order: a single there is served at once.
  ASSERT_TRUE(wait_for_queue(locks[0], [](const auto& q) { return queue_has_waiters(q, 1); }));
  ASSERT_EQ(locks[0].acquire(lock_priority::normal, 2'000'000'000), ok) << "a forming gang blocked device 0: " << last_error();
  ASSERT_EQ(locks[0].release(), ok);
  const pid_t rank1 = spawn([&] { return rank_rounds(job, 1, 2, 1, 1, page, 0); });
  ASSERT_TRUE(wait_for_queue(locks[1], [](const auto& q) { return queue_has_waiters(q, 1); }));
  std::this_thread::sleep_for(30ms);
  // Queued now: device 0 is free but its next is the gang, so a try there fails.
  EXPECT_EQ(locks[0].try_acquire(), err_busy) << "device 0 went past the queued gang";
  EXPECT_EQ(page->round_of[0].load(), 0u);
  ASSERT_EQ(locks[1].release(), ok);
  EXPECT_EQ(reap(rank0), 0);
  EXPECT_EQ(reap(rank1), 0);
  EXPECT_EQ(page->apart.load(), 0);
  EXPECT_EQ(page->violations.load(), 0);
  free_shared_object(page);
}

// Two jobs of two ranks each over devices 0-1 and 1-2, and single users on every device,
// for many rounds: no deadlock, nobody shares a device, each gang's ranks hold together.
TEST_F(Gang, TwoJobsAndSinglesTakeManyRoundsWithoutDeadlock) {
  const int rounds = static_cast<int>(env_or("VRAMSWAP_GANG_ROUNDS", 500) / 4);
  auto* page = shared_object<rank_page>();
  std::vector<pid_t> pids;
  pids.push_back(spawn([&] { return rank_rounds("a-" + prefix_, 0, 2, 0, rounds, page, 0); }));
  pids.push_back(spawn([&] { return rank_rounds("a-" + prefix_, 1, 2, 1, rounds, page, 0); }));
  pids.push_back(spawn([&] { return rank_rounds("b-" + prefix_, 0, 2, 1, rounds, page, 2); }));
  pids.push_back(spawn([&] { return rank_rounds("b-" + prefix_, 1, 2, 2, rounds, page, 2); }));
  std::vector<pid_t> singles;
  for (int d = 0; d < 3; ++d) {
    singles.push_back(spawn([&, d] {
      device_lock mine;
      if (device_lock::open(key(d), &mine) != ok) return 10;
      std::mt19937 rng(static_cast<uint32_t>(d));
      while (page->stop.load() == 0) {
        if (mine.acquire(lock_priority::normal, 20'000'000'000) != ok) return 11;
        pid_t nobody = 0;
        if (!page->inside[d].compare_exchange_strong(nobody, ::getpid())) page->violations.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
        page->inside[d].store(0);
        if (mine.release() != ok) return 12;
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
      }
      return 0;
    }));
  }
  for (pid_t pid : pids) EXPECT_EQ(reap(pid), 0);
  page->stop.store(1);
  for (pid_t pid : singles) EXPECT_EQ(reap(pid), 0);
  EXPECT_EQ(page->violations.load(), 0);
  EXPECT_EQ(page->apart.load(), 0);
  free_shared_object(page);
}

// A rank killed while its gang is queued: the others leave with an error naming it, the
// devices keep working, and the job's next incarnation (all ranks new) starts clean.
TEST_F(Gang, ARankThatDiesBreaksItsGangWithAClearError) {
  std::vector<device_lock> locks;
  ASSERT_EQ(open_all({0, 1, 2}, &locks), ok);
  ASSERT_EQ(locks[0].acquire(), ok);  // the gang cannot be granted while we hold device 0
  const std::string job = "dies-" + prefix_;
  auto* page = shared_object<rank_page>();
  std::vector<pid_t> survivors;
  for (uint32_t r = 0; r < 2; ++r) {
    survivors.push_back(spawn([&, r] {
      std::unique_ptr<rank_gang> gang;
      if (rank_gang::open(job, r, 3, &gang) != ok) return 10;
      device_lock mine;
      if (device_lock::open(key(static_cast<int>(r)), &mine) != ok) return 11;
      const int rc = gang->acquire(mine, lock_priority::normal, 20'000'000'000);
      if (rc != err_owner_died) {
        std::fprintf(stderr, "rank %u: acquire returned %d: %s\n", r, rc, last_error());
        return 12;
      }
      const std::string why = last_error();
      if (why.find("rank 2") == std::string::npos || why.find("died") == std::string::npos ||
          why.find("Restart the whole job") == std::string::npos) {
        std::fprintf(stderr, "rank %u: unclear error: %s\n", r, why.c_str());
        return 13;
      }
      // And the next acquire says so too.
      if (gang->acquire(mine, lock_priority::normal, 1'000'000'000) != err_owner_died) return 14;
      page->joined.fetch_add(1);
      while (page->stop.load() == 0) std::this_thread::sleep_for(1ms);
      return 0;
    }));
  }
  const pid_t victim = spawn([&] {
    std::unique_ptr<rank_gang> gang;
    if (rank_gang::open(job, 2, 3, &gang) != ok) return 10;
    device_lock mine;
    if (device_lock::open(key(2), &mine) != ok) return 11;
    gang->acquire(mine, lock_priority::normal, 20'000'000'000);
    return 12;
  });
  // All three queued: device 2 has the victim's slot in its order, device 0 a gang waiter.
  ASSERT_TRUE(wait_for_queue(locks[0], [](const auto& q) { return queue_has_waiters(q, 1); }));
  ASSERT_TRUE(wait_for_queue(locks[2], [](const auto& q) { return queue_has_waiters(q, 1); }));
  std::this_thread::sleep_for(20ms);
  ::kill(victim, SIGKILL);
  EXPECT_EQ(reap(victim), 128 + SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (page->joined.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(page->joined.load(), 2) << "the surviving ranks did not learn of the death";
  // While survivors are in it, the gang stays broken for a new rank 2.
  std::unique_ptr<rank_gang> late;
  EXPECT_EQ(rank_gang::open(job, 2, 3, &late), err_owner_died);
  page->stop.store(1);
  for (pid_t pid : survivors) EXPECT_EQ(reap(pid), 0);
  ASSERT_EQ(locks[0].release(), ok);
  // The devices work, and nothing of the gang is left in their queues.
  expect_devices_work_with_empty_queues(locks);
  // A new incarnation of the job: a fresh gang.
  EXPECT_EQ(rank_gang::open(job, 2, 3, &late), ok) << last_error();
  free_shared_object(page);
}

TEST_F(Gang, ARankThatNeverJoinsTimesOutNamingIt) {
  std::unique_ptr<rank_gang> gang;
  const std::string job = "alone-" + prefix_;
  ASSERT_EQ(rank_gang::open(job, 0, 3, &gang), ok) << last_error();
  std::unique_ptr<rank_gang> twice;
  EXPECT_EQ(rank_gang::open(job, 0, 3, &twice), err_busy);
  EXPECT_EQ(rank_gang::open(job, 1, 4, &twice), err_invalid_argument) << "another world size";
  EXPECT_EQ(rank_gang::open(job, 3, 3, &twice), err_invalid_argument);
  device_lock mine;
  ASSERT_EQ(device_lock::open(key(0), &mine), ok);
  EXPECT_EQ(gang->acquire(mine, lock_priority::normal, 200'000'000), err_timeout);
  EXPECT_NE(std::string(last_error()).find("ranks 1, 2 of 3 never joined"), std::string::npos) << last_error();
  std::vector<lock_queue_entry> q;
  ASSERT_EQ(mine.snapshot(&q), ok);
  EXPECT_TRUE(q.empty()) << "the rank's slot stayed after its timeout";
}

// The rank that completes the round dies while giving the members their places: the others
// get the error, and every device works afterwards.
TEST_F(Gang, DeathOfTheQueueingRankLeavesEveryDeviceWorking) {
  const std::string job = "queuer-" + prefix_;
  auto* page = shared_object<rank_page>();
  const pid_t first = spawn([&] {
    std::unique_ptr<rank_gang> gang;
    if (rank_gang::open(job, 0, 2, &gang) != ok) return 10;
    device_lock mine;
    if (device_lock::open(key(0), &mine) != ok) return 11;
    page->joined.store(1);
    const int rc = gang->acquire(mine, lock_priority::normal, 20'000'000'000);
    return rc == err_owner_died ? 0 : 12;
  });
  std::vector<device_lock> locks;
  ASSERT_EQ(open_all({0, 1}, &locks), ok);
  ASSERT_TRUE(wait_for_queue(locks[0], [](const auto& q) { return queue_has_waiters(q, 1); }));
  const pid_t queuer = spawn([&] {
    std::unique_ptr<rank_gang> gang;
    if (rank_gang::open(job, 1, 2, &gang) != ok) return 10;
    device_lock mine;
    if (device_lock::open(key(1), &mine) != ok) return 11;
    g_armed_point = crash_point::gang_queued_one;
    set_crash_hook(kill_self_at_armed_point);
    gang->acquire(mine, lock_priority::normal, 20'000'000'000);
    return 12;
  });
  EXPECT_EQ(reap(queuer), 128 + SIGKILL);
  EXPECT_EQ(reap(first), 0) << "the surviving rank did not get the death as its error";
  expect_devices_work_with_empty_queues(locks);
  free_shared_object(page);
}

}  // namespace
}  // namespace vramswap::detail::lock_test
