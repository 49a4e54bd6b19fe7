// pinned_slots: a slot provider (swap/slot_provider.hpp) of this process's own pinned host
// memory. Chunks of `chunk_slots` slots are made as needed (core/pinned_chunk.hpp: mapped,
// faulted in, registered with the backend once) and kept for the provider's life: nothing
// is pinned per swap, and a slot given back is reused first.
//
// `limit_slots` (0: none) caps the slots made; take(past_limit = true) goes past it.
//
// Ahead of need (make_ahead): making a chunk (faulting host memory in and pinning it) runs
// at a few GB/s, an order of magnitude below the device's copy rate, so an eviction that
// makes its slots as it goes runs at that rate. make_ahead(n) asks threads of the
// provider's own (k_makers of them, so that one chunk's registration with the driver, which
// runs on one thread, overlaps the next chunk's faulting in) to make chunks until n slots
// exist (at most the limit). A maker also tells the watchers of each chunk it makes (a swap
// file registers it for its transfers, which pins the pages once more); made chunks then
// wait in a hand-over list, and the owner's calls adopt them (their slots join the free
// list). A take() that finds no free slot while chunks are in the making waits for the first
// of them rather than making another. If a maker fails (no host memory), it logs once and
// making ahead stops: slots are then made as they are taken, as without it. While the owner
// maps device memory (owner_mapping), which pinning beside it slows many times over, the
// makers start no chunk, pause the chunk in the making between steps of its faulting in, and
// start no registration, for up to k_max_hold_back_ms at a time.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.hpp"
#include "core/pinned_chunk.hpp"
#include "swap/slot_provider.hpp"

namespace vramswap::detail {

class pinned_slots final : public slot_provider {
 public:
  // `label` names the owner in errors ("tiered store for device 0").
  pinned_slots(backend& be, size_t slot_size, size_t chunk_slots, size_t limit_slots, std::string label);
  ~pinned_slots() override;  // stops the makers of make_ahead, if any
  pinned_slots(const pinned_slots&) = delete;
  pinned_slots& operator=(const pinned_slots&) = delete;

  size_t slot_size() const noexcept override { return slot_size_; }
  int take(bool past_limit, char** slot) override;
  void give_back(char* slot) override;
  bool owns(const char* slot) const noexcept override;
  size_t free_now() const override;
  uint64_t bytes_pinned() const noexcept override;  // made ahead and not yet adopted included
  void watch_regions(std::function<void(char*, size_t)> fn) override;
  void make_ahead(size_t slots) override;
  void owner_mapping(bool mapping) override;
  void stop_making_ahead() override;

  // The longest a maker waits, before a chunk, between steps of faulting it in and before
  // registering it, for the owner's mapping to end.
  static constexpr uint64_t k_max_hold_back_ms = 50;

  // Make sure at least `slots` slots exist (handed out or free), past the limit if need be.
  int reserve(size_t slots);

  // Slots made so far, by the owner or ahead (adopted or not).
  size_t slots_committed() const;

 private:
  int grow(size_t slots);
  // Take over the chunks made ahead; if `wait` and none is made, wait for the first of those
  // in the making.
  void adopt_made(bool wait);
  void make_ahead_loop();
  // While the owner maps (owner_mapping), wait until it is done, stop, or k_max_hold_back_ms.
  void hold_back_while_owner_maps(std::unique_lock<std::mutex>& lock);

  backend& be_;
  const size_t slot_size_;
  const size_t chunk_slots_;
  const size_t limit_slots_;
  const std::string label_;
  std::vector<pinned_chunk> chunks_;
  std::vector<char*> free_;
  size_t slots_made_ = 0;  // in chunks_
  // Watchers are added, and chunks announced to them, under watch_mutex_ (taken before
  // ahead_mutex_ where both are): the makers announce the chunks they make.
  std::mutex watch_mutex_;
  std::vector<std::function<void(char*, size_t)>> watchers_;

  // Shared with the thread of make_ahead, under ahead_mutex_.
  struct made_chunk {
    pinned_chunk chunk;
    size_t slots = 0;
  };
  static constexpr int k_makers = 2;
  mutable std::mutex ahead_mutex_;
  std::condition_variable ahead_wake_;  // the target rose, or stop
  std::condition_variable ahead_made_;  // a chunk was made (or failed)
  size_t ahead_target_ = 0;
  size_t committed_ = 0;               // slots made or being made, by anyone
  int making_ = 0;                     // chunks the makers are making now
  int owner_mapping_ = 0;              // owner_mapping(true) calls not yet ended
  bool ahead_failed_ = false;
  bool stop_ = false;
  std::vector<made_chunk> made_;       // made ahead, not yet adopted
  std::vector<std::thread> makers_;
  pid_t ahead_owner_ = 0;              // the process that started the makers
};

}  // namespace vramswap::detail
