// Description: two real processes, each with more memory than its host budget (so every
// eviction spills to the swap file), take turns on one device under the device lock:
// acquire -> restore_all -> verify every byte -> write new bytes -> evict_all -> release,
// several rounds each. Checks that both finish cleanly, that turns never overlap, and that
// they really alternated.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "core/options.hpp"
#include "lock/device_lock.hpp"
#include "support/test_env.hpp"

extern char** environ;

namespace vramswap::detail {
namespace {

TEST(SwapTurns, TwoProcessesLargerThanTheirHostBudgetTakeTurns) {
  const std::string prefix = "vstest-swap-" + std::to_string(::getpid()) + "-";
  vramswap::detail::test::set_env("VRAMSWAP_SHM_PREFIX", prefix.c_str());
  option_set(option_id::shm_prefix, prefix.c_str());
  char log_path[] = "/tmp/vramswap-turns-XXXXXX";
  const int fd = ::mkstemp(log_path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  constexpr int rounds = 4;
  const std::string rounds_arg = std::to_string(rounds);
  std::vector<pid_t> children;
  for (int i = 0; i < 2; ++i) {
    const std::string index = std::to_string(i);
    const char* argv[] = {VRAMSWAP_SWAP_TURNS_HELPER, index.c_str(), rounds_arg.c_str(), log_path, "/var/tmp", nullptr};
    pid_t pid = 0;
    ASSERT_EQ(::posix_spawn(&pid, VRAMSWAP_SWAP_TURNS_HELPER, nullptr, nullptr, const_cast<char**>(argv), environ), 0);
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "helper " << pid << " ended with status " << status;
  }
  std::ifstream in(log_path);
  std::vector<std::pair<int, std::string>> lines;
  int who = 0;
  std::string what;
  while (in >> who >> what) lines.emplace_back(who, what);
  ::unlink(log_path);
  device_lock::remove("host-0");
  option_set(option_id::shm_prefix, nullptr);
  ASSERT_EQ(lines.size(), 2u * 2 * rounds);
  int switches = 0;
  for (size_t i = 0; i < lines.size(); i += 2) {
    EXPECT_EQ(lines[i].second, "in");
    EXPECT_EQ(lines[i + 1].second, "out");
    EXPECT_EQ(lines[i].first, lines[i + 1].first) << "turns overlapped at line " << i;
    if (i > 0 && lines[i].first != lines[i - 1].first) ++switches;
  }
  EXPECT_GE(switches, 1) << "the two processes never alternated";
}

}  // namespace
}  // namespace vramswap::detail
