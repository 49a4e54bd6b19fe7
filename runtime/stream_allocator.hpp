// stream_allocator: stream-ordered allocation (cudaMallocAsync/cudaFreeAsync semantics) over a
// session's pager, for frameworks that allocate and free at a high rate (PyTorch through
// vramswap.torch, the preload shim's cudaMallocAsync).
//
// A freed block is not given back to the pager: it waits in a cache of its stream, and a
// later allocation on the same stream takes it at once — safe without any synchronization,
// because work queued on one stream runs in order, so everything queued before the free is
// done with the block before anything queued after the new allocation touches it. (The
// pager's own free unmaps at once, which is only safe once the device is idle.) Blocks
// cached by one stream serve another only after trim(), which synchronizes the device and
// hands every cached block back to the pager. An allocation that finds no room trims and
// tries again.
//
// Outside the lock (the pager not resident), an allocation must be backed at once, from
// free frames of the pool, or it fails: its caller queues device work on it right away.
// A cached block serves then only if its pages (which an eviction may have dropped) can be
// backed too.
//
// A cached block is advised discardable: while it waits, an eviction need not copy it (a
// page holding only cached blocks is dropped, and comes back zero-filled). Reuse advises
// it normal again. So caching costs frames while resident, never transfer time. Where
// evictions happen only between holds (a device session: `advise_at_release`), the advice
// waits for the release (advise_cached, called before the lock is let go): a block freed
// and taken again within one hold, as a training step's tensors are, costs the pager
// nothing. Where pages may move at any time (an oversubscribed session), frees advise at once.
//
// CUDA graphs: memory allocated for a stream that is being captured, or freed while its
// stream is being captured, belongs to the graph, which may replay at any later time; it
// is never cached nor handed back (graph_bytes), until the process exits. Work on other
// streams that uses a block must be ordered before the free by the caller (as PyTorch's
// record_stream contract, which the pluggable allocator interface does not forward).
//
// Thread-safe: one mutex; the pager's calls happen under it.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <atomic>
#include <unordered_map>

#include "core/backend.hpp"
#include "core/pager.hpp"

namespace vramswap::detail {

struct stream_allocator_stats {
  uint64_t live_bytes = 0;     // handed out, not freed (sizes as asked, rounded)
  uint64_t cached_bytes = 0;   // freed, waiting in a stream's cache
  uint64_t graph_bytes = 0;    // held for CUDA graphs
  uint64_t hits = 0;           // allocations served from a cache
  uint64_t misses = 0;         // allocations that went to the pager
  uint64_t trims = 0;          // device synchronized and caches emptied
  uint64_t busy_ns = 0;        // time inside allocate, deallocate and trim, waits for the mutex included
};

class stream_allocator {
 public:
  // `advise_at_release`: the pager evicts only while the process does not hold the lock, and
  // advise_cached() is called before every release.
  stream_allocator(backend& be, int device, pager& memory, bool advise_at_release)
      : be_(be), device_(device), memory_(memory), advise_at_release_(advise_at_release) {}
  ~stream_allocator() = default;  // the pager frees what is left with the arena
  stream_allocator(const stream_allocator&) = delete;
  stream_allocator& operator=(const stream_allocator&) = delete;

  // `stream`: the application's CUstream / cudaStream_t as a number (0: the legacy default
  // stream). err_out_of_memory after a trim did not make room; nothing changes then.
  int allocate(uint64_t size, uintptr_t stream, device_ptr* out);
  // A pointer allocate() returned; err_invalid_argument for anything else (nothing changes).
  int deallocate(device_ptr ptr, uintptr_t stream);
  // Synchronize the device, then give every cached block back to the pager.
  int trim();
  // Advise every cached block not yet advised discardable (before a release, so that the
  // eviction that may follow does not copy them).
  int advise_cached();
  bool owns(device_ptr ptr) const;
  stream_allocator_stats stats() const;

  // Sizes are rounded so that a training loop's repeated shapes meet their cached blocks:
  // to 512 B below 1 MiB, to 128 KiB above. A cached block serves a request up to 1/8
  // smaller than itself.
  static uint64_t round_size(uint64_t size) noexcept;

 private:
  struct block {
    uint64_t size = 0;
    uintptr_t stream = 0;
    bool cached = false;  // freed, waiting in its stream's cache
    bool advised = false; // cached and advised discardable (its pages may be dropped)
    bool graph = false;   // allocated or freed during a capture: the graph's for good
  };
  int capturing(uintptr_t stream, bool* out);
  // Whether cached block `p` can serve now: resident, or backed now from free frames.
  bool back_cached(device_ptr p);
  int trim_locked();

  backend& be_;
  const int device_;
  pager& memory_;
  const bool advise_at_release_;
  mutable std::mutex mutex_;
  std::unordered_map<device_ptr, block> blocks_;  // every block handed out and not given back
  // Cached (freed) blocks, per stream: size -> address.
  std::unordered_map<uintptr_t, std::multimap<uint64_t, device_ptr>> cache_;
  stream_allocator_stats stats_;
  // Outside stats_: added to after the mutex is let go, so that its wait counts.
  std::atomic<uint64_t> busy_ns_{0};
};

}  // namespace vramswap::detail
