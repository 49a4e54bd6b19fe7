#include "swap/pinned_slots.hpp"

#include <algorithm>

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

int pinned_slots::grow(size_t slots) {
  pinned_chunk c;
  VS_TRY(add_context(pinned_chunk::make_anonymous(be_, slot_size_ * slots, label_.c_str(), &c),
                     "(%zu slots of %zu bytes pinned already): ", slots_made_, slot_size_));
  for (size_t i = slots; i-- > 0;) free_.push_back(c.base() + i * slot_size_);
  for (const auto& fn : watchers_) fn(c.base(), c.bytes());
  chunks_.push_back(std::move(c));
  slots_made_ += slots;
  return ok;
}

int pinned_slots::take(bool past_limit, char** slot) {
  if (free_.empty()) {
    const bool at_limit = limit_slots_ != 0 && slots_made_ >= limit_slots_;
    if (at_limit && !past_limit) return err_busy;
    VS_TRY(grow(at_limit ? chunk_slots_ : std::min(chunk_slots_, limit_slots_ == 0 ? chunk_slots_ : limit_slots_ - slots_made_)));
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
  for (const pinned_chunk& c : chunks_) fn(c.base(), c.bytes());
  watchers_.push_back(std::move(fn));
}

int pinned_slots::reserve(size_t slots) {
  while (slots_made_ < slots) VS_TRY(grow(chunk_slots_));
  return ok;
}

}  // namespace vramswap::detail
