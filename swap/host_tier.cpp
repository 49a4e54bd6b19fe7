#include "swap/host_tier.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>

#include "core/status.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL and we touch pages instead
#endif

namespace vramswap::detail {

host_tier::host_tier(backend& be, size_t slot_size, size_t chunk_slots)
    : be_(be), slot_size_(slot_size), chunk_slots_(chunk_slots == 0 ? 1 : chunk_slots) {}

host_tier::~host_tier() {
  for (const chunk& c : chunks_) {
    be_.host_unregister(c.base);
    ::munmap(c.base, c.bytes);
  }
}

int host_tier::grow_locked() {
  const size_t bytes = slot_size_ * chunk_slots_;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return fail(err_out_of_memory, "host tier: cannot map %zu more bytes of host memory (%s); %" PRIu64 " bytes already pinned", bytes,
                std::strerror(errno), static_cast<uint64_t>(chunks_.size()) * bytes);
  }
  ::madvise(p, bytes, MADV_HUGEPAGE);  // best effort: fewer pages to fault in and to pin
  if (::madvise(p, bytes, MADV_POPULATE_WRITE) != 0) {
    if (errno != EINVAL) {
      const int e = errno;
      ::munmap(p, bytes);
      return fail(err_out_of_memory, "host tier: cannot fault in %zu bytes of host memory (%s)", bytes, std::strerror(e));
    }
    std::memset(p, 0, bytes);
  }
  const int rc = be_.host_register(p, bytes);
  if (rc != ok) {
    ::munmap(p, bytes);
    return add_context(rc, "host tier: pinning a %zu-byte chunk: ", bytes);
  }
  chunks_.push_back(chunk{static_cast<char*>(p), bytes});
  for (size_t i = chunk_slots_; i-- > 0;) free_.push_back(static_cast<char*>(p) + i * slot_size_);
  return ok;
}

int host_tier::slot_for_write(uint64_t key, size_t size, void** host) {
  if (size > slot_size_) {
    return fail(err_invalid_argument, "host tier: page %" PRIu64 " of %zu bytes does not fit a %zu-byte slot", key, size, slot_size_);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = held_.find(key); it != held_.end()) {
    *host = it->second;
    return ok;
  }
  if (free_.empty()) VS_TRY(grow_locked());
  char* slot = free_.back();
  free_.pop_back();
  held_.emplace(key, slot);
  *host = slot;
  return ok;
}

int host_tier::slot_for_read(uint64_t key, void** host) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = held_.find(key);
  if (it == held_.end()) return fail(err_invalid_argument, "host tier: no saved copy of page %" PRIu64, key);
  *host = it->second;
  return ok;
}

int host_tier::release(uint64_t key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = held_.find(key);
  if (it == held_.end()) return ok;
  free_.push_back(it->second);
  held_.erase(it);
  return ok;
}

bool host_tier::holds(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_.count(key) != 0;
}

uint64_t host_tier::bytes_held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<uint64_t>(held_.size()) * slot_size_;
}

uint64_t host_tier::bytes_pinned() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<uint64_t>(chunks_.size()) * chunk_slots_ * slot_size_;
}

int host_tier::reserve(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  while (static_cast<uint64_t>(free_.size() + held_.size()) * slot_size_ < bytes) VS_TRY(grow_locked());
  return ok;
}

}  // namespace vramswap::detail
