#include "lock/process_identity.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "core/status.hpp"

namespace vramswap::detail {
namespace {

std::atomic<uint64_t> g_fork_generation{0};
std::atomic<pid_t> g_cached_pid{0};           // 0: not read yet (or reset by a fork)
std::atomic<uint64_t> g_cached_start_time{0};
std::atomic<uint64_t> g_cached_pid_ns{0};

void on_fork_child() noexcept {
  g_cached_pid.store(0, std::memory_order_relaxed);
  g_fork_generation.fetch_add(1, std::memory_order_relaxed);
}

[[maybe_unused]] const int g_atfork_registered = pthread_atfork(nullptr, nullptr, on_fork_child);

struct stat_fields {
  char state;
  uint64_t start_time;
};

// Parse /proc/<pid>/stat. The command name (field 2) may contain spaces and parentheses,
// so fields are counted from the last ')'.
bool read_stat(pid_t pid, stat_fields* out) noexcept {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr || p[1] != ' ') return false;
  p += 2;  // now at field 3, the state
  out->state = *p;
  // Skip to field 22 (starttime): 19 more spaces after the state.
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p, ' ');
    if (p == nullptr) return false;
    ++p;
  }
  char* end = nullptr;
  out->start_time = std::strtoull(p, &end, 10);
  return end != p;
}

// The inode that names the namespace behind `path` (/proc/<pid>/ns/pid); 0 when unreadable.
uint64_t namespace_inode(const char* path) noexcept {
  struct stat st {};
  return ::stat(path, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

}  // namespace

uint64_t fork_generation() noexcept { return g_fork_generation.load(std::memory_order_relaxed); }

int current_process(process_identity* out) noexcept {
  pid_t pid = g_cached_pid.load(std::memory_order_acquire);
  if (pid == 0) {
    pid = ::getpid();
    stat_fields self{};
    if (!read_stat(pid, &self)) {
      return fail(err_unavailable,
                  "lock: cannot read /proc/%d/stat, which the lock needs to tell live processes from dead ones; "
                  "mount /proc in this process's PID namespace",
                  static_cast<int>(pid));
    }
    g_cached_start_time.store(self.start_time, std::memory_order_relaxed);
    g_cached_pid.store(pid, std::memory_order_release);
  }
  out->pid = pid;
  out->start_time = g_cached_start_time.load(std::memory_order_relaxed);
  out->pid_ns = current_pid_namespace();
  return ok;
}

uint64_t current_pid_namespace() noexcept {
  // A process's own PID namespace never changes (unshare and setns move only its children).
  uint64_t ns = g_cached_pid_ns.load(std::memory_order_relaxed);
  if (ns == 0) {
    ns = namespace_inode("/proc/self/ns/pid");
    g_cached_pid_ns.store(ns, std::memory_order_relaxed);
  }
  return ns;
}

uint64_t pid_namespace_of(pid_t pid) noexcept {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/ns/pid", static_cast<int>(pid));
  return pid > 0 ? namespace_inode(path) : 0;
}

int open_pidfd(pid_t pid) noexcept {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

pid_t pidfd_process(int fd) noexcept {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
  const int in = ::open(path, O_RDONLY | O_CLOEXEC);
  if (in < 0) return -2;
  char buf[1024];
  const ssize_t n = ::read(in, buf, sizeof buf - 1);
  ::close(in);
  if (n <= 0) return -2;
  buf[n] = '\0';
  const char* p = std::strstr(buf, "\nPid:");
  if (p == nullptr) return -2;
  return static_cast<pid_t>(std::strtol(p + 5, nullptr, 10));
}

void describe_process_in(pid_t pid, uint64_t pid_ns, char* buf, size_t size) noexcept {
  if (visible_here(pid_ns)) {
    describe_process(pid, buf, size);
  } else if (size > 0) {
    std::snprintf(buf, size, "pid %d in another PID namespace (pid:[%llu])", static_cast<int>(pid),
                  static_cast<unsigned long long>(pid_ns));
  }
}

pid_t current_tid() noexcept {
  thread_local pid_t t_tid = 0;
  thread_local uint64_t t_generation = 0;
  const uint64_t generation = fork_generation();
  if (t_tid == 0 || t_generation != generation) {
    t_tid = ::gettid();
    t_generation = generation;
  }
  return t_tid;
}

liveness check_liveness(const process_identity& who) noexcept {
  if (who.pid <= 0) return liveness::dead;
  stat_fields now{};
  if (!read_stat(who.pid, &now)) return liveness::dead;
  if (now.start_time != who.start_time) return liveness::dead;  // the PID was reused
  if (now.state == 'Z' || now.state == 'X' || now.state == 'x') return liveness::dead;
  return liveness::alive;
}

char process_state(pid_t id) noexcept {
  stat_fields now{};
  if (id <= 0 || !read_stat(id, &now)) return 0;
  return now.state;
}

pid_t process_of_thread(pid_t tid) noexcept {
  if (tid <= 0) return 0;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/status", static_cast<int>(tid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[2048];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* p = std::strstr(buf, "\nTgid:");
  return p == nullptr ? 0 : static_cast<pid_t>(std::strtol(p + 6, nullptr, 10));
}

void describe_process(pid_t pid, char* buf, size_t size) noexcept {
  if (size == 0) return;
  char comm[64] = "?";
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/comm", static_cast<int>(pid));
  const int fd = pid > 0 ? ::open(path, O_RDONLY | O_CLOEXEC) : -1;
  if (fd >= 0) {
    const ssize_t n = ::read(fd, comm, sizeof comm - 1);
    ::close(fd);
    comm[n > 0 ? n : 0] = '\0';
    if (n > 0 && comm[n - 1] == '\n') comm[n - 1] = '\0';
  }
  const char state = process_state(pid);
  if (state == 0 || state == 'Z' || state == 'X' || state == 'x') {
    std::snprintf(buf, size, "pid %d (gone)", static_cast<int>(pid));
  } else if (is_stopped_state(state)) {
    std::snprintf(buf, size, "pid %d (%s), stopped (SIGSTOP, Ctrl-Z or a debugger)", static_cast<int>(pid), comm);
  } else {
    std::snprintf(buf, size, "pid %d (%s)", static_cast<int>(pid), comm);
  }
}

uint64_t monotonic_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace vramswap::detail
