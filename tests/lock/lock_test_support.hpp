// Helpers for the lock's multi-process tests: a unique segment per test, forked children,
// shared memory between the test and its children, waiting for the queue to settle.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/device_lock.hpp"
#include "lock/shared_segment.hpp"
#include "lock/process_identity.hpp"

namespace vramswap::detail::lock_test {

// Each test gets its own segment name prefix, so parallel ctest runs and leftovers from a
// crashed run never collide; TearDown removes the segment.
class lock_fixture : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    prefix_ = "vstest-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-";
    option_set(option_id::shm_prefix, prefix_.c_str());
    key_ = "host-0";
    device_lock::remove(key_);
  }
  void TearDown() override {
    device_lock::remove(key_);
    option_set(option_id::shm_prefix, nullptr);
  }
  std::string segment_path() const {
    std::string path;
    EXPECT_EQ(shared_segment::path_for(key_, /*create_dir=*/false, &path), ok) << last_error();
    return path;
  }

  std::string prefix_;
  std::string key_;
};

// Memory shared between the test process and its forked children.
template <typename T>
T* shared_object() {
  void* p = ::mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::abort();
  }
  return new (p) T{};
}
template <typename T>
void free_shared_object(T* p) {
  p->~T();
  ::munmap(p, sizeof(T));
}

// Fork a child that runs `body` and exits with its return value. The child never returns
// into GoogleTest.
inline pid_t spawn(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    std::abort();
  }
  if (pid == 0) {
    int code = 99;
    try {
      code = body();
    } catch (...) {
      code = 98;
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  return pid;
}

// Exit status of `pid` (waits for it); 128+signal for a killed child. A child still running
// after `bound` (a lock wait that never ends, say) is a failure that says what it was doing,
// not a ctest timeout: it is killed, and the result is -2.
inline int reap(pid_t pid, std::chrono::seconds bound = std::chrono::seconds(300)) {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd >= 0) {
    const auto until = std::chrono::steady_clock::now() + bound;
    pollfd ended{pidfd, POLLIN, 0};
    int r = 0;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
      r = left > 0 ? ::poll(&ended, 1, static_cast<int>(std::min<long long>(left, 60'000))) : 0;
      if (r != 0 && !(r < 0 && errno == EINTR)) break;
      if (left <= 0) break;
    }
    ::close(pidfd);
    if (r == 0) {
      auto proc_file = [pid](const char* what) {
        std::string text;
        if (FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/" + what).c_str(), "r")) {
          char buf[512];
          const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
          text.assign(buf, n);
          std::fclose(f);
        }
        return text;
      };
      ADD_FAILURE() << "child pid " << pid << " still ran after " << bound.count() << " s; killed. It was: " << proc_file("stat")
                    << " waiting in " << proc_file("wchan");
      ::kill(pid, SIGKILL);
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return -2;
    }
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

// Wait until `predicate(queue)` holds, at most `timeout`; returns whether it did.
inline bool wait_for_queue(device_lock& lock, const std::function<bool(const std::vector<lock_queue_entry>&)>& predicate,
                           std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<lock_queue_entry> queue;
  while (std::chrono::steady_clock::now() < deadline) {
    if (lock.snapshot(&queue) == 0 && predicate(queue)) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return false;
}

inline bool queue_has_waiters(const std::vector<lock_queue_entry>& q, size_t n) {
  size_t waiting = 0;
  for (const auto& e : q) waiting += e.holding ? 0 : 1;
  return waiting == n;
}

}  // namespace vramswap::detail::lock_test
