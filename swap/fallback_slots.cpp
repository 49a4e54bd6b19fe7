#include "swap/fallback_slots.hpp"

#include "core/status.hpp"

namespace vramswap::detail {

fallback_slots::fallback_slots(std::unique_ptr<slot_provider> primary, std::unique_ptr<slot_provider> fallback)
    : primary_(std::move(primary)), fallback_(std::move(fallback)) {}

int fallback_slots::take(bool past_limit, char** slot) {
  const int rc = primary_->take(false, slot);
  if (rc != err_busy) return rc;
  return fallback_->take(past_limit, slot);
}

void fallback_slots::give_back(char* slot) {
  if (primary_->owns(slot)) primary_->give_back(slot);
  else fallback_->give_back(slot);
}

bool fallback_slots::owns(const char* slot) const noexcept { return primary_->owns(slot) || fallback_->owns(slot); }

void fallback_slots::watch_regions(std::function<void(char*, size_t)> fn) {
  primary_->watch_regions(fn);
  fallback_->watch_regions(std::move(fn));
}

}  // namespace vramswap::detail
