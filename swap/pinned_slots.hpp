// pinned_slots: a slot provider (swap/slot_provider.hpp) of this process's own pinned host
// memory. Chunks of `chunk_slots` slots are made as needed (core/pinned_chunk.hpp: mapped,
// faulted in, registered with the backend once) and kept for the provider's life: nothing
// is pinned per swap, and a slot given back is reused first.
//
// `limit_slots` (0: none) caps the slots made; take(past_limit = true) goes past it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/pinned_chunk.hpp"
#include "swap/slot_provider.hpp"

namespace vramswap::detail {

class pinned_slots final : public slot_provider {
 public:
  // `label` names the owner in errors ("tiered store for device 0").
  pinned_slots(backend& be, size_t slot_size, size_t chunk_slots, size_t limit_slots, std::string label);

  size_t slot_size() const noexcept override { return slot_size_; }
  int take(bool past_limit, char** slot) override;
  void give_back(char* slot) override;
  bool owns(const char* slot) const noexcept override;
  size_t free_now() const override;
  uint64_t bytes_pinned() const noexcept override { return uint64_t{slots_made_} * slot_size_; }
  void watch_regions(std::function<void(char*, size_t)> fn) override;

  // Make sure at least `slots` slots exist (handed out or free), past the limit if need be.
  int reserve(size_t slots);

 private:
  int grow(size_t slots);

  backend& be_;
  const size_t slot_size_;
  const size_t chunk_slots_;
  const size_t limit_slots_;
  const std::string label_;
  std::vector<pinned_chunk> chunks_;
  std::vector<char*> free_;
  size_t slots_made_ = 0;
  std::vector<std::function<void(char*, size_t)>> watchers_;
};

}  // namespace vramswap::detail
