// Time-sharing end to end, with real processes: session_worker clients take turns on one
// device whose pool holds only one of them at a time, checking every byte after every
// acquire; holders and evicting owners are killed with SIGKILL at the moments that matter,
// watched through the pool segment; the survivors must finish with intact data, and no
// frame may leak. Host backend (CI); scripts/device-run.sh runs the same with cuda.
#include <dirent.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "pool/pool_segment.hpp"
#include "lock/process_identity.hpp"
#include "lock/shared_segment.hpp"
#include "support/backends.hpp"
#include "support/deployment.hpp"
#include "support/child_output.hpp"
#include "support/scratch_fs.hpp"
#include "support/signal_files.hpp"

extern char** environ;

namespace vramswap::detail {
namespace {
using namespace pool_layout;
using clock_type = std::chrono::steady_clock;

constexpr uint64_t MiB = 1ull << 20;

class TimeSharing : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = test::backend_under_test();
    std::string key;
    ASSERT_TRUE(test::device0_key(backend_, &key));
    deploy_.create("ts", key,
                   {"VRAMSWAP_BACKEND=" + backend_, "VRAMSWAP_HOST_DEVICE_MEMORY=256MiB", "VRAMSWAP_FRAME_SIZE=2MiB",
                    "VRAMSWAP_POOL_SIZE=" + std::to_string(pool_bytes_), "VRAMSWAP_POOL_IDLE_EXIT=5", "VRAMSWAP_LOG=warn",
                    "VRAMSWAP_SWAP_DIR=/var/tmp"});
  }

  void TearDown() override { deploy_.destroy(); }

  pid_t spawn_worker(uint64_t bytes, int rounds, uint64_t seed, int hold_ms, const std::vector<std::string>& env = {}) {
    return deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(bytes), std::to_string(rounds), std::to_string(seed),
                          std::to_string(hold_ms)}, env);
  }

  bool open_pool(std::unique_ptr<pool_segment>* out, int wait_ms) { return deploy_.open_pool(out, wait_ms); }

  static int wait_status(pid_t pid) {
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    return status;
  }



  // Every frame free again (the server repairs dead members asynchronously).
  void expect_no_frame_leaked(pool_segment& pool) {
    uint32_t free_frames = 0;
    for (int i = 0; i < 400; ++i) {
      free_frames = pool.count(frame_free);
      if (free_frames == pool.frame_count()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(free_frames, pool.frame_count()) << "frames still owned after every client exited";
  }

  uint32_t member_of(pool_segment& pool, pid_t pid) {
    for (uint32_t m = 0; m < k_member_count; ++m) {
      if (pool.member(m).state.load() == member_live && pool.member(m).pid == pid) return m;
    }
    return k_no_member;
  }

  // Every trace event of every member slot (tagged with its process's pid): the rings stay
  // in the segment after their members left.
  static std::vector<pool_segment::trace_event> all_traces(const pool_segment& pool) {
    std::vector<pool_segment::trace_event> out;
    for (uint32_t m = 0; m < k_member_count; ++m) {
      uint64_t cursor = 0;
      pool.read_trace(m, &cursor, &out);
    }
    return out;
  }

  // One acquire, and the other processes whose evictions started
  // while it did (between its grant and its memory being resident): the owners it asked.
  struct turn {
    int32_t pid;
    uint64_t granted_ns, resident_ns;
    std::vector<int32_t> owners;
    std::vector<std::pair<uint64_t, uint64_t>> evictions;  // [start, end) of each owner's eviction
  };
  static std::vector<turn> turns_with_owners(const std::vector<pool_segment::trace_event>& events) {
    std::vector<turn> turns;
    for (const auto& r : events) {
      if (r.kind != trace_resident) continue;
      turn t{r.pid, r.ns, r.ns + r.duration_ns, {}, {}};
      for (const auto& e : events) {
        if (e.kind != trace_evicted || e.pid == r.pid || e.ns < t.granted_ns || e.ns > t.resident_ns) continue;
        if (std::find(t.owners.begin(), t.owners.end(), e.pid) == t.owners.end()) t.owners.push_back(e.pid);
        t.evictions.emplace_back(e.ns, e.ns + e.duration_ns);
      }
      turns.push_back(t);
    }
    return turns;
  }

  uint32_t count_of(pool_segment& pool, frame_state state, pid_t pid) {
    const uint32_t m = member_of(pool, pid);
    return m == k_no_member ? 0 : pool.count(state, m);
  }

  std::string backend_;
  uint64_t pool_bytes_ = 64 * MiB;
  test::deployment deploy_;
};

// Three processes, each holding more than half the pool, take turns many times.
TEST_F(TimeSharing, ThreeProcessesOverHalfThePoolEachTakeTurnsWithEveryByteIntact) {
  std::vector<pid_t> workers;
  for (int i = 0; i < 3; ++i) workers.push_back(spawn_worker(40 * MiB, 12, 100 + i, 1));
  for (pid_t w : workers) {
    const int status = wait_status(w);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "worker " << w << " status " << status;
  }
  std::unique_ptr<pool_segment> pool;
  ASSERT_TRUE(open_pool(&pool, 1000));
  EXPECT_EQ(pool->frame_count(), pool_bytes_ / (2 * MiB));
  expect_no_frame_leaked(*pool);
}

// SIGKILL a worker while it holds the lock, at a random moment (often while its memory is
// being brought in, or while it writes): the others finish, every byte checked.
TEST_F(TimeSharing, KilledHolderLeavesTheOthersIntact) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<pid_t> workers;
    for (int i = 0; i < 3; ++i) workers.push_back(spawn_worker(40 * MiB, 10, 200 + 10 * trial + i, 1));
    std::unique_ptr<pool_segment> pool;
    ASSERT_TRUE(open_pool(&pool, 10000)) << "no pool segment: did the server start?";
    const pid_t victim = workers[trial % 3];
    bool killed = false;
    const auto deadline = clock_type::now() + std::chrono::seconds(20);
    while (!killed && clock_type::now() < deadline) {
      const uint32_t m = member_of(*pool, victim);
      if (m != k_no_member && pool->member(m).holding.load() == 1) {
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
        killed = ::kill(victim, SIGKILL) == 0;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));  // leave the cores to the workers
    }
    ASSERT_TRUE(killed) << "the victim never held the lock";
    for (pid_t w : workers) {
      const int status = wait_status(w);
      if (w == victim) {
        EXPECT_TRUE(WIFSIGNALED(status) || WIFEXITED(status)) << status;
      } else {
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "survivor " << w << " status " << status << " (trial " << trial << ")";
      }
    }
    expect_no_frame_leaked(*pool);
  }
}

// SIGKILL a worker the moment another asks it to evict frames: it dies in the middle of
// its eviction; the server frees (and zeroes) its frames and the acquirer goes on.
TEST_F(TimeSharing, OwnerKilledMidEvictionLeavesTheOthersIntact) {
  for (int trial = 0; trial < 2; ++trial) {
    std::vector<pid_t> workers;
    for (int i = 0; i < 3; ++i) workers.push_back(spawn_worker(40 * MiB, 10, 300 + 10 * trial + i, 1));
    std::unique_ptr<pool_segment> pool;
    ASSERT_TRUE(open_pool(&pool, 10000));
    const pid_t victim = workers[trial];
    bool killed = false;
    const auto deadline = clock_type::now() + std::chrono::seconds(20);
    while (!killed && clock_type::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      const uint32_t m = member_of(*pool, victim);
      if (m == k_no_member) continue;
      for (uint32_t f = 0; f < pool->frame_count() && !killed; ++f) {
        const frame_word w = frame_word::decode(pool->read(f));
        if (w.state == frame_requested && w.owner == m) killed = ::kill(victim, SIGKILL) == 0;
      }
    }
    ASSERT_TRUE(killed) << "no frame of the victim was ever requested";
    for (pid_t w : workers) {
      const int status = wait_status(w);
      if (w != victim) {
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "survivor " << w << " status " << status << " (trial " << trial << ")";
      }
    }
    expect_no_frame_leaked(*pool);
  }
}

// Turns on a pool that holds two processes' memory, not three: 14 MiB (7 or 8 frames) each
// on 16 frames.
class TimeSharingOnAPoolThatFitsTwo : public TimeSharing {
 protected:
  TimeSharingOnAPoolThatFitsTwo() { pool_bytes_ = 32 * MiB; }
  static constexpr uint64_t k_process_bytes = 14 * MiB;

  // The start line of workers spawned with SESSION_WORKER_PAUSE=0:<start>: once every one has
  // joined the pool, <start> is made and they begin their turns together. A process's
  // start-up (a CUDA context on a GPU) takes longer than its turns, and a worker that
  // finished before the last one started would leave a pool that fits the rest.
  bool start_together(pool_segment& pool, const std::vector<pid_t>& workers, const std::string& start) {
    bool all_joined = false;
    for (int i = 0; i < 6000 && !all_joined; ++i) {
      all_joined = std::all_of(workers.begin(), workers.end(), [&](pid_t w) { return member_of(pool, w) != k_no_member; });
      if (!all_joined) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    test::create_signal_file(start.c_str());
    return all_joined;
  }

  // Turns driven by the test, for workers spawned with SESSION_WORKER_TURNS=<dir>
  // (session_worker.cpp): go.<seed>.<round> lets the worker take that turn, done.<seed>.<round>
  // says it has released it (waited for up to 60 s).
  static void let_take_turn(const std::string& dir, uint64_t seed, int round) {
    test::create_signal_file(turn_file(dir, "go", seed, round).c_str());
  }
  static bool turn_done(const std::string& dir, uint64_t seed, int round) {
    return test::wait_for_signal_file(turn_file(dir, "done", seed, round).c_str(), 60, "time_sharing_test");
  }
  // The member index of a worker once it has joined the pool (within 10 s), or k_no_member.
  uint32_t joined_member(pool_segment& pool, pid_t pid) {
    uint32_t m = k_no_member;
    for (int i = 0; i < 5000 && m == k_no_member; ++i) {
      m = member_of(pool, pid);
      if (m == k_no_member) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return m;
  }

 private:
  static std::string turn_file(const std::string& dir, const char* what, uint64_t seed, int round) {
    return dir + "/" + what + "." + std::to_string(seed) + "." + std::to_string(round);
  }
};

// Five processes on a pool that holds two take turns: the holder's predecessor kept only a
// few frames after its last eviction, so each acquire needs frames from two idle owners
// (those few, and most of the next least recently used one's). Every byte is checked at every
// acquire; the traces show turns served by two owners, each eviction started while the
// acquirer brought its memory in.
TEST_F(TimeSharingOnAPoolThatFitsTwo, FiveProcessesTakeFramesFromTwoOwnersAtOnce) {
  std::unique_ptr<pool_segment> pool;
  std::vector<pid_t> workers;
  // All five start their turns together, once every one has joined (start_together).
  const std::string start = deploy_.dir() + "/start";
  for (int i = 0; i < 5; ++i) {
    // Frames asked for at the acquire, the path this test is about: no eviction ahead. Large
    // and small processes alternate: the one that released last (asked first) may hold less
    // than a large acquirer needs.
    workers.push_back(spawn_worker(i % 2 == 0 ? k_process_bytes : 6 * MiB, 5, 600 + i, 1,
                                   {"VRAMSWAP_EVICT_AHEAD=0", "SESSION_WORKER_PAUSE=0:" + start}));
    if (i == 0) {
      ASSERT_TRUE(open_pool(&pool, 10000)) << "no pool segment: did the server start?";
    }
  }
  ASSERT_TRUE(start_together(*pool, workers, start)) << "not every worker joined the pool within 60 s";
  for (pid_t w : workers) {
    const int status = wait_status(w);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "worker " << w << " status " << status;
  }
  expect_no_frame_leaked(*pool);
  const std::vector<turn> turns = turns_with_owners(all_traces(*pool));
  size_t two_owners = 0;
  for (const turn& t : turns) two_owners += t.owners.size() >= 2;
  // 25 acquires, the first two free. The owner asked first is the one predicted to come back
  // furthest (the last to release); a large acquirer after a small one needs a second owner.
  // How many do depends on the order the processes re-queue in (the lock is FIFO, the
  // scheduler is not). Some must.
  EXPECT_GE(turns.size(), 20u);
  EXPECT_GE(two_owners, 1u) << two_owners << " of " << turns.size() << " acquires took frames from two owners";
}

// Two owners hold the idle frames an acquirer needs, both stopped (SIGSTOP): both are asked
// before either answers, so the requests went out at once, not one owner after the other.
// Then both go on and evict while the acquirer brings its memory in; or one is killed
// (SIGKILL) while asked, and the server frees its frames for the acquirer. Every byte of
// the survivors is checked at their next turn, no frame leaks.
TEST_F(TimeSharingOnAPoolThatFitsTwo, TwoIdleOwnersAreAskedAtOnceAndEitherMayDie) {
  for (int trial = 0; trial < 2; ++trial) {
    const bool kill_one = trial == 1;
    const std::string go = deploy_.dir() + "/go" + std::to_string(trial);
    const std::string pause = "SESSION_WORKER_PAUSE=1:" + go;
    // A and B: 12 MiB (6 or 7 frames) each, one turn, then idle until `go`, then a turn that
    // checks their bytes. C: 24 MiB, more than the free frames and A's together.
    const pid_t a = deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(12 * MiB), "2", std::to_string(700 + trial), "0"}, {pause});
    std::unique_ptr<pool_segment> pool;
    ASSERT_TRUE(open_pool(&pool, 10000));
    // Its first turn is over: it released the lock (its frames may be idle before it, taken
    // free while it allocated).
    auto wait_idle = [&](pid_t w) {
      for (int i = 0; i < 2000; ++i) {
        const uint32_t m = member_of(*pool, w);
        bool released = false;
        for (const auto& e : all_traces(*pool)) released |= e.kind == trace_released && e.pid == w;
        if (released && m != k_no_member && pool->member(m).holding.load() == 0 && pool->count(frame_idle, m) > 0) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      return false;
    };
    ASSERT_TRUE(wait_idle(a)) << "A never finished its first turn";
    const pid_t b = deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(12 * MiB), "2", std::to_string(710 + trial), "0"}, {pause});
    ASSERT_TRUE(wait_idle(b)) << "B never finished its first turn";
    const uint32_t a_frames = count_of(*pool, frame_idle, a), b_frames = count_of(*pool, frame_idle, b);
    const uint32_t free_frames = pool->count(frame_free);
    ASSERT_GT(12u, free_frames + std::max(a_frames, b_frames)) << "C must need frames of both";
    ASSERT_EQ(::kill(a, SIGSTOP), 0);
    ASSERT_EQ(::kill(b, SIGSTOP), 0);
    const pid_t c = deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(24 * MiB), "2", std::to_string(720 + trial), "0"});
    bool both = false;
    for (int i = 0; i < 4000 && !both; ++i) {
      both = count_of(*pool, frame_requested, a) > 0 && count_of(*pool, frame_requested, b) > 0;
      if (!both) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_TRUE(both) << "C's acquire did not ask both stopped owners (frames requested of A: " << count_of(*pool, frame_requested, a)
                      << ", of B: " << count_of(*pool, frame_requested, b) << ")";
    if (kill_one) {
      ASSERT_EQ(::kill(a, SIGKILL), 0);
      ASSERT_EQ(::kill(b, SIGCONT), 0);
    } else {
      ASSERT_EQ(::kill(a, SIGCONT), 0);
      ASSERT_EQ(::kill(b, SIGCONT), 0);
    }
    const int c_status = wait_status(c);
    EXPECT_TRUE(WIFEXITED(c_status) && WEXITSTATUS(c_status) == 0) << "acquirer status " << c_status << " (trial " << trial << ")";
    test::create_signal_file(go.c_str());
    const int a_status = wait_status(a), b_status = wait_status(b);
    if (kill_one) {
      EXPECT_TRUE(WIFSIGNALED(a_status) && WTERMSIG(a_status) == SIGKILL) << a_status;
    } else {
      EXPECT_TRUE(WIFEXITED(a_status) && WEXITSTATUS(a_status) == 0) << "owner A status " << a_status;
    }
    EXPECT_TRUE(WIFEXITED(b_status) && WEXITSTATUS(b_status) == 0) << "owner B status " << b_status << " (trial " << trial << ")";
    expect_no_frame_leaked(*pool);
    // C's first acquire: the owners' evictions began within it.
    for (const turn& t : turns_with_owners(all_traces(*pool))) {
      if (t.pid != c) continue;
      EXPECT_NE(std::find(t.owners.begin(), t.owners.end(), b), t.owners.end()) << "B evicted outside C's restore";
      if (!kill_one) {
        EXPECT_NE(std::find(t.owners.begin(), t.owners.end(), a), t.owners.end()) << "A evicted outside C's restore";
      }
      break;
    }
    pool.reset();
  }
}

// Three jobs take turns in a fixed order on a pool that holds two, their turns driven one
// after another by the test (the lock idle in between), as periodic jobs do. From the second
// round on the one due next is predicted (by its own idle gap, or before it has one by the
// others' mean gap, or in the first turns by who released first), and it asks an idle job
// predicted to come back after it (never the holder) to evict what it needs before its
// acquire: every acquire from then on finds its frames free or asked for already, and asks
// no owner itself (frames_asked_at_acquire stays 0). With
// VRAMSWAP_EVICT_AHEAD=0 the same turns ask at every acquire. Every byte is checked at every
// turn; no frame leaks.
TEST_F(TimeSharingOnAPoolThatFitsTwo, PeriodicJobsFindTheirFramesEvictedAheadOfTheirTurn) {
  for (const bool ahead : {true, false}) {
    const std::string dir = deploy_.dir() + (ahead ? "/turns-ahead" : "/turns-at-acquire");
    ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0) << dir;
    constexpr int k_rounds = 5, k_jobs = 3, k_warm_up = 1;
    std::vector<pid_t> jobs;
    std::unique_ptr<pool_segment> pool;
    for (int j = 0; j < k_jobs; ++j) {
      jobs.push_back(deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(k_process_bytes), std::to_string(k_rounds),
                                    std::to_string(900 + j), "150"},
                                   {"SESSION_WORKER_TURNS=" + dir, std::string("VRAMSWAP_EVICT_AHEAD=") + (ahead ? "1" : "0")}));
      if (j == 0) {
        ASSERT_TRUE(open_pool(&pool, 10000)) << "no pool segment: did the server start?";
      }
    }
    std::vector<uint32_t> member(k_jobs, k_no_member), pages(k_jobs, 0);
    uint64_t at_acquire_steady = 0, ahead_steady = 0;
    for (int round = 1; round <= k_rounds; ++round) {
      for (int j = 0; j < k_jobs; ++j) {
        if (member[j] == k_no_member) member[j] = joined_member(*pool, jobs[j]);
        ASSERT_NE(member[j], k_no_member) << "job " << j << " is not a pool member";
        const member_slot& slot = pool->member(member[j]);
        if (round > k_warm_up && ahead) {
          // Its frames come free ahead of its turn: free ones, and ones it asked for.
          bool ready = false;
          uint32_t need = 0, have = 0;
          for (int i = 0; i < 5000 && !ready; ++i) {
            need = pages[j] - std::min(pages[j], pool->count(frame_idle, member[j]));
            have = pool->count(frame_free) + pool->count(frame_requested);
            ready = have >= need;
            if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
          EXPECT_TRUE(ready) << "round " << round << ", job " << j << ": its next turn needs " << need << " frame(s), "
                             << have << " free or asked for after 10 s";
        }
        let_take_turn(dir, 900 + j, round);
        ASSERT_TRUE(turn_done(dir, 900 + j, round)) << "job " << j << " did not finish round " << round;
        // Right after its release all its pages are in its (idle) frames.
        pages[j] = std::max(pages[j], pool->count(frame_idle, member[j]) + pool->count(frame_requested, member[j]));
        // Frames asked ahead of a turn are asked before it starts: count from the end of the
        // warm-up to the end of the last turn.
        if (round == k_warm_up) {
          at_acquire_steady -= slot.frames_asked_at_acquire.load();
          ahead_steady -= slot.frames_asked_ahead.load();
        } else if (round == k_rounds) {
          at_acquire_steady += slot.frames_asked_at_acquire.load();
          ahead_steady += slot.frames_asked_ahead.load();
        }
      }
    }
    for (int j = 0; j < k_jobs; ++j) {
      const int status = wait_status(jobs[j]);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "job " << j << " status " << status;
    }
    expect_no_frame_leaked(*pool);
    if (ahead) {
      EXPECT_EQ(at_acquire_steady, 0u) << "frames asked for at acquires after the warm-up, with eviction ahead";
      EXPECT_GT(ahead_steady, 0u) << "no frame asked for ahead of a turn";
    } else {
      EXPECT_GT(at_acquire_steady, 0u) << "without eviction ahead, acquires ask for frames";
      EXPECT_EQ(ahead_steady, 0u);
    }
    pool.reset();
  }
}

// A job that queues for the lock asks for the frames its memory needs while the holder still
// holds, in its first turns, before any job has a rhythm to predict: three jobs take one turn
// each on a pool that holds two (so one of them loses frames), then a fourth process takes
// the lock and holds it, and the job that lost frames queues behind it. Every idle job comes
// after it (it would queue behind), so it asks them ahead of its grant, and its turn finds
// its frames free or on their way. Without that rule an idle job with no history is
// predicted back at its release, before the queued one, and nothing is asked until the
// grant. Every byte is checked at every turn; no frame leaks.
TEST_F(TimeSharingOnAPoolThatFitsTwo, AJobQueuedForTheLockAsksForItsFramesBeforeItsGrant) {
  const std::string dir = deploy_.dir() + "/queued";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0) << dir;
  constexpr int k_jobs = 3;
  constexpr uint64_t k_holder_seed = 790;
  std::unique_ptr<pool_segment> pool;
  std::vector<pid_t> jobs;
  for (int j = 0; j < k_jobs; ++j) {
    jobs.push_back(deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(k_process_bytes), "2", std::to_string(700 + j), "0"},
                                 {"SESSION_WORKER_TURNS=" + dir}));
    if (j == 0) {
      ASSERT_TRUE(open_pool(&pool, 10000)) << "no pool segment: did the server start?";
    }
  }
  const pid_t holder = deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(2 * MiB), "1", std::to_string(k_holder_seed), "3000"},
                                     {"SESSION_WORKER_TURNS=" + dir});
  auto go = [&](uint64_t seed, int round) { let_take_turn(dir, seed, round); };
  auto done = [&](uint64_t seed, int round) { return turn_done(dir, seed, round); };
  auto member_of_pid = [&](pid_t pid) { return joined_member(*pool, pid); };
  // Round 1: one turn each; right after its release all of a job's pages are in its idle frames.
  std::vector<uint32_t> member(k_jobs), pages(k_jobs);
  for (int j = 0; j < k_jobs; ++j) {
    member[j] = member_of_pid(jobs[j]);
    ASSERT_NE(member[j], k_no_member) << "job " << j << " is not a pool member";
    go(700 + j, 1);
    ASSERT_TRUE(done(700 + j, 1)) << "job " << j << " did not finish its first turn";
    pages[j] = pool->count(frame_idle, member[j]) + pool->count(frame_requested, member[j]);
  }
  const uint32_t holder_member = member_of_pid(holder);
  ASSERT_NE(holder_member, k_no_member) << "the holder is not a pool member";
  go(k_holder_seed, 1);
  bool holding = false;
  for (int i = 0; i < 5000 && !holding; ++i) {
    holding = pool->member(holder_member).phase.load() == phase_running;
    if (!holding) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(holding) << "the holder did not take the lock";
  // The job that lost frames and released last: the jobs released before it are predicted
  // back before it (their release plus its own idle gap, the only gap known), so only the
  // rule that a queued job comes before every idle one lets it ask ahead.
  int lost = -1;
  for (int j = k_jobs - 1; j >= 0 && lost < 0; --j) {
    if (pool->count(frame_idle, member[j]) < pages[j]) lost = j;
  }
  ASSERT_GT(lost, 0) << "three jobs of " << k_process_bytes / MiB << " MiB on a pool of " << pool_bytes_ / MiB
                     << " MiB: no job but the first lost a frame";
  const member_slot& slot = pool->member(member[lost]);
  const uint64_t asked_before = slot.frames_asked_ahead.load();
  go(700 + lost, 2);
  // Within the holder's 3 s hold: the queued job asked ahead, and what it needs is free or asked for.
  bool ready = false;
  uint32_t need = 0, have = 0;
  const auto until = clock_type::now() + std::chrono::milliseconds(2500);
  while (!ready && clock_type::now() < until) {
    need = pages[lost] - std::min(pages[lost], pool->count(frame_idle, member[lost]));
    have = pool->count(frame_free) + pool->count(frame_requested);
    ready = slot.phase.load() == phase_waiting && slot.frames_asked_ahead.load() > asked_before && have >= need;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const bool still_held = pool->member(holder_member).phase.load() == phase_running;
  EXPECT_TRUE(ready) << "job " << lost << " queued behind the holder: " << slot.frames_asked_ahead.load() - asked_before
                     << " frame(s) asked ahead; its turn needs " << need << ", " << have << " free or asked for";
  EXPECT_TRUE(still_held) << "the holder let go before the check ended (a slow machine?): the frames were not seen asked ahead of the grant";
  ASSERT_TRUE(done(k_holder_seed, 1)) << "the holder did not finish its turn";
  ASSERT_TRUE(done(700 + lost, 2)) << "job " << lost << " did not finish its second turn";
  for (int j = 0; j < k_jobs; ++j) {
    if (j == lost) continue;
    go(700 + j, 2);
    ASSERT_TRUE(done(700 + j, 2)) << "job " << j << " did not finish its second turn";
  }
  for (pid_t p : jobs) {
    const int status = wait_status(p);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "job " << p << " status " << status;
  }
  const int status = wait_status(holder);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "holder status " << status;
  expect_no_frame_leaked(*pool);
}

// A job that took one turn and then stays idle (a finished job that lives on, a notebook left
// open) with part of its memory out, beside a job that keeps taking turns: the idle one is
// predicted back by the other's idle gap, and once it is overdue by more than that gap it
// asks nothing ahead, so the live job's memory stays resident turn after turn. (In the very
// first turns, before anyone has a gap, it may ask once: a wrong guess costs one eviction.)
// Every byte of both is checked at every turn; no frame leaks.
TEST_F(TimeSharingOnAPoolThatFitsTwo, AnIdleJobOverdueForItsTurnDoesNotKeepEvictingALiveOne) {
  const std::string dir = deploy_.dir() + "/overdue";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0) << dir;
  constexpr uint64_t k_idle_seed = 960, k_live_seed = 961;
  constexpr int k_live_rounds = 8, k_settled = 3;
  // 20 + 14 MiB on a pool of 32: the live job's turns take a frame of the idle one's.
  const pid_t idle = deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(20 * MiB), "2", std::to_string(k_idle_seed), "0"},
                                   {"SESSION_WORKER_TURNS=" + dir});
  std::unique_ptr<pool_segment> pool;
  ASSERT_TRUE(open_pool(&pool, 10000)) << "no pool segment: did the server start?";
  const pid_t live = deploy_.spawn(
      {VRAMSWAP_SESSION_WORKER, std::to_string(k_process_bytes), std::to_string(k_live_rounds), std::to_string(k_live_seed), "20"},
      {"SESSION_WORKER_TURNS=" + dir});
  const uint32_t idle_member = joined_member(*pool, idle), live_member = joined_member(*pool, live);
  ASSERT_NE(idle_member, k_no_member) << "the idle job is not a pool member";
  ASSERT_NE(live_member, k_no_member) << "the live job is not a pool member";
  let_take_turn(dir, k_idle_seed, 1);
  ASSERT_TRUE(turn_done(dir, k_idle_seed, 1)) << "the idle job did not finish its turn";
  const uint32_t idle_pages = pool->count(frame_idle, idle_member) + pool->count(frame_requested, idle_member);
  // The idle job's release lies well past any of the live job's gaps (150-200 ms each).
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  let_take_turn(dir, k_live_seed, 1);
  ASSERT_TRUE(turn_done(dir, k_live_seed, 1)) << "the live job did not finish its first turn";
  ASSERT_LT(pool->count(frame_idle, idle_member), idle_pages) << "the live job's first turn took no frame of the idle job's";
  const member_slot& idle_slot = pool->member(idle_member);
  uint64_t asked_settled = 0;
  uint32_t live_pages = 0;
  // Its last round (after the loop) ends with its exit, which frees its frames.
  for (int round = 2; round < k_live_rounds; ++round) {
    let_take_turn(dir, k_live_seed, round);
    ASSERT_TRUE(turn_done(dir, k_live_seed, round)) << "the live job did not finish round " << round;
    // Given a moment for an ask to land and be served.
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    const uint32_t kept = pool->count(frame_idle, live_member);
    if (round == k_settled) {
      asked_settled = idle_slot.frames_asked_ahead.load();
      live_pages = kept;
    } else if (round > k_settled) {
      // Its memory stays in its frames between turns.
      EXPECT_EQ(kept, live_pages) << "round " << round << ": the live job kept " << kept << " of its " << live_pages
                                  << " frame(s); the idle job asked " << idle_slot.frames_asked_ahead.load() - asked_settled
                                  << " more ahead since round " << k_settled;
    }
  }
  EXPECT_GE(live_pages, k_process_bytes / pool->frame_size()) << "the live job's memory was not resident after round " << k_settled;
  EXPECT_EQ(idle_slot.frames_asked_ahead.load(), asked_settled) << "the overdue idle job went on asking ahead";
  let_take_turn(dir, k_live_seed, k_live_rounds);
  ASSERT_TRUE(turn_done(dir, k_live_seed, k_live_rounds)) << "the live job did not finish its last round";
  let_take_turn(dir, k_idle_seed, 2);
  ASSERT_TRUE(turn_done(dir, k_idle_seed, 2)) << "the idle job did not finish its second turn";
  for (pid_t p : {idle, live}) {
    const int status = wait_status(p);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "job " << p << " status " << status;
  }
  expect_no_frame_leaked(*pool);
}

// Five processes on a pool that holds two; the moment an acquirer has asked two owners for
// frames, one of them is killed (SIGKILL), often in the middle of its eviction while the
// other evicts too: the server frees the dead one's frames, the acquirer and every other
// survivor finish with every byte intact, no frame leaks.
TEST_F(TimeSharingOnAPoolThatFitsTwo, OneOfTwoOwnersKilledWhileBothEvictLeavesTheOthersIntact) {
  for (int trial = 0; trial < 2; ++trial) {
    std::vector<pid_t> workers;
    std::unique_ptr<pool_segment> pool;
    const std::string start = deploy_.dir() + "/start-" + std::to_string(trial);
    for (int i = 0; i < 5; ++i) {
      workers.push_back(spawn_worker(i % 2 == 0 ? k_process_bytes : 6 * MiB, 5, 800 + 10 * trial + i, 1,
                                     {"VRAMSWAP_EVICT_AHEAD=0", "SESSION_WORKER_PAUSE=0:" + start}));
      if (i == 0) {
        ASSERT_TRUE(open_pool(&pool, 10000));
      }
    }
    ASSERT_TRUE(start_together(*pool, workers, start)) << "not every worker joined the pool within 60 s";
    pid_t victim = 0;
    const auto deadline = clock_type::now() + std::chrono::seconds(30);
    while (victim == 0 && clock_type::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      // Owners with requested frames, by the same requester.
      uint32_t owners[2] = {k_no_member, k_no_member};
      uint32_t requester = k_no_member;
      for (uint32_t f = 0; f < pool->frame_count(); ++f) {
        const frame_word w = frame_word::decode(pool->read(f));
        if (w.state != frame_requested) continue;
        if (requester == k_no_member) requester = w.requester;
        if (w.requester != requester) continue;
        if (owners[0] == k_no_member) owners[0] = w.owner;
        else if (w.owner != owners[0]) owners[1] = w.owner;
      }
      if (owners[1] == k_no_member) continue;
      const uint32_t pick = owners[trial % 2];
      const pid_t pid = pool->member(pick).pid;
      if (std::find(workers.begin(), workers.end(), pid) != workers.end() && ::kill(pid, SIGKILL) == 0) victim = pid;
    }
    ASSERT_NE(victim, 0) << "no acquire ever asked two owners at once";
    for (pid_t w : workers) {
      const int status = wait_status(w);
      if (w != victim) {
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "survivor " << w << " status " << status << " (trial " << trial << ")";
      }
    }
    expect_no_frame_leaked(*pool);
  }
}

// Memory that does not fit the pool is refused clearly, and the lock is not kept.
TEST_F(TimeSharing, MemoryLargerThanThePoolIsAClearError) {
  const pid_t w = spawn_worker(80 * MiB, 1, 400, 0);
  const int status = wait_status(w);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  const pid_t ok_worker = spawn_worker(20 * MiB, 2, 401, 0);
  const int status2 = wait_status(ok_worker);
  EXPECT_TRUE(WIFEXITED(status2) && WEXITSTATUS(status2) == 0) << "the lock must not stay with the failed process";
}

// The owner of idle frames a lock holder needs is killed while a child it forked without
// exec (a DataLoader worker) lives on, holding its connection and its GPU context: its frames
// stay its own until the child exits, and the holder's timeout says so instead of calling the
// owner stopped. Once the child is gone they are repaired, and the next process gets them.
TEST_F(TimeSharing, AnOwnerKilledWhileItsForkedChildLivesIsNamedInTheWaitersError) {
  const std::string forked = deploy_.dir() + "/child.pid";
  const std::string never = deploy_.dir() + "/never";
  const std::string taker_err = deploy_.dir() + "/taker.err";
  // 40 MiB each on a 64 MiB pool: the taker needs frames the owner holds idle.
  const pid_t owner = spawn_worker(40 * MiB, 2, 600, 0, {"SESSION_WORKER_FORK=1:" + forked, "SESSION_WORKER_PAUSE=1:" + never});
  pid_t child = 0;
  for (int i = 0; i < 2000 && child <= 0; ++i) {
    child = static_cast<pid_t>(std::atol(test::slurp(forked).c_str()));
    if (child <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GT(child, 0) << "the owner never forked";
  struct kill_at_end {  // however the test ends: the child is nobody's to reap but init's
    pid_t pid;
    ~kill_at_end() { ::kill(pid, SIGKILL); }
  } child_guard{child};
  std::unique_ptr<pool_segment> pool;
  ASSERT_TRUE(open_pool(&pool, 10000));
  const uint32_t m = member_of(*pool, owner);
  ASSERT_NE(m, k_no_member);
  ASSERT_GT(pool->count(frame_idle, m), 0u);
  ::kill(owner, SIGKILL);
  wait_status(owner);

  const pid_t taker = deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(40 * MiB), "1", "601", "0"}, {"VRAMSWAP_EVICT_TIMEOUT=2"},
                                    "", taker_err);
  const int taker_status = wait_status(taker);
  const std::string taker_log = test::slurp(taker_err);
  EXPECT_TRUE(WIFEXITED(taker_status) && WEXITSTATUS(taker_status) == 2) << "status " << taker_status << "\n" << taker_log;
  EXPECT_NE(taker_log.find("process " + std::to_string(owner) + " (pool member " + std::to_string(m) + "), which owns frame"),
            std::string::npos) << taker_log;
  EXPECT_NE(taker_log.find("has exited, but its frames are not back in the pool"), std::string::npos) << taker_log;
  EXPECT_EQ(taker_log.find("SIGSTOP"), std::string::npos) << "a dead owner is not a stopped one:\n" << taker_log;

  ::kill(child, SIGKILL);
  expect_no_frame_leaked(*pool);
  const pid_t next = spawn_worker(40 * MiB, 2, 602, 0);
  const int next_status = wait_status(next);
  EXPECT_TRUE(WIFEXITED(next_status) && WEXITSTATUS(next_status) == 0) << next_status;
}

// The owner of the frames a lock holder needs runs out of swap space part-way through the
// eviction (its disk tier on a small real filesystem, its host tier nearly none): every page
// it saved before the disk filled, and every page still in flight then, comes back intact at
// its next turn; the holder's timeout says which process could not evict and why; and the
// owner logs the failure once, not at every retry.
class TimeSharingPastTheHostTier : public TimeSharing {
 protected:
  // A host tier holds at least 50 pages (100 MiB of 2 MiB frames): processes larger than
  // that, on a pool that holds one of them.
  TimeSharingPastTheHostTier() { pool_bytes_ = 200 * MiB; }
};

TEST_F(TimeSharingPastTheHostTier, AFullSwapDiskInTheOwnerLosesNoByteAndTheWaiterIsToldWhy) {
  test::scratch_image img;
  test::scratch_mount disk;
  std::string why;
  if (!test::mount_small_ext4(disk, img, &why)) GTEST_SKIP() << why;
  const std::string owner_err = deploy_.dir() + "/owner.err";
  const std::string taker_err = deploy_.dir() + "/taker.err";
  // 180 MiB each on a 200 MiB pool: the taker needs 80 of the owner's frames; the owner has
  // 100 MiB of host tier (the least it takes) and about 20 MiB of disk for them.
  const pid_t owner = deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(180 * MiB), "2", "500", "1500"},
                                    {"VRAMSWAP_SWAP_DIR=" + disk.dir(), "VRAMSWAP_HOST_LIMIT=8MiB"}, "", owner_err);
  std::unique_ptr<pool_segment> pool;
  ASSERT_TRUE(open_pool(&pool, 10000));
  // The owner holds its first turn; the taker queues behind it.
  for (int i = 0; i < 1000; ++i) {
    const uint32_t m = member_of(*pool, owner);
    if (m != k_no_member && pool->member(m).holding.load() != 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const pid_t taker = deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(180 * MiB), "1", "501", "0"},
                                    {"VRAMSWAP_EVICT_TIMEOUT=3"}, "", taker_err);
  const int taker_status = wait_status(taker);
  const int owner_status = wait_status(owner);
  const std::string owner_log = test::slurp(owner_err);
  const std::string taker_log = test::slurp(taker_err);
  EXPECT_TRUE(WIFEXITED(owner_status) && WEXITSTATUS(owner_status) == 0)
      << "the owner must find every byte at its next turn; status " << owner_status << ", its stderr:\n" << owner_log;
  EXPECT_TRUE(WIFEXITED(taker_status) && WEXITSTATUS(taker_status) == 2) << "status " << taker_status << "\n" << taker_log;
  EXPECT_NE(taker_log.find("process " + std::to_string(owner) + " (pool member"), std::string::npos) << taker_log;
  EXPECT_NE(taker_log.find("could not evict"), std::string::npos) << taker_log;
  EXPECT_NE(taker_log.find("no_space"), std::string::npos) << "the waiter must be told the owner's disk is full:\n" << taker_log;
  EXPECT_EQ(taker_log.find("SIGSTOP"), std::string::npos) << "a full disk is not a stopped process:\n" << taker_log;
  size_t lines = 0;
  for (size_t at = owner_log.find("another process asked for"); at != std::string::npos;
       at = owner_log.find("another process asked for", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 1u) << "the owner logs the failed eviction once, not at every retry:\n" << owner_log;
}

}  // namespace
}  // namespace vramswap::detail
