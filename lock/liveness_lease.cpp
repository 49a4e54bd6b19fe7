#include "lock/liveness_lease.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/log.hpp"
#include "core/status.hpp"

namespace vramswap::detail {
namespace {

flock lease_range(short type, uint32_t index) {
  flock fl{};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = k_lease_base + static_cast<off_t>(index);
  fl.l_len = 1;
  fl.l_pid = 0;  // OFD locks require 0
  return fl;
}

// Lock-free: the child handler runs in a forked child, where a mutex another thread held at
// the fork would never be released. Each entry is a descriptor + 1 (0: empty).
std::atomic<int> g_lease_fds[k_max_lease_fds];
std::atomic<bool> g_registry_ready{false};

void orphan_leases_in_child() noexcept {
  int null_fd = -1;
  for (auto& slot : g_lease_fds) {
    const int fd = slot.load(std::memory_order_relaxed) - 1;
    if (fd < 0) continue;
    if (null_fd < 0) null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd < 0 || ::dup3(null_fd, fd, O_CLOEXEC) < 0) ::close(fd);  // no /dev/null: drop it all the same
  }
  if (null_fd >= 0) ::close(null_fd);
}

void prepare_registry() {
  bool expected = false;
  if (g_registry_ready.compare_exchange_strong(expected, true)) ::pthread_atfork(nullptr, nullptr, orphan_leases_in_child);
}

}  // namespace

int take_lease(int fd, uint32_t index, const char* what) noexcept {
  flock fl = lease_range(F_WRLCK, index);
  while (::fcntl(fd, F_OFD_SETLK, &fl) != 0) {
    const int e = errno;
    if (e == EINTR) continue;
    if (e == EAGAIN || e == EACCES) return fail(err_busy, "%s: lease %u is held by another process", what, index);
    return fail_errno(e,
                      "%s: cannot take the OFD lock that tells other processes this one is alive (lease %u); its file system "
                      "does not support OFD locks: put VRAMSWAP_RUNTIME_DIR on a local file system (tmpfs, ext4, xfs)",
                      what, index);
  }
  return ok;
}

void drop_lease(int fd, uint32_t index) noexcept {
  flock fl = lease_range(F_UNLCK, index);
  while (::fcntl(fd, F_OFD_SETLK, &fl) != 0) {
    if (errno == EINTR) continue;
    log(log_level::warn, "liveness lease %u: dropping it failed (%s); it goes when this process ends", index, std::strerror(errno));
    return;
  }
}

bool lease_held_elsewhere(int fd, uint32_t index) noexcept {
  flock fl = lease_range(F_WRLCK, index);
  while (::fcntl(fd, F_OFD_GETLK, &fl) != 0) {
    if (errno == EINTR) continue;
    log(log_level::warn, "liveness lease %u: cannot test it (%s); its owner is taken to be alive", index, std::strerror(errno));
    return true;
  }
  return fl.l_type != F_UNLCK;
}

int open_lease_description(int fd, const char* what, int* out) noexcept {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  const int lease = ::open(path, O_RDWR | O_CLOEXEC);
  if (lease < 0) {
    return fail_errno(errno, "%s: cannot open a second description of it for the liveness leases (%s); mount /proc", what, path);
  }
  *out = lease;
  return ok;
}

int register_lease_fd(int fd) noexcept {
  prepare_registry();
  for (auto& slot : g_lease_fds) {
    int expected = 0;
    if (slot.compare_exchange_strong(expected, fd + 1, std::memory_order_acq_rel)) return ok;
  }
  return fail(err_busy, "liveness leases: more than %d shared files open at once in this process", k_max_lease_fds);
}

void unregister_lease_fd(int fd) noexcept {
  for (auto& slot : g_lease_fds) {
    int expected = fd + 1;
    if (slot.compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) return;
  }
}

}  // namespace vramswap::detail
