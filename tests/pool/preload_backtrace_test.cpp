// VRAMSWAP_PRELOAD_BACKTRACE=1 reports a crash and dies; it never hangs. The crash here is
// inside malloc with the arena's lock held (heap_crash), where a handler that allocates (the
// first backtrace() loads libgcc_s) would wait on that lock for ever.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

TEST(PreloadBacktrace, ACrashInsideMallocIsReportedAndEndsTheProcess) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "an AddressSanitizer build: ASan's malloc replaces glibc's, so the crash inside glibc's "
                  "malloc this test makes cannot happen (ASan reports the use after free first), and the "
                  "sanitized preload library needs the ASan runtime ahead of it in LD_PRELOAD; an "
                  "unsanitized build (scripts/device-run.sh) runs it";
#endif
  const std::string err = "/tmp/vramswap-heap-crash-" + std::to_string(::getpid()) + ".err";
  std::vector<std::string> env = {"LD_PRELOAD=" VRAMSWAP_PRELOAD_LIBRARY, "VRAMSWAP_PRELOAD_BACKTRACE=1"};
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  const char* argv[] = {VRAMSWAP_HEAP_CRASH, nullptr};
  pid_t pid = -1;
  ASSERT_EQ(::posix_spawn(&pid, VRAMSWAP_HEAP_CRASH, &actions, nullptr, const_cast<char**>(argv), envp.data()), 0);
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  bool ended = false;
  for (int i = 0; i < 1000 && !ended; ++i) {
    ended = ::waitpid(pid, &status, WNOHANG) == pid;
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!ended) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  std::stringstream said;
  said << std::ifstream(err).rdbuf();
  ::unlink(err.c_str());
  ASSERT_TRUE(ended) << "the crashed process hung in its crash handler for 10 s: " << said.str();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << "status " << status << ": " << said.str();
  EXPECT_NE(said.str().find("vramswap preload: crashed; native stack:"), std::string::npos) << said.str();
}
