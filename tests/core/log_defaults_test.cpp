// Description: what a process says by default. A program that uses the library logs at warn
// unless VRAMSWAP_LOG says otherwise (vramswapd makes its own default info); "no usable GPU,
// using the host backend" is said once per process tree: by the first process, not again by
// the processes it forks or forks and execs (a launcher's workers, Python's multiprocessing,
// PyTorch's DataLoader workers).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "core/backend.hpp"
#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"

extern char** environ;

namespace vramswap::detail {
namespace {

std::string self_path() {
  std::string self(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  self.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return self;
}

// Run this test binary's `test` (a DISABLED_ one) in a new process with environment `envp`
// (nullptr: this process's own), its stderr appended to `err_path`. Returns its exit status.
int run_child(const std::string& test, char** envp, const std::string& err_path) {
  std::string self = self_path();
  std::string filter = "--gtest_filter=" + test;
  std::string disabled = "--gtest_also_run_disabled_tests";
  char* argv[] = {self.data(), filter.data(), disabled.data(), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, self.c_str(), &fa, nullptr, argv, envp != nullptr ? envp : environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Unset VRAMSWAP_LOG for this process for the scope, and read the level again.
struct log_unset {
  std::string saved;
  bool had = false;
  log_unset() {
    if (const char* v = std::getenv("VRAMSWAP_LOG")) had = true, saved = v;
    ::unsetenv("VRAMSWAP_LOG");
    options_reread_for_testing();
  }
  ~log_unset() {
    if (had) ::setenv("VRAMSWAP_LOG", saved.c_str(), 1);
    options_reread_for_testing();
    log_set_default_level(log_level::warn);
  }
};

TEST(LogDefaults, AProgramLogsAtWarnAndTheServerAtInfoUnlessVramswapLogSays) {
  log_unset unset;
  log_set_default_level(log_level::warn);  // the library's default, read again
  EXPECT_TRUE(log_enabled(log_level::warn));
  EXPECT_FALSE(log_enabled(log_level::info)) << "a library client logs at warn by default";
  log_set_default_level(log_level::info);  // what vramswapd does first
  EXPECT_TRUE(log_enabled(log_level::info));
  EXPECT_FALSE(log_enabled(log_level::debug));
  option_set(option_id::log_level, "debug");  // a set VRAMSWAP_LOG wins over either default
  log_set_default_level(log_level::info);
  EXPECT_TRUE(log_enabled(log_level::debug));
  option_set(option_id::log_level, "error");
  log_set_default_level(log_level::info);
  EXPECT_FALSE(log_enabled(log_level::warn));
  option_set(option_id::log_level, nullptr);
}

// The children of the test below.
int choose_backend() {
  backend* be = nullptr;
  return default_backend(&be);
}

TEST(NoGpuTreeLeaf, DISABLED_ChoosesItsBackend) { ASSERT_EQ(choose_backend(), ok) << last_error(); }

// The root of a process tree: chooses, then starts a forked worker that makes a choice of its
// own (one made before the fork is inherited as it is), and two fork-and-exec'd children,
// one of which starts a child of its own, all inheriting the environment.
TEST(NoGpuTreeRoot, DISABLED_ChoosesThenStartsChildren) {
  ASSERT_EQ(choose_backend(), ok) << last_error();
  const pid_t worker = ::fork();
  if (worker == 0) {
    std::unique_ptr<backend> own;
    ::_exit(choose_backend() == ok && select_backend("auto", &own) == ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(worker, &status, 0), worker);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const char* err = std::getenv("NO_GPU_TEST_ERR");
  ASSERT_NE(err, nullptr);
  EXPECT_EQ(run_child("NoGpuTreeLeaf.DISABLED_ChoosesItsBackend", nullptr, err), 0);
  EXPECT_EQ(run_child("NoGpuTreeMiddle.DISABLED_ChoosesAndStartsOne", nullptr, err), 0);
}

TEST(NoGpuTreeMiddle, DISABLED_ChoosesAndStartsOne) {
  ASSERT_EQ(choose_backend(), ok) << last_error();
  EXPECT_EQ(run_child("NoGpuTreeLeaf.DISABLED_ChoosesItsBackend", nullptr, std::getenv("NO_GPU_TEST_ERR")), 0);
}

// Five processes of one tree fall back to the host backend; one warning, from the root. A
// second tree (a new job) warns again.
TEST(NoGpu, IsSaidOncePerProcessTree) {
  const std::string err_path = "/tmp/vramswap-no-gpu-" + std::to_string(::getpid()) + ".err";
  ::unlink(err_path.c_str());
  // Auto, no VRAMSWAP_LOG, and no GPU even on a machine that has one.
  std::string err_env = "NO_GPU_TEST_ERR=" + err_path, path = "PATH=/usr/bin:/bin", no_gpu = "CUDA_VISIBLE_DEVICES=";
  std::string asan = std::string("ASAN_OPTIONS=") + (std::getenv("ASAN_OPTIONS") ? std::getenv("ASAN_OPTIONS") : "");
  char* envp[] = {err_env.data(), path.data(), no_gpu.data(), asan.data(), nullptr};
  for (int tree = 1; tree <= 2; ++tree) {
    ASSERT_EQ(run_child("NoGpuTreeRoot.DISABLED_ChoosesThenStartsChildren", envp, err_path), 0);
    std::ifstream in(err_path);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    if (count_of(text, "backend cuda") > 0) GTEST_SKIP() << "a GPU is usable here despite CUDA_VISIBLE_DEVICES=\"\"";
    EXPECT_EQ(count_of(text, "no usable GPU"), static_cast<size_t>(tree)) << "one line per process tree:\n" << text;
    EXPECT_EQ(count_of(text, " warn: no usable GPU ("), static_cast<size_t>(tree)) << "said at warn, the default level:\n" << text;
    EXPECT_NE(text.find("using the host backend"), std::string::npos) << text;
  }
  ::unlink(err_path.c_str());
}

}  // namespace
}  // namespace vramswap::detail
