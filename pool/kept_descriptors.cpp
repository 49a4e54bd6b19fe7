#include "pool/kept_descriptors.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <new>

namespace vramswap::detail {
namespace {

// Every live kept_descriptors of the process, for the fork handler. The mutex is held across
// fork() (prepare -> parent/child), so the child never sees a list half changed.
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::vector<kept_descriptors*>& registry() {
  static std::vector<kept_descriptors*> r;
  return r;
}

void lock_registry() noexcept { registry_mutex().lock(); }
void unlock_registry() noexcept { registry_mutex().unlock(); }

}  // namespace

kept_descriptors::kept_descriptors() {
  static std::once_flag installed;
  std::call_once(installed, [] { ::pthread_atfork(lock_registry, unlock_registry, close_in_child); });
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().push_back(this);
}

kept_descriptors::~kept_descriptors() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  drop_locked();
  auto& r = registry();
  r.erase(std::remove(r.begin(), r.end(), this), r.end());
}

bool kept_descriptors::keep(int fd) noexcept {
  std::lock_guard<std::mutex> lock(registry_mutex());
  if (!complete_) return false;
  // Above the select() range when the limit leaves room there; anywhere otherwise.
  rlimit lim{};
  const bool known = ::getrlimit(RLIMIT_NOFILE, &lim) == 0;
  const bool room_above =
      known && (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur > static_cast<rlim_t>(k_base) + fds_.size() + 64);
  const int kept = ::fcntl(fd, F_DUPFD_CLOEXEC, room_above ? k_base : 0);
  bool stored = kept >= 0;
  if (stored) {
    try {
      fds_.push_back(kept);
    } catch (const std::bad_alloc&) {
      ::close(kept);
      errno = ENOMEM;
      stored = false;
    }
  }
  if (!stored) {
    const int e = errno;
    drop_locked();
    complete_ = false;
    errno = e;
  }
  return stored;
}

void kept_descriptors::drop_locked() noexcept {
  for (int fd : fds_) ::close(fd);
  fds_.clear();
}

// In the child of a fork, with the registry's mutex held (taken in prepare): only the
// forking thread exists, and close() is async-signal-safe.
void kept_descriptors::close_in_child() noexcept {
  for (kept_descriptors* k : registry()) {
    for (int fd : k->fds_) ::close(fd);
    k->fds_.clear();
    k->complete_ = false;
  }
  unlock_registry();
}

}  // namespace vramswap::detail
