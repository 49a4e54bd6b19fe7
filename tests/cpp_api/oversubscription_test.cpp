// Oversubscription end to end, with real processes: oversub_worker is a
// low-priority job running without the lock on more memory than the pool has; session_worker
// clients take turns under the lock and take the job's pool frames back while it runs. Both
// check every byte of their memory all along. Host backend (CI); scripts/device-run.sh runs
// the same with cuda, and the preload shim's own tests run on the GPU (tests/gpu/).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "core/backend.hpp"
#include "core/status.hpp"
#include "pool/pool_segment.hpp"
#include "support/backends.hpp"
#include "support/child_output.hpp"
#include "support/deployment.hpp"
#include "support/signal_files.hpp"

namespace vramswap::detail {
namespace {
using namespace pool_layout;
constexpr uint64_t MiB = 1ull << 20;

class Oversubscription : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = test::backend_under_test();
    std::string key;
    ASSERT_TRUE(test::device0_key(backend_, &key));
    deploy_.create("os", key,
                   {"VRAMSWAP_BACKEND=" + backend_, "VRAMSWAP_HOST_DEVICE_MEMORY=256MiB", "VRAMSWAP_FRAME_SIZE=2MiB",
                    "VRAMSWAP_POOL_SIZE=" + std::to_string(pool_bytes_), "VRAMSWAP_POOL_IDLE_EXIT=5", "VRAMSWAP_LOG=warn",
                    "VRAMSWAP_SWAP_DIR=/var/tmp"});
  }
  void TearDown() override { deploy_.destroy(); }

  pid_t spawn_job(uint64_t bytes, double seconds, uint64_t seed, const std::vector<std::string>& env = {},
                  const std::vector<std::string>& after = {}) {
    std::vector<std::string> args = {VRAMSWAP_OVERSUB_WORKER, std::to_string(bytes), std::to_string(seconds), std::to_string(seed)};
    args.insert(args.end(), after.begin(), after.end());
    return deploy_.spawn(args, env, out_file(), err_file());
  }
  // A job on 3/4 of the pool (48 MiB: 24 of its 32 frames, lent), running `seconds`; *pool
  // opened once the job holds them. -1 (after a test failure) if it never did.
  pid_t spawn_job_on_three_quarters(double seconds, uint64_t seed, std::unique_ptr<pool_segment>* pool,
                                    const std::vector<std::string>& env = {}, const std::vector<std::string>& after = {}) {
    const pid_t job = spawn_job(48 * MiB, seconds, seed, env, after);
    if (!deploy_.open_pool(pool, 10000)) {
      ADD_FAILURE() << "the job's pool never appeared";
      return -1;
    }
    if (const uint32_t lent = wait_lent(**pool, 24, 10000); lent != 24) {
      ADD_FAILURE() << "the job never took its 24 frames (" << lent << " lent)";
      return -1;
    }
    return job;
  }
  std::string out_file() const { return deploy_.dir() + "/job.out"; }
  std::string err_file() const { return deploy_.dir() + "/job.err"; }
  static std::string slurp(const std::string& path) { return test::slurp(path); }
  // The job's summary line, key=value pairs.
  std::map<std::string, double> job_numbers() const {
    return test::key_values(out_file());
  }
  static int wait_status(pid_t pid) {
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    return status;
  }
  static bool exited_ok(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  uint32_t wait_lent(pool_segment& pool, uint32_t at_least, int wait_ms) {
    uint32_t lent = 0;
    for (int waited = 0; waited < wait_ms; waited += 5) {
      if ((lent = pool.count(frame_lent)) >= at_least) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return lent;
  }
  // Wait until the job's log says `text` (a generous bound: a loaded machine).
  bool wait_job_said(const std::string& text, int wait_ms = 30000) {
    for (int waited = 0; waited < wait_ms; waited += 20) {
      if (slurp(err_file()).find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  static size_t count_of(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = 0; (at = text.find(what, at)) != std::string::npos; at += what.size()) ++n;
    return n;
  }
  // A lock user allocating 56 MiB under the lock (7/8 of the pool: 20 frames or more from the
  // job), its data checked; the job is told when it is done.
  void run_lock_user(const std::string& user_done, uint64_t seed) {
    const pid_t user =
        deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(56 * MiB), "2", std::to_string(seed), "20", "alloc-under-lock"},
                      {"VRAMSWAP_EVICT_TIMEOUT=10"});
    EXPECT_TRUE(exited_ok(wait_status(user))) << "the lock user failed; the job said: " << slurp(err_file());
    ASSERT_TRUE(test::create_signal_file(user_done.c_str())) << user_done;
  }
  // A job on 3/4 of the pool (VRAMSWAP_OVERSUBSCRIBE_COMPUTE=`compute`); a lock user
  // allocates 56 MiB under the lock in three allocations of 14, 10 and 5 frames (and one of
  // 1000 bytes), `gap_ms` apart, each needing frames of the job: each a request of its own,
  // which the user waits for. The job must serve each and wait for no next request.
  void reclaim_allocations_apart(const std::string& compute, int gap_ms) {
    std::unique_ptr<pool_segment> pool;
    const std::string user_done = deploy_.dir() + "/user-done";
    const pid_t job = spawn_job_on_three_quarters(0.5, 141, &pool, {"VRAMSWAP_OVERSUBSCRIBE_COMPUTE=" + compute}, {user_done, "0.2"});
    ASSERT_GT(job, 0);
    const pid_t user = deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(56 * MiB), "1", "151", "0", "alloc-under-lock"},
                                     {"VRAMSWAP_EVICT_TIMEOUT=10", "SESSION_WORKER_ALLOC_GAP_MS=" + std::to_string(gap_ms),
                                      // Still holding when the job decides after its last request.
                                      "SESSION_WORKER_HOLD_AFTER_ALLOC_MS=500"});
    EXPECT_TRUE(exited_ok(wait_status(user))) << "the lock user failed; the job said: " << slurp(err_file());
    ASSERT_TRUE(test::create_signal_file(user_done.c_str())) << user_done;
    ASSERT_TRUE(exited_ok(wait_status(job))) << slurp(err_file());
    std::printf("job: %s", slurp(out_file()).c_str());
    auto n = job_numbers();
    EXPECT_GE(n["demoted"], 20) << slurp(out_file());
    EXPECT_GE(n["reclaims"], 2) << "the allocations should have been requests of their own: " << slurp(out_file());
    EXPECT_EQ(n["lingers"], 0) << "a burst waited for a next request that could not come in time: " << slurp(out_file());
    EXPECT_GE(n["lingers_skipped"], n["bursts"]) << slurp(out_file());
    expect_no_frame_leaked(*pool);
  }
  void expect_no_frame_leaked(pool_segment& pool) {
    uint32_t free_frames = 0;
    for (int i = 0; i < 400; ++i) {
      if ((free_frames = pool.count(frame_free)) == pool.frame_count()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(free_frames, pool.frame_count()) << "frames still owned after every client exited";
  }

  std::string backend_;
  uint64_t pool_bytes_ = 64 * MiB;
  test::deployment deploy_;
};

// 1.5x the pool: the pool's frames, then host frames for the rest; every byte checked.
TEST_F(Oversubscription, JobRunsOnOneAndAHalfPoolsWithEveryByteIntact) {
  // Long enough for two rounds of checking and rewriting 96 MiB under the sanitizers on a
  // loaded 2-core machine.
  const pid_t job = spawn_job(96 * MiB, 2.0, 11);
  ASSERT_TRUE(exited_ok(wait_status(job))) << slurp(err_file());
  std::printf("job: %s", slurp(out_file()).c_str());
  auto n = job_numbers();
  EXPECT_GE(n["rounds"], 2) << slurp(out_file());
  EXPECT_EQ(n["pool_bytes"], 64.0 * MiB) << "every free pool frame should be lent to the job";
  EXPECT_EQ(n["host_bytes"], 32.0 * MiB) << "the rest in host frames";
  std::unique_ptr<pool_segment> pool;
  ASSERT_TRUE(deploy_.open_pool(&pool, 1000));
  expect_no_frame_leaked(*pool);
}

// A job runs on 3/4 of the pool; a lock user needing 7/8 of it takes frames back while the
// job's rounds go on; when the lock user is gone the job's pages move back into the pool.
TEST_F(Oversubscription, LockUserReclaimsFramesFromARunningJobAndTheJobGetsThemBack) {
  std::unique_ptr<pool_segment> pool;
  // The job outlives the lock user by more than the quiet time before a promotion, however
  // slow the lock user's turns (a loaded machine): it runs on for 4 s after the user is done.
  const std::string user_done = deploy_.dir() + "/user-done";
  const pid_t job = spawn_job_on_three_quarters(1.0, 21, &pool, {}, {user_done, "4"});
  ASSERT_GT(job, 0);
  const pid_t user = deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(56 * MiB), "6", "31", "20"});
  EXPECT_TRUE(exited_ok(wait_status(user))) << "the lock user failed";
  ASSERT_TRUE(test::create_signal_file(user_done.c_str())) << user_done;
  ASSERT_TRUE(exited_ok(wait_status(job))) << slurp(err_file());
  std::printf("job: %s", slurp(out_file()).c_str());  // the reclaim numbers, for the log
  auto n = job_numbers();
  EXPECT_GE(n["demoted"], 20) << slurp(out_file());  // 56 MiB needs >= 28 of 32 frames; 8 were free
  EXPECT_GE(n["reclaims"], 1);
  EXPECT_GE(n["promoted"], 1) << "free frames after the lock user left should have come back to the job: " << slurp(out_file());
  // The host frames its pages left on the way back are kept for the next reclaim.
  EXPECT_GE(n["spare_bytes"], n["promoted"] * 2 * MiB) << slurp(out_file());
  EXPECT_GE(n["rounds"], 3);
  expect_no_frame_leaked(*pool);
}

// A lock user queued behind a long hold asks the job's lent frames ahead of its grant; the
// job serves them once and does not take the freed frames back while the user waits (it
// moves pages back into free frames after a quiet second otherwise, and puts a new
// allocation's pages in free frames first), so the user's asks do not go back and forth: it
// asks for about what it needs, not that again every second. Every byte of all three checked.
TEST_F(Oversubscription, ALockUserQueuedForTheLockGetsTheJobsFramesOnceAheadOfItsGrant) {
  std::unique_ptr<pool_segment> pool;
  const std::string user_done = deploy_.dir() + "/user-done";
  // The job also allocates 8 MiB more while the user waits: into host frames, not the free
  // frames that are about to be the user's.
  const std::string grow = deploy_.dir() + "/grow";
  const pid_t job = spawn_job_on_three_quarters(1.0, 61, &pool, {"OVERSUB_WORKER_GROW=" + std::to_string(8 * MiB) + ":" + grow},
                                                {user_done, "0.5"});
  ASSERT_GT(job, 0);
  // The holder: 2 MiB (a free frame), holding the lock 4 s.
  const pid_t holder = deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(2 * MiB), "1", "71", "4000"});
  auto member_of = [&](pid_t pid) {
    for (int i = 0; i < 5000; ++i) {
      for (uint32_t m = 0; m < k_member_count; ++m) {
        if (pool->member(m).state.load() == member_live && pool->member(m).pid == pid) return m;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return k_no_member;
  };
  const uint32_t holder_member = member_of(holder);
  ASSERT_NE(holder_member, k_no_member) << "the holder is not a pool member";
  bool holding = false;
  for (int i = 0; i < 10000 && !holding; ++i) {
    holding = pool->member(holder_member).phase.load() == phase_running;
    if (!holding) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(holding) << "the holder did not take the lock";
  // The waiting user: 40 MiB, 20 frames, of which the pool has 7 free; the rest are the job's.
  const pid_t user = deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(40 * MiB), "1", "72", "20"});
  const uint32_t user_member = member_of(user);
  ASSERT_NE(user_member, k_no_member) << "the user is not a pool member";
  bool queued = false;
  for (int i = 0; i < 2000 && !queued; ++i) {
    queued = pool->member(user_member).phase.load() == phase_waiting && pool->member(user_member).frames_asked_ahead.load() > 0;
    if (!queued) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const bool still_held = pool->member(holder_member).phase.load() == phase_running;
  ASSERT_TRUE(test::create_signal_file(grow.c_str())) << grow;
  const int holder_status = wait_status(holder);
  const uint64_t asked = pool->member(user_member).frames_asked_ahead.load();
  EXPECT_TRUE(exited_ok(holder_status)) << "the holder failed";
  EXPECT_TRUE(exited_ok(wait_status(user))) << "the user failed; the job said: " << slurp(err_file());
  ASSERT_TRUE(test::create_signal_file(user_done.c_str())) << user_done;
  ASSERT_TRUE(exited_ok(wait_status(job))) << slurp(err_file());
  std::printf("job: %s", slurp(out_file()).c_str());
  EXPECT_GT(asked, 0u) << "the queued user asked nothing ahead of its grant";
  EXPECT_LE(asked, 20u) << "the queued user asked " << asked << " frames ahead for its 20: the job took freed frames back while it waited";
  EXPECT_LE(job_numbers()["demoted"], 20) << "the job moved more pages out than the user needed: " << slurp(out_file());
  EXPECT_TRUE(queued) << "the user never queued and asked ahead while the holder held";
  EXPECT_TRUE(still_held) << "the holder let go before the job grew (a slow machine?)";
  EXPECT_EQ(job_numbers()["grown_pool_bytes"], 0) << "the job's allocation took pool frames while the user waited: " << slurp(out_file());
  expect_no_frame_leaked(*pool);
}

// A lock holder that allocates (frames taken at malloc, as an unmodified program under the
// shim does) asks for all the frames it needs at once: the job serves them in one or two
// reclaims, not one per page (each reclaim drains the job's device work).
TEST_F(Oversubscription, AllocationUnderTheLockReclaimsInOneRequest) {
  std::unique_ptr<pool_segment> pool;
  const pid_t job = spawn_job_on_three_quarters(3.0, 61, &pool);
  ASSERT_GT(job, 0);
  const pid_t user = deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(56 * MiB), "3", "71", "20", "alloc-under-lock"});
  EXPECT_TRUE(exited_ok(wait_status(user))) << "the lock user failed";
  ASSERT_TRUE(exited_ok(wait_status(job))) << slurp(err_file());
  std::printf("job: %s", slurp(out_file()).c_str());
  auto n = job_numbers();
  EXPECT_GE(n["demoted"], 20) << slurp(out_file());
  EXPECT_LE(n["reclaims"], 3) << "frames were asked for page by page: " << slurp(out_file());
  expect_no_frame_leaked(*pool);
}

// A lock holder allocates, each allocation a request of its own that it waits for. The job
// serves each at once and ends the burst without waiting for a next request when no wait
// can save anything: while its launches yield to the holder (the default: nothing of the
// job's starts while its gate is open), even for allocations that come back to back; and,
// running free, when the holder's requests come further apart than the wait lasts (its own
// work between allocations, 150 ms here).
TEST_F(Oversubscription, ReclaimsForAHolderThatTheJobYieldsToWaitForNoNextRequest) { reclaim_allocations_apart("yield", 0); }
TEST_F(Oversubscription, ReclaimsOfAllocationsThatComeApartWaitForNoNextRequest) { reclaim_allocations_apart("free", 150); }

// A job at its VRAMSWAP_OVERSUBSCRIBE_LIMIT cannot move its pages to host memory: the lock
// user that asked for its frames fails at VRAMSWAP_EVICT_TIMEOUT with an error that says so,
// the job logs the failure once (not at every retry) and runs on with its bytes intact, and
// the request of the user that left is withdrawn, so that nobody's pages move for it.
TEST_F(Oversubscription, LockUserFacingAJobAtItsHostLimitFailsClearlyAndTheJobRunsOn) {
  std::unique_ptr<pool_segment> pool;
  const pid_t job = spawn_job_on_three_quarters(6.0, 81, &pool, {"VRAMSWAP_OVERSUBSCRIBE_LIMIT=4MiB", "VRAMSWAP_LOG=info"});
  ASSERT_GT(job, 0);
  // 56 MiB needs 28 of the 32 frames: 8 are free, 20 must come from the job, which can move
  // only 2 pages (4 MiB) to host memory.
  const std::string user_err = deploy_.dir() + "/user.err";
  const pid_t user = deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(56 * MiB), "2", "91", "20"},
                                   {"VRAMSWAP_EVICT_TIMEOUT=2"}, deploy_.dir() + "/user.out", user_err);
  const int user_status = wait_status(user);
  EXPECT_TRUE(WIFEXITED(user_status) && WEXITSTATUS(user_status) == 2) << user_status << slurp(user_err);
  const std::string said = slurp(user_err);
  EXPECT_NE(said.find("a low-priority job (VRAMSWAP_OVERSUBSCRIBE=1)"), std::string::npos) << said;
  EXPECT_NE(said.find("VRAMSWAP_OVERSUBSCRIBE_LIMIT"), std::string::npos) << said;
  // The job's own error, published in its member slot, not a guess.
  EXPECT_NE(said.find("its last try failed"), std::string::npos) << said;
  EXPECT_NE(said.find("more would pass VRAMSWAP_OVERSUBSCRIBE_LIMIT"), std::string::npos) << said;
  EXPECT_NE(said.find(std::to_string(job)), std::string::npos) << "the error should name the job's pid: " << said;
  // The user is gone: its requests are withdrawn (the frames are the job's again).
  uint32_t requested = 0;
  for (int i = 0; i < 300; ++i) {
    if ((requested = pool->count(frame_requested)) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(requested, 0u) << "requests of a lock user that left were not withdrawn";

  ASSERT_TRUE(exited_ok(wait_status(job))) << slurp(err_file());
  std::printf("job: %s", slurp(out_file()).c_str());
  const std::string err = slurp(err_file());
  size_t failures = 0;
  for (size_t at = 0; (at = err.find("giving back", at)) != std::string::npos; ++at) ++failures;
  EXPECT_EQ(failures, 1u) << "the failure should be logged once, not at every retry: " << err;
  // The limit bounds the frames made ahead (2 of 2 MiB at most, with those in use), quietly.
  auto n = job_numbers();
  EXPECT_LE(n["made_ahead"], 2) << slurp(out_file());
  EXPECT_LE(n["host_bytes"] + n["spare_bytes"], 4.0 * MiB) << slurp(out_file());
  EXPECT_EQ(err.find("made ahead of a reclaim"), std::string::npos) << err;
  EXPECT_NE(err.find("withdrawn"), std::string::npos) << err;
  expect_no_frame_leaked(*pool);
}

// The job makes host frames ahead of a reclaim, one per page in its lent pool frames, while
// no reclaim runs; a lock user that then takes its frames back waits for no new host frame.
TEST_F(Oversubscription, ReclaimAfterFramesWereMadeAheadCreatesNoHostFrameWhileTheHolderWaits) {
  std::unique_ptr<pool_segment> pool;
  const std::string user_done = deploy_.dir() + "/user-done";
  const pid_t job = spawn_job_on_three_quarters(0.5, 101, &pool, {"VRAMSWAP_LOG=info"}, {user_done, "1"});
  ASSERT_GT(job, 0);
  ASSERT_TRUE(wait_job_said("24 host frame(s) (48 MiB) ready ahead for reclaims")) << slurp(err_file());
  run_lock_user(user_done, 111);
  ASSERT_TRUE(exited_ok(wait_status(job))) << slurp(err_file());
  std::printf("job: %s", slurp(out_file()).c_str());
  auto n = job_numbers();
  EXPECT_GE(n["demoted"], 20) << slurp(out_file());
  EXPECT_GE(n["made_ahead"], 24) << slurp(out_file());
  EXPECT_EQ(n["created_in_reclaim"], 0) << "a reclaim created host frames although they were made ahead: " << slurp(err_file());
  const std::string err = slurp(err_file());
  EXPECT_GE(count_of(err, "reclaim: "), 1u) << err;
  EXPECT_EQ(count_of(err, "reclaim: "), count_of(err, "; 0 created while the lock holder waited)")) << err;
  expect_no_frame_leaked(*pool);
}

// VRAMSWAP_OVERSUBSCRIBE_AHEAD bounds the frames made ahead; a reclaim needing more creates
// the rest while the lock holder waits, and every byte is intact.
TEST_F(Oversubscription, FramesMadeAheadAreBoundedByTheOptionAndAReclaimCreatesTheRest) {
  std::unique_ptr<pool_segment> pool;
  const std::string user_done = deploy_.dir() + "/user-done";
  const pid_t job = spawn_job_on_three_quarters(0.5, 121, &pool, {"VRAMSWAP_LOG=info", "VRAMSWAP_OVERSUBSCRIBE_AHEAD=8MiB"},
                                                {user_done, "1"});
  ASSERT_GT(job, 0);
  ASSERT_TRUE(wait_job_said("4 host frame(s) (8 MiB) ready ahead for reclaims")) << slurp(err_file());
  run_lock_user(user_done, 131);
  ASSERT_TRUE(exited_ok(wait_status(job))) << slurp(err_file());
  std::printf("job: %s", slurp(out_file()).c_str());
  auto n = job_numbers();
  EXPECT_GE(n["demoted"], 20) << slurp(out_file());
  EXPECT_GE(n["created_in_reclaim"], 16) << "20 pages or more, 4 host frames made ahead: " << slurp(out_file());
  expect_no_frame_leaked(*pool);
}

// Making a frame ahead fails at the backend (creating the frame fails: its memfd cannot grow
// past the job's RLIMIT_FSIZE): the job logs it once and runs on with its bytes intact; once
// frames can be created again, a reclaim gives the lock user its frames.
TEST_F(Oversubscription, FailingToMakeFramesAheadLeavesTheJobRightAndReclaimWorks) {
  if (backend_ != "host") GTEST_SKIP() << "the failure is made with RLIMIT_FSIZE, which only the host backend's frames (memfds) obey";
  std::unique_ptr<pool_segment> pool;
  const std::string user_done = deploy_.dir() + "/user-done";
  const std::string can_create = deploy_.dir() + "/can-create";
  const pid_t job = spawn_job_on_three_quarters(0.5, 141, &pool,
                                                {"VRAMSWAP_LOG=info", "OVERSUB_WORKER_FSIZE=" + std::to_string(1 * MiB),
                                                 "OVERSUB_WORKER_FSIZE_UNTIL=" + can_create},
                                                {user_done, "1"});
  ASSERT_GT(job, 0);
  ASSERT_TRUE(wait_job_said("a host frame made ahead of a reclaim (0 made before it)")) << slurp(err_file());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // at least one retry, failing too
  EXPECT_EQ(::waitpid(job, nullptr, WNOHANG), 0) << "the job should run on: " << slurp(err_file());
  ASSERT_TRUE(test::create_signal_file(can_create.c_str())) << can_create;
  run_lock_user(user_done, 151);
  ASSERT_TRUE(exited_ok(wait_status(job))) << slurp(err_file());
  std::printf("job: %s", slurp(out_file()).c_str());
  auto n = job_numbers();
  EXPECT_GE(n["demoted"], 20) << slurp(out_file());
  const std::string err = slurp(err_file());
  EXPECT_EQ(count_of(err, "made ahead of a reclaim"), 1u) << "logged once, not at every retry: " << err;
  EXPECT_NE(err.find("ftruncate(memfd"), std::string::npos) << "the backend's failure should be said: " << err;
  expect_no_frame_leaked(*pool);
}

// SIGKILL of a running job: the pool server frees its lent frames, scrubbed.
TEST_F(Oversubscription, KilledJobsFramesAreFreed) {
  const pid_t job = spawn_job(96 * MiB, 30.0, 41);
  std::unique_ptr<pool_segment> pool;
  ASSERT_TRUE(deploy_.open_pool(&pool, 10000));
  ASSERT_EQ(wait_lent(*pool, 32, 10000), 32u);
  ASSERT_EQ(::kill(job, SIGKILL), 0);
  const int status = wait_status(job);
  EXPECT_TRUE(WIFSIGNALED(status));
  expect_no_frame_leaked(*pool);
}

// Past VRAMSWAP_OVERSUBSCRIBE_LIMIT an allocation fails, saying which limit and what to do.
TEST_F(Oversubscription, AllocationPastTheHostLimitFailsClearly) {
  const pid_t job = spawn_job(96 * MiB, 0.1, 51, {"VRAMSWAP_OVERSUBSCRIBE_LIMIT=16MiB"});
  const int status = wait_status(job);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  const std::string err = slurp(err_file());
  EXPECT_NE(err.find("VRAMSWAP_OVERSUBSCRIBE_LIMIT"), std::string::npos) << err;
  EXPECT_NE(err.find("malloc"), std::string::npos) << err;
  std::unique_ptr<pool_segment> pool;
  ASSERT_TRUE(deploy_.open_pool(&pool, 1000));
  expect_no_frame_leaked(*pool);
}

// Placement by use: the job declares uses of its last block, whose pages were first backed
// in host frames (the pool was full), and none of the others. Within a few rounds its pages
// are in pool frames, swapped with unused ones (the job lends as many pool frames as
// before), and every byte of every block stays right through the moves.
TEST_F(Oversubscription, PlacementByUseMovesUsedPagesFromHostIntoPoolFrames) {
  // It runs on until a round has checked every byte after the first pages were placed.
  const pid_t job = spawn_job(96 * MiB, 2.0, 101, {"VRAMSWAP_TEST_HOT_BLOCK=2", "VRAMSWAP_OVERSUBSCRIBE_PLACEMENT=1", "VRAMSWAP_TEST_WAIT_PLACED=1", "VRAMSWAP_LOG=info"});
  ASSERT_TRUE(exited_ok(wait_status(job))) << slurp(err_file());
  std::printf("job: %s", slurp(out_file()).c_str());
  auto n = job_numbers();
  EXPECT_EQ(n["start_host_bytes"], 32.0 * MiB) << "the last 16 MiB block should have started in host frames";
  EXPECT_EQ(n["hot_bytes"], 16.0 * MiB);
  EXPECT_EQ(n["hot_pool_bytes"], 16.0 * MiB) << "the used block should be in pool frames: " << slurp(out_file());
  EXPECT_GE(n["placed_in"], 8) << slurp(out_file());
  EXPECT_EQ(n["placed_in"], n["placed_out"]) << "placement swaps: as many pages out of pool frames as into them";
  EXPECT_EQ(n["pool_bytes"], 64.0 * MiB);
  EXPECT_EQ(n["host_bytes"], 32.0 * MiB);
  EXPECT_GE(n["placement_rounds"], 1);
  EXPECT_GE(n["rounds_after_placement"], 1) << "no round checked the bytes after the moves";
  const std::string err = slurp(err_file());
  EXPECT_NE(err.find("placement by use: 8 much-used page(s) into pool frames"), std::string::npos) << err;
  std::unique_ptr<pool_segment> pool;
  ASSERT_TRUE(deploy_.open_pool(&pool, 1000));
  expect_no_frame_leaked(*pool);
}

// A job whose steps use a fixed hot set larger than the pool (80 MiB of its 96 on 64 MiB of
// pool), sampled as the shim samples launches, so that pages used alike show different
// counts from one observation to the next. The placement settles within a few rounds: the
// unused tensors (first backed in pool frames) go to host frames, hot ones take their pool
// frames, and in the second half of the run no page moves; every byte is checked all along.
TEST_F(Oversubscription, PlacementByUseSettlesOnAFixedHotSetAndThenMovesNothing) {
  const pid_t job = spawn_job(96 * MiB, 10.0, 131, {"VRAMSWAP_TEST_STEPS=3", "VRAMSWAP_OVERSUBSCRIBE_PLACEMENT=1", "VRAMSWAP_LOG=info"});
  ASSERT_TRUE(exited_ok(wait_status(job))) << slurp(err_file());
  std::printf("job: %s", slurp(out_file()).c_str());
  auto n = job_numbers();
  EXPECT_EQ(n["start_host_bytes"], 32.0 * MiB);
  EXPECT_EQ(n["cold_pool_bytes"], 0) << "the unused tensors should have left the pool frames: " << slurp(out_file());
  EXPECT_GE(n["placed_in"], 8) << slurp(out_file());
  EXPECT_EQ(n["placed_in"], n["placed_in_at_half"]) << "pages still moved in the second half of the run: " << slurp(out_file());
  EXPECT_LE(n["placement_rounds"], 3) << "the placement took too many rounds to settle: " << slurp(out_file());
  EXPECT_LE(n["placed_in"], 16) << "pages moved back and forth: " << slurp(out_file());
  EXPECT_EQ(n["placed_in"], n["placed_out"]);
  EXPECT_EQ(n["pool_bytes"], 64.0 * MiB);
  EXPECT_GE(n["rounds"], 3) << "too few rounds checked the bytes";
  std::unique_ptr<pool_segment> pool;
  ASSERT_TRUE(deploy_.open_pool(&pool, 1000));
  expect_no_frame_leaked(*pool);
}

// A page in a host frame used steadily but lightly (30 uses a second: a 2 MiB page saves
// 60 MiB/s of link traffic in a pool frame): moving it would pay less than the gate's
// closing costs, so the cost model skips the rounds and nothing moves.
TEST_F(Oversubscription, PlacementByUseSkipsARoundWhoseGainIsBelowItsCost) {
  const pid_t job = spawn_job(96 * MiB, 6.0, 141, {"VRAMSWAP_TEST_LIGHT_USE=30", "VRAMSWAP_OVERSUBSCRIBE_PLACEMENT=1", "VRAMSWAP_LOG=debug"});
  ASSERT_TRUE(exited_ok(wait_status(job))) << slurp(err_file());
  std::printf("job: %s", slurp(out_file()).c_str());
  auto n = job_numbers();
  EXPECT_GE(n["placement_skipped"], 1) << slurp(out_file());
  EXPECT_EQ(n["placed_in"], 0) << slurp(out_file());
  EXPECT_EQ(n["placement_rounds"], 0);
  const std::string err = slurp(err_file());
  EXPECT_NE(err.find("placement by use: a round skipped"), std::string::npos) << err;
  EXPECT_NE(err.find("round(s) skipped: their gain was below their cost"), std::string::npos) << err;
}

// Many rounds: the used tensor changes every 2.5 s, so placement moves pages round after
// round (each new tensor in, unused ones out) while the job checks every byte of its memory
// between any two of its copies; nothing is lost, and the frames add up at the end.
TEST_F(Oversubscription, EveryByteSurvivesManyPlacementRounds) {
  const pid_t job = spawn_job(96 * MiB, 12.0, 151, {"VRAMSWAP_TEST_ROTATE=2.5", "VRAMSWAP_OVERSUBSCRIBE_PLACEMENT=1", "VRAMSWAP_LOG=info"});
  ASSERT_TRUE(exited_ok(wait_status(job))) << slurp(err_file());
  std::printf("job: %s", slurp(out_file()).c_str());
  auto n = job_numbers();
  EXPECT_GE(n["placement_rounds"], 3) << slurp(out_file());
  EXPECT_GE(n["placed_in"], 6) << slurp(out_file());
  EXPECT_EQ(n["placed_in"], n["placed_out"]);
  EXPECT_EQ(n["pool_bytes"], 64.0 * MiB);
  EXPECT_EQ(n["host_bytes"], 32.0 * MiB);
  EXPECT_GE(n["rounds_after_placement"], 2) << "too few rounds checked the bytes after the moves";
  std::unique_ptr<pool_segment> pool;
  ASSERT_TRUE(deploy_.open_pool(&pool, 1000));
  expect_no_frame_leaked(*pool);
}

// VRAMSWAP_OVERSUBSCRIBE_PLACEMENT=0: the same job's pages stay where they were first backed.
TEST_F(Oversubscription, PlacementByUseOffLeavesPagesWhereTheyWereFirstBacked) {
  const pid_t job = spawn_job(96 * MiB, 3.0, 102, {"VRAMSWAP_TEST_HOT_BLOCK=2", "VRAMSWAP_OVERSUBSCRIBE_PLACEMENT=0"});
  // (Without placement the used block stays in host frames: what the test above fails on.)
  ASSERT_TRUE(exited_ok(wait_status(job))) << slurp(err_file());
  auto n = job_numbers();
  EXPECT_EQ(n["placed_in"], 0) << slurp(out_file());
  EXPECT_EQ(n["hot_pool_bytes"], 0) << slurp(out_file());
}

// A lock user takes frames from a job whose placement keeps swapping pages (its used block
// changes every 2 s): the user gets its frames, nothing of either is lost, and placement
// goes on around the reclaim.
TEST_F(Oversubscription, LockUserReclaimsFramesFromAJobWhosePlacementSwapsPages) {
  const std::string user_done = deploy_.dir() + "/user-done";
  // The job runs on after the user until it has placed pages (the policy wants two periods of
  // use before a round moves any: on a loaded machine that can come after the reclaim).
  const pid_t job = spawn_job(96 * MiB, 2.5, 111,
                              {"VRAMSWAP_TEST_HOT_BLOCK=alternate", "VRAMSWAP_OVERSUBSCRIBE_PLACEMENT=1", "VRAMSWAP_TEST_WAIT_PLACED=1",
                               "VRAMSWAP_LOG=info"},
                              {user_done, "3"});
  std::unique_ptr<pool_segment> pool;
  ASSERT_TRUE(deploy_.open_pool(&pool, 10000));
  ASSERT_EQ(wait_lent(*pool, 32, 10000), 32u);
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // the job's first placement rounds
  const pid_t user = deploy_.spawn({VRAMSWAP_SESSION_WORKER, std::to_string(56 * MiB), "4", "121", "20"});
  EXPECT_TRUE(exited_ok(wait_status(user))) << "the lock user failed";
  ASSERT_TRUE(test::create_signal_file(user_done.c_str())) << user_done;
  ASSERT_TRUE(exited_ok(wait_status(job))) << slurp(err_file());
  std::printf("job: %s", slurp(out_file()).c_str());
  auto n = job_numbers();
  EXPECT_GE(n["demoted"], 20) << slurp(out_file());
  EXPECT_GE(n["reclaims"], 1);
  EXPECT_GE(n["placed_in"], 1) << slurp(out_file());
  EXPECT_GE(n["rounds"], 2);
  expect_no_frame_leaked(*pool);
}

}  // namespace
}  // namespace vramswap::detail
