// vmm_program (a program of the driver's virtual memory API, knowing nothing of vramswap) as a
// real child process on the host driver emulation (LD_LIBRARY_PATH=its lib/ directory):
//   - alone, both lookup paths (cuGetProcAddress, dlsym): the emulation's baseline;
//   - under the preload shim (LD_PRELOAD, VRAMSWAP_BACKEND=host), oversubscribed: its VMM
//     memory is vramswap's pages, lent pool frames; a lock user takes the lock and allocates
//     7/8 of the pool, moving the program's pages to host frames, and both find every byte;
//   - under the shim at normal priority: the allocation goes through vramswap (the shim's log
//     lines: the device lock taken at the first allocation, the at-exit summary).
// Each shim case has its own deployment (shm prefix, runtime directory, pool server).
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pool/pool_report.hpp"
#include "pool/pool_segment.hpp"
#include "support/backends.hpp"
#include "support/child_output.hpp"
#include "support/deployment.hpp"
#include "support/signal_files.hpp"

namespace vramswap::detail {
namespace {
constexpr uint64_t MiB = 1ull << 20;

int wait_status(pid_t pid) {
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return status;
}
bool exited_ok(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
std::string describe(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

#if defined(__SANITIZE_ADDRESS__)
extern "C" void __asan_init();
#endif

// What LD_PRELOAD names for the shim. In a sanitized build (CI) the ASan runtime must come
// ahead of the sanitized shim: the one this test runs with (the same as vmm_program's).
std::string shim_preload() {
  std::string preload = VRAMSWAP_PRELOAD_LIBRARY;
#if defined(__SANITIZE_ADDRESS__)
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&__asan_init), &info) != 0 && info.dli_fname != nullptr) {
    preload = std::string(info.dli_fname) + ":" + preload;
  }
#endif
  return preload;
}

// The shim's lines of `text` (its log), for the test's own log.
void print_shim_lines(const std::string& text) {
  for (size_t at = 0; (at = text.find("preload: ", at)) != std::string::npos; ++at) {
    std::printf("program: %s\n", text.substr(at, text.find('\n', at) - at).c_str());
  }
}

// The number after `prefix` in `text`, or -1.
double number_after(const std::string& text, const std::string& prefix) {
  const size_t at = text.find(prefix);
  return at == std::string::npos ? -1 : std::atof(text.c_str() + at + prefix.size());
}

// --- (a) the emulation alone ----------------------------------------------------------------
class VmmProgramAlone : public ::testing::TestWithParam<const char*> {};

TEST_P(VmmProgramAlone, MapsWritesWaitsRemapsAndFindsEveryByte) {
  std::string dir = "/tmp/vramswap-vmm-XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string signal = dir + "/go", out = dir + "/out", err = dir + "/err";
  ASSERT_TRUE(test::create_signal_file(signal.c_str()));  // no wait
  std::vector<std::string> args = {VRAMSWAP_VMM_PROGRAM, std::string("--lookup=") + GetParam(), "8", signal, "7"};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "LD_LIBRARY_PATH=", 16) != 0 && std::strncmp(*e, "LD_PRELOAD=", 11) != 0) env.emplace_back(*e);
  }
  env.push_back(std::string("LD_LIBRARY_PATH=") + VRAMSWAP_HOST_DRIVER_DIR);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = -1;
  ASSERT_EQ(::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data()), 0);
  posix_spawn_file_actions_destroy(&fa);
  const int status = wait_status(pid);
  EXPECT_TRUE(exited_ok(status)) << describe(status) << "; stderr: " << test::slurp(err);
  EXPECT_NE(test::slurp(out).find("written\n"), std::string::npos) << test::slurp(out);
  EXPECT_NE(test::slurp(out).find("every byte matched"), std::string::npos) << test::slurp(out);
  for (const auto& f : {signal, out, err}) ::unlink(f.c_str());
  ::rmdir(dir.c_str());
}

INSTANTIATE_TEST_SUITE_P(Lookup, VmmProgramAlone, ::testing::Values("proc", "dlsym"),
                         [](const ::testing::TestParamInfo<const char*>& p) { return std::string(p.param); });

// --- (b), (c) under the shim ----------------------------------------------------------------
class VmmProgramUnderShim : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(test::device0_key("host", &key_));
    deploy_.create("vp", key_,
                   {"VRAMSWAP_BACKEND=host", "VRAMSWAP_HOST_DEVICE_MEMORY=256MiB", "VRAMSWAP_FRAME_SIZE=2MiB",
                    "VRAMSWAP_POOL_SIZE=" + std::to_string(64 * MiB), "VRAMSWAP_POOL_IDLE_EXIT=5", "VRAMSWAP_LOG=warn",
                    "VRAMSWAP_SWAP_DIR=/var/tmp"});
  }
  void TearDown() override { deploy_.destroy(); }

  // vmm_program under the shim on `granules` granules; VRAMSWAP_LOG=info for its at-exit line.
  pid_t spawn_program(int granules, const std::string& signal, std::vector<std::string> env, const char* extra = nullptr) {
    env.push_back("LD_PRELOAD=" + shim_preload());
    env.push_back(std::string("LD_LIBRARY_PATH=") + VRAMSWAP_HOST_DRIVER_DIR);
    env.push_back("VRAMSWAP_LOG=info");
    std::vector<std::string> args = {VRAMSWAP_VMM_PROGRAM, "--lookup=proc", std::to_string(granules), signal, "3"};
    if (extra != nullptr) args.push_back(extra);
    return deploy_.spawn(args, env, out_file(), err_file());
  }
  // Until the program said "written" (true), or exited or took a minute (false).
  bool wait_written(pid_t pid, int* status) {
    for (int waited = 0; waited < 60000; waited += 10) {
      if (test::slurp(out_file()).find("written\n") != std::string::npos) return true;
      if (::waitpid(pid, status, WNOHANG) == pid) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  std::string out_file() const { return deploy_.dir() + "/program.out"; }
  std::string err_file() const { return deploy_.dir() + "/program.err"; }
  std::string said() const { return "stdout: " + test::slurp(out_file()) + "\nstderr: " + test::slurp(err_file()); }

  test::deployment deploy_;
  std::string key_;
};

// 24 granules (48 MiB, 3/4 of the pool) mapped by the program, oversubscribed: lent pool
// frames. A lock user allocating 56 MiB under the lock takes 20 of them back, the program's
// pages go to host frames while it waits; both check every byte.
TEST_F(VmmProgramUnderShim, OversubscribedProgramsVmmPagesMoveForALockUserAndKeepTheirBytes) {
  const std::string signal = deploy_.dir() + "/go";
  const pid_t program = spawn_program(24, signal, {"VRAMSWAP_OVERSUBSCRIBE=1"});
  ASSERT_GT(program, 0);
  int status = 0;
  if (!wait_written(program, &status)) {
    if (::waitpid(program, &status, WNOHANG) == 0) {
      ::kill(program, SIGKILL);
      wait_status(program);
      FAIL() << "the program never said \"written\"; " << said();
    }
    FAIL() << "the program ended before writing (" << describe(status) << "); " << said();
  }
  // The program's VMM memory is vramswap's: pool frames lent to it.
  std::unique_ptr<pool_segment> pool;
  uint32_t lent = 0;
  if (deploy_.open_pool(&pool, 10000)) {
    for (int i = 0; i < 1000 && (lent = pool->count(pool_layout::frame_lent)) < 24; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  EXPECT_EQ(lent, 24u) << "the program's 24 mapped granules should be vramswap pages in lent pool frames (no pool: "
                       << (pool == nullptr) << "); " << said();

  const pid_t user = deploy_.spawn(
      {VRAMSWAP_SESSION_WORKER, std::to_string(56 * MiB), "2", "31", "20", "alloc-under-lock"}, {"VRAMSWAP_EVICT_TIMEOUT=10"});
  const int user_status = wait_status(user);
  EXPECT_TRUE(exited_ok(user_status)) << "the lock user failed (" << describe(user_status) << "); the program said: " << said();
  ASSERT_TRUE(test::create_signal_file(signal.c_str()));
  status = wait_status(program);
  EXPECT_TRUE(exited_ok(status)) << describe(status) << "; " << said();
  // The shim's at-exit line (its memory is all released by then: 0 MiB live).
  const std::string err = test::slurp(err_file());
  print_shim_lines(err);
  EXPECT_GE(number_after(err, "preload: device 0 at exit: "), 0) << "no at-exit line: nothing went through vramswap; " << said();
  EXPECT_GE(number_after(err, "MiB in host frames; "), 20) << "pages moved to host frames for the lock user; " << said();
}

// Normal priority: the program takes the device lock at its first allocation; its memory is
// vramswap's (the shim's at-exit line counts it).
TEST_F(VmmProgramUnderShim, NormalPriorityProgramAllocatesThroughVramswap) {
  const std::string signal = deploy_.dir() + "/go";
  ASSERT_TRUE(test::create_signal_file(signal.c_str()));
  const pid_t program = spawn_program(8, signal, {});
  ASSERT_GT(program, 0);
  const int status = wait_status(program);
  EXPECT_TRUE(exited_ok(status)) << describe(status) << "; " << said();
  // The first allocation through vramswap takes the lock; the at-exit line says what it did
  // (its memory is all released by then: 0 MiB live).
  const std::string err = test::slurp(err_file());
  print_shim_lines(err);
  EXPECT_NE(err.find("preload: device 0: taking the device lock"), std::string::npos)
      << "the program's VMM allocations did not go through vramswap; " << said();
  EXPECT_GE(number_after(err, "preload: device 0 at exit: "), 0) << "no at-exit line; " << said();
}

// Device memory past the shim (cuMemAllocPitch is not virtualized): said once, naming the
// path, and counted as the process's memory outside the pool while it holds it.
TEST_F(VmmProgramUnderShim, MemoryPastTheShimIsSaidAndCountedOutsideThePool) {
  const std::string signal = deploy_.dir() + "/go";
  const pid_t program = spawn_program(4, signal, {}, "--also-pitch");
  ASSERT_GT(program, 0);
  int status = 0;
  if (!wait_written(program, &status)) {
    ::kill(program, SIGKILL);
    wait_status(program);
    FAIL() << "the program never said \"written\"; " << said();
  }
  uint64_t outside = 0;
  device_report report;
  for (int i = 0; i < 500 && outside == 0; ++i) {
    if (collect_report(key_, &report) == ok) {
      for (const process_report& p : report.processes) {
        if (p.pid == program) outside = p.outside_pool_bytes;
      }
    }
    if (outside == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(outside, 3 * MiB) << "3 rows of 1 MiB from cuMemAllocPitch; " << said();
  EXPECT_LT(outside, 4 * MiB) << said();
  ASSERT_TRUE(test::create_signal_file(signal.c_str()));
  status = wait_status(program);
  EXPECT_TRUE(exited_ok(status)) << describe(status) << "; " << said();
  const std::string err = test::slurp(err_file());
  const std::string warning = "the program got device memory through cuMemAllocPitch (cudaMallocPitch), which vramswap does not virtualize";
  const size_t first = err.find(warning);
  EXPECT_NE(first, std::string::npos) << said();
  EXPECT_EQ(err.find(warning, first + 1), std::string::npos) << "said once; " << said();
}

}  // namespace
}  // namespace vramswap::detail
