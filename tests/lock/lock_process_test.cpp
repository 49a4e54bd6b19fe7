// Description: the lock across real processes: exact FIFO grant order under 16 contenders,
// priority classes, mutual exclusion (8 processes x 10,000 non-atomic increments), a
// holder or waiter killed with SIGKILL, and a process killed at each named point inside
// the lock's own critical sections.
#include <fcntl.h>
#include <signal.h>

#include <cstring>
#include <fstream>

#include "core/log.hpp"
#include "lock/crash_points.hpp"
#include "lock_test_support.hpp"

namespace vramswap::detail::lock_test {
namespace {

using namespace std::chrono_literals;

constexpr int k_max_contenders = 64;

// Grant order as seen by the contenders: each appends its index when granted.
struct grant_log {
  std::atomic<int> count{0};
  int order[k_max_contenders];
  std::atomic<int> failures{0};
  char failure[256];
};

class LockProcesses : public lock_fixture {
 protected:
  // A waiter in a process of its own with VRAMSWAP_WAIT_NOTICE=1, its log (warn) in
  // `log_path`: runs `waits` with its own opening of the lock; its exit status is what
  // `waits` returns (10, 11: it could not start).
  pid_t spawn_noticing_waiter(const std::string& log_path, const std::function<int(device_lock&)>& waits) {
    return spawn([&] {
      const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd < 0 || ::dup2(fd, 2) < 0) return 10;
      option_set(option_id::wait_notice, "1");
      option_set(option_id::log_level, "warn");
      device_lock mine;
      if (device_lock::open(key_, &mine) != ok) return 11;
      return waits(mine);
    });
  }
  // The wait notices in the log at `log_path`, which goes.
  static std::vector<std::string> wait_notices(const std::string& log_path) {
    std::ifstream in(log_path);
    std::vector<std::string> notices;
    for (std::string line; std::getline(in, line);) {
      if (line.find("lock: waiting ") != std::string::npos) notices.push_back(line);
    }
    ::unlink(log_path.c_str());
    return notices;
  }
  // Start `n` contenders one after another, each fully enqueued before the next starts,
  // while the test holds the lock; then release and collect the grant order.
  std::vector<int> grant_order(device_lock& lock, const std::vector<lock_priority>& classes) {
    auto* log = shared_object<grant_log>();
    EXPECT_EQ(lock.acquire(), ok) << last_error();
    std::vector<pid_t> children;
    for (size_t i = 0; i < classes.size(); ++i) {
      children.push_back(spawn([&, i] {
        device_lock mine;
        if (device_lock::open(key_, &mine) != ok) return 10;
        if (mine.acquire(classes[i], 10'000'000'000) != ok) return 11;
        log->order[log->count.fetch_add(1)] = static_cast<int>(i);
        return mine.release() == ok ? 0 : 12;
      }));
      EXPECT_TRUE(wait_for_queue(lock, [&](const auto& q) { return queue_has_waiters(q, i + 1); }))
          << "contender " << i << " never showed up in the queue";
    }
    EXPECT_EQ(lock.release(), ok);
    for (pid_t c : children) EXPECT_EQ(reap(c), 0);
    std::vector<int> order(log->order, log->order + log->count.load());
    free_shared_object(log);
    return order;
  }
};

TEST_F(LockProcesses, GrantOrderIsExactlyFifoUnder16Contenders) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  const std::vector<lock_priority> classes(16, lock_priority::normal);
  const std::vector<int> order = grant_order(lock, classes);
  std::vector<int> expected(16);
  for (int i = 0; i < 16; ++i) expected[i] = i;
  EXPECT_EQ(order, expected);
}

TEST_F(LockProcesses, HighClassGoesFirstAndEachClassIsFifo) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  std::vector<lock_priority> classes;
  for (int i = 0; i < 16; ++i) classes.push_back(i % 3 == 1 ? lock_priority::high : lock_priority::normal);
  const std::vector<int> order = grant_order(lock, classes);
  std::vector<int> expected;
  for (int i = 0; i < 16; ++i) {
    if (classes[i] == lock_priority::high) expected.push_back(i);
  }
  for (int i = 0; i < 16; ++i) {
    if (classes[i] == lock_priority::normal) expected.push_back(i);
  }
  EXPECT_EQ(order, expected);
}

struct counter_page {
  volatile uint64_t counter;  // incremented non-atomically, only inside the lock
  std::atomic<int> start{0};
};

TEST_F(LockProcesses, MutualExclusion8ProcessesX10000Increments) {
  constexpr int k_processes = 8;
  constexpr int k_increments = 10'000;
  auto* page = shared_object<counter_page>();
  std::vector<pid_t> children;
  for (int p = 0; p < k_processes; ++p) {
    children.push_back(spawn([&] {
      device_lock lock;
      if (device_lock::open(key_, &lock) != ok) return 10;
      while (page->start.load() == 0) std::this_thread::yield();
      for (int i = 0; i < k_increments; ++i) {
        if (lock.acquire() != ok) return 11;
        const uint64_t v = page->counter;  // read-modify-write in two steps on purpose
        page->counter = v + 1;
        if (lock.release() != ok) return 12;
      }
      return 0;
    }));
  }
  page->start.store(1);
  for (pid_t c : children) EXPECT_EQ(reap(c), 0);
  EXPECT_EQ(page->counter, uint64_t{k_processes} * k_increments);
  free_shared_object(page);
}

struct death_report {
  std::atomic<int> holding{0};
  std::atomic<int> granted{0};
  std::atomic<uint64_t> grant_ns{0};
  std::atomic<int> previous_holder_died{0};
  std::atomic<int> dead_holder_pid{0};
};

// A process that takes the lock of `key`, says so in `report`, and holds it until it is
// killed; returns once it holds.
pid_t start_holder(const std::string& key, death_report* report) {
  const pid_t holder = spawn([&] {
    device_lock mine;
    if (device_lock::open(key, &mine) != ok || mine.acquire() != ok) return 10;
    report->holding.store(1);
    for (;;) ::pause();
  });
  while (report->holding.load() == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  return holder;
}

TEST_F(LockProcesses, HolderKilledPassesTheLockOnWithin100ms) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  auto* report = shared_object<death_report>();
  const pid_t holder = start_holder(key_, report);
  const pid_t waiter = spawn([&] {
    device_lock mine;
    acquire_info info;
    if (device_lock::open(key_, &mine) != ok || mine.acquire(lock_priority::normal, 5'000'000'000, &info) != ok) return 10;
    report->grant_ns.store(monotonic_ns());
    report->previous_holder_died.store(info.previous_holder_died ? 1 : 0);
    report->dead_holder_pid.store(info.dead_holder_pid);
    return mine.release() == ok ? 0 : 11;
  });
  ASSERT_TRUE(wait_for_queue(lock, [](const auto& q) { return queue_has_waiters(q, 1); }));
  std::this_thread::sleep_for(20ms);  // let the waiter settle into its futex sleep
  const uint64_t killed_ns = monotonic_ns();
  ASSERT_EQ(::kill(holder, SIGKILL), 0);
  EXPECT_EQ(reap(holder), 128 + SIGKILL);
  EXPECT_EQ(reap(waiter), 0);
  const double recovery_ms = static_cast<double>(report->grant_ns.load() - killed_ns) / 1e6;
  std::printf("recovery after holder SIGKILL: %.2f ms\n", recovery_ms);
  EXPECT_LT(recovery_ms, 100.0);
  EXPECT_EQ(report->previous_holder_died.load(), 1);
  EXPECT_EQ(report->dead_holder_pid.load(), holder);
  // The lock is free and the queue empty again.
  ASSERT_EQ(lock.try_acquire(), ok) << last_error();
  ASSERT_EQ(lock.release(), ok);
  free_shared_object(report);
}

// The waiter that repairs after a holder's death logs it ("holder ... died holding the
// lock"), and its stderr is a pipe nobody reads (a parent that reads only stdout): the write
// blocks. It must not block inside the internal mutex, or nobody could take, hand on or
// look at the lock again. The lines of a critical section are written after it.
TEST_F(LockProcesses, AWaiterWhoseStderrIsStuckDoesNotKeepTheInternalMutex) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  auto* report = shared_object<death_report>();
  int stuck[2];
  ASSERT_EQ(::pipe2(stuck, O_CLOEXEC), 0);
  ASSERT_EQ(::fcntl(stuck[1], F_SETFL, O_NONBLOCK), 0);
  static char fill[4096];
  while (::write(stuck[1], fill, sizeof fill) > 0) {
  }
  ASSERT_EQ(::fcntl(stuck[1], F_SETFL, 0), 0);  // full, and blocking from now on
  const pid_t holder = start_holder(key_, report);
  const pid_t waiter = spawn([&] {
    if (::dup2(stuck[1], STDERR_FILENO) < 0) return 12;
    ::setenv("VRAMSWAP_LOG", "warn", 1);
    log_set_default_level(log_level::warn);  // read VRAMSWAP_LOG again
    device_lock mine;
    if (device_lock::open(key_, &mine) != ok || mine.acquire() != ok) return 10;
    return mine.release() == ok ? 0 : 11;
  });
  ASSERT_TRUE(wait_for_queue(lock, [](const auto& q) { return queue_has_waiters(q, 1); }));
  std::this_thread::sleep_for(20ms);
  ASSERT_EQ(::kill(holder, SIGKILL), 0);
  EXPECT_EQ(reap(holder), 128 + SIGKILL);
  std::this_thread::sleep_for(200ms);  // the waiter repairs, logs, and is stuck on its stderr
  std::vector<lock_queue_entry> queue;
  EXPECT_EQ(lock.snapshot(&queue, 1'000'000'000), ok) << "the internal mutex stayed taken: " << last_error();
  ::kill(waiter, SIGKILL);
  reap(waiter);
  ::close(stuck[0]);
  ::close(stuck[1]);
  free_shared_object(report);
}

// A holder killed while nobody waits (no waiter's liveness scan, no pool server to repair):
// a try, and an acquire shorter than a scan, find it dead themselves and get the lock, instead
// of being refused for good.
TEST_F(LockProcesses, ATryFindsADeadHolderGoneAndTakesTheLock) {
  for (const int64_t timeout_ns : {int64_t{0}, int64_t{2'000'000}}) {
    auto* report = shared_object<death_report>();
    const pid_t holder = start_holder(key_, report);
    ASSERT_EQ(::kill(holder, SIGKILL), 0);
    EXPECT_EQ(reap(holder), 128 + SIGKILL);
    device_lock lock;
    ASSERT_EQ(device_lock::open(key_, &lock), ok);
    acquire_info info;
    EXPECT_EQ(lock.acquire(lock_priority::normal, timeout_ns, &info), ok) << "timeout " << timeout_ns << " ns: " << last_error();
    EXPECT_TRUE(info.previous_holder_died);
    if (lock.held()) {
      EXPECT_EQ(lock.release(), ok);
    }
    free_shared_object(report);
  }
}

TEST_F(LockProcesses, KilledWaiterLeavesTheQueueAndOrderHolds) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  auto* log = shared_object<grant_log>();
  ASSERT_EQ(lock.acquire(), ok);
  std::vector<pid_t> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.push_back(spawn([&, i] {
      device_lock mine;
      if (device_lock::open(key_, &mine) != ok || mine.acquire() != ok) return 10;
      log->order[log->count.fetch_add(1)] = i;
      return mine.release() == ok ? 0 : 11;
    }));
    ASSERT_TRUE(wait_for_queue(lock, [&](const auto& q) { return queue_has_waiters(q, waiters.size()); }));
  }
  ASSERT_EQ(::kill(waiters[1], SIGKILL), 0);
  EXPECT_EQ(reap(waiters[1]), 128 + SIGKILL);
  // The liveness scan removes the dead entry (here run at once, as waiters do every 10 ms).
  ASSERT_EQ(lock.repair_now(), ok);
  std::vector<lock_queue_entry> q;
  ASSERT_EQ(lock.snapshot(&q), ok);
  ASSERT_EQ(q.size(), 3u);
  for (const auto& e : q) EXPECT_NE(e.pid, waiters[1]) << "the dead waiter is still queued";
  EXPECT_EQ(q[1].pid, waiters[0]);
  EXPECT_EQ(q[2].pid, waiters[2]);
  ASSERT_EQ(lock.release(), ok);
  EXPECT_EQ(reap(waiters[0]), 0);
  EXPECT_EQ(reap(waiters[2]), 0);
  ASSERT_EQ(log->count.load(), 2);
  EXPECT_EQ(log->order[0], 0);
  EXPECT_EQ(log->order[1], 2);
  free_shared_object(log);
}

TEST_F(LockProcesses, TimeoutAcrossProcesses) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  ASSERT_EQ(lock.acquire(), ok);
  const pid_t child = spawn([&] {
    device_lock mine;
    if (device_lock::open(key_, &mine) != ok) return 10;
    if (mine.try_acquire() != err_busy) return 11;
    const uint64_t t0 = monotonic_ns();
    if (mine.acquire(lock_priority::high, 30'000'000) != err_timeout) return 12;
    const uint64_t waited = monotonic_ns() - t0;
    if (waited < 30'000'000 || waited > 2'000'000'000) return 13;
    return 0;
  });
  EXPECT_EQ(reap(child), 0);
  std::vector<lock_queue_entry> q;
  ASSERT_EQ(lock.snapshot(&q), ok);
  EXPECT_EQ(q.size(), 1u);
  ASSERT_EQ(lock.release(), ok);
}

// --- a process stopped inside the internal mutex; an interrupted wait --------------------

struct stop_report {
  std::atomic<int> done{0};
  std::atomic<int> rc{0};
  std::atomic<uint64_t> waited_ns{0};
  std::atomic<int> try_rc{0};
  std::atomic<uint64_t> try_ns{0};
  char message[1024];
};

crash_point g_stop_point = crash_point::count_;
void stop_self_at_point(crash_point point) {
  if (point == g_stop_point) ::raise(SIGSTOP);
}

bool becomes_stopped(pid_t pid, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (is_stopped_state(process_state(pid))) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

// Wait for `pid` at most `timeout`; -1 (and the child left running) when it did not exit.
int reap_within(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    std::this_thread::sleep_for(2ms);
  }
  return -1;
}

// A process stopped (SIGSTOP) while it holds the lock's internal mutex: a 1 s timed acquire
// still returns in about 1 s, with an error that names the stopped process; a try returns
// at once; the holder's release does not hang either; once resumed, the stopped process
// gets its turn.
TEST_F(LockProcesses, StoppedInsideTheInternalMutexBoundsEveryWait) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  ASSERT_EQ(lock.acquire(), ok);
  const pid_t victim = spawn([&] {
    device_lock mine;
    if (device_lock::open(key_, &mine) != ok) return 10;
    g_stop_point = crash_point::enqueue_published;
    set_crash_hook(stop_self_at_point);
    if (mine.acquire(lock_priority::normal, 60'000'000'000) != ok) return 11;
    return mine.release() == ok ? 0 : 12;
  });
  ASSERT_TRUE(becomes_stopped(victim)) << "the victim never stopped inside the mutex";
  auto* report = shared_object<stop_report>();
  const pid_t waiter = spawn([&] {
    device_lock mine;
    if (device_lock::open(key_, &mine) != ok) return 10;
    uint64_t t0 = monotonic_ns();
    report->try_rc.store(mine.try_acquire());
    report->try_ns.store(monotonic_ns() - t0);
    t0 = monotonic_ns();
    const int rc = mine.acquire(lock_priority::normal, 1'000'000'000);
    report->waited_ns.store(monotonic_ns() - t0);
    report->rc.store(rc);
    std::snprintf(report->message, sizeof report->message, "%s", last_error());
    report->done.store(1);
    return 0;
  });
  const int waiter_status = reap_within(waiter, 20s);
  EXPECT_EQ(waiter_status, 0) << "a 1 s timed acquire did not return within 20 s while a process is stopped in the mutex";
  if (waiter_status == 0) {
    EXPECT_EQ(report->try_rc.load(), err_busy);
    EXPECT_LT(report->try_ns.load(), 2'000'000'000u);
    EXPECT_EQ(report->rc.load(), err_timeout) << report->message;
    EXPECT_GE(report->waited_ns.load(), 1'000'000'000u);
    EXPECT_LT(report->waited_ns.load(), 4'000'000'000u) << "a 1 s timed acquire took " << report->waited_ns.load() / 1e9 << " s";
    const std::string message = report->message;
    EXPECT_NE(message.find("pid " + std::to_string(victim)), std::string::npos) << message;
    EXPECT_NE(message.find("stopped"), std::string::npos) << message;
    EXPECT_NE(message.find("kill -CONT " + std::to_string(victim)), std::string::npos) << message;
  }
  // The holder's release must not hang on the stuck mutex either.
  const uint64_t t0 = monotonic_ns();
  EXPECT_EQ(lock.release(), ok) << last_error();
  EXPECT_LT(monotonic_ns() - t0, 4'000'000'000u);
  ::kill(victim, SIGCONT);
  if (waiter_status < 0) {
    ::kill(waiter, SIGKILL);
    reap(waiter);
  }
  EXPECT_EQ(reap_within(victim, 20s), 0) << "the resumed victim did not get its turn";
  std::vector<lock_queue_entry> q;
  ASSERT_EQ(lock.snapshot(&q), ok) << last_error();
  EXPECT_TRUE(q.empty());
  ASSERT_EQ(lock.acquire(lock_priority::normal, 5'000'000'000), ok) << last_error();
  ASSERT_EQ(lock.release(), ok);
  free_shared_object(report);
}

// A timeout names the holder and the waiters ahead.
TEST_F(LockProcesses, TimeoutNamesTheHolderAndTheWaitersAhead) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  ASSERT_EQ(lock.acquire(), ok);
  const pid_t ahead = spawn([&] {
    device_lock mine;
    if (device_lock::open(key_, &mine) != ok) return 10;
    return mine.acquire(lock_priority::normal, 30'000'000'000) == ok && mine.release() == ok ? 0 : 11;
  });
  ASSERT_TRUE(wait_for_queue(lock, [](const auto& q) { return queue_has_waiters(q, 1); }));
  device_lock other;
  ASSERT_EQ(device_lock::open(key_, &other), ok);
  std::string message;
  std::thread t([&] {
    EXPECT_EQ(other.acquire(lock_priority::normal, 50'000'000), err_timeout);
    message = last_error();
  });
  t.join();
  EXPECT_NE(message.find("held by pid " + std::to_string(::getpid())), std::string::npos) << message;
  EXPECT_NE(message.find("waiters ahead: pid " + std::to_string(ahead)), std::string::npos) << message;
  ASSERT_EQ(lock.release(), ok);
  EXPECT_EQ(reap(ahead), 0);
}

// A holder that forks keeps its lock: the fork does not make its segment (and its leases)
// someone else's, and a waiter in another process must not take it for dead.
TEST_F(LockProcesses, AHolderThatForksKeepsItsLock) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  ASSERT_EQ(lock.acquire(), ok);
  const pid_t child = spawn([] { return 0; });  // a fork (that exits at once, as fork+exec's child does)
  EXPECT_EQ(reap(child), 0);
  ASSERT_EQ(lock.acquire(), ok) << "re-entry after a fork: " << last_error();
  const pid_t waiter = spawn([&] {
    device_lock mine;
    if (device_lock::open(key_, &mine) != ok) return 10;
    // Long enough for several liveness scans: a holder taken for dead would be passed over.
    return mine.acquire(lock_priority::normal, 300'000'000) == err_timeout ? 0 : 11;
  });
  EXPECT_EQ(reap(waiter), 0) << "a waiter got the lock of a live holder that had forked";
  ASSERT_EQ(lock.release(), ok);
  ASSERT_EQ(lock.release(), ok) << last_error();
}

// A holder killed while a child it forked lives on: the child shares the holder's mapping of
// the segment, not its leases, so the lock passes on at once.
TEST_F(LockProcesses, AHolderKilledWhileItsForkedChildLivesPassesTheLockOn) {
  auto* child_pid = shared_object<std::atomic<pid_t>>();
  const pid_t holder = spawn([&] {
    device_lock mine;
    if (device_lock::open(key_, &mine) != ok || mine.acquire() != ok) return 10;
    const pid_t c = ::fork();
    if (c == 0) {
      for (;;) ::pause();
    }
    child_pid->store(c);
    for (;;) ::pause();
  });
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  ASSERT_TRUE(wait_for_queue(lock, [](const auto& q) { return !q.empty() && q.front().holding; })) << "the holder never held";
  for (int i = 0; i < 500 && child_pid->load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_GT(child_pid->load(), 0);
  ASSERT_EQ(::kill(holder, SIGKILL), 0);
  reap(holder);
  EXPECT_EQ(::kill(child_pid->load(), 0), 0) << "the holder's child lives on";
  acquire_info info;
  EXPECT_EQ(lock.acquire(lock_priority::normal, 2'000'000'000, &info), ok)
      << "the lock of a killed holder stays held while its forked child lives: " << last_error();
  EXPECT_TRUE(info.previous_holder_died);
  if (lock.held()) {
    EXPECT_EQ(lock.release(), ok);
  }
  ::kill(child_pid->load(), SIGKILL);
  free_shared_object(child_pid);
}

// A long wait says once, after VRAMSWAP_WAIT_NOTICE seconds, whom it waits for: the holder's
// pid, command and user, and for how long it has held the lock.
TEST_F(LockProcesses, ALongWaitSaysOnceWhoHoldsTheLock) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  ASSERT_EQ(lock.acquire(), ok);
  const std::string log_path = "/tmp/vramswap-wait-notice-" + std::to_string(::getpid()) + ".log";
  const pid_t waiter = spawn_noticing_waiter(log_path, [](device_lock& mine) {
    return mine.acquire(lock_priority::normal, 3'000'000'000) == err_timeout ? 0 : 12;
  });
  EXPECT_EQ(reap_within(waiter, 20s), 0);
  const std::vector<std::string> lines = wait_notices(log_path);
  std::string notices;
  for (const std::string& l : lines) notices += l + "\n";
  EXPECT_EQ(lines.size(), 1u) << "one notice per wait, after 1 s of a 3 s wait:\n" << notices;
  EXPECT_NE(notices.find("held by pid " + std::to_string(::getpid()) + " ("), std::string::npos) << notices;
  EXPECT_NE(notices.find(" of uid " + std::to_string(::geteuid())), std::string::npos) << "the holder's user:\n" << notices;
  EXPECT_NE(notices.find(" for "), std::string::npos) << "how long it has held the lock:\n" << notices;
  EXPECT_NE(notices.find("VRAMSWAP_WAIT_NOTICE"), std::string::npos) << "the setting that made it speak:\n" << notices;
  ASSERT_EQ(lock.release(), ok);
}

// A job whose every turn waits past VRAMSWAP_WAIT_NOTICE (several jobs on one device) logs it
// at most every six notice times, and the next notice counts the waits held back: not a line
// per turn for days. Here: four waits of 1.5 s with a notice time of 1 s; the first three
// come within 6 s of the first notice, the fourth after.
TEST_F(LockProcesses, WaitNoticesComeAtMostEverySixNoticeTimesWithACount) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  ASSERT_EQ(lock.acquire(), ok);
  const std::string log_path = "/tmp/vramswap-wait-notices-" + std::to_string(::getpid()) + ".log";
  const pid_t waiter = spawn_noticing_waiter(log_path, [](device_lock& mine) {
    for (int i = 0; i < 4; ++i) {
      if (i == 3) std::this_thread::sleep_for(2s);
      if (mine.acquire(lock_priority::normal, 1'500'000'000) != err_timeout) return 12;
    }
    return 0;
  });
  EXPECT_EQ(reap_within(waiter, 30s), 0);
  const std::vector<std::string> notices = wait_notices(log_path);
  ASSERT_EQ(notices.size(), 2u) << "the first wait's notice and the fourth's";
  EXPECT_EQ(notices[0].find("more wait(s)"), std::string::npos) << notices[0];
  EXPECT_NE(notices[1].find("; 2 more wait(s) that long since the last notice"), std::string::npos) << notices[1];
  EXPECT_NE(notices[1].find("at most every 6 s"), std::string::npos) << notices[1];
  ASSERT_EQ(lock.release(), ok);
}

volatile sig_atomic_t g_signals = 0;
void count_signal(int) { g_signals = g_signals + 1; }

// An acquire with a wait_interrupt that stops on a signal: SIGUSR1 to the waiting process
// makes it leave the queue at once with err_interrupted; the next waiter is granted next.
TEST_F(LockProcesses, InterruptedWaiterLeavesTheQueue) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  ASSERT_EQ(lock.acquire(), ok);
  auto* report = shared_object<stop_report>();
  const pid_t child = spawn([&] {
    struct sigaction sa {};
    sa.sa_handler = count_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // futex waits return EINTR anyway
    ::sigaction(SIGUSR1, &sa, nullptr);
    device_lock mine;
    if (device_lock::open(key_, &mine) != ok) return 10;
    // Stop once the handler has run, as a caller with its own pending-signal flag does
    // (Python's): a signal that lands while the waiter is not inside its futex wait (between
    // its enqueue and the wait, or while it spins) interrupts no system call, and is seen at
    // the waiter's next check of the flag instead.
    const scoped_wait_interrupt on_signal({[](void*, bool) { return g_signals > 0; }, nullptr});
    const int rc = mine.acquire();
    report->rc.store(rc);
    std::snprintf(report->message, sizeof report->message, "%s", last_error());
    report->done.store(1);
    return g_signals > 0 ? 0 : 20;
  });
  ASSERT_TRUE(wait_for_queue(lock, [](const auto& q) { return queue_has_waiters(q, 1); }));
  ::kill(child, SIGUSR1);
  const int status = reap_within(child, 10s);
  EXPECT_EQ(status, 0) << "the signalled waiter did not return";
  if (status < 0) {
    ::kill(child, SIGKILL);
    reap(child);
  }
  EXPECT_EQ(report->rc.load(), err_interrupted) << report->message;
  std::vector<lock_queue_entry> q;
  ASSERT_EQ(lock.snapshot(&q), ok);
  EXPECT_EQ(q.size(), 1u) << "the interrupted waiter is still queued";
  ASSERT_EQ(lock.release(), ok);
  free_shared_object(report);
}

// --- a death at each named point of the lock's critical sections ----------------------

crash_point g_armed_point = crash_point::count_;
void kill_self_at_armed_point(crash_point point) {
  if (point == g_armed_point) ::raise(SIGKILL);
}

class CrashPoint : public lock_fixture, public ::testing::WithParamInterface<crash_point> {};

// The victim walks through every critical section: a repair, a try_acquire that fails
// (enqueue, then leave), a release request to the test (which holds the lock), a blocking
// acquire during which its liveness scans mark the test's hold past its short limit, and a
// release that hands the lock to a waiting helper. It kills itself at the armed point; the
// helper and the test must then get the lock, and the queue must be clean and FIFO.
TEST_P(CrashPoint, DeathThereLeavesTheLockWorking) {
  const crash_point point = GetParam();
  device_lock lock;
  option_set(option_id::max_hold, "0.05");  // the test's own hold, marked by the waiting victim
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  option_set(option_id::max_hold, nullptr);
  auto* report = shared_object<death_report>();
  ASSERT_EQ(lock.acquire(), ok);
  const pid_t victim = spawn([&] {
    device_lock mine;
    if (device_lock::open(key_, &mine) != ok) return 10;
    g_armed_point = point;
    set_crash_hook(kill_self_at_armed_point);
    if (mine.repair_now() != ok) return 11;
    if (mine.try_acquire() != err_busy) return 12;
    release_request_result asked;
    if (mine.request_release(&asked) != ok || !asked.held) return 15;
    if (mine.acquire() != ok) return 13;
    report->holding.store(1);
    if (mine.release() != ok) return 14;
    return 0;
  });
  // Wait until the victim is dead or queued behind us.
  bool victim_dead = false;
  int victim_status = -1;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  std::vector<lock_queue_entry> q;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(victim, &status, WNOHANG) == victim) {
      victim_dead = true;
      victim_status = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
      break;
    }
    ASSERT_EQ(lock.snapshot(&q), ok) << last_error();
    if (queue_has_waiters(q, 1)) break;
    std::this_thread::sleep_for(200us);
  }
  // Before anyone else waits: the victim's scans mark our hold (past 50 ms) or it dies there.
  while (!victim_dead && std::chrono::steady_clock::now() < deadline + 5s && !lock.holder_over_hold_limit()) {
    int status = 0;
    if (::waitpid(victim, &status, WNOHANG) == victim) {
      victim_dead = true;
      victim_status = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    }
    std::this_thread::sleep_for(200us);
  }
  const pid_t helper = spawn([&] {
    device_lock mine;
    acquire_info info;
    if (device_lock::open(key_, &mine) != ok) return 10;
    if (mine.acquire(lock_priority::normal, 5'000'000'000, &info) != ok) return 11;
    report->previous_holder_died.store(info.previous_holder_died ? 1 : 0);
    return mine.release() == ok ? 0 : 12;
  });
  ASSERT_TRUE(wait_for_queue(lock, [&](const auto& queue) {
    for (const auto& e : queue) {
      if (e.pid == helper) return true;
    }
    return false;
  })) << "helper never queued (lock stuck at " << crash_point_name(point) << "?)";
  ASSERT_EQ(lock.release(), ok) << last_error();
  if (!victim_dead) victim_status = reap(victim);
  EXPECT_EQ(victim_status, 128 + SIGKILL) << "the victim never reached " << crash_point_name(point);
  EXPECT_EQ(reap(helper), 0) << "the helper did not get the lock after a death at " << crash_point_name(point);
  ASSERT_EQ(lock.acquire(lock_priority::normal, 2'000'000'000), ok) << last_error();
  ASSERT_EQ(lock.repair_now(), ok);
  ASSERT_EQ(lock.snapshot(&q), ok);
  EXPECT_EQ(q.size(), 1u) << "entries of the dead victim remain after a death at " << crash_point_name(point);
  ASSERT_EQ(lock.release(), ok);
  free_shared_object(report);
}

INSTANTIATE_TEST_SUITE_P(EveryPoint, CrashPoint,
                         ::testing::Values(crash_point::enqueue_slot_filled, crash_point::enqueue_published,
                                           crash_point::grant_state_stored, crash_point::grant_before_wake,
                                           crash_point::release_slot_freed, crash_point::timeout_slot_freed,
                                           crash_point::recovery_midway, crash_point::over_limit_marked,
                                           crash_point::release_request_stored),
                         [](const ::testing::TestParamInfo<crash_point>& param) { return crash_point_name(param.param); });

}  // namespace
}  // namespace vramswap::detail::lock_test
