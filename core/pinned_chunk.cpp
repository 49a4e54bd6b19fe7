#include "core/pinned_chunk.hpp"

#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>

#include "core/log.hpp"
#include "core/status.hpp"

// The C library may predate the kernel's flag (Linux 5.14); the kernel's number is fixed.
// Kernels that lack it answer EINVAL, which fault_in_writable handles.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace vramswap::detail {

namespace {

// Faulting memory in is the kernel zeroing (or mapping) every page, a few GB/s on one thread;
// threads faulting in pieces of one range at once scale nearly linearly up to about eight,
// where memory bandwidth and the page allocator bind, and a piece of at least 64 MiB keeps
// starting a thread negligible against its work.
constexpr unsigned k_max_fault_threads = 8;
constexpr size_t k_min_fault_piece = size_t{64} << 20;
constexpr size_t k_huge_page = size_t{2} << 20;
// With a pause point, each thread faults its piece in steps of this much (huge pages
// whole), so that whatever waits for the pause waits for a few milliseconds of faulting at
// most.
constexpr size_t k_pause_step = size_t{16} << 20;

unsigned usable_cpus() noexcept {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return static_cast<unsigned>(std::max(1, CPU_COUNT(&set)));
}

}  // namespace

// Asked of a page of our own: EINVAL from a range of the caller's could as well mean the
// range cannot be written, which must be reported rather than touched (that would be SIGSEGV).
bool kernel_populates() noexcept {
  static const bool yes = [] {
    void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return true;  // no page to ask with: assume a current kernel
    const bool known = ::madvise(p, 4096, MADV_POPULATE_WRITE) == 0 || errno != EINVAL;
    ::munmap(p, 4096);
    return known;
  }();
  return yes;
}

namespace {

int fault_in_piece(char* base, size_t bytes, populate_fallback fallback) noexcept {
  if (bytes == 0) return 0;
  if (kernel_populates()) return ::madvise(base, bytes, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
  if (fallback == populate_fallback::touch) {
    for (size_t off = 0; off < bytes; off += 4096) static_cast<volatile char*>(base)[off] = 0;
  }
  return 0;
}

}  // namespace

int fault_in_writable(void* base, size_t bytes, populate_fallback fallback, const std::function<void()>& pause_point) noexcept {
  char* const p = static_cast<char*>(base);
  // [lo, hi) in steps, the pause point before each step but the first.
  auto fault_in_range = [&](size_t lo, size_t hi) {
    if (!pause_point) return fault_in_piece(p + lo, hi - lo, fallback);
    for (size_t at = lo; at < hi; at += k_pause_step) {
      if (at != lo) pause_point();
      if (const int e = fault_in_piece(p + at, std::min(hi - at, k_pause_step), fallback); e != 0) return e;
    }
    return 0;
  };
  const unsigned threads = static_cast<unsigned>(
      std::min<size_t>({k_max_fault_threads, usable_cpus(), std::max<size_t>(1, bytes / k_min_fault_piece)}));
  if (threads <= 1) return fault_in_range(0, bytes);
  // Pieces on huge-page boundaries, so that no huge page is split between two threads.
  const size_t piece = (bytes / threads + k_huge_page - 1) / k_huge_page * k_huge_page;
  std::array<int, k_max_fault_threads> errors{};
  auto fault_in_nth = [&](unsigned t) {
    const size_t lo = std::min(bytes, size_t{t} * piece), hi = std::min(bytes, lo + piece);
    errors[t] = fault_in_range(lo, hi);
  };
  std::array<std::thread, k_max_fault_threads> helpers;
  for (unsigned t = 1; t < threads; ++t) {
    try {
      helpers[t] = std::thread(fault_in_nth, t);
    } catch (const std::exception&) {
      // No thread to be had: this thread faults that piece in below.
    }
  }
  for (unsigned t = 0; t < threads; ++t) {
    if (!helpers[t].joinable()) fault_in_nth(t);
  }
  for (std::thread& h : helpers) {
    if (h.joinable()) h.join();
  }
  for (unsigned t = 0; t < threads; ++t) {
    if (errors[t] != 0) return errors[t];
  }
  return 0;
}

int pinned_chunk::pin(backend& be, void* p, size_t bytes, populate_fallback fallback, const char* what, pinned_chunk* out,
                      const std::function<void()>& pause_point) noexcept {
  ::madvise(p, bytes, MADV_HUGEPAGE);  // best effort: fewer pages to fault in and to pin
  if (const int e = fault_in_writable(p, bytes, fallback, pause_point); e != 0) {
    ::munmap(p, bytes);
    return fail(err_out_of_memory, "%s: cannot fault in %zu bytes of host memory (%s); free host memory or use less", what, bytes,
                std::strerror(e));
  }
  if (pause_point) pause_point();
  if (const int rc = be.host_register(p, bytes); rc != ok) {
    ::munmap(p, bytes);
    return add_context(rc, "%s: pinning %zu bytes of host memory: ", what, bytes);
  }
  out->reset();
  out->be_ = &be;
  out->base_ = static_cast<char*>(p);
  out->bytes_ = bytes;
  return ok;
}

int pinned_chunk::make_anonymous(backend& be, size_t bytes, const char* what, pinned_chunk* out,
                                 const std::function<void()>& pause_point) noexcept {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return fail_errno(errno, "%s: cannot map %zu more bytes of host memory", what, bytes);
  return pin(be, p, bytes, populate_fallback::touch, what, out, pause_point);
}

int pinned_chunk::map_shared(backend& be, int fd, size_t bytes, const char* what, pinned_chunk* out) noexcept {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail_errno(errno, "%s: mapping %zu bytes", what, bytes);
  return pin(be, p, bytes, populate_fallback::leave_to_pin, what, out, {});
}

void pinned_chunk::reset() noexcept {
  if (base_ == nullptr) return;
  if (be_->host_unregister(base_) != ok) log(log_level::warn, "unpinning %zu bytes of host memory: %s", bytes_, last_error());
  ::munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
}

pinned_chunk::~pinned_chunk() { reset(); }

pinned_chunk::pinned_chunk(pinned_chunk&& o) noexcept
    : be_(o.be_), base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

pinned_chunk& pinned_chunk::operator=(pinned_chunk&& o) noexcept {
  if (this != &o) {
    reset();
    be_ = o.be_;
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

}  // namespace vramswap::detail
