// The shared host pool end to end, with real processes: vramswapd runs with
// VRAMSWAP_HOST_POOL, session_worker clients (each more than half the device pool) take
// turns saving their pages into its slots, checking every byte (random data) after every
// acquire. The host pool holds only what is saved at once plus a little slack, so a
// handoff's eviction must reuse the slots that the acquirer's restore gives back as its
// copies in complete. A worker killed with SIGKILL while holding slots has them freed by the
// server and the others go on intact; a host pool too small for the processes is a clear
// error naming it. Host backend (CI).
#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.hpp"
#include "core/status.hpp"
#include "cli/status_view.hpp"
#include "pool/pool_report.hpp"
#include "pool/pool_segment.hpp"
#include "support/deployment.hpp"

namespace vramswap::detail {
namespace {
using namespace pool_layout;
using clock_type = std::chrono::steady_clock;

constexpr uint64_t MiB = 1ull << 20;

// session_worker with 40 MiB uses 21-22 pages of 2 MiB (four allocations, one of 1000 bytes).
class HostPool : public ::testing::Test {
 protected:
  void start(uint64_t pool_bytes, uint64_t host_pool_bytes, int evict_timeout_s = 20, const std::string& swap_dir = "") {
    std::unique_ptr<vramswap::detail::backend> made;
    ASSERT_EQ(make_backend(backend_kind::host, &made), ok) << last_error();
    device_info info;
    ASSERT_EQ(made->get_device_info(0, &info), ok);
    std::vector<std::string> env = {"VRAMSWAP_BACKEND=host", "VRAMSWAP_HOST_DEVICE_MEMORY=256MiB", "VRAMSWAP_FRAME_SIZE=2MiB",
                                    "VRAMSWAP_POOL_SIZE=" + std::to_string(pool_bytes),
                                    "VRAMSWAP_HOST_POOL=" + std::to_string(host_pool_bytes),
                                    "VRAMSWAP_EVICT_TIMEOUT=" + std::to_string(evict_timeout_s), "VRAMSWAP_POOL_IDLE_EXIT=5",
                                    "VRAMSWAP_LOG=warn"};
    if (!swap_dir.empty()) env.push_back("VRAMSWAP_SWAP_DIR=" + swap_dir);
    deploy_.create("hp", info.uuid, env);
    started_ = true;
  }
  void TearDown() override {
    stop_watch();
    if (started_) deploy_.destroy();
  }

  pid_t spawn_worker(uint64_t bytes, int rounds, uint64_t seed, const std::string& err_file = "") {
    return deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(bytes), std::to_string(rounds), std::to_string(seed), "1"}, {}, "",
                         err_file);
  }
  static int wait_status(pid_t pid) {
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    return status;
  }
  static bool exited_ok(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

  // Watch the slot table while the workers run: the most slots ever in use at once.
  void watch(pool_segment& pool) {
    watching_ = true;
    watcher_ = std::thread([this, &pool] {
      while (watching_.load()) {
        const uint32_t used = pool.count_slots(slot_used);
        max_used_.store(std::max(max_used_.load(), used));
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  }
  void stop_watch() {
    watching_ = false;
    if (watcher_.joinable()) watcher_.join();
  }

  // Every frame and every host slot free again (the server repairs dead members asynchronously).
  void expect_nothing_leaked(pool_segment& pool) {
    for (int i = 0; i < 400; ++i) {
      if (pool.count(frame_free) == pool.frame_count() && pool.count_slots(slot_free) == pool.host_slot_count()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(pool.count(frame_free), pool.frame_count()) << "frames still owned after every client exited";
    EXPECT_EQ(pool.count_slots(slot_free), pool.host_slot_count()) << "host slots still used after every client exited";
  }

  uint32_t member_of(pool_segment& pool, pid_t pid) {
    for (uint32_t m = 0; m < k_member_count; ++m) {
      if (pool.member(m).state.load() == member_live && pool.member(m).pid == pid) return m;
    }
    return k_no_member;
  }

  static std::string read_file(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  test::deployment deploy_;
  bool started_ = false;
  std::atomic<bool> watching_{false};
  std::atomic<uint32_t> max_used_{0};
  std::thread watcher_;
};

// The benchmark's shape: two processes, a device pool that holds one (24 frames) and a host
// pool of about one process (20 slots). Together they need 42-44 pages of 44 places: every
// handoff evicts into slots that the acquirer frees as its copies in complete.
TEST_F(HostPool, TwoProcessesTakeTurnsThroughAHostPoolOfOneProcessesSize) {
  ASSERT_NO_FATAL_FAILURE(start(48 * MiB, 40 * MiB));
  std::vector<pid_t> workers;
  workers.push_back(spawn_worker(40 * MiB, 10, 500));
  std::unique_ptr<pool_segment> pool;
  ASSERT_TRUE(deploy_.open_pool(&pool, 10000)) << "no pool segment: did the server start?";
  ASSERT_EQ(pool->host_slot_count(), 20u);
  watch(*pool);
  workers.push_back(spawn_worker(40 * MiB, 10, 501));
  // `vramswap status` shows the host pool's occupancy (the same report the CLI renders).
  device_report report;
  for (int i = 0; i < 2000; ++i) {
    ASSERT_EQ(collect_report(deploy_.key(), *pool, nullptr, &report), ok) << last_error();
    if (report.host_slots_used > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(report.host_slots, 20u);
  EXPECT_GT(report.host_slots_used, 0u) << "status never saw a used host slot";
  EXPECT_NE(render_text({report}).find("host pool"), std::string::npos) << render_text({report});
  for (pid_t w : workers) {
    const int status = wait_status(w);
    EXPECT_TRUE(exited_ok(status)) << "worker " << w << " status " << status;
  }
  stop_watch();
  EXPECT_GE(max_used_.load(), 15u) << "the workers did not save their pages in the shared host pool";
  EXPECT_LE(max_used_.load(), 20u);
  expect_nothing_leaked(*pool);
}

// Three processes over half the device pool each (32 frames) and a host pool of 36 slots:
// about one and a half processes' memory, where per-process tiers would pin up to all
// three at once.
TEST_F(HostPool, ThreeProcessesTakeTurnsWithEveryByteIntact) {
  ASSERT_NO_FATAL_FAILURE(start(64 * MiB, 72 * MiB));
  std::vector<pid_t> workers;
  std::unique_ptr<pool_segment> pool;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(spawn_worker(40 * MiB, 8, 600 + i));
    if (i == 0) {
      ASSERT_TRUE(deploy_.open_pool(&pool, 10000));
      watch(*pool);
    }
  }
  for (pid_t w : workers) {
    const int status = wait_status(w);
    EXPECT_TRUE(exited_ok(status)) << "worker " << w << " status " << status;
  }
  stop_watch();
  EXPECT_GE(max_used_.load(), 20u) << "the workers did not save their pages in the shared host pool";
  expect_nothing_leaked(*pool);
}

// SIGKILL a worker while its saved pages are in the host pool (it is waiting for its turn):
// the server frees its slots (and frames); the others finish with every byte intact.
TEST_F(HostPool, KilledProcessHoldingSlotsHasThemFreedAndTheOthersGoOn) {
  ASSERT_NO_FATAL_FAILURE(start(64 * MiB, 72 * MiB));
  for (int trial = 0; trial < 2; ++trial) {
    std::vector<pid_t> workers;
    for (int i = 0; i < 3; ++i) workers.push_back(spawn_worker(40 * MiB, 10, 700 + 10 * trial + i));
    std::unique_ptr<pool_segment> pool;
    ASSERT_TRUE(deploy_.open_pool(&pool, 10000));
    const pid_t victim = workers[trial];
    uint32_t victim_member = k_no_member;
    bool killed = false;
    const auto deadline = clock_type::now() + std::chrono::seconds(20);
    while (!killed && clock_type::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      const uint32_t m = member_of(*pool, victim);
      if (m == k_no_member || pool->member(m).holding.load() == 1) continue;
      if (pool->count_slots(slot_used, m) >= 5) {
        victim_member = m;
        killed = ::kill(victim, SIGKILL) == 0;
      }
    }
    ASSERT_TRUE(killed) << "the victim never had pages in the host pool";
    for (pid_t w : workers) {
      const int status = wait_status(w);
      if (w == victim) {
        EXPECT_TRUE(WIFSIGNALED(status)) << status;
      } else {
        EXPECT_TRUE(exited_ok(status)) << "survivor " << w << " status " << status << " (trial " << trial << ")";
      }
    }
    EXPECT_EQ(pool->count_slots(slot_used, victim_member), 0u) << "the dead member's slots were not freed";
    expect_nothing_leaked(*pool);
  }
}

// Two processes that together need more than the device pool and the host pool hold: a
// clear error that names the host pool, not a hang.
TEST_F(HostPool, HostPoolTooSmallForTheProcessesIsAClearError) {
  ASSERT_NO_FATAL_FAILURE(start(48 * MiB, 34 * MiB, 2));  // 24 frames + 17 slots < 42 pages
  const std::string err0 = deploy_.dir() + "/w0.err", err1 = deploy_.dir() + "/w1.err";
  std::vector<pid_t> workers;
  // Enough rounds that the two overlap: a first worker that finished before the second
  // started would have shared nothing (seen under a loaded CI machine with 3 rounds).
  workers.push_back(spawn_worker(40 * MiB, 40, 800, err0));
  std::unique_ptr<pool_segment> pool;
  ASSERT_TRUE(deploy_.open_pool(&pool, 10000));
  workers.push_back(spawn_worker(40 * MiB, 40, 801, err1));
  int failed = 0;
  const std::string errs[2] = {err0, err1};
  for (int i = 0; i < 2; ++i) {
    const int status = wait_status(workers[i]);
    const std::string text = read_file(errs[i]);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 2) {
      ++failed;
      EXPECT_NE(text.find("VRAMSWAP_HOST_POOL"), std::string::npos) << "worker " << i << ": " << text;
    } else {
      EXPECT_TRUE(exited_ok(status)) << "worker " << i << " status " << status << ": " << text;
    }
  }
  EXPECT_GE(failed, 1) << "memory larger than device pool + host pool cannot have been time-shared";
  expect_nothing_leaked(*pool);
}

// The same two processes and the same too small host pool, with VRAMSWAP_SWAP_DIR set: the
// pages past the shared host pool go to each process's swap file and come back byte-exact
// (the workers check every byte after every acquire), where without it one of them fails.
TEST_F(HostPool, WithASwapDirPagesPastTheHostPoolSpillToDiskAndEveryByteSurvives) {
  const std::string swap_dir = "/var/tmp/vramswap-hp-swap-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(swap_dir.c_str(), 0700), 0) << swap_dir << ": " << std::strerror(errno);
  ASSERT_NO_FATAL_FAILURE(start(48 * MiB, 34 * MiB, 20, swap_dir));  // 24 frames + 17 slots < 42 pages
  const std::string err0 = deploy_.dir() + "/w0.err", err1 = deploy_.dir() + "/w1.err";
  std::vector<pid_t> workers;
  workers.push_back(spawn_worker(40 * MiB, 12, 900, err0));
  std::unique_ptr<pool_segment> pool;
  ASSERT_TRUE(deploy_.open_pool(&pool, 10000));
  watch(*pool);
  workers.push_back(spawn_worker(40 * MiB, 12, 901, err1));
  const std::string errs[2] = {err0, err1};
  for (int i = 0; i < 2; ++i) {
    const int status = wait_status(workers[i]);
    EXPECT_TRUE(exited_ok(status)) << "worker " << i << " status " << status << ": " << read_file(errs[i]);
  }
  stop_watch();
  EXPECT_LE(max_used_.load(), 17u);
  expect_nothing_leaked(*pool);
  ::rmdir(swap_dir.c_str());  // the swap files were unlinked (O_TMPFILE): it is empty
}

}  // namespace
}  // namespace vramswap::detail
