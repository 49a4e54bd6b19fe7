// fallback_slots: a slot provider (swap/slot_provider.hpp) that takes from `primary` and,
// when it has none free, from `fallback` (the idea of rmm's failure-callback and fallback
// adaptors: a resource over an upstream). The chain of a process with the shared host pool
// and a swap file uses it: the pool first, then a few pinned slots of its own, so that it
// can still stage pages to and from the swap file while other processes hold the whole pool.
// A slot goes back to the provider it came from.
#pragma once

#include <memory>

#include "swap/slot_provider.hpp"

namespace vramswap::detail {

class fallback_slots final : public slot_provider {
 public:
  // Both give slots of the same size.
  fallback_slots(std::unique_ptr<slot_provider> primary, std::unique_ptr<slot_provider> fallback);

  size_t slot_size() const noexcept override { return primary_->slot_size(); }
  int take(bool past_limit, char** slot) override;
  void give_back(char* slot) override;
  bool owns(const char* slot) const noexcept override;
  // The primary's: the fallback is for when it has none, not room to wait for.
  size_t free_now() const override { return primary_->free_now(); }
  uint64_t bytes_pinned() const noexcept override { return primary_->bytes_pinned() + fallback_->bytes_pinned(); }
  void watch_regions(std::function<void(char*, size_t)> fn) override;
  bool shared() const noexcept override { return primary_->shared(); }
  uint32_t give_back_count() const noexcept override { return primary_->give_back_count(); }
  int wait_for_give_back(uint32_t seen, uint64_t waited_ns) override { return primary_->wait_for_give_back(seen, waited_ns); }

 private:
  std::unique_ptr<slot_provider> primary_;
  std::unique_ptr<slot_provider> fallback_;
};

}  // namespace vramswap::detail
