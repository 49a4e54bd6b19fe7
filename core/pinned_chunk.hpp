// pinned_chunk: host memory mapped, faulted in and registered with the backend once, for
// copies at the link's rate (cuMemHostRegister of memory already faulted in is far faster
// than allocating pinned memory, and nothing is pinned per copy). Every place that pins
// host memory for saved pages makes it here: the page stores' own slots (swap/), the
// client's mapping of the shared host pool (pool/pool_connection.cpp), and vramswapd's
// committing of that pool (server/, which only faults it in: fault_in_writable).
#pragma once

#include <cstddef>
#include <functional>

#include "core/backend.hpp"

namespace vramswap::detail {

// How to fault pages in where the kernel lacks MADV_POPULATE_WRITE (before Linux 5.14).
enum class populate_fallback {
  touch,          // write a zero to every page: only for memory whose bytes are not yet anyone's
  leave_to_pin,   // do nothing: the backend's registration faults the pages in (shared memory
                  // that may hold other processes' bytes must never be written here)
};

// Whether this kernel has MADV_POPULATE_WRITE (Linux 5.14), asked once of a page of our own.
bool kernel_populates() noexcept;

// Map every page of [base, base + bytes) writable now, so that the memory is committed
// before anyone counts on it. 0, or the errno of the failure (ENOMEM: no room). A large
// range is faulted in by up to eight threads at once, pieces of it each (this thread one of
// them): the kernel's zeroing of the pages, not the copy that needs them, sets the rate.
// `pause_point` (optional; called from those threads at once) runs between steps of a few
// MiB of each thread's piece: a caller that must not fault memory in while something else
// runs waits there. A store's maker does while its owner maps device memory, because the
// driver's mapping calls run many times slower beside faulting in.
int fault_in_writable(void* base, size_t bytes, populate_fallback fallback,
                      const std::function<void()>& pause_point = {}) noexcept;

class pinned_chunk {
 public:
  pinned_chunk() = default;
  // Fresh anonymous memory (private, zero-filled), faulted in and registered. `what` names
  // the memory for the error ("tiered store for device 0", say).
  // `pause_point` (optional) runs between the steps of faulting in (as fault_in_writable's,
  // from several threads at once) and before registering: a maker holds its faulting in and
  // its registration back there while its owner maps device memory.
  static int make_anonymous(backend& be, size_t bytes, const char* what, pinned_chunk* out,
                            const std::function<void()>& pause_point = {}) noexcept;
  // A MAP_SHARED mapping of `fd` (a memfd), faulted in without writing and registered.
  static int map_shared(backend& be, int fd, size_t bytes, const char* what, pinned_chunk* out) noexcept;
  ~pinned_chunk();  // unregisters and unmaps
  pinned_chunk(pinned_chunk&& o) noexcept;
  pinned_chunk& operator=(pinned_chunk&& o) noexcept;
  pinned_chunk(const pinned_chunk&) = delete;
  pinned_chunk& operator=(const pinned_chunk&) = delete;

  char* base() const noexcept { return base_; }
  size_t bytes() const noexcept { return bytes_; }

 private:
  static int pin(backend& be, void* p, size_t bytes, populate_fallback fallback, const char* what, pinned_chunk* out,
                 const std::function<void()>& pause_point) noexcept;
  void reset() noexcept;

  backend* be_ = nullptr;
  char* base_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace vramswap::detail
