#include "core/pinned_chunk.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/log.hpp"
#include "core/status.hpp"

// The C library may predate the kernel's flag (Linux 5.14); the kernel's number is fixed.
// Kernels that lack it answer EINVAL, which fault_in_writable handles.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace vramswap::detail {

int fault_in_writable(void* base, size_t bytes, populate_fallback fallback) noexcept {
  if (::madvise(base, bytes, MADV_POPULATE_WRITE) == 0) return 0;
  if (errno != EINVAL) return errno;
  if (fallback == populate_fallback::touch) {
    for (size_t off = 0; off < bytes; off += 4096) static_cast<volatile char*>(base)[off] = 0;
  }
  return 0;
}

int pinned_chunk::pin(backend& be, void* p, size_t bytes, populate_fallback fallback, const char* what, pinned_chunk* out) noexcept {
  ::madvise(p, bytes, MADV_HUGEPAGE);  // best effort: fewer pages to fault in and to pin
  if (const int e = fault_in_writable(p, bytes, fallback); e != 0) {
    ::munmap(p, bytes);
    return fail(err_out_of_memory, "%s: cannot fault in %zu bytes of host memory (%s); free host memory or use less", what, bytes,
                std::strerror(e));
  }
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

int pinned_chunk::make_anonymous(backend& be, size_t bytes, const char* what, pinned_chunk* out) noexcept {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return fail_errno(errno, "%s: cannot map %zu more bytes of host memory", what, bytes);
  return pin(be, p, bytes, populate_fallback::touch, what, out);
}

int pinned_chunk::map_shared(backend& be, int fd, size_t bytes, const char* what, pinned_chunk* out) noexcept {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail_errno(errno, "%s: mapping %zu bytes", what, bytes);
  return pin(be, p, bytes, populate_fallback::leave_to_pin, what, out);
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
