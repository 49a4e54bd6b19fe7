#include "swap/pinned_slots.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>

#include "core/log.hpp"
#include "core/status.hpp"

namespace vramswap::detail {

int slot_provider::wait_for_give_back(uint32_t seen, uint64_t waited_ns) {
  (void)seen;
  (void)waited_ns;
  return fail(err_internal, "slot provider: waited for a give-back from other processes, but its slots are not shared");
}

pinned_slots::pinned_slots(backend& be, size_t slot_size, size_t chunk_slots, size_t limit_slots, std::string label)
    : be_(be), slot_size_(slot_size), chunk_slots_(std::max<size_t>(1, chunk_slots)), limit_slots_(limit_slots),
      label_(std::move(label)) {}

pinned_slots::~pinned_slots() { stop_making_ahead(); }

void pinned_slots::stop_making_ahead() {
  {
    std::lock_guard<std::mutex> lock(ahead_mutex_);
    stop_ = true;
  }
  ahead_wake_.notify_all();
  // A forked child has a copy of this object but not the threads.
  const bool ours = ::getpid() == ahead_owner_;
  for (std::thread& t : makers_) {
    if (!t.joinable()) continue;
    if (ours) {
      t.join();
    } else {
      t.detach();
    }
  }
  makers_.clear();
}

int pinned_slots::grow(size_t slots) {
  {
    std::lock_guard<std::mutex> lock(ahead_mutex_);
    committed_ += slots;
  }
  pinned_chunk c;
  if (const int rc = pinned_chunk::make_anonymous(be_, slot_size_ * slots, label_.c_str(), &c); rc != ok) {
    {
      std::lock_guard<std::mutex> lock(ahead_mutex_);
      committed_ -= slots;
    }
    return add_context(rc, "(%zu slots of %zu bytes pinned already): ", slots_made_, slot_size_);
  }
  for (size_t i = slots; i-- > 0;) free_.push_back(c.base() + i * slot_size_);
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    for (const auto& fn : watchers_) fn(c.base(), c.bytes());
  }
  chunks_.push_back(std::move(c));
  slots_made_ += slots;
  return ok;
}

void pinned_slots::adopt_made(bool wait) {
  std::vector<made_chunk> made;
  {
    std::unique_lock<std::mutex> lock(ahead_mutex_);
    if (wait) ahead_made_.wait(lock, [&] { return making_ == 0 || !made_.empty(); });
    made.swap(made_);
  }
  for (made_chunk& m : made) {  // the watchers heard of them from the makers
    for (size_t i = m.slots; i-- > 0;) free_.push_back(m.chunk.base() + i * slot_size_);
    chunks_.push_back(std::move(m.chunk));
    slots_made_ += m.slots;
  }
}

void pinned_slots::make_ahead(size_t slots) {
  if (limit_slots_ != 0) slots = std::min(slots, limit_slots_);
  {
    std::lock_guard<std::mutex> lock(ahead_mutex_);
    // Whole chunks only, so that a hint a slot above the last does not make a small chunk.
    if (stop_ || ahead_failed_ || slots <= ahead_target_ || slots < committed_ + chunk_slots_) return;
    ahead_target_ = slots;
    if (makers_.empty()) {
      ahead_owner_ = ::getpid();
      try {
        for (int i = 0; i < k_makers; ++i) makers_.emplace_back([this] { make_ahead_loop(); });
      } catch (const std::exception& e) {
        // Fewer makers (or none: slots are then made as they are taken).
        log(log_level::warn, "%s: pinning host memory ahead of need on %zu threads, not %d: %s", label_.c_str(), makers_.size(),
            k_makers, e.what());
      }
    }
  }
  ahead_wake_.notify_all();
}

void pinned_slots::owner_mapping(bool mapping) {
  {
    std::lock_guard<std::mutex> lock(ahead_mutex_);
    if (mapping) {
      ++owner_mapping_;
      return;
    }
    if (owner_mapping_ == 0 || --owner_mapping_ > 0) return;
  }
  ahead_wake_.notify_all();
}

void pinned_slots::hold_back_while_owner_maps(std::unique_lock<std::mutex>& lock) {
  ahead_wake_.wait_for(lock, std::chrono::milliseconds(k_max_hold_back_ms), [&] { return stop_ || owner_mapping_ == 0; });
}

void pinned_slots::make_ahead_loop() {
  std::unique_lock<std::mutex> lock(ahead_mutex_);
  bool held_back = false;  // this chunk waited for the owner's mapping once: it goes on now
  for (;;) {
    ahead_wake_.wait(lock, [&] { return stop_ || (!ahead_failed_ && committed_ + chunk_slots_ <= ahead_target_); });
    if (stop_) return;
    if (!held_back && owner_mapping_ > 0) {
      // The lock is let go while waiting: the other maker may take the last chunk of the
      // target meanwhile, so the target is asked again after.
      hold_back_while_owner_maps(lock);
      held_back = true;
      continue;
    }
    held_back = false;
    const size_t slots = chunk_slots_;
    committed_ += slots;
    ++making_;
    lock.unlock();
    made_chunk m;
    m.slots = slots;
    const int rc = pinned_chunk::make_anonymous(be_, slot_size_ * slots, label_.c_str(), &m.chunk, [this] {
      std::unique_lock<std::mutex> holding(ahead_mutex_);
      hold_back_while_owner_maps(holding);
    });
    const std::string why = rc != ok ? last_error() : std::string();
    if (rc != ok) clear_error();
    std::unique_lock<std::mutex> watching(watch_mutex_);
    if (rc == ok) {
      for (const auto& fn : watchers_) fn(m.chunk.base(), m.chunk.bytes());
    }
    lock.lock();
    --making_;
    if (rc != ok) {
      committed_ -= slots;
      const bool first = !ahead_failed_;
      ahead_failed_ = true;
      if (first) {
        log(log_level::warn, "%s: pinning host memory ahead of need stopped at %zu slots of %zu bytes: %s; slots are pinned as "
            "evictions need them from now on (VRAMSWAP_HOST_PIN_AHEAD=0 turns pinning ahead off)", label_.c_str(), committed_,
            slot_size_, why.c_str());
      }
    } else {
      made_.push_back(std::move(m));
    }
    lock.unlock();
    watching.unlock();
    ahead_made_.notify_all();
    lock.lock();
  }
}

uint64_t pinned_slots::bytes_pinned() const noexcept {
  std::lock_guard<std::mutex> lock(ahead_mutex_);
  size_t slots = slots_made_;
  for (const made_chunk& m : made_) slots += m.slots;
  return uint64_t{slots} * slot_size_;
}

size_t pinned_slots::slots_committed() const {
  std::lock_guard<std::mutex> lock(ahead_mutex_);
  return committed_;
}

int pinned_slots::take(bool past_limit, char** slot) {
  if (free_.empty()) adopt_made(/*wait=*/true);
  if (free_.empty()) {
    // Counted with what the makers are making, so that both together stay
    // within the limit; if the limit is reached by a chunk still in the making, wait for it.
    const size_t committed = slots_committed();
    if (limit_slots_ != 0 && committed >= limit_slots_ && committed > slots_made_) {
      adopt_made(/*wait=*/true);
    }
  }
  if (free_.empty()) {
    const size_t committed = slots_committed();
    const bool at_limit = limit_slots_ != 0 && committed >= limit_slots_;
    if (at_limit && !past_limit) return err_busy;
    VS_TRY(grow(at_limit || limit_slots_ == 0 ? chunk_slots_ : std::min(chunk_slots_, limit_slots_ - committed)));
  }
  *slot = free_.back();
  free_.pop_back();
  return ok;
}

void pinned_slots::give_back(char* slot) { free_.push_back(slot); }

bool pinned_slots::owns(const char* slot) const noexcept {
  for (const pinned_chunk& c : chunks_) {
    if (slot >= c.base() && slot < c.base() + c.bytes()) return true;
  }
  return false;
}

size_t pinned_slots::free_now() const {
  if (limit_slots_ == 0) return SIZE_MAX;
  return free_.size() + (slots_made_ < limit_slots_ ? limit_slots_ - slots_made_ : 0);
}

void pinned_slots::watch_regions(std::function<void(char*, size_t)> fn) {
  std::lock_guard<std::mutex> watching(watch_mutex_);
  for (const pinned_chunk& c : chunks_) fn(c.base(), c.bytes());
  {
    std::lock_guard<std::mutex> lock(ahead_mutex_);
    for (const made_chunk& m : made_) fn(m.chunk.base(), m.chunk.bytes());
  }
  watchers_.push_back(std::move(fn));
}

int pinned_slots::reserve(size_t slots) {
  adopt_made(/*wait=*/false);
  while (slots_made_ < slots) VS_TRY(grow(chunk_slots_));
  return ok;
}

}  // namespace vramswap::detail
