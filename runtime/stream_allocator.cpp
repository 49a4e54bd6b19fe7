#include "runtime/stream_allocator.hpp"

#include <chrono>
#include <cinttypes>

#include "core/status.hpp"

namespace vramswap::detail {

namespace {
// Adds the time from its making to its end to `total`: declared before a lock_guard, it
// ends after it, so the wait for the mutex counts too.
class busy_time {
 public:
  explicit busy_time(std::atomic<uint64_t>& total) : total_(total) {}
  ~busy_time() {
    const auto took = std::chrono::steady_clock::now() - start_;
    total_.fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count()),
                     std::memory_order_relaxed);
  }
  busy_time(const busy_time&) = delete;
  busy_time& operator=(const busy_time&) = delete;

 private:
  std::atomic<uint64_t>& total_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};
}  // namespace

uint64_t stream_allocator::round_size(uint64_t size) noexcept {
  constexpr uint64_t small = 512, large = 128 << 10, boundary = 1 << 20;
  const uint64_t unit = size < boundary ? small : large;
  return (size + unit - 1) / unit * unit;
}

int stream_allocator::capturing(uintptr_t stream, bool* out) {
  return add_context(be_.app_stream_capturing(device_, stream, out), "asking whether stream 0x%" PRIxPTR " is being captured: ",
                     stream);
}

int stream_allocator::allocate(uint64_t size, uintptr_t stream, device_ptr* out) {
  if (size == 0) return fail(err_invalid_argument, "malloc_async(device %d): size 0", device_);
  if (out == nullptr) return fail(err_invalid_argument, "malloc_async(device %d): out is null", device_);
  const uint64_t want = round_size(size);
  if (want < size) return fail(err_out_of_memory, "malloc_async(%" PRIu64 " bytes, device %d): size too large", size, device_);
  const busy_time busy(busy_ns_);
  std::lock_guard<std::mutex> lock(mutex_);
  bool graph = false;
  VS_TRY(add_context(capturing(stream, &graph), "malloc_async(%" PRIu64 " bytes, device %d): ", size, device_));

  // A block this stream freed, at most 1/8 larger than asked. Not resident (outside the
  // lock), an eviction may have dropped its pages: it serves only if they can be backed now.
  if (auto c = cache_.find(stream); c != cache_.end()) {
    auto it = c->second.lower_bound(want);
    // Resident and never advised: every page is mapped and holds what it held, so the block
    // serves as it is. Otherwise its pages may have been dropped: backed again or no use.
    const bool as_is = it != c->second.end() && !blocks_.at(it->second).advised && memory_.resident();
    if (it != c->second.end() && it->first - want <= want / 8 && (as_is || back_cached(it->second))) {
      const device_ptr p = it->second;
      block& b = blocks_.at(p);
      if (b.advised) VS_TRY(add_context(memory_.advise(p, b.size, advice::normal), "malloc_async: reusing a cached block: "));
      c->second.erase(it);
      b.cached = false;
      b.advised = false;
      b.graph = graph;
      stats_.cached_bytes -= b.size;
      stats_.live_bytes += b.size;
      if (graph) stats_.graph_bytes += b.size;
      ++stats_.hits;
      *out = p;
      return ok;
    }
  }

  // Outside the lock the block must be backed now (backing::required): its caller queues
  // work on it at once (PyTorch's .cuda(), a fill), which would fault on unbacked pages.
  device_ptr p = 0;
  int rc = memory_.malloc(want, &p, backing::required);
  if (rc == err_out_of_memory && !graph && stats_.cached_bytes > 0) {
    // Room may be waiting in the caches (of other streams, or in sizes that did not fit):
    // arena space, and frames that go back to the pool free.
    VS_TRY(add_context(trim_locked(), "malloc_async(%" PRIu64 " bytes, device %d): making room: ", size, device_));
    rc = memory_.malloc(want, &p, backing::required);
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
    return fail(rc, "malloc_async(%" PRIu64 " bytes, stream 0x%" PRIxPTR ", device %d; %" PRIu64 " bytes cached%s): %s", size, stream,
                device_, stats_.cached_bytes, graph ? ", capturing a CUDA graph: no trim possible" : "", why.c_str());
  }
  blocks_.emplace(p, block{want, stream, false, graph});
  stats_.live_bytes += want;
  if (graph) stats_.graph_bytes += want;
  ++stats_.misses;
  *out = p;
  return ok;
}

bool stream_allocator::back_cached(device_ptr p) {
  const block& b = blocks_.at(p);
  if (memory_.back_now(p, b.size) == ok) return true;
  clear_error();  // the miss path below reports it, after a trim
  return false;
}

int stream_allocator::deallocate(device_ptr ptr, uintptr_t stream) {
  const busy_time busy(busy_ns_);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocks_.find(ptr);
  if (it == blocks_.end() || it->second.cached) {
    return fail(err_invalid_argument,
                "free_async(0x%" PRIxPTR ", device %d): %s; nothing was freed", ptr, device_,
                it == blocks_.end() ? "not a pointer that malloc_async returned (or one already given back)"
                                    : "already freed (double free)");
  }
  block& b = it->second;
  bool now_capturing = false;
  if (!b.graph) {
    VS_TRY(add_context(capturing(b.stream, &now_capturing), "free_async(0x%" PRIxPTR ", device %d): ", ptr, device_));
    if (!now_capturing && stream != b.stream) {
      VS_TRY(add_context(capturing(stream, &now_capturing), "free_async(0x%" PRIxPTR ", device %d): ", ptr, device_));
    }
  }
  stats_.live_bytes -= b.size;
  if (b.graph || now_capturing) {
    // A graph may replay and touch it at any time: it stays allocated, never reused.
    if (!b.graph) stats_.graph_bytes += b.size;
    b.graph = true;
    blocks_.erase(it);
    return ok;
  }
  // Not resident, no release comes before the next eviction: advise now.
  if (!advise_at_release_ || !memory_.resident()) {
    VS_TRY(add_context(memory_.advise(ptr, b.size, advice::discardable), "free_async(0x%" PRIxPTR ", device %d): ", ptr, device_));
    b.advised = true;
  }
  // Ordered on the freeing stream: that is the stream whose later work may reuse it.
  b.cached = true;
  b.stream = stream;
  cache_[stream].emplace(b.size, ptr);
  stats_.cached_bytes += b.size;
  return ok;
}

int stream_allocator::trim() {
  const busy_time busy(busy_ns_);
  std::lock_guard<std::mutex> lock(mutex_);
  return trim_locked();
}

int stream_allocator::advise_cached() {
  const busy_time busy(busy_ns_);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [stream, sizes] : cache_) {
    for (auto& [size, p] : sizes) {
      block& b = blocks_.at(p);
      if (b.advised) continue;
      VS_TRY(add_context(memory_.advise(p, b.size, advice::discardable), "advising the cached blocks (device %d): ", device_));
      b.advised = true;
    }
  }
  return ok;
}

int stream_allocator::trim_locked() {
  if (stats_.cached_bytes == 0) return ok;
  // Work queued before the frees may still use the blocks: let it finish before the pager
  // unmaps anything.
  VS_TRY(add_context(be_.device_synchronize(device_), "trim(device %d): ", device_));
  ++stats_.trims;
  for (auto& [stream, sizes] : cache_) {
    for (auto it = sizes.begin(); it != sizes.end();) {
      const device_ptr p = it->second;
      const uint64_t size = blocks_.at(p).size;
      VS_TRY(add_context(memory_.free(p), "trim(device %d): ", device_));
      blocks_.erase(p);
      stats_.cached_bytes -= size;
      it = sizes.erase(it);
    }
  }
  cache_.clear();
  return ok;
}

bool stream_allocator::owns(device_ptr ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return blocks_.count(ptr) != 0;
}

stream_allocator_stats stream_allocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  stream_allocator_stats s = stats_;
  s.busy_ns = busy_ns_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace vramswap::detail
