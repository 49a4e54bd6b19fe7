#include "swap/pool_host_store.hpp"

#include <cinttypes>
#include <map>
#include <string>

#include "core/log.hpp"
#include "core/status.hpp"
#include "lock/futex.hpp"
#include "lock/process_identity.hpp"

namespace vramswap::detail {
using namespace pool_layout;

namespace {
constexpr uint64_t k_wait_slice_ns = 10'000'000;  // re-check the timeout and the server this often
}

pool_host_store::pool_host_store(pool_segment& pool, uint32_t me, char* base, uint64_t wait_timeout_ns,
                                 std::function<bool()> server_alive)
    : pool_(pool), me_(me), base_(base), wait_timeout_ns_(wait_timeout_ns), server_alive_(std::move(server_alive)) {}

pool_host_store::~pool_host_store() {
  std::lock_guard<std::mutex> lock(mutex_);
  bool any = false;
  for (const auto& [key, s] : held_) {
    const uint64_t seen = pool_.read_slot(s);
    const slot_word w = slot_word::decode(seen);
    if (w.state == slot_used && w.owner == me_) any |= pool_.move_slot(s, seen, slot_free, k_no_member);
  }
  held_.clear();
  if (any) pool_.notify_slots_freed();
}

bool pool_host_store::try_take_free(uint32_t* slot) {
  const uint32_t n = pool_.host_slot_count();
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t s = (scan_hint_ + k) % n;
    const uint64_t raw = pool_.read_slot(s);
    if (slot_word::decode(raw).state != slot_free) continue;
    if (pool_.move_slot(s, raw, slot_used, me_)) {
      scan_hint_ = (s + 1) % n;
      *slot = s;
      return true;
    }
  }
  return false;
}

int pool_host_store::write_slot(uint64_t key, size_t size, bool wait, void** host) {
  const uint64_t slot_size = pool_.host_slot_size();
  if (size > slot_size) {
    return fail(err_invalid_argument, "host pool: page %" PRIu64 " of %zu bytes does not fit a %" PRIu64 "-byte slot", key, size,
                slot_size);
  }
  const uint64_t start = monotonic_ns();
  std::unique_lock<std::mutex> lock(mutex_);
  if (auto it = held_.find(key); it != held_.end()) {
    *host = base_ + uint64_t{it->second} * slot_size;
    return ok;
  }
  for (;;) {
    // Read the futex word before scanning, so a slot freed after the scan wakes us.
    const uint32_t seen = pool_.header()->slots_freed.load(std::memory_order_acquire);
    uint32_t s = 0;
    if (try_take_free(&s)) {
      held_.emplace(key, s);
      *host = base_ + uint64_t{s} * slot_size;
      return ok;
    }
    if (!wait) return err_busy;  // a hint to the caller, not an error: no detail
    const uint64_t waited = monotonic_ns() - start;
    if (waited >= wait_timeout_ns_) return exhausted_error(waited);
    if (server_alive_ && !server_alive_()) {
      return fail(err_unavailable, "host pool: the pool server (pid %d) exited while this process waited for a host slot; restart "
                  "the job (a new server starts on demand)", pool_.header()->server_pid);
    }
    // Other threads of this process may release (and so free slots) while we sleep.
    lock.unlock();
    futex_wait(&pool_.header()->slots_freed, seen, k_wait_slice_ns);
    lock.lock();
  }
}

int pool_host_store::slot_for_write(uint64_t key, size_t size, void** host) { return write_slot(key, size, true, host); }

int pool_host_store::try_slot_for_write(uint64_t key, size_t size, void** host) { return write_slot(key, size, false, host); }

int pool_host_store::exhausted_error(uint64_t waited_ns) const {
  std::map<uint32_t, uint32_t> by_owner;
  for (uint32_t s = 0; s < pool_.host_slot_count(); ++s) {
    const slot_word w = slot_word::decode(pool_.read_slot(s));
    if (w.state == slot_used) ++by_owner[w.owner];
  }
  std::string holders;
  for (const auto& [m, n] : by_owner) {
    char part[96];
    std::snprintf(part, sizeof part, "%smember %u (pid %d%s) %u", holders.empty() ? "" : ", ", m,
                  m < k_member_count ? pool_.member(m).pid : 0, m == me_ ? ", this process" : "", n);
    holders += part;
  }
  const uint64_t slot_mib = pool_.host_slot_size() >> 20;
  return fail(err_out_of_memory,
              "host pool exhausted: all %u slots of %" PRIu64 " MiB of the shared host pool (VRAMSWAP_HOST_POOL of vramswapd pid "
              "%d) are in use and none was given back within %.1f s (VRAMSWAP_EVICT_TIMEOUT); slots held: %s. The host pool must "
              "hold what all processes of this device save at once (their memory less the device pool) plus slack: raise "
              "VRAMSWAP_HOST_POOL and restart vramswapd, or run fewer or smaller processes on this device",
              pool_.host_slot_count(), slot_mib, pool_.header()->server_pid, waited_ns / 1e9,
              holders.empty() ? "none (all were given back just now)" : holders.c_str());
}

int pool_host_store::slot_for_read(uint64_t key, void** host) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = held_.find(key);
  if (it == held_.end()) return fail(err_invalid_argument, "host pool: no saved copy of page %" PRIu64, key);
  *host = base_ + uint64_t{it->second} * pool_.host_slot_size();
  return ok;
}

int pool_host_store::release(uint64_t key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = held_.find(key);
  if (it == held_.end()) return ok;
  const uint32_t s = it->second;
  held_.erase(it);
  for (;;) {
    const uint64_t seen = pool_.read_slot(s);
    const slot_word w = slot_word::decode(seen);
    if (w.state != slot_used || w.owner != me_) {
      // Only the server's repair frees another member's slot, and it repairs only members
      // that hung up: we were taken for dead (a new server, or our socket closed).
      log(log_level::error, "host pool: slot %u of page %" PRIu64 " is no longer this process's (member %u; state %d, owner %u)", s,
          key, me_, static_cast<int>(w.state), w.owner);
      return ok;
    }
    if (pool_.move_slot(s, seen, slot_free, k_no_member)) break;
  }
  pool_.notify_slots_freed();
  return ok;
}

bool pool_host_store::holds(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_.count(key) != 0;
}

uint64_t pool_host_store::bytes_held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<uint64_t>(held_.size()) * pool_.host_slot_size();
}

uint32_t pool_host_store::slots_held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<uint32_t>(held_.size());
}

}  // namespace vramswap::detail
