// A test body run in a child made by fork() from a process whose other threads (a session's
// keeper and service threads, the host backend's stream worker) may be allocating at the
// moment of the fork.
//
// glibc's malloc is fork-safe. AddressSanitizer's allocator is not before LLVM 18, which
// added its pthread_atfork handlers; GCC 12's libasan, the one CI builds with, has none. A
// child forked while another thread held the sanitizer's allocator lock waits on it forever
// at its first allocation. Under AddressSanitizer, then, a child still running after
// `bound` is taken for that and killed, and the fork is tried again; a child that hangs on
// every try is a failure, reported with its state. Without the sanitizer there is one try
// and no bound: a hang there is the code's.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#if defined(__SANITIZE_ADDRESS__)
#define VRAMSWAP_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define VRAMSWAP_TEST_UNDER_ASAN 1
#endif
#endif

namespace vramswap::detail::test {

struct forked_outcome {
  int status = -1;        // the child's exit code, 128 + signal if a signal ended it, -1: none
  int tries = 0;          // forks made
  std::string hung;       // what /proc said of the last child that was killed for hanging
};

// Runs body() in a forked child, which then _exits with its return value.
inline forked_outcome run_in_forked_child(const std::function<int()>& body,
                                          std::chrono::milliseconds bound = std::chrono::seconds(20)) {
#ifdef VRAMSWAP_TEST_UNDER_ASAN
  constexpr int k_tries = 5;
#else
  constexpr int k_tries = 1;
#endif
  forked_outcome out;
  for (out.tries = 1; out.tries <= k_tries; ++out.tries) {
    const pid_t child = ::fork();
    if (child < 0) return out;
    if (child == 0) ::_exit(body());
    const auto until = std::chrono::steady_clock::now() + bound;
    int status = 0;
    for (;;) {
      const pid_t r = ::waitpid(child, &status, k_tries > 1 ? WNOHANG : 0);
      if (r == child) {
        out.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return out;
      }
      if (r < 0 || std::chrono::steady_clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::ifstream stat("/proc/" + std::to_string(child) + "/stat");
    std::ostringstream said;
    said << stat.rdbuf();
    out.hung = "pid " + std::to_string(child) + ": " + said.str();
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
  }
  out.tries = k_tries;
  return out;
}

}  // namespace vramswap::detail::test
