// The public API (vramswap/vramswap.hpp and vramswap/vramswap.h) on the host backend: the
// guard's std::unique_lock-like semantics, try and timeout against a real second process
// (api_worker), exceptions and their messages, the C API's codes and last_error, the device
// order rule with two devices, and misuse in a forked child.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/options.hpp"
#include "cpp_api/api_test_env.hpp"
#include "runtime/runtime.hpp"
#include "support/forked_child.hpp"
#include "support/random_bytes.hpp"
#include "vramswap/vramswap.h"
#include "vramswap/vramswap.hpp"
#include "support/test_env.hpp"

extern char** environ;

namespace {
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
constexpr size_t MiB = size_t{1} << 20;

class PublicApi : public ::testing::Test {
 protected:
  void TearDown() override { env_.end(); }

  // A second process holding `device`'s lock for hold_ms; returns once it holds it.
  pid_t spawn_holder(int device, int hold_ms) {
    const std::string ready = env_.runtime_dir() + "/ready-" + std::to_string(device);
    ::unlink(ready.c_str());
    const pid_t pid = spawn_worker({"hold", std::to_string(device), std::to_string(hold_ms), ready});
    struct stat st {};
    for (int i = 0; i < 2000 && ::stat(ready.c_str(), &st) != 0; ++i) std::this_thread::sleep_for(5ms);
    EXPECT_EQ(::stat(ready.c_str(), &st), 0) << "the holder never took the lock";
    return pid;
  }
  // Runs api_worker with `args` and `extra_env` (NAME=VALUE) added to this environment; its
  // exit code, and its stderr in *err.
  int run_worker(const std::vector<std::string>& args, const std::vector<std::string>& extra_env, std::string* err) {
    const std::string err_path = env_.runtime_dir() + "/worker.err";
    const int code = wait_exit(spawn_worker(args, err_path, extra_env));
    *err = read_file(err_path);
    return code;
  }
  static size_t count_of(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  }

  // api_worker with these arguments, its stderr into `err_file` (when given), with `extra_env`
  // (NAME=VALUE) before this environment.
  pid_t spawn_worker(std::vector<std::string> args, const std::string& err_file = "",
                     const std::vector<std::string>& extra_env = {}) {
    args.insert(args.begin(), VRAMSWAP_API_WORKER);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_text(extra_env);
    for (char** e = environ; *e != nullptr; ++e) env_text.emplace_back(*e);
    std::vector<char*> envp;
    for (auto& e : env_text) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (!err_file.empty()) posix_spawn_file_actions_addopen(&actions, 2, err_file.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    pid_t pid = -1;
    EXPECT_EQ(::posix_spawn(&pid, VRAMSWAP_API_WORKER, &actions, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&actions);
    return pid;
  }
  std::string path(const char* name) const { return env_.runtime_dir() + "/" + name; }
  static void create(const std::string& file) {
    const int fd = ::open(file.c_str(), O_CREAT | O_WRONLY, 0600);
    if (fd >= 0) ::close(fd);
  }
  // Until every thread of `pid`, a process that is not this one's child (waitpid cannot see
  // its stop), is stopped: kill(SIGSTOP) returns while a thread of it may still run.
  static bool wait_stopped(pid_t pid) {
    const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
    for (int i = 0; i < 500; ++i) {
      bool all = true, any = false;
      if (DIR* dir = ::opendir(tasks.c_str())) {
        while (const dirent* e = ::readdir(dir)) {
          if (e->d_name[0] == '.') continue;
          const std::string stat = read_file(tasks + "/" + e->d_name + "/stat");
          const size_t paren = stat.rfind(')');
          if (paren == std::string::npos || paren + 2 >= stat.size()) continue;  // gone meanwhile
          any = true;
          all = all && (stat[paren + 2] == 'T' || stat[paren + 2] == 't');
        }
        ::closedir(dir);
      }
      if (any && all) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
  // Until `file` exists or `pid` has exited (then false, its status in *status).
  static bool wait_file(const std::string& file, pid_t pid, int* status) {
    struct stat st {};
    for (int i = 0; i < 12000; ++i) {
      if (::stat(file.c_str(), &st) == 0) return true;
      if (::waitpid(pid, status, WNOHANG) == pid) return false;
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << file << " never appeared";
    return false;
  }
  static std::string read_file(const std::string& file) {
    std::string out;
    if (FILE* f = std::fopen(file.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
      std::fclose(f);
    }
    return out;
  }
  static int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }
  static int wait_exit(pid_t pid) {
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  vramswap::detail::test::api_test_env env_;
};

TEST_F(PublicApi, GuardOwnsUntilUnlockOrDestruction) {
  {
    vramswap::gpu_lock g(0);
    EXPECT_TRUE(g.owns_lock());
    EXPECT_TRUE(static_cast<bool>(g));
    EXPECT_EQ(g.device(), 0);
    EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 1u);
    g.unlock();
    EXPECT_FALSE(g.owns_lock());
    EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 0u);
    try {
      g.unlock();
      FAIL() << "unlock of a guard that does not own must throw";
    } catch (const vramswap::error& e) {
      EXPECT_EQ(e.code(), VRAMSWAP_ERR_NOT_OWNER);
      EXPECT_NE(std::string(e.what()).find("gpu_lock::unlock(device 0)"), std::string::npos) << e.what();
    }
    g.lock();
    EXPECT_TRUE(g.owns_lock());
    EXPECT_THROW(g.lock(), vramswap::invalid_argument);  // a guard owns at most once
  }
  // The destructor released it: nothing left to unlock.
  EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 0u);
  EXPECT_EQ(vramswap_unlock(0), VRAMSWAP_ERR_NOT_OWNER);
  EXPECT_NE(std::string(vramswap_last_error()).find("does not hold"), std::string::npos) << vramswap_last_error();
}

TEST_F(PublicApi, ReentryByTheHoldingThreadIsCounted) {
  const uint64_t before = vramswap::get_stats(0).acquires;
  {
    vramswap::gpu_lock outer(0);
    {
      vramswap::gpu_lock inner(0, vramswap::priority::high);  // priority ignored on re-entry
      EXPECT_TRUE(inner.owns_lock());
      EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 2u);
    }
    EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 1u);
  }
  EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 0u);
  EXPECT_EQ(vramswap::get_stats(0).acquires, before + 1) << "a re-entry is not an acquisition";
}

TEST_F(PublicApi, MoveTransfersOwnershipAndReleaseForgetsIt) {
  vramswap::gpu_lock a(0);
  vramswap::gpu_lock b(std::move(a));
  EXPECT_FALSE(a.owns_lock());
  EXPECT_TRUE(b.owns_lock());
  vramswap::gpu_lock c(0, std::defer_lock);
  c = std::move(b);
  EXPECT_TRUE(c.owns_lock());
  EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 1u);
  EXPECT_TRUE(c.release());  // the caller now owns it, through the C API
  EXPECT_FALSE(c.owns_lock());
  EXPECT_EQ(vramswap_unlock(0), VRAMSWAP_OK) << vramswap_last_error();
}

TEST_F(PublicApi, GenericLockingCodeDrivesAGpuLock) {
  vramswap::gpu_lock g(0, std::defer_lock);
  {
    std::unique_lock<vramswap::gpu_lock> ul(g);
    EXPECT_TRUE(g.owns_lock());
  }
  EXPECT_FALSE(g.owns_lock());
  {
    std::lock_guard<vramswap::gpu_lock> lg(g);
    EXPECT_TRUE(g.owns_lock());
  }
  EXPECT_FALSE(g.owns_lock());
  EXPECT_TRUE(g.try_lock_until(std::chrono::steady_clock::now() + 1s));
  g.unlock();
}

volatile sig_atomic_t g_usr1_handled = 0;
void on_usr1(int) { g_usr1_handled = g_usr1_handled + 1; }

// SIGUSR1 (counted by on_usr1) to the thread that made it, every 20 ms from `after` on, until
// stop(); on_usr1 is its handler for the object's life. since_first() is how long after the
// first signal a moment came: the bound on how long a wait went on once signals arrived.
class usr1_pester {
 public:
  explicit usr1_pester(std::chrono::milliseconds after) : waiting_(::pthread_self()) {
    struct sigaction sa {};
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    installed_ = ::sigaction(SIGUSR1, &sa, &previous_) == 0;
    if (!installed_) return;  // without the handler, SIGUSR1 would end the test
    thread_ = std::thread([this, after] {
      std::this_thread::sleep_for(after);
      first_ns_.store(clock_type::now().time_since_epoch().count());
      while (!stopped_.load()) {
        ::pthread_kill(waiting_, SIGUSR1);
        std::this_thread::sleep_for(20ms);
      }
    });
  }
  ~usr1_pester() {
    stop();
    if (installed_) ::sigaction(SIGUSR1, &previous_, nullptr);
  }
  usr1_pester(const usr1_pester&) = delete;
  usr1_pester& operator=(const usr1_pester&) = delete;
  bool installed() const { return installed_; }
  void stop() {
    stopped_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  std::chrono::nanoseconds since_first(clock_type::time_point at) const {
    return std::chrono::nanoseconds(at.time_since_epoch().count() - first_ns_.load());
  }

 private:
  pthread_t waiting_;
  struct sigaction previous_ {};
  bool installed_ = false;
  std::atomic<bool> stopped_{false};
  std::atomic<int64_t> first_ns_{0};
  std::thread thread_;
};

// A signal handler that runs on the waiting thread ends vramswap_lock_interruptible's wait
// (VRAMSWAP_ERR_INTERRUPTED, nothing held, out of the queue); vramswap_lock's wait goes on
// through the same signals until the grant.
TEST_F(PublicApi, InterruptibleCLockEndsOnASignalThePlainOneWaitsThroughIt) {
  struct sigaction sa {}, previous{};
  sa.sa_handler = on_usr1;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(::sigaction(SIGUSR1, &sa, &previous), 0);
  const pid_t holder = spawn_holder(0, 3000);
  const pthread_t waiting = ::pthread_self();
  std::atomic<bool> returned{false};
  // Signals every 20 ms until the call returns: one of them finds the thread asleep.
  auto pester = [&] {
    while (!returned.load()) {
      std::this_thread::sleep_for(20ms);
      if (!returned.load()) ::pthread_kill(waiting, SIGUSR1);
    }
  };
  std::thread t1(pester);
  const int rc = vramswap_lock_interruptible(0, VRAMSWAP_PRIORITY_NORMAL, -1);
  returned.store(true);
  t1.join();
  EXPECT_EQ(rc, VRAMSWAP_ERR_INTERRUPTED) << vramswap_last_error();
  EXPECT_STREQ(vramswap_status_name(VRAMSWAP_ERR_INTERRUPTED), "interrupted");
  EXPECT_GT(g_usr1_handled, 0);
  EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 0u);
  returned.store(false);
  std::thread t2(pester);
  EXPECT_EQ(vramswap_lock(0, VRAMSWAP_PRIORITY_NORMAL, 30'000'000'000), VRAMSWAP_OK) << vramswap_last_error();
  returned.store(true);
  t2.join();
  EXPECT_EQ(vramswap_unlock(0), VRAMSWAP_OK);
  EXPECT_EQ(wait_exit(holder), 0);
  ::sigaction(SIGUSR1, &previous, nullptr);
}

// The first acquire of a device opens its session, which waits for the pool server to answer
// its hello. A server that took the connection and then stopped answering (SIGSTOP, stuck in
// a driver call) held that acquire for the server start timeout (30 s), past the acquire's
// own timeout and through every signal. The timeout now bounds the whole call, and an
// interruptible acquire ends on a signal there too; neither leaves anything behind, and the
// lock is taken once the server answers again.
TEST_F(PublicApi, AnAcquiresTimeoutAndSignalsEndItsWaitForAPoolServerThatDoesNotAnswer) {
  EXPECT_EQ(wait_exit(spawn_holder(0, 1)), 0);  // it started the device's pool server
  pid_t server = 0;
  ASSERT_EQ(vramswap::detail::rt::pool_server_pid(0, &server), 0);
  ASSERT_GT(server, 0);
  ASSERT_EQ(::kill(server, SIGSTOP), 0);
  struct resume_at_end {
    pid_t pid;
    ~resume_at_end() { ::kill(pid, SIGCONT); }
  } resume{server};
  ASSERT_TRUE(wait_stopped(server)) << "the pool server (pid " << server << ") did not stop within 5 s";

  auto t0 = clock_type::now();
  EXPECT_EQ(vramswap_lock(0, VRAMSWAP_PRIORITY_NORMAL, 300'000'000), VRAMSWAP_ERR_TIMEOUT) << vramswap_last_error();
  EXPECT_LT(clock_type::now() - t0, 300ms + 100ms) << "the acquire's timeout (0.3 s) should bound its wait for the server";
  const std::string timed_out = vramswap_last_error();
  EXPECT_NE(timed_out.find("timeout ran out while waiting for the pool server (pid " + std::to_string(server) + ") to answer"),
            std::string::npos) << timed_out;
  EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 0u);

  {
    usr1_pester pester(200ms);
    ASSERT_TRUE(pester.installed());
    const int interrupted = vramswap_lock_interruptible(0, VRAMSWAP_PRIORITY_NORMAL, -1);
    const auto returned = clock_type::now();
    pester.stop();
    EXPECT_EQ(interrupted, VRAMSWAP_ERR_INTERRUPTED) << vramswap_last_error();
    EXPECT_LT(pester.since_first(returned), 100ms) << "a signal should end the wait for the server";
  }
  EXPECT_NE(std::string(vramswap_last_error()).find("interrupted while waiting for the pool server"), std::string::npos)
      << vramswap_last_error();
  EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 0u);

  // Another thread opening the session meanwhile, waiting for the same server, holds the
  // runtime's mutex: this thread's wait for that mutex is bounded by its timeout too.
  std::thread opener([] { vramswap_lock(0, VRAMSWAP_PRIORITY_NORMAL, 3'000'000'000); });
  std::this_thread::sleep_for(300ms);
  t0 = clock_type::now();
  EXPECT_EQ(vramswap_lock(0, VRAMSWAP_PRIORITY_NORMAL, 300'000'000), VRAMSWAP_ERR_TIMEOUT) << vramswap_last_error();
  EXPECT_LT(clock_type::now() - t0, 2s) << "the other thread's opening (3 s) should not hold this timeout";
  EXPECT_NE(std::string(vramswap_last_error()).find("another thread of this process to open"), std::string::npos)
      << vramswap_last_error();
  opener.join();

  ASSERT_EQ(::kill(server, SIGCONT), 0);
  EXPECT_EQ(vramswap_lock(0, VRAMSWAP_PRIORITY_NORMAL, 20'000'000'000), VRAMSWAP_OK) << vramswap_last_error();
  EXPECT_EQ(vramswap_unlock(0), VRAMSWAP_OK) << vramswap_last_error();
}

// After the grant, an acquire brings its memory in, and waits for the pool frames it needs
// from the processes that hold them idle. An owner that does not answer (SIGSTOP, stuck in a
// driver call) held that wait for VRAMSWAP_EVICT_TIMEOUT (30 s), past the acquire's timeout
// and through every signal. The timeout bounds it too, and an interruptible acquire ends on a
// signal there; either way the lock is released again and nothing of this process's memory
// is lost: once the owner goes on, the next acquire brings every byte back.
TEST_F(PublicApi, AnAcquiresTimeoutAndSignalsEndItsWaitForFramesAStoppedOwnerHolds) {
  // The pool: 32 frames of 2 MiB. This process keeps 24 MiB (12 frames); the owner then
  // takes 56 MiB (28 frames, some of them evicted from this process), and keeps them idle.
  constexpr size_t mine_bytes = 24 * MiB;
  constexpr uint64_t seed = 3911;
  void* mine = nullptr;
  {
    vramswap::gpu_lock lock(0);
    mine = vramswap::malloc(mine_bytes, 0);
    vramswap::detail::test::fill_random(mine, mine_bytes, seed);
  }
  const std::string ready = path("owner-ready"), end = path("owner-end");
  const pid_t owner = spawn_worker({"keep", "0", std::to_string(56 * MiB), ready, end}, path("owner.err"));
  int status = 0;
  ASSERT_TRUE(wait_file(ready, owner, &status)) << "the owner exited " << exit_code(status) << ": " << read_file(path("owner.err"));
  // The owner took its frames partly from this process: what it kept here is not all of it.
  const vramswap::stats before = vramswap::get_stats(0);
  ASSERT_LT(before.resident_bytes, mine_bytes) << "the owner did not take frames from this process (host "
                                               << before.host_bytes << " B, resident " << before.resident_bytes << " B)";
  // kill() returns before every thread of the owner has stopped: one of them could still serve
  // a request for a moment. The group stop is complete once waitpid reports it.
  ASSERT_EQ(::kill(owner, SIGSTOP), 0);
  ASSERT_EQ(::waitpid(owner, &status, WUNTRACED), owner);
  ASSERT_TRUE(WIFSTOPPED(status));
  struct resume_at_end {
    pid_t pid;
    ~resume_at_end() { ::kill(pid, SIGCONT); }
  } resume{owner};

  constexpr auto timeout = 500ms;
  auto t0 = clock_type::now();
  const int timed = vramswap_lock(0, VRAMSWAP_PRIORITY_NORMAL, std::chrono::nanoseconds(timeout).count());
  auto waited = clock_type::now() - t0;
  if (timed == VRAMSWAP_OK) {
    const vramswap::stats s = vramswap::get_stats(0);
    vramswap_unlock(0);
    create(end);
    FAIL() << "granted with the owner stopped: before, resident " << before.resident_bytes << " B, host " << before.host_bytes
           << " B; now resident " << s.resident_bytes << " B, evictions served " << s.evictions_served;
  }
  EXPECT_EQ(timed, VRAMSWAP_ERR_TIMEOUT) << vramswap_last_error();
  // The bound is the timeout plus a slice of the frame wait and the way out (the lock's
  // release); the wait took 30 s before.
  EXPECT_LT(waited, timeout + 100ms) << "the acquire's timeout should bound its wait for the frames";
  const std::string timed_out = vramswap_last_error();
  EXPECT_NE(timed_out.find("process " + std::to_string(owner) + " (pool member"), std::string::npos) << timed_out;
  EXPECT_NE(timed_out.find("(the acquire's timeout)"), std::string::npos) << timed_out;
  EXPECT_NE(timed_out.find("the lock was released again"), std::string::npos) << timed_out;
  EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 0u);

  {
    usr1_pester pester(300ms);
    ASSERT_TRUE(pester.installed());
    const int interrupted = vramswap_lock_interruptible(0, VRAMSWAP_PRIORITY_NORMAL, 20'000'000'000);
    const auto returned = clock_type::now();
    pester.stop();
    EXPECT_EQ(interrupted, VRAMSWAP_ERR_INTERRUPTED) << vramswap_last_error();
    EXPECT_LT(pester.since_first(returned), 100ms) << "a signal should end the wait for the frames";
  }
  EXPECT_NE(std::string(vramswap_last_error()).find("interrupted while waiting for other processes to give back the pool frames"),
            std::string::npos) << vramswap_last_error();
  EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 0u);

  // The owner goes on and evicts; every byte of this process comes back.
  ASSERT_EQ(::kill(owner, SIGCONT), 0);
  {
    vramswap::gpu_lock lock(0, 20s);
    ASSERT_TRUE(lock.owns_lock()) << "the owner did not give the frames back within 20 s";
    EXPECT_EQ(vramswap::detail::test::first_mismatch(mine, mine_bytes, seed), mine_bytes) << "this process's bytes changed";
    vramswap::free(mine, 0);
  }
  create(end);
  EXPECT_EQ(wait_exit(owner), 0) << read_file(path("owner.err"));
}

// A first acquire that gives up (its timeout) while the pool server it started is still on its
// way (a wrapper that takes 1.5 s, as a server that initializes CUDA takes seconds) leaves it
// to start. The next acquire waits for that server instead of starting a second one, which
// would lose the race for the pool and have the start recorded as failed for every waiter.
TEST_F(PublicApi, AServerStartLeftByAnAcquireThatGaveUpIsWaitedForNotRepeated) {
  const std::string slow = env_.runtime_dir() + "/slow-vramswapd";
  const std::string starts = env_.runtime_dir() + "/server-starts";  // a line per start
  {
    std::FILE* f = std::fopen(slow.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, "#!/bin/sh\necho $$ >>%s\nsleep 1.5\nexec %s \"$@\"\n", starts.c_str(), VRAMSWAP_SERVER_BINARY);
    std::fclose(f);
    ASSERT_EQ(::chmod(slow.c_str(), 0755), 0);
  }
  vramswap::detail::option_set(vramswap::detail::option_id::server_path, slow.c_str());
  struct restore_server {
    ~restore_server() { vramswap::detail::option_set(vramswap::detail::option_id::server_path, VRAMSWAP_SERVER_BINARY); }
  } restore;

  auto t0 = clock_type::now();
  EXPECT_EQ(vramswap_lock(0, VRAMSWAP_PRIORITY_NORMAL, 500'000'000), VRAMSWAP_ERR_TIMEOUT) << vramswap_last_error();
  EXPECT_LT(clock_type::now() - t0, 1400ms) << "the timeout should end the wait for the server's start";
  EXPECT_NE(std::string(vramswap_last_error()).find("was left to start"), std::string::npos) << vramswap_last_error();
  EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 0u);

  EXPECT_EQ(vramswap_lock(0, VRAMSWAP_PRIORITY_NORMAL, 20'000'000'000), VRAMSWAP_OK) << vramswap_last_error();
  EXPECT_EQ(vramswap_unlock(0), VRAMSWAP_OK);
  EXPECT_EQ(count_of(read_file(starts), "\n"), 1u) << "servers started: " << read_file(starts);
}

TEST_F(PublicApi, TryAndTimeoutAgainstAnotherProcess) {
  const pid_t holder = spawn_holder(0, 2500);
  vramswap::gpu_lock t(0, std::try_to_lock);
  EXPECT_FALSE(t.owns_lock());
  const auto t0 = clock_type::now();
  EXPECT_FALSE(t.try_lock_for(150ms));
  EXPECT_GE(clock_type::now() - t0, 150ms);
  try {
    vramswap::gpu_lock timed(0, 100ms);
    FAIL() << "the timed constructor must throw vramswap::timeout";
  } catch (const vramswap::timeout& e) {
    EXPECT_EQ(e.code(), VRAMSWAP_ERR_TIMEOUT);
    EXPECT_NE(std::string(e.what()).find("gpu_lock(device 0): not acquired within 100"), std::string::npos) << e.what();
  }
  // The C API: a try is busy, a timed wait times out; both say why.
  EXPECT_EQ(vramswap_lock(0, VRAMSWAP_PRIORITY_NORMAL, 0), VRAMSWAP_ERR_BUSY);
  EXPECT_STRNE(vramswap_last_error(), "");
  EXPECT_EQ(vramswap_lock(0, VRAMSWAP_PRIORITY_HIGH, 50'000'000), VRAMSWAP_ERR_TIMEOUT);
  EXPECT_STREQ(vramswap_status_name(VRAMSWAP_ERR_TIMEOUT), "timeout");
  EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 0u);
  // A blocking lock waits for the holder to let go.
  vramswap::gpu_lock g(0);
  EXPECT_TRUE(g.owns_lock());
  EXPECT_GE(clock_type::now() - t0, 1s);
  g.unlock();
  EXPECT_EQ(wait_exit(holder), 0);
}

// Fair turns through a real session: a holder past VRAMSWAP_MAX_HOLD while this process
// waits is warned by its service thread while it sleeps (no call of its own); and
// `vramswap release-request` reaches a holder that polls vramswap::release_requested().
TEST_F(PublicApi, AHolderIsWarnedPastItsLimitAndHearsAReleaseRequest) {
  const std::string ready = path("ready-fair"), held_log = path("held.err"), polled_log = path("polled.err");
  pid_t holder = spawn_worker({"hold", "0", "1500", ready}, held_log, {"VRAMSWAP_MAX_HOLD=0.3"});
  int status = 0;
  ASSERT_TRUE(wait_file(ready, holder, &status)) << "the holder exited " << exit_code(status) << ": " << read_file(held_log);
  {
    vramswap::gpu_lock waits(0);  // granted when the holder lets go
  }
  EXPECT_EQ(wait_exit(holder), 0) << read_file(held_log);
  std::string text = read_file(held_log);
  EXPECT_EQ(count_of(text, "past its VRAMSWAP_MAX_HOLD"), 1u) << text;
  EXPECT_NE(text.find("lock: this process has held "), std::string::npos) << "said while holding, by the service thread:\n" << text;
  EXPECT_NE(text.find("pid " + std::to_string(::getpid()) + " ("), std::string::npos) << "who waits:\n" << text;

  ::unlink(ready.c_str());
  holder = spawn_worker({"polled", "0", ready}, polled_log);
  ASSERT_TRUE(wait_file(ready, holder, &status)) << "the holder exited " << exit_code(status) << ": " << read_file(polled_log);
  EXPECT_FALSE(vramswap::release_requested(0)) << "this process does not hold the lock";
  const std::string cli_out = path("cli.out");
  std::vector<std::string> args = {VRAMSWAP_CLI_BINARY, "release-request", "--device", "host-0"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, cli_out.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t cli = -1;
  ASSERT_EQ(::posix_spawn(&cli, VRAMSWAP_CLI_BINARY, &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  EXPECT_EQ(wait_exit(cli), 0) << read_file(cli_out);
  EXPECT_NE(read_file(cli_out).find("asked pid " + std::to_string(holder) + " ("), std::string::npos) << read_file(cli_out);
  EXPECT_EQ(wait_exit(holder), 0) << "the holder did not hear the request (5) or its C and C++ answers differ (6): "
                                  << read_file(polled_log);
  text = read_file(polled_log);
  EXPECT_EQ(count_of(text, "asked this process to release"), 1u) << text;
}

TEST_F(PublicApi, ErrorsAreTypedAndNameTheCall) {
  try {
    vramswap::gpu_lock g(7);
    FAIL();
  } catch (const vramswap::invalid_argument& e) {
    EXPECT_EQ(e.code(), VRAMSWAP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("lock(device 7): no such device"), std::string::npos) << e.what();
  }
  EXPECT_THROW(vramswap::gpu_lock(-1), vramswap::invalid_argument);
  EXPECT_THROW(vramswap::gpu_lock(0, static_cast<vramswap::priority>(9)), vramswap::invalid_argument);
  EXPECT_THROW(vramswap::malloc(0), vramswap::invalid_argument);
  try {
    vramswap::malloc(size_t{1} << 40);  // far beyond the arena
    FAIL();
  } catch (const vramswap::out_of_memory& e) {
    EXPECT_EQ(e.code(), VRAMSWAP_ERR_OUT_OF_MEMORY);
    EXPECT_NE(std::string(e.what()).find("malloc("), std::string::npos) << e.what();
  }
  void* p = vramswap::malloc(4096);
  EXPECT_THROW(vramswap::free(static_cast<char*>(p) + 256), vramswap::invalid_argument);  // interior pointer
  EXPECT_NO_THROW(vramswap::free(p));
  EXPECT_THROW(vramswap::free(p), vramswap::invalid_argument);  // double free
  EXPECT_NO_THROW(vramswap::free(nullptr));
  // Every exception is a std::runtime_error (and so a std::exception).
  try {
    vramswap::malloc(0);
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("size 0"), std::string::npos) << e.what();
  }
}

TEST_F(PublicApi, EveryCodeMapsToItsException) {
  auto thrown = [](int code) -> std::string {
    try {
      vramswap::throw_error(code, "detail");
    } catch (const vramswap::invalid_argument&) {
      return "invalid_argument";
    } catch (const vramswap::out_of_memory&) {
      return "out_of_memory";
    } catch (const vramswap::cuda_error&) {
      return "cuda_error";
    } catch (const vramswap::version_mismatch&) {
      return "version_mismatch";
    } catch (const vramswap::timeout&) {
      return "timeout";
    } catch (const vramswap::unavailable&) {
      return "unavailable";
    } catch (const vramswap::error& e) {
      return e.code() == code && std::string(e.what()) == "detail" ? "error" : "wrong";
    }
    return "none";
  };
  EXPECT_EQ(thrown(VRAMSWAP_ERR_INVALID_ARGUMENT), "invalid_argument");
  EXPECT_EQ(thrown(VRAMSWAP_ERR_OUT_OF_MEMORY), "out_of_memory");
  EXPECT_EQ(thrown(VRAMSWAP_ERR_CUDA), "cuda_error");
  EXPECT_EQ(thrown(VRAMSWAP_ERR_VERSION_MISMATCH), "version_mismatch");
  EXPECT_EQ(thrown(VRAMSWAP_ERR_TIMEOUT), "timeout");
  EXPECT_EQ(thrown(VRAMSWAP_ERR_UNAVAILABLE), "unavailable");
  for (int code : {VRAMSWAP_ERR_NOT_OWNER, VRAMSWAP_ERR_BUSY, VRAMSWAP_ERR_SYSTEM, VRAMSWAP_ERR_IO, VRAMSWAP_ERR_NO_SPACE,
                   VRAMSWAP_ERR_INTERNAL, VRAMSWAP_ERR_OWNER_DIED}) {
    EXPECT_EQ(thrown(code), "error") << vramswap_status_name(code);
  }
  try {
    vramswap::throw_error(VRAMSWAP_ERR_BUSY, "");
  } catch (const vramswap::error& e) {
    EXPECT_STREQ(e.what(), "vramswap: busy");
  }
}

TEST_F(PublicApi, CApiReturnsCodesAndMessages) {
  EXPECT_EQ(vramswap_lock(0, 5, -1), VRAMSWAP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(vramswap_last_error()).find("priority 5"), std::string::npos) << vramswap_last_error();
  EXPECT_EQ(vramswap_lock(0, VRAMSWAP_PRIORITY_NORMAL, -7), VRAMSWAP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(vramswap_lock(3, VRAMSWAP_PRIORITY_NORMAL, -1), VRAMSWAP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(vramswap_malloc(nullptr, 100, 0), VRAMSWAP_ERR_INVALID_ARGUMENT);
  void* p = nullptr;
  EXPECT_EQ(vramswap_malloc(&p, 3 * MiB, 0), VRAMSWAP_OK) << vramswap_last_error();
  EXPECT_NE(p, nullptr);
  EXPECT_EQ(vramswap_advise(p, 3 * MiB, 9, 0), VRAMSWAP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(vramswap_advise(p, 3 * MiB, VRAMSWAP_ADVICE_DISCARDABLE, 0), VRAMSWAP_OK) << vramswap_last_error();
  // Versioned stats: a full struct, and an old caller's shorter one.
  vramswap_stats_t s;
  std::memset(&s, 0xff, sizeof s);
  s.size = sizeof s;
  ASSERT_EQ(vramswap_stats(0, &s), VRAMSWAP_OK) << vramswap_last_error();
  EXPECT_EQ(s.size, sizeof s);
  EXPECT_EQ(s.allocations, 1u);
  EXPECT_GE(s.allocated_bytes, 3 * MiB);
  EXPECT_GE(s.resident_bytes, 3 * MiB) << "allocated without the lock while the pool has free frames: backed at once";
  vramswap_stats_t small;
  std::memset(&small, 0xee, sizeof small);
  small.size = 24;  // size, allocated_bytes, allocations
  ASSERT_EQ(vramswap_stats(0, &small), VRAMSWAP_OK);
  EXPECT_EQ(small.size, 24u);
  EXPECT_EQ(small.allocations, 1u);
  uint64_t untouched;
  std::memset(&untouched, 0xee, sizeof untouched);
  EXPECT_EQ(small.resident_bytes, untouched) << "fields past the caller's size are not written";
  small.size = 8;
  EXPECT_EQ(vramswap_stats(0, &small), VRAMSWAP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(vramswap_stats(0, nullptr), VRAMSWAP_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(vramswap_lock(0, VRAMSWAP_PRIORITY_NORMAL, -1), VRAMSWAP_OK) << vramswap_last_error();
  s.size = sizeof s;
  ASSERT_EQ(vramswap_stats(0, &s), VRAMSWAP_OK);
  EXPECT_GE(s.resident_bytes, 3 * MiB);
  EXPECT_EQ(vramswap_unlock(0), VRAMSWAP_OK);
  EXPECT_EQ(vramswap_unlock(0), VRAMSWAP_ERR_NOT_OWNER);
  EXPECT_EQ(vramswap_free(p, 0), VRAMSWAP_OK);
  EXPECT_EQ(vramswap_free(nullptr, 0), VRAMSWAP_OK);
  EXPECT_STREQ(vramswap_status_name(VRAMSWAP_OK), "ok");
  EXPECT_STREQ(vramswap_status_name(12345), "unknown");
}

TEST_F(PublicApi, MemoryKeepsItsBytesAcrossLockTurns) {
  const size_t n = 5 * MiB + 123;
  void* p = vramswap::malloc(n);
  std::vector<unsigned char> data(n), back(n);
  std::mt19937_64 rng(42);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  const auto ptr = reinterpret_cast<uintptr_t>(p);
  EXPECT_EQ(vramswap::detail::rt::copy_to_device(0, ptr, data.data(), n), VRAMSWAP_ERR_NOT_OWNER) << "not without the lock";
  {
    vramswap::gpu_lock g(0);
    ASSERT_EQ(vramswap::detail::rt::copy_to_device(0, ptr, data.data(), n), VRAMSWAP_OK) << vramswap_last_error();
  }
  // Another process takes the device in between.
  EXPECT_EQ(wait_exit(spawn_holder(0, 50)), 0);
  {
    vramswap::gpu_lock g(0);
    ASSERT_EQ(vramswap::detail::rt::copy_from_device(0, back.data(), ptr, n), VRAMSWAP_OK) << vramswap_last_error();
    const vramswap::stats st = vramswap::get_stats(0);
    EXPECT_EQ(st.allocations, 1u);
    EXPECT_GE(st.resident_bytes, n);
    EXPECT_EQ(st.acquires, 2u);
    EXPECT_GT(st.acquire_seconds, 0.0);
  }
  EXPECT_EQ(std::memcmp(data.data(), back.data(), n), 0);
  vramswap::advise(p, n, vramswap::advice::read_mostly);
  EXPECT_THROW(vramswap::advise(p, 2 * n, vramswap::advice::normal), vramswap::invalid_argument);
  vramswap::free(p);
  EXPECT_EQ(vramswap::get_stats(0).allocations, 0u);
}

// The usual PyTorch shape (model.cuda() before the training loop), in C++: memory allocated
// and written outside the lock while the pool has free frames is backed at once, becomes
// this process's like any other, is saved when another process needs its frames, and comes
// back byte for byte at the next lock.
TEST_F(PublicApi, MemoryAllocatedAndWrittenOutsideTheLockIsKeptAcrossTurns) {
  const size_t n = 40 * MiB + 123;  // 21 of the pool's 32 frames
  auto* p = static_cast<unsigned char*>(vramswap::malloc(n));
  EXPECT_GE(vramswap::get_stats(0).resident_bytes, n) << "the pool had free frames: backed at once, without the lock";
  std::vector<unsigned char> data(n), back(n);
  vramswap::detail::test::fill_random(data.data(), n, 99);
  std::memcpy(p, data.data(), n);  // host backend: device memory is this process's memory
  // Another process takes the lock and the whole pool: our frames are idle frames like any.
  create(path("release"));
  const pid_t filler = spawn_worker({"fill", "0", std::to_string(64 * MiB), path("ready"), path("release")});
  ASSERT_EQ(wait_exit(filler), 0) << "the other process could not have the whole pool";
  const vramswap::stats after = vramswap::get_stats(0);
  EXPECT_GE(after.bytes_out, 20 * MiB) << "our pages were saved for the other process";
  EXPECT_GT(after.evictions_served, 0u);
  EXPECT_EQ(after.resident_bytes, 0u);
  {
    vramswap::gpu_lock g(0);
    ASSERT_EQ(vramswap::detail::rt::copy_from_device(0, back.data(), reinterpret_cast<uintptr_t>(p), n), VRAMSWAP_OK) << vramswap_last_error();
  }
  EXPECT_EQ(std::memcmp(back.data(), data.data(), n), 0) << "bytes written outside the lock were lost";
  vramswap::free(p);
}

// Outside the lock with no free frame: the stream-ordered allocation (what PyTorch uses, whose
// next step is a kernel or a copy on the block) fails saying what to do; a plain allocation
// stays unbacked until the next lock, and touching it anyway (host backend) is explained on
// stderr before the SIGSEGV kills the process.
TEST_F(PublicApi, OutsideTheLockWithNoFreeFrameAllocationFailsOrTouchIsExplained) {
  const pid_t filler = spawn_worker({"fill", "0", std::to_string(64 * MiB), path("ready"), path("release")});
  int status = 0;
  ASSERT_TRUE(wait_file(path("ready"), filler, &status)) << "the filler exited " << exit_code(status);
  void* q = nullptr;
  void* const stream = reinterpret_cast<void*>(0x77);
  EXPECT_EQ(vramswap_malloc_async(&q, 4 * MiB, 0, stream), VRAMSWAP_ERR_OUT_OF_MEMORY);
  const std::string why = vramswap_last_error();
  EXPECT_NE(why.find("does not hold the device lock"), std::string::npos) << why;
  EXPECT_NE(why.find("Allocate inside the lock"), std::string::npos) << why;
  EXPECT_NE(why.find("no free frame among its 32"), std::string::npos) << why;
  EXPECT_EQ(vramswap::get_stats(0).allocations, 0u) << "a failed allocation changes nothing";
  void* plain = vramswap::malloc(4 * MiB);
  EXPECT_EQ(vramswap::get_stats(0).resident_bytes, 0u) << "no free frame: a plain allocation waits for the next lock";
  vramswap::free(plain);

  const pid_t toucher = spawn_worker({"touch", "0", std::to_string(4 * MiB), path("touched"), path("go")}, path("touch.err"));
  EXPECT_FALSE(wait_file(path("touched"), toucher, &status)) << "writing unbacked memory outside the lock must fault";
  EXPECT_GE(exit_code(status), 128) << "killed by the fault (SIGSEGV, or SIGABRT from a sanitizer's report)";
  const std::string err = read_file(path("touch.err"));
  EXPECT_NE(err.find("vramswap: segmentation fault at 0x"), std::string::npos) << err;
  EXPECT_NE(err.find("device 0's memory (vramswap's arena"), std::string::npos) << err;
  EXPECT_NE(err.find("did not hold the device lock"), std::string::npos) << err;
  EXPECT_NE(err.find("vramswap.gpu_lock()"), std::string::npos) << err;
  create(path("release"));
  EXPECT_EQ(wait_exit(filler), 0);
}

// Memory written outside the lock, then evicted for another process, then touched outside
// the lock again: the fault is explained (it cannot be paged in without the lock).
TEST_F(PublicApi, TouchingEvictedMemoryOutsideTheLockIsExplained) {
  const pid_t toucher = spawn_worker({"touch", "0", std::to_string(40 * MiB), path("touched"), path("go")}, path("touch.err"));
  int status = 0;
  ASSERT_TRUE(wait_file(path("touched"), toucher, &status)) << "allocating and writing outside the lock failed: "
                                                           << read_file(path("touch.err"));
  create(path("release"));
  EXPECT_EQ(wait_exit(spawn_worker({"fill", "0", std::to_string(64 * MiB), path("ready"), path("release")})), 0);
  create(path("go"));
  EXPECT_GE(wait_exit(toucher), 128) << "reading evicted memory outside the lock must fault";
  const std::string err = read_file(path("touch.err"));
  EXPECT_NE(err.find("vramswap: segmentation fault at 0x"), std::string::npos) << err;
  EXPECT_NE(err.find("did not hold the device lock"), std::string::npos) << err;
  EXPECT_NE(err.find("saved for another process"), std::string::npos) << err;
}

TEST_F(PublicApi, DevicesAreLockedInIncreasingOrder) {
  {
    vramswap::gpu_lock g0(0);
    vramswap::gpu_lock g1(1);  // increasing: fine
    EXPECT_TRUE(g0.owns_lock() && g1.owns_lock());
  }
  {
    vramswap::gpu_lock g1(1);
    try {
      vramswap::gpu_lock g0(0);
      FAIL() << "locking device 0 while holding device 1 must throw";
    } catch (const vramswap::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("increasing device order"), std::string::npos) << e.what();
    }
    EXPECT_THROW(vramswap::gpu_lock(0, 10ms), vramswap::invalid_argument);  // timed waits count too
    EXPECT_EQ(vramswap_lock(0, VRAMSWAP_PRIORITY_NORMAL, -1), VRAMSWAP_ERR_INVALID_ARGUMENT);
    vramswap::gpu_lock t0(0, std::try_to_lock);  // a try never waits: any order
    EXPECT_TRUE(t0.owns_lock());
    vramswap::gpu_lock again(1);  // re-entry is not out of order
    EXPECT_TRUE(again.owns_lock());
  }
  // std::lock takes both whatever order it is given (it waits only while holding nothing).
  vramswap::gpu_lock a(1, std::defer_lock), b(0, std::defer_lock);
  std::lock(a, b);
  EXPECT_TRUE(a.owns_lock() && b.owns_lock());
}

// A gang guard over both devices: all or none, the order rule, the C calls, bad lists.
TEST_F(PublicApi, AGangGuardTakesEveryDeviceOrNone) {
  {
    vramswap::gpu_lock both(std::vector<int>{1, 0});
    EXPECT_TRUE(both.owns_lock());
    EXPECT_EQ(both.device(), 0);
    EXPECT_EQ(both.devices(), (std::vector<int>{0, 1}));
    EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 1u);
    EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(1), 1u);
    vramswap::gpu_lock again(std::vector<int>{0, 1});  // the whole gang again: re-entry
    EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(1), 2u);
  }
  EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 0u);
  EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(1), 0u);
  {
    vramswap::gpu_lock one(1);
    try {
      vramswap::gpu_lock both(std::vector<int>{0, 1});
      FAIL() << "a gang from device 0 while holding device 1 must throw";
    } catch (const vramswap::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("increasing device order"), std::string::npos) << e.what();
    }
  }
  // Another process holds device 1: a try takes nothing, not even the free device 0.
  const pid_t holder = spawn_holder(1, 400);
  {
    vramswap::gpu_lock both(std::vector<int>{0, 1}, std::try_to_lock);
    EXPECT_FALSE(both.owns_lock());
    EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 0u);
    const int devs[] = {0, 1};
    EXPECT_EQ(vramswap_lock_devices(devs, 2, VRAMSWAP_PRIORITY_NORMAL, 0), VRAMSWAP_ERR_BUSY);
    EXPECT_NE(std::string(vramswap_last_error()).find("held by"), std::string::npos) << vramswap_last_error();
    // Waiting: granted both once the holder is done.
    const auto t0 = clock_type::now();
    ASSERT_EQ(vramswap_lock_devices(devs, 2, VRAMSWAP_PRIORITY_NORMAL, 20'000'000'000), VRAMSWAP_OK) << vramswap_last_error();
    EXPECT_GT(clock_type::now() - t0, 50ms) << "granted while another process held device 1";
    const int only_one[] = {0, 0};
    EXPECT_EQ(vramswap_unlock_devices(only_one, 2), VRAMSWAP_ERR_NOT_OWNER);
    EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 1u) << "a wrong list releases nothing";
    EXPECT_EQ(vramswap_unlock_devices(devs, 2), VRAMSWAP_OK) << vramswap_last_error();
    EXPECT_EQ(vramswap_unlock_devices(devs, 2), VRAMSWAP_ERR_NOT_OWNER);
  }
  EXPECT_EQ(wait_exit(holder), 0);
  EXPECT_THROW(vramswap::gpu_lock(std::vector<int>{}), vramswap::invalid_argument);
  EXPECT_THROW(vramswap::gpu_lock(std::vector<int>{0, 0}), vramswap::invalid_argument);
  EXPECT_THROW(vramswap::gpu_lock(std::vector<int>{0, 16}), vramswap::invalid_argument);
  EXPECT_EQ(vramswap_lock_devices(nullptr, 2, VRAMSWAP_PRIORITY_NORMAL, -1), VRAMSWAP_ERR_INVALID_ARGUMENT);
  const int twice[] = {1, 1};
  EXPECT_EQ(vramswap_lock_devices(twice, 2, VRAMSWAP_PRIORITY_NORMAL, -1), VRAMSWAP_ERR_INVALID_ARGUMENT);
  const int no_such[] = {0, 5};
  EXPECT_EQ(vramswap_lock_devices(no_such, 2, VRAMSWAP_PRIORITY_NORMAL, -1), VRAMSWAP_ERR_INVALID_ARGUMENT);
}

// Real sessions in a random mix of single-device locks and gangs (the guard and the C call)
// over two devices whose memory does not fit the pools together: every grant finds nobody
// else inside and its memory as it left it.
TEST_F(PublicApi, GangsAndSinglesMixWithMemorySwappedThrough) {
  const std::string inside = path("inside");
  std::vector<pid_t> workers;
  for (int w = 0; w < 3; ++w) {
    workers.push_back(spawn_worker({"mix", "30", std::to_string(11 + w), std::to_string(24 * MiB), inside},
                                   path(("mix" + std::to_string(w) + ".err").c_str())));
  }
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ(wait_exit(workers[w]), 0) << read_file(path(("mix" + std::to_string(w) + ".err").c_str()));
  }
}

// Gangs of processes: two ranks (one process per device) take their turns together, beside
// a process that mixes single-device locks and gangs of both devices; then a rank killed
// while the other waits makes the other's lock fail, naming it.
TEST_F(PublicApi, RanksOfAJobTakeTheirTurnsTogether) {
  const std::string shared = path("ranks");
  const std::string job = "job-" + env_.prefix();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pids.push_back(spawn_worker({"rank", job, std::to_string(r), "2", "25", std::to_string(8 * MiB), shared},
                                path(("rank" + std::to_string(r) + ".err").c_str())));
  }
  const pid_t mixer = spawn_worker({"mix", "25", "7", std::to_string(8 * MiB), path("inside")}, path("mixer.err"));
  for (int r = 0; r < 2; ++r) EXPECT_EQ(wait_exit(pids[r]), 0) << read_file(path(("rank" + std::to_string(r) + ".err").c_str()));
  EXPECT_EQ(wait_exit(mixer), 0) << read_file(path("mixer.err"));

  // A rank killed while its gang waits (device 1 is ours): the other's lock fails, naming it.
  const std::string job2 = "dies-" + env_.prefix();
  vramswap::gpu_lock hold(1);
  const pid_t rank0 = spawn_worker({"rank", job2, "0", "2", "3", std::to_string(MiB), path("ranks2")}, path("r0.err"));
  const pid_t rank1 = spawn_worker({"rank", job2, "1", "2", "3", std::to_string(MiB), path("ranks2")}, path("r1.err"));
  int status = 0;
  ASSERT_TRUE(wait_file(path("ranks2") + ".joined1", rank1, &status)) << read_file(path("r1.err"));
  std::this_thread::sleep_for(200ms);  // most likely queued by now; joined is enough
  ::kill(rank1, SIGKILL);
  EXPECT_EQ(wait_exit(rank1), 128 + SIGKILL);
  EXPECT_EQ(wait_exit(rank0), 8) << read_file(path("r0.err"));
  const std::string err = read_file(path("r0.err"));
  EXPECT_NE(err.find("rank 1 (pid " + std::to_string(rank1)), std::string::npos) << err;
  EXPECT_NE(err.find("Restart the whole job"), std::string::npos) << err;
  // The C call: bad arguments.
  EXPECT_EQ(vramswap_join_gang("j", 2, 2, 0), VRAMSWAP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(vramswap_join_gang("bad/job", 0, 2, 0), VRAMSWAP_ERR_INVALID_ARGUMENT);
}

// At exit vramswap closes its sessions; a handler or static destructor that runs after that
// (one registered before vramswap's first use) may still free its memory (it is gone with
// the session: success) and is told that vramswap shut down if it allocates. It used to
// reopen a session over the backend that exit had already destroyed, and crash.
TEST_F(PublicApi, CallsAfterTheTeardownAtExitAreAnsweredNotCrashedOn) {
  std::string err;
  EXPECT_EQ(run_worker({"after-teardown", "0"}, {"VRAMSWAP_LOG=warn"}, &err), 0) << err;
}

// A child forked after vramswap was used that calls exit(): its atexit handlers and static
// destructors run over the parent's copies (the sessions, the backend's threads, a failure's
// detail). It exits 0; it used to abort (a double free) or hang joining the parent's threads.
TEST_F(PublicApi, AForkedChildThatCallsExitEndsCleanly) {
  for (int round = 0; round < 5; ++round) {
    std::string err;
    EXPECT_EQ(run_worker({"fork-exit", "0"}, {"VRAMSWAP_LOG=warn"}, &err), 0) << "round " << round << ": " << err;
  }
}

TEST_F(PublicApi, AMalformedSettingStopsAProcessAtItsFirstCall) {
  // Each of these used to run with a warning ("no disk tier") and no pinned-memory limit.
  for (const char* setting : {"VRAMSWAP_HOST_LIMIT=abc", "VRAMSWAP_SWAP_BLOCK=1.5", "VRAMSWAP_SWAP_EXTENT=1GiB ",
                              "VRAMSWAP_SWAP_QUEUE_DEPTH=abc"}) {
    SCOPED_TRACE(setting);
    std::string err;
    EXPECT_EQ(run_worker({"each", "1"}, {setting}, &err), 2) << err;
    const std::string name(setting, std::strchr(setting, '='));
    const std::string value(std::strchr(setting, '=') + 1);
    EXPECT_NE(err.find("lock(device 0): " + name + "=\"" + value + "\""), std::string::npos) << err;
    EXPECT_NE(err.find("expected a "), std::string::npos) << "the accepted forms: " << err;
    EXPECT_EQ(err.find("no disk tier"), std::string::npos) << err;
  }
  std::string err;
  EXPECT_EQ(run_worker({"each", "1"}, {"VRAMSWAP_HOST_LIMIT=abc"}, &err), 2);
  EXPECT_NE(err.find("VRAMSWAP_HOST_LIMIT=\"abc\" is not a size; expected a size: bytes, or a number with a K/M/G/T suffix "
                     "(\"4096\", \"32MiB\", \"1.5G\"); or a percentage of RAM (\"50%\")"),
            std::string::npos)
      << err;
}

TEST_F(PublicApi, AnUnknownSettingGetsOneWarningNamingTheClosestOne) {
  std::string err;
  // Two devices, each locked twice: the settings are checked at each session's opening.
  ASSERT_EQ(run_worker({"each", "2"}, {"VRAMSWAP_POOLSIZE=1", "VRAMSWAP_LOG=warn"}, &err), 0) << err;
  EXPECT_EQ(count_of(err, "VRAMSWAP_POOLSIZE"), 1u) << err;
  EXPECT_NE(err.find("warn: VRAMSWAP_POOLSIZE is set, but vramswap has no such setting, so it has no effect; did you mean "
                     "VRAMSWAP_POOL_SIZE?"),
            std::string::npos)
      << err;
  // The variables of the Python package, the preload shim and the tests are known.
  ASSERT_EQ(run_worker({"each", "1"}, {"VRAMSWAP_TORCH=1", "VRAMSWAP_PRELOAD_BACKTRACE=1", "VRAMSWAP_TEST_SERVER=x", "VRAMSWAP_LOG=warn"},
                       &err),
            0)
      << err;
  EXPECT_EQ(err.find("no such setting"), std::string::npos) << err;
}

TEST_F(PublicApi, AMalformedSettingFailsEveryCallUntilCorrected) {
  vramswap::detail::test::set_env("VRAMSWAP_EVICT_TIMEOUT", "30s");
  EXPECT_EQ(vramswap_lock(0, VRAMSWAP_PRIORITY_NORMAL, -1), VRAMSWAP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(vramswap_last_error()).find("VRAMSWAP_EVICT_TIMEOUT=\"30s\" is not a whole number; expected a whole number "
                                                    "from 1 to 86400"),
            std::string::npos)
      << vramswap_last_error();
  try {
    vramswap::gpu_lock g(0);
    FAIL() << "a malformed setting must throw";
  } catch (const vramswap::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("VRAMSWAP_EVICT_TIMEOUT"), std::string::npos) << e.what();
  }
  EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 0u);
  // Nothing was left half made: once corrected, the same process opens its session.
  vramswap::detail::test::unset_env("VRAMSWAP_EVICT_TIMEOUT");
  {
    vramswap::gpu_lock g(0);
    EXPECT_TRUE(g.owns_lock());
  }
  EXPECT_EQ(vramswap::detail::rt::held_by_this_thread(0), 0u);
}

TEST_F(PublicApi, AForkedChildGetsAClearError) {
  vramswap::gpu_lock g(0);
  void* p = vramswap::malloc(4096);
  const auto child = vramswap::detail::test::run_in_forked_child([&g, &p] {
    int failures = 0;
    try {
      g.unlock();
      ++failures;
    } catch (const vramswap::unavailable& e) {
      if (std::string(e.what()).find("forked") == std::string::npos) ++failures;
    } catch (...) {
      ++failures;
    }
    try {
      vramswap::gpu_lock mine(0);
      ++failures;
    } catch (const vramswap::unavailable&) {
    } catch (...) {
      ++failures;
    }
    if (vramswap_malloc(&p, 4096, 0) != VRAMSWAP_ERR_UNAVAILABLE) ++failures;
    if (std::string(vramswap_last_error()).find("posix_spawn") == std::string::npos) ++failures;
    vramswap_stats_t s{};
    s.size = sizeof s;
    if (vramswap_stats(0, &s) != VRAMSWAP_ERR_UNAVAILABLE) ++failures;
    if (vramswap_unlock(0) != VRAMSWAP_ERR_UNAVAILABLE) ++failures;
    return failures;
  });
  EXPECT_EQ(child.status, 0) << "after " << child.tries << " fork(s); a child killed for hanging: " << child.hung;
  // The parent is unaffected.
  EXPECT_TRUE(g.owns_lock());
  g.unlock();
  vramswap::free(p);
}

}  // namespace
