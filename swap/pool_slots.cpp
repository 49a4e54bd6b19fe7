#include "swap/pool_slots.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <system_error>

#include "core/log.hpp"
#include "core/status.hpp"
#include "lock/futex.hpp"

namespace vramswap::detail {
using namespace pool_layout;

namespace {
constexpr uint64_t k_wait_slice_ns = 10'000'000;  // re-check the timeout and the server this often
constexpr size_t k_region_bytes = size_t{1} << 30;  // a backing tier registers buffers of at most this
}  // namespace

pool_slots::pool_slots(pool_segment& pool, uint32_t me, char* base, uint64_t wait_timeout_ns, std::function<bool()> pool_alive)
    : pool_(pool), me_(me), base_(base), wait_timeout_ns_(wait_timeout_ns), pool_alive_(std::move(pool_alive)) {}

pool_slots::~pool_slots() {
  {
    std::lock_guard<std::mutex> lock(dirty_mutex_);
    stopping_ = true;
  }
  dirty_changed_.notify_all();
  if (scrubber_.joinable()) scrubber_.join();
  bool any = false;
  for (const uint32_t s : taken_) {
    const uint64_t seen = pool_.read_slot(s);
    const slot_word w = slot_word::decode(seen);
    if (w.state != slot_used || w.owner != me_) continue;
    scrub(s);
    any |= pool_.move_slot(s, seen, slot_free, k_no_member);
  }
  if (any) pool_.notify_slots_freed();
  // What the scrubber had not come to yet, and any other slot left dirty(me).
  for (uint32_t s = 0; s < pool_.host_slot_count(); ++s) scrub_if_dirty(s);
}

void pool_slots::scrub(uint32_t s) noexcept {
  std::memset(base_ + uint64_t{s} * pool_.host_slot_size(), 0, pool_.host_slot_size());
}

bool pool_slots::scrub_if_dirty(uint32_t s) {
  const uint64_t seen = pool_.read_slot(s);
  const slot_word w = slot_word::decode(seen);
  if (w.state != slot_dirty || w.owner != me_ || !pool_.move_slot(s, seen, slot_used, me_)) return false;
  scrub(s);
  free_slot(s);
  return true;
}

void pool_slots::scrubber_main() {
  std::unique_lock<std::mutex> lock(dirty_mutex_);
  while (!stopping_) {
    if (dirty_.empty()) {
      dirty_changed_.wait(lock);
      continue;
    }
    const dirty_slot next = dirty_.front();
    if (std::chrono::steady_clock::now() < next.scrub_at) {
      dirty_changed_.wait_until(lock, next.scrub_at);
      continue;
    }
    dirty_.pop_front();
    lock.unlock();
    scrub_if_dirty(next.slot);  // taken by a member meanwhile (or by us again): nothing to do
    lock.lock();
  }
}

int pool_slots::take(bool past_limit, char** slot) {
  (void)past_limit;  // a shared pool has no room past its size
  const uint32_t n = pool_.host_slot_count();
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t s = (scan_hint_ + k) % n;
    const uint64_t raw = pool_.read_slot(s);
    // A dirty slot holds its last owner's bytes until we write a whole page over them: the
    // slots are only ever taken to be written whole (a page's copy out, or its read from disk).
    const slot_state state = slot_word::decode(raw).state;
    if (state != slot_free && state != slot_dirty) continue;
    if (pool_.move_slot(s, raw, slot_used, me_)) {
      scan_hint_ = (s + 1) % n;
      taken_.insert(s);
      *slot = base_ + uint64_t{s} * pool_.host_slot_size();
      return ok;
    }
  }
  return err_busy;  // a hint to the caller, not an error: no detail
}

bool pool_slots::move_own_slot(uint32_t s, slot_state to, uint32_t owner) {
  for (;;) {
    const uint64_t seen = pool_.read_slot(s);
    const slot_word w = slot_word::decode(seen);
    if (w.state != slot_used || w.owner != me_) {
      // Only the server's repair frees another member's slot, and it repairs only members
      // that hung up: we were taken for dead (a new server, or our socket closed).
      log(log_level::error, "host pool: slot %u is no longer this process's (member %u; state %d, owner %u)", s, me_,
          static_cast<int>(w.state), w.owner);
      return false;
    }
    if (pool_.move_slot(s, seen, to, owner)) return true;
  }
}

void pool_slots::free_slot(uint32_t s) {
  if (move_own_slot(s, slot_free, k_no_member)) pool_.notify_slots_freed();
}

// Dirty, not zeroed: another member may take it at once to write over it; the scrubber
// zeroes it a moment later if nobody did.
void pool_slots::give_back(char* slot) {
  const uint32_t s = static_cast<uint32_t>(static_cast<uint64_t>(slot - base_) / pool_.host_slot_size());
  taken_.erase(s);
  if (!move_own_slot(s, slot_dirty, me_)) return;
  pool_.notify_slots_freed();
  {
    std::lock_guard<std::mutex> lock(dirty_mutex_);
    if (!scrubber_.joinable()) {
      try {
        scrubber_ = std::thread([this] { scrubber_main(); });
      } catch (const std::system_error& e) {
        // No thread for it: zeroed here, as it was before there was a scrubber.
        log(log_level::warn, "host pool: cannot start the thread that zeroes slots given back (%s); zeroing slot %u now", e.what(), s);
        scrub_if_dirty(s);
        return;
      }
    }
    dirty_.push_back({s, std::chrono::steady_clock::now() + k_scrub_after});
  }
  dirty_changed_.notify_one();
}

bool pool_slots::owns(const char* slot) const noexcept {
  return slot >= base_ && slot < base_ + uint64_t{pool_.host_slot_count()} * pool_.host_slot_size();
}

size_t pool_slots::free_now() const {
  size_t n = 0;
  for (uint32_t s = 0; s < pool_.host_slot_count(); ++s) n += slot_word::decode(pool_.read_slot(s)).state != slot_used ? 1 : 0;
  return n;
}

void pool_slots::watch_regions(std::function<void(char*, size_t)> fn) {
  const uint64_t slot = pool_.host_slot_size();
  const uint64_t total = uint64_t{pool_.host_slot_count()} * slot;
  const uint64_t step = slot == 0 ? 0 : std::max<uint64_t>(1, k_region_bytes / slot) * slot;
  for (uint64_t off = 0; step != 0 && off < total; off += step) fn(base_ + off, static_cast<size_t>(std::min(step, total - off)));
}

uint32_t pool_slots::give_back_count() const noexcept { return pool_.header()->slots_freed.load(std::memory_order_acquire); }

int pool_slots::wait_for_give_back(uint32_t seen, uint64_t waited_ns) {
  if (waited_ns >= wait_timeout_ns_) return exhausted_error(waited_ns);
  if (pool_alive_ && !pool_alive_()) {
    return fail(err_unavailable, "host pool: this process's pool is gone (its pool server, pid %d, ended, and the next server did "
                "not take this process back: its log says why) while it waited for a host slot; restart the job",
                pool_.header()->server_pid);
  }
  futex_wait(&pool_.header()->slots_freed, seen, k_wait_slice_ns);
  return ok;
}

int pool_slots::exhausted_error(uint64_t waited_ns) const {
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
              "VRAMSWAP_HOST_POOL and restart vramswapd, set VRAMSWAP_SWAP_DIR so that saved pages past the pool go to a swap "
              "file, or run fewer or smaller processes on this device",
              pool_.host_slot_count(), slot_mib, pool_.header()->server_pid, waited_ns / 1e9,
              holders.empty() ? "none (all were given back just now)" : holders.c_str());
}

}  // namespace vramswap::detail
