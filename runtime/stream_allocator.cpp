#include "runtime/stream_allocator.hpp"

#include <atomic>
#include <chrono>
#include <cinttypes>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

#include "core/status.hpp"

namespace vramswap::detail {

namespace {
// The busy time's clock, read twice per call: the CPU's constant-rate counter where there is
// one (a register read, about a third of the steady clock's vDSO call), else the steady clock
// in nanoseconds. Its rate is measured against the steady clock over the allocator's life
// (stats()), so nothing is calibrated up front.
#if defined(__x86_64__) || defined(__i386__)
bool counter_usable() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  // CPUID 0x80000007, EDX bit 8: the time-stamp counter runs at a constant rate in every
  // power state (the "invariant TSC"); without it, ticks are no measure of time.
  return __get_cpuid(0x80000007, &a, &b, &c, &d) != 0 && (d & (1u << 8)) != 0;
}
const bool g_counter = counter_usable();
uint64_t counter() noexcept { return __rdtsc(); }
#elif defined(__aarch64__)
const bool g_counter = true;  // the generic timer's virtual count: constant rate by the architecture
uint64_t counter() noexcept {
  uint64_t v = 0;
  asm volatile("mrs %0, cntvct_el0" : "=r"(v));
  return v;
}
#else
const bool g_counter = false;
uint64_t counter() noexcept { return 0; }
#endif

uint64_t steady_ns() noexcept {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}
uint64_t busy_clock() noexcept { return g_counter ? counter() : steady_ns(); }

// Adds the ticks from `start` to its end to `total`. Made after the lock_guard, with a start
// read before it, so that it ends while the mutex is still held (`total` needs no atomic)
// and the wait for the mutex counts.
class busy_time {
 public:
  busy_time(uint64_t& total, uint64_t start) noexcept : total_(total), start_(start) {}
  ~busy_time() { total_ += busy_clock() - start_; }
  busy_time(const busy_time&) = delete;
  busy_time& operator=(const busy_time&) = delete;

 private:
  uint64_t& total_;
  const uint64_t start_;
};

constexpr uint64_t block_unit = 512;
uint64_t round_up(uint64_t v, uint64_t unit) noexcept { return (v + unit - 1) / unit * unit; }
}  // namespace

stream_allocator::stream_allocator(backend& be, int device, pager& memory, bool advise_at_release)
    : be_(be), device_(device), memory_(memory), advise_at_release_(advise_at_release), made_ticks_(busy_clock()),
      made_ns_(steady_ns()) {}

stream_allocator::~stream_allocator() {
  for (auto& [base, seg] : segments_) {
    for (block* b = seg.head; b != nullptr;) {
      block* next = b->next;
      delete b;
      b = next;
    }
  }
  for (block* b : spare_) delete b;
}

uint64_t stream_allocator::round_size(uint64_t size) noexcept { return round_up(size, block_unit); }

uint64_t stream_allocator::segment_size(uint64_t want, bool small) const noexcept {
  if (small) return small_segment;
  // Whole frames: a large segment shares no page with another, so that giving it back frees
  // its frames, and its tail beyond the request is a free block the next requests split.
  const uint64_t unit = std::max<uint64_t>(small_segment, memory_.frame_size());
  return round_up(want < medium_request ? medium_segment : want, unit);
}

namespace {

// Keys of per-thread default streams: (a number of the thread's own) << 2 | 3. Stream
// handles are pointers (aligned: low bits 00) or the constants 1 (legacy) and 2 (per-thread),
// so no key is ever a handle.
constexpr uintptr_t k_thread_key_bits = 3;
std::atomic<uintptr_t> g_next_thread_key{1};

uintptr_t stream_key(uintptr_t stream) noexcept {
  if (stream != stream_allocator::k_per_thread_stream) return stream;
  thread_local const uintptr_t key = (g_next_thread_key.fetch_add(1, std::memory_order_relaxed) << 2) | k_thread_key_bits;
  return key;
}

// The stream a key stands for, as the driver knows it on the calling thread.
uintptr_t stream_of_key(uintptr_t key) noexcept {
  return (key & k_thread_key_bits) == k_thread_key_bits ? stream_allocator::k_per_thread_stream : key;
}

}  // namespace

int stream_allocator::capturing(uintptr_t key, bool* out) {
  if ((key & k_thread_key_bits) == k_thread_key_bits && key != stream_key(k_per_thread_stream)) {
    *out = false;  // another thread's default stream: the driver answers only about the caller's
    return ok;
  }
  const uintptr_t stream = stream_of_key(key);
  // A capture may begin on any stream at any time (cudaStreamBeginCapture tells no
  // allocator), so the answer is asked for on every call, never remembered.
  const int rc = be_.app_stream_capturing(device_, stream, out);
  if (rc == ok) return ok;
  return add_context(rc, "asking whether stream 0x%" PRIxPTR " is being captured: ", stream);
}

void stream_allocator::pool_insert(free_set& pool, block* b) {
  if (spare_set_nodes_.empty()) {
    pool.insert(b);
    return;
  }
  free_set::node_type n = std::move(spare_set_nodes_.back());
  spare_set_nodes_.pop_back();
  n.value() = b;
  pool.insert(std::move(n));
}

void stream_allocator::pool_erase(free_set& pool, block* b) {
  free_set::node_type n = pool.extract(b);
  if (n.empty()) return;
  try {
    spare_set_nodes_.push_back(std::move(n));
  } catch (const std::bad_alloc&) {
    // n frees its node
  }
}

void stream_allocator::live_insert(block* b) {
  if (spare_live_nodes_.empty()) {
    live_.emplace(b->addr, b);
    return;
  }
  live_map::node_type n = std::move(spare_live_nodes_.back());
  spare_live_nodes_.pop_back();
  n.key() = b->addr;
  n.mapped() = b;
  live_.insert(std::move(n));  // a failed rehash throws, and n frees its node
}

void stream_allocator::live_erase(live_map::iterator it) {
  live_map::node_type n = live_.extract(it);
  try {
    spare_live_nodes_.push_back(std::move(n));
  } catch (const std::bad_alloc&) {
    // n frees its node
  }
}

stream_allocator::block* stream_allocator::new_block() {
  if (spare_.empty()) return new block;
  block* b = spare_.back();
  spare_.pop_back();
  *b = block{};
  return b;
}

void stream_allocator::recycle(block* b) {
  try {
    spare_.push_back(b);
  } catch (...) {
    delete b;
  }
}

stream_allocator::block* stream_allocator::find_free(free_set& pool, uint64_t want, uintptr_t stream) {
  block key;
  key.stream = stream;
  key.size = want;
  key.addr = 0;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  return *it;
}

stream_allocator::block* stream_allocator::find_free_any(free_set& pool, uint64_t want) {
  block* best = nullptr;
  block key;
  for (auto it = pool.begin(); it != pool.end();) {
    key.stream = (*it)->stream;
    key.size = want;
    key.addr = 0;
    auto fit = pool.lower_bound(&key);
    if (fit != pool.end() && (*fit)->stream == key.stream && (best == nullptr || (*fit)->size < best->size)) best = *fit;
    key.size = UINT64_MAX;  // past this stream's blocks
    key.addr = UINT64_MAX;
    it = pool.upper_bound(&key);
  }
  return best;
}

int stream_allocator::take(block* b, uint64_t want, uintptr_t stream, bool graph, device_ptr* out) {
  // Not resident (outside the lock), an eviction may have dropped or saved its pages: they
  // must be backed now, or the block is no use. Resident, every live page is mapped.
  if (!memory_.resident_now()) VS_TRY(memory_.back_now(b->addr, want));
  if (b->adv != advised::none) {
    // Within a hold whose release advises every free block again, the whole block is made
    // normal: advising only the part taken would leave its remainder advised, the part
    // freed again not, and their merge "some", which every later take from it in the hold
    // would advise once more (a pager call per allocation).
    const bool whole = advise_at_release_ && memory_.resident_now();
    if (const int rc = memory_.advise(b->addr, whole ? b->size : want, advice::normal); rc != ok) {
      return add_context(rc, "malloc_async: reusing a free block: ");
    }
    ++stats_.advice_calls;
    if (whole) b->adv = advised::none;  // its remainder, split off below, too
  }
  const uint64_t rest = b->size - want;
  const bool split = b->seg->small ? rest >= block_unit : rest > small_request;
  block* r = nullptr;
  try {
    if (split) r = new_block();
    live_insert(b);
  } catch (const std::bad_alloc&) {
    if (r != nullptr) recycle(r);
    return fail(err_out_of_memory, "malloc_async(%" PRIu64 " bytes, device %d): out of host memory", want, device_);
  }
  if (split) {
    r->addr = b->addr + want;
    r->size = rest;
    r->stream = b->stream;
    r->seg = b->seg;
    r->prev = b;
    r->next = b->next;
    r->adv = b->adv;
    if (b->next != nullptr) b->next->prev = r;
    b->next = r;
    b->size = want;
    pool_insert(pool_of(r), r);
  }
  b->st = state::live;
  b->stream = stream;
  b->adv = advised::none;
  b->graph = graph;
  stats_.cached_bytes -= b->size;
  stats_.live_bytes += b->size;
  if (graph) stats_.graph_bytes += b->size;
  *out = b->addr;
  return ok;
}

int stream_allocator::new_segment(uint64_t want, uint64_t seg_size, uintptr_t stream, bool small, bool graph, device_ptr* out) {
  // Outside the lock the segment must be backed now (backing::required): its caller queues
  // work on it at once (PyTorch's .cuda(), a fill), which would fault on unbacked pages.
  device_ptr p = 0;
  VS_TRY(memory_.malloc(seg_size, &p, backing::required));
  block* b = nullptr;
  try {
    b = new_block();
    auto [it, made] = segments_.emplace(p, segment{p, seg_size, stream, small, b});
    (void)made;
    b->addr = p;
    b->size = seg_size;
    b->stream = stream;
    b->seg = &it->second;
  } catch (...) {
    if (b != nullptr) recycle(b);
    (void)memory_.free(p);  // nothing used it yet
    throw;
  }
  ++stats_.segments;
  stats_.segment_bytes += seg_size;
  stats_.new_bytes += seg_size;
  stats_.cached_bytes += seg_size;
  return take(b, want, stream, graph, out);  // resident or backed, never advised: cannot fail
}

int stream_allocator::allocate(uint64_t size, uintptr_t app_stream, device_ptr* out) {
  const uintptr_t stream = stream_key(app_stream);
  if (size == 0) return fail(err_invalid_argument, "malloc_async(device %d): size 0", device_);
  if (out == nullptr) return fail(err_invalid_argument, "malloc_async(device %d): out is null", device_);
  const uint64_t want = round_size(size);
  if (want < size || want > (uint64_t{1} << 62)) {
    return fail(err_out_of_memory, "malloc_async(%" PRIu64 " bytes, device %d): size too large", size, device_);
  }
  const uint64_t start = busy_clock();
  std::lock_guard<std::mutex> lock(mutex_);
  const busy_time busy(busy_ticks_, start);
  bool graph = false;
  if (const int rc = capturing(stream, &graph); rc != ok) {
    return add_context(rc, "malloc_async(%" PRIu64 " bytes, device %d): ", size, device_);
  }
  const bool small = want <= small_request;
  free_set& pool = small ? small_free_ : large_free_;

  // A free block of this stream: taken out of its set while it is handed out, put back if
  // its pages cannot be backed now (outside the lock), and the search goes on to a segment.
  auto from_free = [&](bool any_stream) -> bool {
    block* b = any_stream ? find_free_any(pool, want) : find_free(pool, want, stream);
    if (b == nullptr) return false;
    pool_erase(pool, b);
    if (take(b, want, stream, graph, out) == ok) {
      ++stats_.hits;
      return true;
    }
    clear_error();  // the miss path below reports it, after a trim
    pool_insert(pool, b);
    return false;
  };
  if (from_free(false)) return ok;

  // A shared large segment while there is room for one, else one of the request's size.
  const uint64_t seg_size = segment_size(want, small);
  const uint64_t shared_size = small || want < medium_request ? seg_size
                               : std::max(seg_size, large_segment_frames * memory_.frame_size());
  int rc = new_segment(want, shared_size, stream, small, graph, out);
  if (rc == err_out_of_memory && shared_size > seg_size) {
    clear_error();
    rc = new_segment(want, seg_size, stream, small, graph, out);
  }
  if (rc == err_out_of_memory && !graph && stats_.cached_bytes > 0) {
    // Room may be waiting in free blocks of other streams, and in whole free segments whose
    // frames go back to the pool. Right after the trim's synchronize no work is pending on
    // any free block: the best fit of any stream serves.
    VS_TRY(add_context(trim_locked(), "malloc_async(%" PRIu64 " bytes, device %d): making room: ", size, device_));
    if (from_free(true)) return ok;
    rc = new_segment(want, seg_size, stream, small, graph, out);
  }
  if (rc == err_out_of_memory && seg_size > want) {
    // No room for a whole segment: one of just this size may still fit.
    clear_error();
    rc = new_segment(want, want, stream, small, graph, out);
  }
  if (rc != ok) {
    const std::string why = last_error();
    if (rc == err_out_of_memory && !memory_.resident()) {
      return fail(rc,
                  "malloc_async(%" PRIu64 " bytes, stream 0x%" PRIxPTR ", device %d; %" PRIu64 " bytes cached): this process does not "
                  "hold the device lock, and outside it only free frames of the pool can back memory: %s. Allocate inside the lock "
                  "(vramswap.gpu_lock(), vramswap::gpu_lock, vramswap_lock), e.g. `with vramswap.gpu_lock(): model = "
                  "Net().cuda()`: there frames are taken from idle processes, whose bytes are saved first",
                  size, stream, device_, stats_.cached_bytes, why.c_str());
    }
    return fail(rc,
                "malloc_async(%" PRIu64 " bytes, stream 0x%" PRIxPTR ", device %d; %" PRIu64 " bytes live, %" PRIu64
                " bytes free in %" PRIu64 " segment(s) of %" PRIu64 " bytes%s): %s",
                size, stream, device_, stats_.live_bytes, stats_.cached_bytes, stats_.segments, stats_.segment_bytes,
                graph ? ", capturing a CUDA graph: no trim possible" : "", why.c_str());
  }
  ++stats_.misses;
  return ok;
}

void stream_allocator::merge_into(block* into, block* gone) {
  into->size += gone->size;
  into->adv = into->adv == advised::all && gone->adv == advised::all     ? advised::all
              : into->adv == advised::none && gone->adv == advised::none ? advised::none
                                                                          : advised::some;
  into->next = gone->next;
  if (gone->next != nullptr) gone->next->prev = into;
  recycle(gone);
}

void stream_allocator::insert_free(block* b) {
  free_set& pool = pool_of(b);
  if (block* p = b->prev; p != nullptr && p->st == state::free && p->stream == b->stream) {
    pool_erase(pool, p);
    merge_into(p, b);
    b = p;
  }
  if (block* n = b->next; n != nullptr && n->st == state::free && n->stream == b->stream) {
    pool_erase(pool, n);
    merge_into(b, n);
  }
  pool_insert(pool, b);
}

int stream_allocator::deallocate(device_ptr ptr, uintptr_t app_stream) {
  const uintptr_t stream = stream_key(app_stream);
  const uint64_t start = busy_clock();
  std::lock_guard<std::mutex> lock(mutex_);
  const busy_time busy(busy_ticks_, start);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    return fail(err_invalid_argument,
                "free_async(0x%" PRIxPTR ", device %d): not a pointer that malloc_async returned, or one already freed (double "
                "free); nothing was freed",
                ptr, device_);
  }
  block* b = it->second;
  bool now_capturing = false;
  if (!b->graph) {
    int rc = capturing(b->stream, &now_capturing);
    if (rc == ok && !now_capturing && stream != b->stream) rc = capturing(stream, &now_capturing);
    if (rc != ok) return add_context(rc, "free_async(0x%" PRIxPTR ", device %d): ", ptr, device_);
  }
  // Not resident, no release comes before the next eviction: advise now.
  const bool advise_now = !b->graph && !now_capturing && (!advise_at_release_ || !memory_.resident_now());
  if (advise_now) {
    if (const int rc = memory_.advise(ptr, b->size, advice::discardable); rc != ok) {
      return add_context(rc, "free_async(0x%" PRIxPTR ", device %d): ", ptr, device_);
    }
    ++stats_.advice_calls;
  }
  live_erase(it);
  stats_.live_bytes -= b->size;
  if (b->graph || now_capturing) {
    // A graph may replay and touch it at any time: it stays taken, never reused, and its
    // segment is never given back.
    if (!b->graph) stats_.graph_bytes += b->size;
    b->st = state::graph;
    return ok;
  }
  // Ordered on the freeing stream: that is the stream whose later work may reuse it.
  b->st = state::free;
  b->stream = stream;
  b->adv = advise_now ? advised::all : advised::none;
  stats_.cached_bytes += b->size;
  insert_free(b);
  return ok;
}

int stream_allocator::trim() {
  const uint64_t start = busy_clock();
  std::lock_guard<std::mutex> lock(mutex_);
  const busy_time busy(busy_ticks_, start);
  return trim_locked();
}

int stream_allocator::advise_cached() {
  const uint64_t start = busy_clock();
  std::lock_guard<std::mutex> lock(mutex_);
  const busy_time busy(busy_ticks_, start);
  for (free_set* pool : {&small_free_, &large_free_}) {
    for (block* b : *pool) {
      if (b->adv == advised::all) continue;
      VS_TRY(add_context(memory_.advise(b->addr, b->size, advice::discardable), "advising the free blocks (device %d): ", device_));
      ++stats_.advice_calls;
      b->adv = advised::all;  // not a key of the set: changing it in place is safe
    }
  }
  return ok;
}

int stream_allocator::trim_locked() {
  if (stats_.cached_bytes == 0) return ok;
  // Work queued before the frees may still use the blocks: let it finish before the pager
  // unmaps anything, or another stream takes them.
  VS_TRY(add_context(be_.device_synchronize(device_), "trim(device %d): ", device_));
  ++stats_.trims;
  for (auto s = segments_.begin(); s != segments_.end();) {
    segment& seg = s->second;
    free_set& pool = seg.small ? small_free_ : large_free_;
    // After the synchronize, free blocks may serve any stream: they go back to the
    // segment's, merged where they meet.
    for (block* b = seg.head; b != nullptr; b = b->next) {
      if (b->st == state::free && b->stream != seg.stream) {
        pool_erase(pool, b);
        b->stream = seg.stream;
        pool_insert(pool, b);
      }
    }
    for (block* b = seg.head; b != nullptr; b = b->next) {
      if (b->st != state::free || b->next == nullptr || b->next->st != state::free) continue;
      pool_erase(pool, b);
      while (b->next != nullptr && b->next->st == state::free) {
        pool_erase(pool, b->next);
        merge_into(b, b->next);
      }
      pool_insert(pool, b);
    }
    block* head = seg.head;
    if (head->st == state::free && head->next == nullptr) {
      VS_TRY(add_context(memory_.free(seg.base), "trim(device %d): ", device_));
      pool_erase(pool, head);
      stats_.cached_bytes -= seg.size;
      stats_.segment_bytes -= seg.size;
      --stats_.segments;
      recycle(head);
      s = segments_.erase(s);
      continue;
    }
    ++s;
  }
  return ok;
}

bool stream_allocator::owns(device_ptr ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto s = segments_.upper_bound(ptr);
  if (s == segments_.begin()) return false;
  --s;
  return ptr < s->second.base + s->second.size;
}

stream_allocator_stats stream_allocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  stream_allocator_stats s = stats_;
  if (!g_counter) {
    s.busy_ns = busy_ticks_;
  } else {
    const uint64_t ticks = busy_clock() - made_ticks_;
    const uint64_t ns = steady_ns() - made_ns_;
    s.busy_ns = ticks == 0 ? 0 : static_cast<uint64_t>(static_cast<long double>(busy_ticks_) * ns / ticks);
  }
  return s;
}

int stream_allocator::check_invariants() const {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t live = 0, free = 0, graph = 0, bytes = 0, free_blocks = 0;
  for (const auto& [base, seg] : segments_) {
    bytes += seg.size;
    device_ptr at = seg.base;
    const block* prev = nullptr;
    for (const block* b = seg.head; b != nullptr; prev = b, b = b->next) {
      if (b->addr != at || b->prev != prev || b->seg != &seg || b->size == 0) {
        return fail(err_internal, "stream_allocator: segment 0x%" PRIxPTR ": block 0x%" PRIxPTR " + %" PRIu64 " out of place (expected 0x%" PRIxPTR ")",
                    seg.base, b->addr, b->size, at);
      }
      at += b->size;
      if (b->st == state::free) {
        ++free_blocks;
        free += b->size;
        const free_set& pool = seg.small ? small_free_ : large_free_;
        if (pool.count(const_cast<block*>(b)) == 0) {
          return fail(err_internal, "stream_allocator: free block 0x%" PRIxPTR " is not in its pool", b->addr);
        }
        if (prev != nullptr && prev->st == state::free && prev->stream == b->stream) {
          return fail(err_internal, "stream_allocator: free blocks 0x%" PRIxPTR " and 0x%" PRIxPTR " of one stream were not merged",
                      prev->addr, b->addr);
        }
      } else if (b->st == state::live) {
        live += b->size;
        if (b->graph) graph += b->size;
        auto it = live_.find(b->addr);
        if (it == live_.end() || it->second != b) {
          return fail(err_internal, "stream_allocator: live block 0x%" PRIxPTR " is not in the live map", b->addr);
        }
      } else {
        graph += b->size;
      }
    }
    if (at != seg.base + seg.size) {
      return fail(err_internal, "stream_allocator: segment 0x%" PRIxPTR " + %" PRIu64 ": blocks end at 0x%" PRIxPTR, seg.base, seg.size, at);
    }
  }
  if (free_blocks != small_free_.size() + large_free_.size() || live != stats_.live_bytes || free != stats_.cached_bytes || graph != stats_.graph_bytes || bytes != stats_.segment_bytes ||
      segments_.size() != stats_.segments) {
    return fail(err_internal,
                "stream_allocator: counts disagree: live %" PRIu64 "/%" PRIu64 ", free %" PRIu64 "/%" PRIu64 " (%" PRIu64
                " blocks, %zu in the pools), graph %" PRIu64 "/%" PRIu64 ", segments %zu/%" PRIu64 " of %" PRIu64 "/%" PRIu64 " bytes",
                live, stats_.live_bytes, free, stats_.cached_bytes, free_blocks, small_free_.size() + large_free_.size(), graph,
                stats_.graph_bytes, segments_.size(), stats_.segments, bytes, stats_.segment_bytes);
  }
  return ok;
}

}  // namespace vramswap::detail
