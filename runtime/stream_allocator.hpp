// stream_allocator: stream-ordered allocation (cudaMallocAsync/cudaFreeAsync semantics) over a
// session's pager, for frameworks that allocate and free at a high rate (PyTorch through
// vramswap.torch, the preload shim's cudaMallocAsync).
//
// A caching allocator in the manner of PyTorch's CUDACachingAllocator. Memory comes from the
// pager in segments, and requests are served from blocks carved out of them:
//   - sizes round up to 512 B;
//   - requests up to 1 MiB (the small pool) come from 2 MiB segments; larger ones (the large
//     pool) from segments of 20 MiB for requests below 10 MiB, and of 16 frames or the
//     request's size otherwise (the request's size alone once the pool has no room for
//     more), all rounded up to the pager's frame size (so that a large segment covers
//     whole pages, which a trim then gives back whole). The pager packs small segments
//     into shared pages;
//   - an allocation takes the best fit (smallest, then lowest address) among the free blocks
//     of its pool that belong to its stream, and splits it when the remainder is worth
//     keeping (at least 512 B in the small pool, more than 1 MiB in the large one);
//   - a freed block merges at once with the free neighbours of its segment that belong to
//     the same stream;
//   - only when no free block fits does the allocator ask the pager for a new segment.
// So a model whose tensors come in many sizes holds about what its peak of live bytes
// needs, and a step that allocates what the previous one freed makes no system call.
//
// Stream order: a freed block is not given back to the pager; it is a free block of the
// stream it was freed on, and a later allocation on that stream takes it at once — safe
// without any synchronization, because work queued on one stream runs in order, so
// everything queued before the free is done with the block before anything queued after the
// new allocation touches it. (The pager's own free unmaps at once, which is only safe once
// the device is idle.) Free blocks of one stream serve another only after trim(), which
// synchronizes the device, gives every wholly free segment back to the pager, and hands the
// free blocks of the segments still in use to their segments' streams (merging them). An
// allocation that finds no room trims, then takes the best free block of any stream (right
// after the synchronize, no work is pending on any), then a new segment, then a segment of
// just its own size.
//
// Outside the lock (the pager not resident), an allocation must be backed at once, from
// free frames of the pool, or it fails: its caller queues device work on it right away.
// A free block serves then only if its pages (which an eviction may have dropped) can be
// backed too.
//
// A free block is advised discardable: while it waits, an eviction need not copy it (a
// page holding only free bytes is dropped, and comes back zero-filled; a page it shares with
// a live block is copied, as the arena's advice is per byte). Reuse advises the part taken
// normal again. So caching costs frames while resident, never transfer time. Where
// evictions happen only between holds (a device session: `advise_at_release`), the advice
// waits for the release (advise_cached, called before the lock is let go): a block freed
// and taken again within one hold, as a training step's tensors are, costs the pager
// nothing, and the first take of an advised block in a hold advises the whole block normal
// (the release advises what stays free again), so that the blocks it is split into and
// merged from cost nothing more in that hold either. Where pages may move at any time (an
// oversubscribed session), frees advise at once and reuse advises only the part taken.
//
// CUDA graphs: memory allocated for a stream that is being captured, or freed while its
// stream is being captured, belongs to the graph, which may replay at any later time; it
// is never reused nor handed back (graph_bytes), until the process exits, and neither is
// the segment that holds it. Work on other streams that uses a block must be ordered before
// the free by the caller (as PyTorch's record_stream contract, which the pluggable allocator
// interface does not forward).
//
// Thread-safe: one mutex; the pager's calls happen under it.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/backend.hpp"
#include "core/pager.hpp"

namespace vramswap::detail {

struct stream_allocator_stats {
  uint64_t live_bytes = 0;     // handed out, not freed (blocks' sizes: as asked, rounded, or a little more)
  uint64_t cached_bytes = 0;   // free blocks inside the segments, waiting for reuse
  uint64_t graph_bytes = 0;    // held for CUDA graphs
  uint64_t hits = 0;           // allocations served from a free block
  uint64_t misses = 0;         // allocations that took a new segment from the pager
  uint64_t trims = 0;          // device synchronized and whole free segments given back
  uint64_t busy_ns = 0;        // time inside allocate, deallocate and trim, waits for the mutex included
  uint64_t new_bytes = 0;      // bytes of the segments taken from the pager (misses'), total
  uint64_t advice_calls = 0;   // pager advise calls: normal on reuse, discardable on free or before a release
  uint64_t segments = 0;       // segments held from the pager now
  uint64_t segment_bytes = 0;  // their bytes (PyTorch's "reserved"): live, cached, or the graphs'
};

class stream_allocator {
 public:
  // `advise_at_release`: the pager evicts only while the process does not hold the lock, and
  // advise_cached() is called before every release.
  stream_allocator(backend& be, int device, pager& memory, bool advise_at_release);
  ~stream_allocator();  // the pager frees the segments with the arena
  stream_allocator(const stream_allocator&) = delete;
  stream_allocator& operator=(const stream_allocator&) = delete;

  // `stream`: the application's CUstream / cudaStream_t as a number (0: the legacy default
  // stream). err_out_of_memory after a trim did not make room; nothing changes then.
  //
  // The per-thread default stream (k_per_thread_stream: CU_STREAM_PER_THREAD,
  // cudaStreamPerThread) is one handle for a different stream on every thread. Its blocks
  // are kept under a key of the calling thread's own (never reused by another thread, even
  // after this one ends), so that a block freed on one thread's stream never serves another
  // thread's without the synchronize that reuse across streams takes; asked whether it is
  // being captured, the driver is asked about the calling thread's.
  static constexpr uintptr_t k_per_thread_stream = 0x2;
  int allocate(uint64_t size, uintptr_t stream, device_ptr* out);
  // A pointer allocate() returned; err_invalid_argument for anything else (nothing changes).
  int deallocate(device_ptr ptr, uintptr_t stream);
  // Synchronize the device, then give every wholly free segment back to the pager; free
  // blocks of the segments kept go back to their segments' streams.
  int trim();
  // Advise every free block not yet advised discardable (before a release, so that the
  // eviction that may follow does not copy them).
  int advise_cached();
  // Whether `ptr` lies in one of the segments (a block live, free or the graph's).
  bool owns(device_ptr ptr) const;
  stream_allocator_stats stats() const;
  // Check the books (tests): blocks tile each segment, free blocks are in their pool's set,
  // no two free neighbours of one stream are apart, the counters match. err_internal names
  // the first disagreement.
  int check_invariants() const;

  // Sizes round up to 512 B (as cudaMalloc's alignment, halved; PyTorch's block size).
  static uint64_t round_size(uint64_t size) noexcept;
  static constexpr uint64_t small_request = 1 << 20;    // at most this: the small pool
  static constexpr uint64_t small_segment = 2 << 20;
  static constexpr uint64_t medium_request = 10 << 20;  // below this: a shared large segment
  static constexpr uint64_t medium_segment = 20 << 20;
  // Requests of medium_request and more share segments of this many frames while the pool
  // has room: one segment per request would leave up to a frame's worth free after each
  // (a 44 MiB tensor in a 64 MiB segment), which only smaller requests of the same stream
  // can use.
  static constexpr uint64_t large_segment_frames = 16;

 private:
  enum class state : uint8_t { free, live, graph };
  // How much of a free block is advised discardable.
  enum class advised : uint8_t { none, some, all };
  struct segment;
  struct block {
    device_ptr addr = 0;
    uint64_t size = 0;
    uintptr_t stream = 0;  // free: the stream it may serve without a synchronization
    segment* seg = nullptr;
    block* prev = nullptr;  // neighbours in the segment, by address
    block* next = nullptr;
    state st = state::free;
    advised adv = advised::none;
    bool graph = false;     // live: allocated during a capture, the graph's when freed
  };
  struct segment {
    device_ptr base = 0;
    uint64_t size = 0;
    uintptr_t stream = 0;  // the stream it was made for
    bool small = false;
    block* head = nullptr;  // the block at base (never merged away: it has no prev)
  };
  struct by_size {  // best fit: stream, then size, then address
    bool operator()(const block* a, const block* b) const noexcept {
      if (a->stream != b->stream) return a->stream < b->stream;
      if (a->size != b->size) return a->size < b->size;
      return a->addr < b->addr;
    }
  };
  using free_set = std::set<block*, by_size>;
  using live_map = std::unordered_map<device_ptr, block*>;

  int capturing(uintptr_t stream, bool* out);
  // The sets' and the live map's nodes are reused (extract, then insert the node back with a
  // new value): a step that allocates what the previous one freed then calls no malloc.
  void pool_insert(free_set& pool, block* b);
  void pool_erase(free_set& pool, block* b);
  void live_insert(block* b);
  void live_erase(live_map::iterator it);
  free_set& pool_of(const block* b) { return b->seg->small ? small_free_ : large_free_; }
  // The best free block of `pool` for `want` bytes on `stream`, or null.
  block* find_free(free_set& pool, uint64_t want, uintptr_t stream);
  // The same over every stream's free blocks (only right after a synchronize).
  block* find_free_any(free_set& pool, uint64_t want);
  // Hand out `want` bytes of free block `b` (taken out of its set): back and advise what
  // needs it, split off the remainder worth keeping. Nothing changes on failure.
  int take(block* b, uint64_t want, uintptr_t stream, bool graph, device_ptr* out);
  // A new segment for `want` bytes on `stream` of `seg_size` bytes, its first block handed out.
  int new_segment(uint64_t want, uint64_t seg_size, uintptr_t stream, bool small, bool graph, device_ptr* out);
  uint64_t segment_size(uint64_t want, bool small) const noexcept;
  // Merge free block `b` with its free neighbours of the same stream, insert it in its set.
  void insert_free(block* b);
  void merge_into(block* into, block* gone);  // `gone` follows `into`; its record is recycled
  block* new_block();
  void recycle(block* b);
  int trim_locked();

  backend& be_;
  const int device_;
  pager& memory_;
  const bool advise_at_release_;
  mutable std::mutex mutex_;
  live_map live_;                                // every block handed out and not freed
  free_set small_free_, large_free_;
  std::map<device_ptr, segment> segments_;       // by base
  std::vector<block*> spare_;                    // block records to reuse (a split makes one)
  std::vector<free_set::node_type> spare_set_nodes_;
  std::vector<live_map::node_type> spare_live_nodes_;
  stream_allocator_stats stats_;
  // The busy time in ticks of a cheap counter (busy_clock in the .cpp), turned into
  // nanoseconds by stats() at the rate measured since the allocator was made.
  uint64_t busy_ticks_ = 0;
  const uint64_t made_ticks_;
  const uint64_t made_ns_;
};

}  // namespace vramswap::detail
