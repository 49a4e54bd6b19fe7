// Description: restarts of the pool server (vramswapd) under running jobs, with real
// processes: three restart_worker jobs take turns on the device lock with random data checked
// at every turn while the server is stopped with SIGTERM (as a service manager does on an
// upgrade; the test plays the manager and starts the next one) and killed with SIGKILL (the
// jobs start the next one themselves); none fails and every byte stays intact. A job that dies
// while no server runs has its frames scrubbed and freed by the next server, and with no job
// left a stop still removes the pool. A server of another layout refuses a pool still in use,
// by name, and leaves it alone.
//
// Host backend by default; VRAMSWAP_TEST_BACKEND=cuda runs the same on the GPU
// (scripts/device-run.sh), where the next server gets the frames' handles from the jobs'
// imports (the server that made them is gone).
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/liveness_lease.hpp"
#include "pool/pool_layout.hpp"
#include "lock/shared_segment.hpp"
#include "pool/pool_segment.hpp"
#include "server/pool_server.hpp"
#include "support/backends.hpp"
#include "support/child_output.hpp"
#include "support/deployment.hpp"

namespace vramswap::detail {
namespace {
using namespace pool_layout;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

constexpr uint64_t MiB = 1ull << 20;

bool eventually(const std::function<bool()>& predicate, std::chrono::milliseconds timeout = 20s) {
  const auto deadline = clock_type::now() + timeout;
  while (clock_type::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return predicate();
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

class Restart : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = test::backend_under_test();
    ASSERT_TRUE(test::device0_key(backend_, &key_));
    deploy_.create("rs", key_,
                   {"VRAMSWAP_BACKEND=" + backend_, "VRAMSWAP_HOST_DEVICE_MEMORY=256MiB", "VRAMSWAP_FRAME_SIZE=2MiB",
                    "VRAMSWAP_POOL_SIZE=16MiB", "VRAMSWAP_HOST_POOL=48MiB", "VRAMSWAP_POOL_IDLE_EXIT=5", "VRAMSWAP_LOG=info", "VRAMSWAP_EVICT_TIMEOUT=20",
                    "VRAMSWAP_SWAP_DIR=/var/tmp"});
    stop_file_ = deploy_.dir() + "/stop";
  }

  void TearDown() override {
    // What the servers and jobs said, for a failure's story.
    if (HasFailure()) {
      const std::string show = "for f in " + deploy_.dir() + "/*.log " + deploy_.dir() + "/*.err; do echo \"== $f\"; cat \"$f\"; done >&2";
      if (std::system(show.c_str()) != 0) std::fprintf(stderr, "(could not show the logs in %s)\n", deploy_.dir().c_str());
    }
    for (pid_t p : jobs_) {
      if (p > 0 && ::kill(p, SIGKILL) == 0) ::waitpid(p, nullptr, 0);
    }
    for (pid_t s : servers_) {
      if (::kill(s, SIGKILL) == 0) ::waitpid(s, nullptr, 0);
    }
    if (notify_fd_ >= 0) ::close(notify_fd_);
    deploy_.destroy();
  }

  std::string file(const std::string& name) const { return deploy_.dir() + "/" + name; }

  // A foreground server, as a service manager runs it (with `managed`, a NOTIFY_SOCKET the
  // test holds, so that it tells its clients a manager restarts it); its pid once ready.
  pid_t start_server(const std::string& tag, bool managed, std::vector<std::string> extra = {}) {
    if (managed) {
      if (notify_fd_ < 0) {
        notify_fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        const std::string path = file("notify");
        std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
        EXPECT_EQ(::bind(notify_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
      }
      extra.push_back("NOTIFY_SOCKET=" + file("notify"));
    }
    const pid_t pid = deploy_.spawn({VRAMSWAP_SERVER_BINARY, "--foreground", "--ready-fd", "1"}, extra, file(tag + ".out"),
                                    file(tag + ".log"));
    servers_.push_back(pid);
    const bool ready = eventually([&] { return test::slurp(file(tag + ".out")).rfind("ready ", 0) == 0; }, 30s);
    EXPECT_TRUE(ready) << tag << " did not get ready: " << test::slurp(file(tag + ".log"));
    return ready ? pid : -1;
  }
  int stop_server(pid_t pid, int sig) {
    ::kill(pid, sig);
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    servers_.erase(std::remove(servers_.begin(), servers_.end(), pid), servers_.end());
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  }

  pid_t start_job(int i, uint64_t bytes, const std::string& mode = "") {
    std::vector<std::string> args = {VRAMSWAP_RESTART_WORKER, std::to_string(bytes), std::to_string(500 + i), stop_file_};
    if (!mode.empty()) args.push_back(mode);
    const pid_t pid = deploy_.spawn(args, {}, file("job" + std::to_string(i) + ".out"), file("job" + std::to_string(i) + ".err"));
    jobs_.push_back(pid);
    return pid;
  }
  std::string job_output(int i) const {
    return test::slurp(file("job" + std::to_string(i) + ".out")) + test::slurp(file("job" + std::to_string(i) + ".err"));
  }

  // Tells every job to stop (the stop file) and waits for each: it must end well, with
  // every byte it wrote checked at every turn. `ids` name their output files.
  void stop_jobs(const std::vector<pid_t>& jobs, const std::vector<int>& ids) {
    const int fd = ::open(stop_file_.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    ::close(fd);
    for (size_t i = 0; i < jobs.size(); ++i) {
      int status = 0;
      ASSERT_EQ(::waitpid(jobs[i], &status, 0), jobs[i]);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "job " << ids[i] << " status " << status << ": " << job_output(ids[i]);
      EXPECT_NE(job_output(ids[i]).find("rounds "), std::string::npos) << job_output(ids[i]);
    }
    jobs_.clear();
  }

  uint32_t member_of(pid_t pid) const {
    for (uint32_t m = 0; m < k_member_count; ++m) {
      if (pool_->member(m).state.load() == member_live && pool_->member(m).pid == pid) return m;
    }
    return k_no_member;
  }
  uint64_t acquires_of(pid_t pid) const {
    const uint32_t m = member_of(pid);
    return m == k_no_member ? 0 : pool_->member(m).acquires.load();
  }
  // Every job takes `turns` more turns on the lock (or one of them stops making progress).
  bool all_take_turns(const std::vector<pid_t>& jobs, uint64_t turns, std::chrono::milliseconds timeout = 20s) {
    std::vector<uint64_t> from;
    for (pid_t p : jobs) from.push_back(acquires_of(p));
    return eventually(
        [&] {
          for (size_t i = 0; i < jobs.size(); ++i) {
            if (acquires_of(jobs[i]) < from[i] + turns) return false;
          }
          return true;
        },
        timeout);
  }
  uint32_t frames_of(uint32_t member) const {
    uint32_t n = 0;
    for (uint32_t f = 0; f < pool_->frame_count(); ++f) {
      const frame_word w = frame_word::decode(pool_->read(f));
      n += w.state != frame_free && w.owner == member;
    }
    return n;
  }
  // The log of a server that a job started (on demand).
  std::string server_log() const { return test::slurp(deploy_.dir() + "/" + deploy_.prefix() + key_ + ".log"); }
  std::string segment_path() const {
    std::string name;
    EXPECT_EQ(pool_segment::name_for(key_, &name), ok);
    return deploy_.dir() + name;
  }

  std::string backend_;
  std::string key_;
  std::string stop_file_;
  test::deployment deploy_;
  std::unique_ptr<pool_segment> pool_;  // mapped read-only: the same file across adoptions
  std::vector<pid_t> jobs_;
  std::vector<pid_t> servers_;
  int notify_fd_ = -1;
};

// The whole story: SIGTERM of a managed server with jobs running, a job dying while no server
// runs, the next server adopting the pool (frames and shared host pool from the jobs) and
// repairing that job, SIGKILL of that server, the jobs starting and rejoining a third one
// (exactly one of them starts it), and at the end, with no job left, a stop that removes the
// pool.
TEST_F(Restart, JobsGoOnThroughASigtermAndAKillOfTheServerWithEveryByteIntact) {
  const pid_t first = start_server("server1", /*managed=*/true);
  ASSERT_GT(first, 0);
  ASSERT_TRUE(deploy_.open_pool(&pool_, 5000, /*read_only=*/true));
  // Three jobs of 6 MiB (4 frames each, with the page its small allocations share) on a pool
  // of 8 frames: turns move memory.
  std::vector<pid_t> jobs;
  std::vector<int> ids;  // their output files
  for (int i = 0; i < 3; ++i) {
    jobs.push_back(start_job(i, 6 * MiB));
    ids.push_back(i);
  }
  ASSERT_TRUE(all_take_turns(jobs, 2)) << job_output(0) << job_output(1) << job_output(2) << job_output(4);

  // A fourth job takes the lock and keeps it, with its memory in the pool.
  const pid_t victim = start_job(3, 6 * MiB, "hold");
  ASSERT_TRUE(eventually([&] { return test::slurp(file("job3.out")).find("holding") != std::string::npos; })) << job_output(3);
  const uint32_t victim_member = member_of(victim);
  ASSERT_NE(victim_member, k_no_member);
  const uint32_t victim_frames = frames_of(victim_member);
  EXPECT_EQ(victim_frames, 4u);
  // Its pages saved in the shared host pool while the others had their turns (read-mostly
  // copies are not kept: a saved copy goes once the page is back).
  const uint32_t victim_slots = pool_->count_slots(slot_used, victim_member);

  // SIGTERM with jobs attached: an upgrade, the pool is left for the next server.
  EXPECT_EQ(stop_server(first, SIGTERM), 0);
  EXPECT_NE(test::slurp(file("server1.log")).find("leaving the pool"), std::string::npos) << test::slurp(file("server1.log"));
  EXPECT_EQ(::access(segment_path().c_str(), F_OK), 0) << "the pool must stay for the next server";
  // The lock holder dies while no server runs: its lock passes on (the waiters see its
  // lease go), and its frames wait for the next server.
  ::kill(victim, SIGKILL);
  ::waitpid(victim, nullptr, 0);
  jobs_.erase(std::remove(jobs_.begin(), jobs_.end(), victim), jobs_.end());
  // Without a server the jobs go on: frames, host copies and the lock need none.
  EXPECT_TRUE(all_take_turns(jobs, 2)) << job_output(0) << job_output(1) << job_output(2) << job_output(4);
  EXPECT_EQ(frames_of(victim_member), victim_frames) << "nobody may take a dead member's frames before they are scrubbed";
  EXPECT_EQ(pool_->count_slots(slot_used, victim_member), victim_slots);

  // A job that starts now waits for the manager's restart rather than race it.
  const pid_t late = start_job(4, 6 * MiB);
  // The service manager starts the next server: it adopts the pool, the jobs rejoin, and the
  // frames of the job that died are scrubbed and freed; the late job joins (after the first
  // rejoin brought the frames).
  const pid_t second = start_server("server2", /*managed=*/false);
  ASSERT_GT(second, 0);
  jobs.push_back(late);
  ids.push_back(4);
  EXPECT_TRUE(eventually([&] { return count_of(test::slurp(file("server2.log")), "rejoined the pool") == 3; }))
      << test::slurp(file("server2.log"));
  EXPECT_TRUE(eventually([&] { return test::slurp(file("server2.log")).find("pid " + std::to_string(late) + " attached") != std::string::npos; }))
      << test::slurp(file("server2.log"));
  const std::string repaired = "pid " + std::to_string(victim) + " is gone; " + std::to_string(victim_frames) + " frames scrubbed and freed, " +
                               std::to_string(victim_slots) + " host slots zeroed and freed";
  EXPECT_TRUE(eventually([&] { return test::slurp(file("server2.log")).find(repaired) != std::string::npos; }))
      << "expected \"" << repaired << "\" in " << test::slurp(file("server2.log"));
  EXPECT_NE(test::slurp(file("server2.log")).find("adopted the running pool"), std::string::npos);
  EXPECT_TRUE(all_take_turns(jobs, 2)) << job_output(0) << job_output(1) << job_output(2) << job_output(4);

  // SIGKILL: the jobs start the next server themselves (one of them; the others join it).
  EXPECT_EQ(stop_server(second, SIGKILL), 128 + SIGKILL);
  EXPECT_TRUE(eventually([&] { return count_of(server_log(), "rejoined the pool") == 4; }, 30s)) << server_log();
  EXPECT_TRUE(all_take_turns(jobs, 3)) << job_output(0) << job_output(1) << job_output(2) << job_output(4);
  EXPECT_EQ(count_of(server_log(), "adopted the running pool"), 1u) << server_log();
  const pid_t third = pool_->header()->server_pid;
  EXPECT_NE(third, second);
  EXPECT_TRUE(alive(third));

  // Every job ends well, with every byte it wrote checked at every turn.
  stop_jobs(jobs, ids);
  EXPECT_TRUE(eventually([&] { return pool_->count(frame_free) == pool_->frame_count(); })) << "frames still owned";
  EXPECT_TRUE(eventually([&] { return pool_->count_slots(slot_free) == pool_->host_slot_count(); })) << "host slots still used";
  EXPECT_EQ(pool_->host_slot_count(), 24u);
  EXPECT_TRUE(eventually([&] {
    for (uint32_t m = 0; m < k_member_count; ++m) {
      if (pool_->member(m).state.load() != member_free) return false;
    }
    return true;
  }));

  // No job left: a stop removes the pool.
  ::kill(third, SIGTERM);
  EXPECT_TRUE(eventually([&] { return !alive(third); }));
  EXPECT_NE(::access(segment_path().c_str(), F_OK), 0) << "a server with no client left must remove the pool";
  EXPECT_NE(server_log().find("stopped; pool released"), std::string::npos) << server_log();
}

// The node's service (--service: a DaemonSet's server) stops with a job attached, for
// maintenance. The job goes on and never starts a server in its place: one would run in the
// job's cgroup, die with it, and while it lived the service could not start. A job that
// starts meanwhile waits for the service, then fails saying to start it. The service starts
// again (nothing holds the device) and the job rejoins it.
TEST_F(Restart, JobsNeverStartAServerInPlaceOfTheNodesService) {
  auto start_service = [&](const std::string& tag) {
    const pid_t pid = deploy_.spawn({VRAMSWAP_SERVER_BINARY, "--foreground", "--service", "--ready-fd", "1"}, {}, file(tag + ".out"),
                                    file(tag + ".log"));
    servers_.push_back(pid);
    EXPECT_TRUE(eventually([&] { return test::slurp(file(tag + ".out")).rfind("ready ", 0) == 0; }, 30s))
        << tag << " did not get ready: " << test::slurp(file(tag + ".log"));
    return pid;
  };
  const pid_t first = start_service("server1");
  ASSERT_TRUE(deploy_.open_pool(&pool_, 5000, /*read_only=*/true));
  const pid_t member = deploy_.spawn({VRAMSWAP_POOL_CLIENT, "join", "own", "0", "write", "0", "31", "ready", "wait-rejoined", "90",
                                      "check", "0", "31", "ready", "sleep", "120"},
                                     {}, file("member.out"), file("member.err"));
  jobs_.push_back(member);
  ASSERT_TRUE(eventually([&] { return test::slurp(file("member.out")).find("ready") != std::string::npos; })) << test::slurp(file("member.err"));
  EXPECT_EQ(stop_server(first, SIGTERM), 0);
  EXPECT_EQ(::access(segment_path().c_str(), F_OK), 0) << "the pool stays for the service's next start";

  const pid_t late = deploy_.spawn({VRAMSWAP_POOL_CLIENT, "connect"}, {}, file("late.out"), file("late.err"));
  int status = 0;
  ASSERT_EQ(::waitpid(late, &status, 0), late);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << ": " << test::slurp(file("late.err"));
  EXPECT_NE(test::slurp(file("late.err")).find("served by the node's service"), std::string::npos) << test::slurp(file("late.err"));
  EXPECT_NE(test::slurp(file("late.err")).find("starts no server of its own"), std::string::npos) << test::slurp(file("late.err"));
  EXPECT_NE(::access(server_log().c_str(), F_OK), 0) << "a job started a server of its own: " << server_log();

  const pid_t second = start_service("server2");
  EXPECT_EQ(test::slurp(file("server2.log")).find("already serves"), std::string::npos) << test::slurp(file("server2.log"));
  EXPECT_TRUE(eventually([&] { return count_of(test::slurp(file("member.out")), "ready") == 2; }, 30s)) << test::slurp(file("member.err"));
  EXPECT_NE(test::slurp(file("member.out")).find("rejoined " + std::to_string(second)), std::string::npos) << test::slurp(file("member.out"));
  EXPECT_NE(::access(server_log().c_str(), F_OK), 0) << "a job started a server of its own: " << server_log();
}

// A job whose descriptor limit does not let it keep the frames' descriptors works and rejoins
// a next server all the same; the frames come from a job that kept them, and a newcomer
// joins through them.
TEST_F(Restart, AJobThatCannotKeepTheDescriptorsRejoinsAndAnotherHandsTheFramesOver) {
  if (backend_ != "host") GTEST_SKIP() << "skipped: the descriptor budget is the host backend's (one per imported frame)";
  constexpr int frames = 64;
  const std::string pool_size = "VRAMSWAP_POOL_SIZE=" + std::to_string(frames * 2) + "MiB";
  // Managed, so that the next server is the test's (the manager's), with the test's limits:
  // one the limited job started would inherit its RLIMIT_NOFILE, too low to hold the pool.
  const pid_t first = start_server("server1", /*managed=*/true, {pool_size});
  ASSERT_GT(first, 0);
  ASSERT_TRUE(deploy_.open_pool(&pool_, 5000, /*read_only=*/true));
  ASSERT_EQ(pool_->frame_count(), static_cast<uint32_t>(frames));
  const pid_t limited = start_job(0, 6 * MiB, "few-fds:" + std::to_string(frames));
  std::vector<pid_t> jobs = {limited, start_job(1, 6 * MiB)};
  ASSERT_TRUE(all_take_turns(jobs, 2)) << job_output(0) << job_output(1);
  EXPECT_NE(job_output(0).find("cannot keep a descriptor of each of the pool's"), std::string::npos) << job_output(0);
  EXPECT_EQ(job_output(1).find("cannot keep"), std::string::npos) << job_output(1);

  // Killed: the manager starts the next server, which adopts the pool and gets the frames
  // from the job that kept them, whichever rejoins first.
  EXPECT_EQ(stop_server(first, SIGKILL), 128 + SIGKILL);
  ASSERT_GT(start_server("server2", /*managed=*/false, {pool_size}), 0);
  const auto server_log = [&] { return test::slurp(file("server2.log")); };
  EXPECT_TRUE(eventually([&] { return count_of(server_log(), "rejoined the pool") == 2; }, 30s)) << server_log();
  EXPECT_EQ(count_of(server_log(), "and handed over the frames"), 1u) << server_log();
  const std::string log = server_log();
  const size_t at = log.find("pid " + std::to_string(limited) + " rejoined the pool");
  ASSERT_NE(at, std::string::npos) << log;
  EXPECT_EQ(log.substr(at, log.find('\n', at) - at).find("handed over"), std::string::npos)
      << "the job without the descriptors cannot have handed them over: " << log;
  const pid_t late = start_job(2, 6 * MiB);
  jobs.push_back(late);
  EXPECT_TRUE(eventually([&] { return server_log().find("pid " + std::to_string(late) + " attached") != std::string::npos; }))
      << server_log();
  EXPECT_TRUE(all_take_turns(jobs, 2)) << job_output(0) << job_output(1) << job_output(2);

  stop_jobs(jobs, {0, 1, 2});
  EXPECT_TRUE(eventually([&] { return pool_->count(frame_free) == pool_->frame_count(); })) << "frames still owned";
}

// A member that dies while no server runs has its frames scrubbed by the next server before
// anyone can have them; the member that stayed rejoins with its bytes intact, and a newcomer
// served from the frames that member handed over sees the same memory.
TEST_F(Restart, AMemberThatDiesWhileNoServerRunsIsScrubbedByTheNext) {
  const pid_t first = start_server("server1", /*managed=*/true);
  ASSERT_GT(first, 0);
  ASSERT_TRUE(deploy_.open_pool(&pool_, 5000, /*read_only=*/true));
  // A owns frames 0-3 and host slots 0-1, its bytes in them; B owns frame 4 and rejoins the
  // next server.
  const pid_t a = deploy_.spawn({VRAMSWAP_POOL_CLIENT, "connect-noauto", "own", "0", "own", "1", "own", "2", "own", "3", "write", "0", "11",
                                 "write", "1", "12", "write", "2", "13", "write", "3", "14", "own-slot", "0", "15", "own-slot", "1", "16",
                                 "ready", "sleep", "120"},
                                {}, file("a.out"), file("a.err"));
  jobs_.push_back(a);
  const pid_t b = deploy_.spawn({VRAMSWAP_POOL_CLIENT, "join", "own", "4", "write", "4", "77", "ready", "wait-rejoined", "30", "check", "4",
                                 "77", "ready", "sleep", "120"},
                                {}, file("b.out"), file("b.err"));
  jobs_.push_back(b);
  ASSERT_TRUE(eventually([&] { return test::slurp(file("a.out")).find("ready") != std::string::npos; })) << test::slurp(file("a.err"));
  ASSERT_TRUE(eventually([&] { return test::slurp(file("b.out")).find("ready") != std::string::npos; })) << test::slurp(file("b.err"));
  const uint32_t a_member = member_of(a);
  ASSERT_NE(a_member, k_no_member);

  EXPECT_EQ(stop_server(first, SIGTERM), 0);
  ::kill(a, SIGKILL);
  ::waitpid(a, nullptr, 0);
  EXPECT_EQ(frames_of(a_member), 4u) << "a dead member's frames wait for the next server's scrub";
  EXPECT_EQ(pool_->count_slots(slot_used, a_member), 2u);

  const pid_t second = start_server("server2", /*managed=*/false);
  ASSERT_GT(second, 0);
  // B sees its own bytes again after the rejoin.
  ASSERT_TRUE(eventually([&] { return count_of(test::slurp(file("b.out")), "ready") == 2; })) << test::slurp(file("b.err"));
  EXPECT_NE(test::slurp(file("b.out")).find("rejoined " + std::to_string(second)), std::string::npos) << test::slurp(file("b.out"));
  EXPECT_TRUE(eventually([&] {
    return test::slurp(file("server2.log")).find("pid " + std::to_string(a) + " is gone; 4 frames scrubbed and freed, 2 host slots zeroed and freed") !=
           std::string::npos;
  })) << test::slurp(file("server2.log"));
  // A newcomer, served with the frames and the host pool B handed over: B's bytes, and zeros
  // where A's were (scrubbed before they were freed; nobody took them since: B owns only
  // frame 4).
  const pid_t c = deploy_.spawn({VRAMSWAP_POOL_CLIENT, "connect-noauto", "check", "4", "77", "zero", "0", "4", "slot-zero", "0", "2"}, {},
                                file("c.out"), file("c.err"));
  int status = 0;
  ASSERT_EQ(::waitpid(c, &status, 0), c);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << test::slurp(file("c.err")) << test::slurp(file("server2.log"));
  EXPECT_EQ(frames_of(member_of(b)), 1u);
}

// A member whose pool was replaced while no server ran (its segment removed by hand) is not
// taken into the new pool: its rejoin is refused, saying why, and its pool is gone.
TEST_F(Restart, ARejoinToAnotherPoolIsRefusedByName) {
  const pid_t first = start_server("server1", /*managed=*/false);
  ASSERT_GT(first, 0);
  const pid_t b = deploy_.spawn({VRAMSWAP_POOL_CLIENT, "join", "ready", "wait-rejoined", "30"}, {}, file("b.out"), file("b.err"));
  jobs_.push_back(b);
  ASSERT_TRUE(eventually([&] { return test::slurp(file("b.out")).find("ready") != std::string::npos; })) << test::slurp(file("b.err"));
  EXPECT_EQ(stop_server(first, SIGKILL), 128 + SIGKILL);
  ASSERT_EQ(::unlink(segment_path().c_str()), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(b, &status, 0), b);
  jobs_.clear();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  const std::string said = test::slurp(file("b.err"));
  EXPECT_NE(said.find("does not take this process back"), std::string::npos) << said;
  EXPECT_NE(said.find("the pool it belonged to is gone"), std::string::npos) << said;
  EXPECT_NE(said.find("Restart the job"), std::string::npos) << said;
  EXPECT_NE(said.find("wait-rejoined: the pool is gone"), std::string::npos) << said;
}

// The members of a pool whose server ended are all gone before one rejoined: the frames went
// with them, so the next server builds the pool anew, in the same segment, and welcomes the
// newcomer that waited for it.
TEST_F(Restart, APoolWhoseMembersAllEndBeforeRejoiningIsBuiltAnew) {
  const pid_t first = start_server("server1", /*managed=*/false);
  ASSERT_GT(first, 0);
  ASSERT_TRUE(deploy_.open_pool(&pool_, 5000, /*read_only=*/true));
  // A plain connection, which never rejoins: an orphan of the next server.
  const pid_t a = deploy_.spawn({VRAMSWAP_POOL_CLIENT, "connect-noauto", "own", "0", "write", "0", "21", "ready", "sleep", "120"}, {},
                                file("a.out"), file("a.err"));
  jobs_.push_back(a);
  ASSERT_TRUE(eventually([&] { return test::slurp(file("a.out")).find("ready") != std::string::npos; })) << test::slurp(file("a.err"));
  const uint64_t old_pool = pool_->header()->pool_id;
  EXPECT_EQ(stop_server(first, SIGKILL), 128 + SIGKILL);
  const pid_t second = start_server("server2", /*managed=*/false);
  ASSERT_GT(second, 0);
  // A newcomer waits for its welcome: the server has no frames yet.
  const pid_t c = deploy_.spawn({VRAMSWAP_POOL_CLIENT, "connect-noauto", "zero", "0", "8", "ready"}, {}, file("c.out"), file("c.err"));
  jobs_.push_back(c);
  ASSERT_TRUE(eventually([&] { return test::slurp(file("server2.log")).find("waits for its welcome") != std::string::npos; }))
      << test::slurp(file("server2.log"));
  ::kill(a, SIGKILL);
  ::waitpid(a, nullptr, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(c, &status, 0), c);
  jobs_.clear();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << test::slurp(file("c.err")) << test::slurp(file("server2.log"));
  EXPECT_NE(test::slurp(file("server2.log")).find("building the pool anew"), std::string::npos) << test::slurp(file("server2.log"));
  EXPECT_NE(pool_->header()->pool_id, old_pool);
  EXPECT_EQ(pool_->frame_count(), 8u);
}

// A server whose layout differs from a stale pool's, while a process still uses that pool,
// refuses it by name and leaves it as it is; once nobody uses it, it replaces it.
TEST_F(Restart, AnotherLayoutsPoolStillInUseIsRefusedByName) {
  if (backend_ != "host") GTEST_SKIP() << "skipped: in-process server on the host backend only";
  std::unique_ptr<backend> be;
  ASSERT_EQ(make_backend(backend_kind::host, &be), ok);
  std::string path;
  {
    std::unique_ptr<pool_segment> made;
    ASSERT_EQ(pool_segment::create(key_, 16, 2 * MiB, 0, ::getpid(), 0, &made), ok) << last_error();
    path = made->path();
    made->header()->format = (made->header()->format & ((1ull << 48) - 1)) | (uint64_t{k_layout_version + 1} << 48);
    made->keep_for_next_server();
  }
  // A process of that layout still attached: its member lease.
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(take_lease(fd, 3, "test"), ok) << last_error();
  option_set(option_id::frame_size, "2MiB");
  pool_server_options o;
  o.be = be.get();
  o.pool_size = "32MiB";
  std::unique_ptr<pool_server> server;
  clear_error();
  EXPECT_EQ(pool_server::start(o, &server), err_version_mismatch);
  const std::string said = last_error();
  EXPECT_NE(said.find(path), std::string::npos) << said;
  EXPECT_NE(said.find("still used by 1 process"), std::string::npos) << said;
  EXPECT_NE(said.find("layout version " + std::to_string(k_layout_version + 1) + " where this vramswapd has version " +
                      std::to_string(k_layout_version)),
            std::string::npos)
      << said;
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0) << "a refused pool is left alone";
  // Nobody uses it any more: replaced by a pool of this layout.
  ::close(fd);
  ASSERT_EQ(pool_server::start(o, &server), ok) << last_error();
  EXPECT_FALSE(server->adopted());
  server.reset();
  option_set(option_id::frame_size, nullptr);
}

}  // namespace
}  // namespace vramswap::detail
