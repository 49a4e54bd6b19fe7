// Description: fair turns across real processes (docs/lock.md, "Fair turns"): a holder past
// its VRAMSWAP_MAX_HOLD while another process waits is marked in the segment and warned once
// in its own log; at its next acquire it goes behind every waiter that waited for it, even
// as a high-priority holder, and keeps its place ahead of later arrivals; a repeat offender
// among looping processes neither starves them nor starves itself; an operator's release
// request reaches a holder that polls for it (and sends it VRAMSWAP_RELEASE_SIGNAL); with
// the limit off nothing of this happens. Limits are a few tenths of a second.
#include <fcntl.h>
#include <signal.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "lock_test_support.hpp"

namespace vramswap::detail::lock_test {
namespace {

using namespace std::chrono_literals;

// Exit status of `pid` within `timeout`, else -1 (it is then killed and reaped).
int reap_within(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    std::this_thread::sleep_for(2ms);
  }
  ::kill(pid, SIGKILL);
  reap(pid);
  return -1;
}

// Until `done()` or the timeout; whether it came true.
bool eventually(const std::function<bool()>& done, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return done();
}

bool is_waiting(const std::vector<lock_queue_entry>& q, pid_t pid) {
  for (const auto& e : q) {
    if (e.pid == pid && !e.holding) return true;
  }
  return false;
}

// This process's stderr (its log) goes to `path` from now on.
bool log_to(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  return fd >= 0 && ::dup2(fd, STDERR_FILENO) >= 0;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

constexpr int k_max_grants = 256;

// What the children share with the test.
struct board {
  std::atomic<int> holding{0};   // the first holder has the lock
  std::atomic<int> flagged{0};   // the first holder saw itself marked past its limit
  std::atomic<int> release{0};   // the test lets the first holder release
  std::atomic<int> stop{0};      // loops end
  std::atomic<int> grants{0};
  int order[k_max_grants];       // who was granted, in order (a child's own number)
  std::atomic<int> over_while_holding{0};
  std::atomic<uint64_t> since_ns{0};
  std::atomic<uint64_t> granted_ns{0};
  std::atomic<uint64_t> behind_ticket{0};
  std::atomic<int> signals{0};
  char message[512];
};

void note_grant(board* b, int who) {
  const int n = b->grants.fetch_add(1);
  if (n < k_max_grants) b->order[n] = who;
}

class FairTurns : public lock_fixture {
 protected:
  void SetUp() override {
    lock_fixture::SetUp();
    b_ = shared_object<board>();
    log_ = "/tmp/vramswap-fair-turns-" + std::to_string(::getpid()) + "-" + prefix_ + ".log";
  }
  void TearDown() override {
    free_shared_object(b_);
    ::unlink(log_.c_str());
    option_set(option_id::max_hold, nullptr);
    option_set(option_id::release_signal, nullptr);
    lock_fixture::TearDown();
  }

  board* b_ = nullptr;
  std::string log_;  // the first holder's log
};

// A holder past its limit while another process waits: marked in the segment (seen by an
// observer and in the queue), its own log warns once, naming how long and who waits; the
// release does not warn again.
TEST_F(FairTurns, AHolderPastItsLimitWithAWaiterIsFlaggedAndWarnedOnce) {
  device_lock observer;
  ASSERT_EQ(device_lock::open(key_, &observer), ok);
  const pid_t holder = spawn([&] {
    if (!log_to(log_)) return 10;
    option_set(option_id::max_hold, "0.3");
    option_set(option_id::log_level, "warn");
    device_lock mine;
    if (device_lock::open(key_, &mine) != ok) return 11;
    if (mine.acquire() != ok) return 12;
    b_->holding.store(1);
    // Safe points, as the session's service thread makes them, until the test says release.
    while (b_->release.load() == 0) {
      const hold_check h = mine.check_hold();
      if (!h.holding) return 13;
      if (h.over_limit_since_ns != 0) b_->flagged.store(1);
      std::this_thread::sleep_for(20ms);
    }
    return mine.release() == ok ? 0 : 14;
  });
  ASSERT_TRUE(eventually([&] { return b_->holding.load() == 1; }));
  const pid_t waiter = spawn([&] {
    device_lock mine;
    if (device_lock::open(key_, &mine) != ok) return 10;
    if (mine.acquire(lock_priority::normal, 20'000'000'000) != ok) return 11;
    return mine.release() == ok ? 0 : 12;
  });
  ASSERT_TRUE(wait_for_queue(observer, [&](const auto& q) { return is_waiting(q, waiter); }));
  uint64_t since = 0;
  ASSERT_TRUE(eventually([&] { return observer.holder_over_hold_limit(&since); })) << "never marked past its limit";
  ASSERT_TRUE(eventually([&] { return b_->flagged.load() == 1; })) << "the holder's check never saw the mark";
  std::vector<lock_queue_entry> q;
  ASSERT_EQ(observer.snapshot(&q), ok) << last_error();
  ASSERT_FALSE(q.empty());
  ASSERT_TRUE(q[0].holding);
  EXPECT_EQ(q[0].pid, holder);
  EXPECT_EQ(q[0].max_hold_ns, 300'000'000u);
  EXPECT_EQ(q[0].over_limit_since_ns, since);
  EXPECT_GE(since, q[0].granted_ns + 300'000'000u) << "marked before the holder had held for its limit";
  EXPECT_GE(since, q[1].enqueue_ns) << "marked before anyone waited";
  // More safe points pass; the warning stays one.
  std::this_thread::sleep_for(200ms);
  b_->release.store(1);
  EXPECT_EQ(reap_within(holder, 20s), 0);
  EXPECT_EQ(reap_within(waiter, 20s), 0);
  EXPECT_FALSE(observer.holder_over_hold_limit()) << "the mark outlived the hold";
  const std::string text = read_file(log_);
  EXPECT_EQ(count_of(text, "past its VRAMSWAP_MAX_HOLD"), 1u) << "one warning per hold:\n" << text;
  EXPECT_NE(text.find(" warn: lock: this process has held "), std::string::npos) << text;
  EXPECT_NE(text.find("pid " + std::to_string(waiter) + " ("), std::string::npos) << "who waits:\n" << text;
  EXPECT_NE(text.find("queues behind"), std::string::npos) << "what it costs:\n" << text;
}

// A holder past its limit while nobody waits is not marked, nor warned; neither is one with
// the limit off (the default) however long it holds with a waiter.
TEST_F(FairTurns, NoWaiterOrNoLimitMeansNoMark) {
  device_lock observer;
  ASSERT_EQ(device_lock::open(key_, &observer), ok);
  for (const char* limit : std::vector<const char*>{"0.1", nullptr}) {
    SCOPED_TRACE(limit == nullptr ? "limit off" : "nobody waits");
    b_->holding.store(0);
    b_->release.store(0);
    const pid_t holder = spawn([&] {
      if (!log_to(log_)) return 10;
      option_set(option_id::max_hold, limit);
      option_set(option_id::log_level, "warn");
      device_lock mine;
      if (device_lock::open(key_, &mine) != ok) return 11;
      if (mine.acquire() != ok) return 12;
      b_->holding.store(1);
      while (b_->release.load() == 0) {
        if (mine.check_hold().over_limit_since_ns != 0) return 13;
        std::this_thread::sleep_for(20ms);
      }
      return mine.release() == ok ? 0 : 14;
    });
    ASSERT_TRUE(eventually([&] { return b_->holding.load() == 1; }));
    pid_t waiter = 0;
    if (limit == nullptr) {
      waiter = spawn([&] {
        device_lock mine;
        if (device_lock::open(key_, &mine) != ok) return 10;
        if (mine.acquire(lock_priority::normal, 20'000'000'000) != ok) return 11;
        return mine.release() == ok ? 0 : 12;
      });
      ASSERT_TRUE(wait_for_queue(observer, [&](const auto& q) { return is_waiting(q, waiter); }));
    }
    std::this_thread::sleep_for(500ms);
    EXPECT_FALSE(observer.holder_over_hold_limit());
    b_->release.store(1);
    EXPECT_EQ(reap_within(holder, 20s), 0);
    if (waiter != 0) {
      EXPECT_EQ(reap_within(waiter, 20s), 0);
    }
    const std::string text = read_file(log_);
    EXPECT_EQ(count_of(text, "VRAMSWAP_MAX_HOLD"), 0u) << text;
  }
}

// Grant order with a high-priority holder H that holds past its limit while normal waiters
// W1 and W2 wait, releases and at once asks again at high priority, and a high waiter H3 that
// comes after H's new request. With the limit, H goes behind W2 (who waited for it) but
// keeps its place ahead of H3: W1, W2, H, H3. Without it, high goes first: W1, H, H3, W2.
class FairTurnsOrder : public FairTurns, public ::testing::WithParamInterface<bool> {};

TEST_P(FairTurnsOrder, TheNextAcquireQueuesBehindTheWaitersThatWaited) {
  const bool limited = GetParam();
  enum { h = 0, w1 = 1, w2 = 2, h3 = 3 };
  device_lock observer;
  ASSERT_EQ(device_lock::open(key_, &observer), ok);
  const pid_t holder = spawn([&] {
    if (!log_to(log_)) return 10;
    option_set(option_id::max_hold, limited ? "0.3" : nullptr);
    device_lock mine;
    if (device_lock::open(key_, &mine) != ok) return 11;
    if (mine.acquire(lock_priority::high) != ok) return 12;
    b_->holding.store(1);
    while (b_->release.load() == 0) std::this_thread::sleep_for(5ms);
    if (mine.release() != ok) return 13;
    if (mine.acquire(lock_priority::high, 20'000'000'000) != ok) return 14;
    note_grant(b_, h);
    return mine.release() == ok ? 0 : 15;
  });
  ASSERT_TRUE(eventually([&] { return b_->holding.load() == 1; }));
  // W1 holds its turn until H and H3 are queued again, so that the order is decided by the
  // lock alone.
  auto waiter = [&](int who, lock_priority p, size_t hold_until_waiters) {
    return spawn([&, who, p, hold_until_waiters] {
      device_lock mine;
      if (device_lock::open(key_, &mine) != ok) return 10;
      if (mine.acquire(p, 20'000'000'000) != ok) return 11;
      note_grant(b_, who);
      if (hold_until_waiters > 0 &&
          !wait_for_queue(mine, [&](const auto& q) { return queue_has_waiters(q, hold_until_waiters); }, 10000ms)) {
        return 12;
      }
      return mine.release() == ok ? 0 : 13;
    });
  };
  const pid_t first = waiter(w1, lock_priority::normal, 3);
  ASSERT_TRUE(wait_for_queue(observer, [&](const auto& q) { return is_waiting(q, first); }));
  const pid_t second = waiter(w2, lock_priority::normal, 0);
  ASSERT_TRUE(wait_for_queue(observer, [&](const auto& q) { return is_waiting(q, second); }));
  if (limited) {
    ASSERT_TRUE(eventually([&] { return observer.holder_over_hold_limit(); })) << "H never marked past its limit";
  } else {
    std::this_thread::sleep_for(400ms);  // as long as the limited case holds
    EXPECT_FALSE(observer.holder_over_hold_limit());
  }
  b_->release.store(1);
  ASSERT_TRUE(wait_for_queue(observer, [&](const auto& q) { return is_waiting(q, holder); })) << "H did not ask again";
  std::vector<lock_queue_entry> q;
  ASSERT_EQ(observer.snapshot(&q), ok);
  for (const auto& e : q) {
    if (e.pid == holder) {
      EXPECT_EQ(e.behind_ticket != 0, limited) << "H's penalty";
    }
  }
  const pid_t late = waiter(h3, lock_priority::high, 0);
  for (pid_t c : {first, second, late, holder}) EXPECT_EQ(reap_within(c, 20s), 0);
  const std::vector<int> order(b_->order, b_->order + b_->grants.load());
  if (limited) {
    EXPECT_EQ(order, (std::vector<int>{w1, w2, h, h3})) << "H must go behind W2, who waited for it, and before H3, who did not";
  } else {
    EXPECT_EQ(order, (std::vector<int>{w1, h, h3, w2})) << "without a limit the high class goes first";
  }
  EXPECT_EQ(count_of(read_file(log_), "VRAMSWAP_MAX_HOLD"), limited ? 1u : 0u) << read_file(log_);
}

INSTANTIATE_TEST_SUITE_P(LimitOnAndOff, FairTurnsOrder, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Limited" : "Unlimited"; });

// One repeat offender O among three looping workers: each of O's turns is longer than its
// limit. O takes its turns at the priority given; the workers at normal. Between two of O's
// turns every worker gets one (O queues behind them), and O still gets all of its turns.
class FairTurnsOffender : public FairTurns, public ::testing::WithParamInterface<lock_priority> {};

TEST_P(FairTurnsOffender, ARepeatOffenderNeitherStarvesTheOthersNorIsStarved) {
  constexpr int k_turns = 5, k_workers = 3;
  const lock_priority offender_class = GetParam();
  enum { offender = 9 };
  std::vector<pid_t> workers;
  for (int w = 0; w < k_workers; ++w) {
    workers.push_back(spawn([&, w] {
      device_lock mine;
      if (device_lock::open(key_, &mine) != ok) return 10;
      while (b_->stop.load() == 0) {
        const int rc = mine.acquire(lock_priority::normal, 1'000'000'000);
        if (rc == err_timeout) continue;
        if (rc != ok) return 11;
        note_grant(b_, w);
        std::this_thread::sleep_for(5ms);
        if (mine.release() != ok) return 12;
      }
      return 0;
    }));
  }
  const pid_t repeat = spawn([&] {
    option_set(option_id::max_hold, "0.2");
    option_set(option_id::log_level, "error");
    device_lock mine;
    if (device_lock::open(key_, &mine) != ok) return 10;
    for (int turn = 0; turn < k_turns; ++turn) {
      if (mine.acquire(offender_class, 30'000'000'000) != ok) return 11;
      note_grant(b_, offender);
      std::this_thread::sleep_for(300ms);
      if (mine.release() != ok) return 12;
    }
    return 0;
  });
  EXPECT_EQ(reap_within(repeat, 60s), 0) << "the offender did not get its " << k_turns << " turns: starved";
  b_->stop.store(1);
  for (pid_t w : workers) EXPECT_EQ(reap_within(w, 20s), 0);
  // Each worker's turns before the offender's last one.
  const int n = std::min(b_->grants.load(), k_max_grants);
  int last = -1;
  for (int i = 0; i < n; ++i) {
    if (b_->order[i] == offender) last = i;
  }
  ASSERT_GE(last, 0);
  std::string order;
  int turns[k_workers] = {};
  for (int i = 0; i < n; ++i) {
    order += (b_->order[i] == offender ? std::string("O") : std::to_string(b_->order[i])) + " ";
    if (i < last && b_->order[i] != offender) ++turns[b_->order[i]];
  }
  for (int w = 0; w < k_workers; ++w) {
    EXPECT_GE(turns[w], k_turns - 2) << "worker " << w << " got " << turns[w] << " turns during the offender's " << k_turns
                                     << "; grant order: " << order;
  }
}

INSTANTIATE_TEST_SUITE_P(Classes, FairTurnsOffender, ::testing::Values(lock_priority::high, lock_priority::normal),
                         [](const ::testing::TestParamInfo<lock_priority>& p) {
                           return p.param == lock_priority::high ? "High" : "Normal";
                         });

volatile sig_atomic_t g_release_signals = 0;
void count_release_signal(int) { g_release_signals = g_release_signals + 1; }

// An operator's request reaches a holder that polls for it (check_hold at its safe points):
// the request names the holder; the holder's log says who asked, once; with
// VRAMSWAP_RELEASE_SIGNAL the holder's process gets that signal, once; after the release,
// a request finds nobody to ask.
class FairTurnsRequest : public FairTurns, public ::testing::WithParamInterface<bool> {};

TEST_P(FairTurnsRequest, AReleaseRequestReachesAHolderThatPollsIt) {
  const bool with_signal = GetParam();
  const pid_t holder = spawn([&] {
    if (!log_to(log_)) return 10;
    option_set(option_id::log_level, "warn");
    if (with_signal) {
      option_set(option_id::release_signal, "SIGUSR1");
      struct sigaction sa {};
      sa.sa_handler = count_release_signal;
      sigemptyset(&sa.sa_mask);
      ::sigaction(SIGUSR1, &sa, nullptr);
    }
    device_lock mine;
    if (device_lock::open(key_, &mine) != ok) return 11;
    if (mine.acquire() != ok) return 12;
    b_->holding.store(1);
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (!mine.check_hold().release_requested) {
      if (std::chrono::steady_clock::now() > deadline) return 13;
      std::this_thread::sleep_for(10ms);
    }
    for (int i = 0; i < 5; ++i) mine.check_hold();  // later safe points say nothing new
    b_->signals.store(g_release_signals);
    return mine.release() == ok ? 0 : 14;
  });
  ASSERT_TRUE(eventually([&] { return b_->holding.load() == 1; }));
  device_lock op;
  ASSERT_EQ(device_lock::open(key_, &op), ok);
  release_request_result r;
  ASSERT_EQ(op.request_release(&r), ok) << last_error();
  EXPECT_TRUE(r.held);
  EXPECT_FALSE(r.already_asked);
  EXPECT_EQ(r.pid, holder);
  EXPECT_EQ(r.uid, ::geteuid());
  std::vector<lock_queue_entry> q;
  if (op.snapshot(&q) == ok && !q.empty() && q[0].holding) {
    EXPECT_NE(q[0].release_requested_ns, 0u);
  }
  EXPECT_EQ(reap_within(holder, 20s), 0) << "the holder never saw the request";
  EXPECT_EQ(b_->signals.load(), with_signal ? 1 : 0);
  const std::string text = read_file(log_);
  EXPECT_EQ(count_of(text, "asked this process to release"), 1u) << text;
  EXPECT_NE(text.find("pid " + std::to_string(::getpid()) + " ("), std::string::npos) << "who asked:\n" << text;
  EXPECT_NE(text.find("Nothing is taken from it"), std::string::npos) << text;
  ASSERT_EQ(op.request_release(&r), ok) << last_error();
  EXPECT_FALSE(r.held) << "nobody holds the lock now";
}

INSTANTIATE_TEST_SUITE_P(PollAndSignal, FairTurnsRequest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "WithSignal" : "Polled"; });

}  // namespace
}  // namespace vramswap::detail::lock_test
