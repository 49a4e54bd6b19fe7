// The checked entry points of `backend`: validation against shared bookkeeping, then the
// implementation's do_*(). Bookkeeping is updated only after do_*() succeeded, so a failed
// call leaves it exactly as it was.
#include "core/backend.hpp"

#include <cinttypes>
#include <iterator>

#include "core/status.hpp"

namespace vramswap::detail {

const char* backend_kind_name(backend_kind kind) noexcept {
  switch (kind) {
    case backend_kind::host: return "host";
    case backend_kind::cuda: return "cuda";
  }
  return "?";
}

backend::~backend() = default;

namespace {
bool is_multiple(uint64_t value, uint64_t of) { return of != 0 && value % of == 0; }
bool overflows(uintptr_t a, size_t n) { return a + n < a; }
}  // namespace

// --- helpers (mutex_ held by the caller) -------------------------------------------------

int backend::check_device(const char* fn, int device) {
  if (device_count_.load() < 0) {
    int n = 0;
    VS_TRY(do_device_count(&n));
    device_count_.store(n);
  }
  const int count = device_count_.load();
  if (device < 0 || device >= count) {
    return fail(err_invalid_argument, "%s: device %d does not exist (the %s backend has %d device%s)", fn, device, name(),
                count, count == 1 ? "" : "s");
  }
  return ok;
}

int backend::granularity_of(const char* fn, int device, size_t* out) {
  VS_TRY(check_device(fn, device));
  auto it = granularity_.find(device);
  if (it == granularity_.end()) {
    device_info info;
    VS_TRY(do_device_info(device, &info));
    it = granularity_.emplace(device, info.granularity).first;
  }
  *out = it->second;
  return ok;
}

int backend::find_reservation(const char* fn, device_ptr va, size_t size, int* device) {
  auto it = reservations_.upper_bound(va);
  if (it != reservations_.begin()) {
    --it;
    if (va >= it->first && va + size <= it->first + it->second.size) {
      *device = it->second.device;
      return ok;
    }
  }
  return fail(err_not_mapped, "%s: [0x%" PRIxPTR ", 0x%" PRIxPTR ") is not inside any reservation; reserve() it first", fn, va,
              va + size);
}

int backend::check_mapped(const char* fn, device_ptr va, size_t size, int need) {
  // Walk the mappings from the one covering `va` and demand contiguity up to va+size.
  device_ptr cursor = va;
  const device_ptr end = va + size;
  auto it = mappings_.upper_bound(va);
  if (it != mappings_.begin()) --it;
  for (; cursor < end; ++it) {
    if (it == mappings_.end() || it->first > cursor || it->first + it->second.size <= cursor) {
      return fail(err_not_mapped, "%s: [0x%" PRIxPTR ", 0x%" PRIxPTR ") is not mapped at 0x%" PRIxPTR "; map() a frame there first",
                  fn, va, end, cursor);
    }
    if ((it->second.access & need) != need) {
      return fail(err_not_mapped, "%s: mapping at 0x%" PRIxPTR " has no %s access; call set_access() first", fn, it->first,
                  need == static_cast<int>(access_flags::read_write) ? "read-write" : "read");
    }
    cursor = it->first + it->second.size;
  }
  return ok;
}

int backend::check_pinned(const char* fn, const void* ptr, size_t size) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  auto it = pinned_.upper_bound(p);
  if (it != pinned_.begin()) {
    --it;
    if (p >= it->first && p + size <= it->first + it->second.size) return ok;
  }
  return fail(err_invalid_argument,
              "%s: host buffer %p (+%zu bytes) is not pinned; use memory from host_alloc() or host_register() (copies from "
              "pageable memory run at a fraction of the link's rate)",
              fn, ptr, size);
}

int backend::check_stream(const char* fn, stream_id stream, int* device) {
  auto it = streams_.find(stream);
  if (it == streams_.end()) return fail(err_invalid_argument, "%s: stream %" PRIu64 " does not exist (destroyed, or never created)", fn, stream);
  if (device != nullptr) *device = it->second;
  return ok;
}

int backend::check_event(const char* fn, event_id event) {
  if (events_.count(event) == 0) return fail(err_invalid_argument, "%s: event %" PRIu64 " does not exist (destroyed, or never created)", fn, event);
  return ok;
}

// --- devices -----------------------------------------------------------------------------

int backend::device_count(int* count) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (device_count_.load() < 0) {
    int n = 0;
    VS_TRY(do_device_count(&n));
    device_count_.store(n);
  }
  *count = device_count_.load();
  return ok;
}

int backend::get_device_info(int device, device_info* out) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    VS_TRY(check_device("get_device_info", device));
  }
  // Not under mutex_: asking the driver for free memory can take a while.
  return do_device_info(device, out);
}

// --- virtual address space ---------------------------------------------------------------

int backend::reserve(int device, size_t size, size_t alignment, device_ptr* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t gran = 0;
  VS_TRY(granularity_of("reserve", device, &gran));
  if (size == 0 || !is_multiple(size, gran)) {
    return fail(err_invalid_argument, "reserve: size %zu is not a positive multiple of device %d's granularity %zu", size, device, gran);
  }
  if (alignment == 0) alignment = gran;
  if (!is_multiple(alignment, gran) || (alignment & (alignment - 1)) != 0) {
    return fail(err_invalid_argument, "reserve: alignment %zu is not a power-of-two multiple of the granularity %zu", alignment, gran);
  }
  device_ptr va = 0;
  VS_TRY(do_reserve(device, size, alignment, &va));
  reservations_.emplace(va, reservation_rec{size, device});
  *out = va;
  return ok;
}

int backend::unreserve(device_ptr va, size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = reservations_.find(va);
  if (it == reservations_.end() || it->second.size != size) {
    return fail(err_invalid_argument, "unreserve: [0x%" PRIxPTR ", +%zu) is not a reservation made by reserve() (pass its exact start and size)",
                va, size);
  }
  auto m = mappings_.lower_bound(va);
  if (m != mappings_.end() && m->first < va + size) {
    return fail(err_busy, "unreserve: reservation 0x%" PRIxPTR " still has a mapping at 0x%" PRIxPTR "; unmap() it first", va, m->first);
  }
  VS_TRY(do_unreserve(it->second.device, va, size));
  reservations_.erase(it);
  return ok;
}

// --- frames ------------------------------------------------------------------------------

int backend::create_frame(int device, size_t size, frame_id* out) {
  return create_frame_in("create_frame", frame_location::device, device, size, out);
}

int backend::create_host_frame(int device, size_t size, frame_id* out) {
  return create_frame_in("create_host_frame", frame_location::host, device, size, out);
}

int backend::create_frame_in(const char* fn, frame_location where, int device, size_t size, frame_id* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t gran = 0;
  VS_TRY(granularity_of(fn, device, &gran));
  if (size == 0 || !is_multiple(size, gran)) {
    return fail(err_invalid_argument, "%s: size %zu is not a positive multiple of device %d's granularity %zu", fn, size, device, gran);
  }
  frame_id id = 0;
  VS_TRY(where == frame_location::host ? do_create_host_frame(device, size, &id) : do_create_frame(device, size, &id));
  frames_.emplace(id, frame_rec{device, size, 0, where});
  *out = id;
  return ok;
}

int backend::frame_location_of(frame_id frame, frame_location* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = frames_.find(frame);
  if (it == frames_.end()) return fail(err_invalid_argument, "frame_location_of: frame %" PRIu64 " does not exist", frame);
  *out = it->second.location;
  return ok;
}

int backend::export_frame(frame_id frame, int* fd_out) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = frames_.find(frame);
  if (it == frames_.end()) return fail(err_invalid_argument, "export_frame: frame %" PRIu64 " does not exist", frame);
  if (it->second.location == frame_location::host) {
    return fail(err_invalid_argument, "export_frame: frame %" PRIu64 " is in host memory (create_host_frame); host frames are "
                "process-local and cannot be exported", frame);
  }
  // The CUDA driver refuses to export an allocation this process imported: the same rule on
  // every backend, so that what passes on the host backend works on a GPU.
  if (it->second.imported) {
    return fail(err_invalid_argument, "export_frame: frame %" PRIu64 " was imported from another process; an imported frame cannot be "
                "exported again: pass on the descriptor it was imported from", frame);
  }
  return do_export_frame(frame, fd_out);
}

int backend::import_frame(int device, int fd, size_t size, frame_id* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t gran = 0;
  VS_TRY(granularity_of("import_frame", device, &gran));
  if (fd < 0) return fail(err_invalid_argument, "import_frame: descriptor %d is not valid", fd);
  if (size == 0 || !is_multiple(size, gran)) {
    return fail(err_invalid_argument, "import_frame: size %zu is not a positive multiple of device %d's granularity %zu", size, device,
                gran);
  }
  frame_id id = 0;
  VS_TRY(do_import_frame(device, fd, size, &id));
  frames_.emplace(id, frame_rec{device, size, 0, frame_location::device, true});
  *out = id;
  return ok;
}

int backend::release_frame(frame_id frame) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = frames_.find(frame);
  if (it == frames_.end()) return fail(err_invalid_argument, "release_frame: frame %" PRIu64 " does not exist (released twice?)", frame);
  if (it->second.mappings > 0) {
    return fail(err_busy, "release_frame: frame %" PRIu64 " is still mapped %d time(s); unmap() it first", frame, it->second.mappings);
  }
  VS_TRY(do_release_frame(frame));
  frames_.erase(it);
  return ok;
}

int backend::frame_size(frame_id frame, size_t* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = frames_.find(frame);
  if (it == frames_.end()) return fail(err_invalid_argument, "frame_size: frame %" PRIu64 " does not exist", frame);
  *out = it->second.size;
  return ok;
}

// --- mappings ----------------------------------------------------------------------------

int backend::map(device_ptr va, size_t size, frame_id frame, size_t offset) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto f = frames_.find(frame);
  if (f == frames_.end()) return fail(err_invalid_argument, "map: frame %" PRIu64 " does not exist", frame);
  const int device = f->second.device;
  size_t gran = 0;
  VS_TRY(granularity_of("map", device, &gran));
  if (size == 0 || !is_multiple(size, gran) || !is_multiple(va, gran) || offset % gran != 0) {
    return fail(err_invalid_argument,
                "map: va 0x%" PRIxPTR ", size %zu and offset %zu must be multiples of device %d's granularity %zu (size > 0)", va, size,
                offset, device, gran);
  }
  if (offset != 0 || size != f->second.size) {
    return fail(err_invalid_argument,
                "map: bytes [%zu, %zu) are not the whole of frame %" PRIu64 " (%zu bytes); frames map whole, from offset 0", offset,
                offset + size, frame, f->second.size);
  }
  if (overflows(va, size)) return fail(err_invalid_argument, "map: va 0x%" PRIxPTR " + %zu overflows", va, size);
  int res_device = -1;
  VS_TRY(find_reservation("map", va, size, &res_device));
  if (res_device != device) {
    return fail(err_invalid_argument, "map: frame %" PRIu64 " is on device %d but 0x%" PRIxPTR " is reserved on device %d", frame, device,
                va, res_device);
  }
  auto next = mappings_.lower_bound(va);
  if (next != mappings_.end() && next->first < va + size) {
    return fail(err_already_mapped, "map: [0x%" PRIxPTR ", 0x%" PRIxPTR ") overlaps the mapping at 0x%" PRIxPTR "; unmap() it first", va,
                va + size, next->first);
  }
  if (next != mappings_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > va) {
      return fail(err_already_mapped, "map: [0x%" PRIxPTR ", 0x%" PRIxPTR ") overlaps the mapping at 0x%" PRIxPTR "; unmap() it first",
                  va, va + size, prev->first);
    }
  }
  VS_TRY(do_map(device, va, size, frame, offset));
  mappings_.emplace(va, mapping_rec{size, frame, 0});
  ++f->second.mappings;
  return ok;
}

int backend::unmap(device_ptr va, size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (size == 0 || overflows(va, size)) return fail(err_invalid_argument, "unmap: bad range 0x%" PRIxPTR " + %zu", va, size);
  int device = -1;
  VS_TRY(find_reservation("unmap", va, size, &device));
  // The range must be exactly a contiguous run of whole mappings.
  auto first = mappings_.find(va);
  if (first == mappings_.end()) {
    return fail(err_not_mapped, "unmap: no mapping starts at 0x%" PRIxPTR " (already unmapped, or not the start of a mapping)", va);
  }
  auto it = first;
  device_ptr cursor = va;
  while (cursor < va + size) {
    if (it == mappings_.end() || it->first != cursor) {
      return fail(err_not_mapped, "unmap: [0x%" PRIxPTR ", 0x%" PRIxPTR ") is not fully mapped (gap at 0x%" PRIxPTR ")", va, va + size,
                  cursor);
    }
    cursor += it->second.size;
    ++it;
  }
  if (cursor != va + size) {
    return fail(err_invalid_argument, "unmap: [0x%" PRIxPTR ", 0x%" PRIxPTR ") ends inside the mapping that ends at 0x%" PRIxPTR
                "; unmap whole mappings", va, va + size, cursor);
  }
  // One mapping at a time, each struck from the books as soon as it is gone, so that a
  // failure part way leaves them true: the mappings before it unmapped, the rest mapped.
  const size_t run = static_cast<size_t>(std::distance(first, it));
  size_t done = 0;
  for (auto m = first; m != it; ++done) {
    if (const int rc = do_unmap(device, m->first, m->second.size); rc != ok) {
      if (done > 0) {
        add_context(rc, "unmap [0x%" PRIxPTR ", 0x%" PRIxPTR "): %zu of its %zu mappings were unmapped, then ", va, va + size, done,
                    run);
      }
      return rc;
    }
    --frames_[m->second.frame].mappings;
    m = mappings_.erase(m);
  }
  return ok;
}

int backend::set_access(device_ptr va, size_t size, access_flags flags) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (size == 0 || overflows(va, size)) return fail(err_invalid_argument, "set_access: bad range 0x%" PRIxPTR " + %zu", va, size);
  if (flags != access_flags::read && flags != access_flags::read_write) {
    return fail(err_invalid_argument, "set_access: access flags %d are neither read nor read_write", static_cast<int>(flags));
  }
  int device = -1;
  VS_TRY(find_reservation("set_access", va, size, &device));
  VS_TRY(check_mapped("set_access", va, size, 0));
  VS_TRY(do_set_access(device, va, size, flags));
  for (auto it = mappings_.upper_bound(va); it != mappings_.begin();) {  // rewind to the mapping covering va
    --it;
    for (; it != mappings_.end() && it->first < va + size; ++it) it->second.access = static_cast<int>(flags);
    break;
  }
  return ok;
}

// --- pinned host memory ------------------------------------------------------------------

int backend::host_alloc(size_t size, void** out) {
  if (size == 0) return fail(err_invalid_argument, "host_alloc: size 0");
  void* p = nullptr;
  VS_TRY(do_host_alloc(size, &p));
  std::lock_guard<std::mutex> lock(mutex_);
  pinned_.emplace(reinterpret_cast<uintptr_t>(p), pinned_rec{size, true});
  *out = p;
  return ok;
}

int backend::host_free(void* ptr) {
  size_t size = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pinned_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == pinned_.end() || !it->second.allocated) {
      return fail(err_invalid_argument, "host_free: %p was not returned by host_alloc() (or was freed already)", ptr);
    }
    size = it->second.size;
    pinned_.erase(it);
  }
  return do_host_free(ptr, size);
}

int backend::host_register(void* ptr, size_t size) {
  if (ptr == nullptr || size == 0) return fail(err_invalid_argument, "host_register: empty range %p + %zu", ptr, size);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  auto next = pinned_.lower_bound(p);
  bool overlap = next != pinned_.end() && next->first < p + size;
  if (!overlap && next != pinned_.begin()) {
    auto prev = std::prev(next);
    overlap = prev->first + prev->second.size > p;
  }
  if (overlap) return fail(err_already_mapped, "host_register: %p + %zu overlaps memory that is already pinned", ptr, size);
  VS_TRY(do_host_register(ptr, size));
  pinned_.emplace(p, pinned_rec{size, false});
  return ok;
}

int backend::host_unregister(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pinned_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == pinned_.end() || it->second.allocated) {
    return fail(err_invalid_argument, "host_unregister: %p was not registered with host_register()", ptr);
  }
  VS_TRY(do_host_unregister(ptr, it->second.size));
  pinned_.erase(it);
  return ok;
}

bool backend::is_pinned(const void* ptr, size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  auto it = pinned_.upper_bound(p);
  if (it == pinned_.begin()) return false;
  --it;
  return p >= it->first && p + size <= it->first + it->second.size;
}

// --- streams, copies, events -------------------------------------------------------------

int backend::stream_create(int device, stream_id* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  VS_TRY(check_device("stream_create", device));
  stream_id s = 0;
  VS_TRY(do_stream_create(device, &s));
  streams_.emplace(s, device);
  *out = s;
  return ok;
}

int backend::stream_destroy(stream_id stream) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    VS_TRY(check_stream("stream_destroy", stream, nullptr));
    streams_.erase(stream);
  }
  return do_stream_destroy(stream);
}

int backend::stream_synchronize(stream_id stream) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    VS_TRY(check_stream("stream_synchronize", stream, nullptr));
  }
  return do_stream_synchronize(stream);
}

int backend::copy_d2h(void* dst, device_ptr src, size_t size, stream_id stream) {
  if (size == 0) return ok;
  std::lock_guard<std::mutex> lock(mutex_);
  int device = -1;
  VS_TRY(check_stream("copy_d2h", stream, &device));
  if (overflows(src, size)) return fail(err_invalid_argument, "copy_d2h: source 0x%" PRIxPTR " + %zu overflows", src, size);
  int res_device = -1;
  VS_TRY(find_reservation("copy_d2h", src, size, &res_device));
  VS_TRY(check_mapped("copy_d2h", src, size, static_cast<int>(access_flags::read)));
  VS_TRY(check_pinned("copy_d2h", dst, size));
  return do_copy_d2h(res_device, dst, src, size, stream);
}

int backend::copy_h2d(device_ptr dst, const void* src, size_t size, stream_id stream) {
  if (size == 0) return ok;
  std::lock_guard<std::mutex> lock(mutex_);
  int device = -1;
  VS_TRY(check_stream("copy_h2d", stream, &device));
  if (overflows(dst, size)) return fail(err_invalid_argument, "copy_h2d: destination 0x%" PRIxPTR " + %zu overflows", dst, size);
  int res_device = -1;
  VS_TRY(find_reservation("copy_h2d", dst, size, &res_device));
  VS_TRY(check_mapped("copy_h2d", dst, size, static_cast<int>(access_flags::read_write)));
  VS_TRY(check_pinned("copy_h2d", src, size));
  return do_copy_h2d(res_device, dst, src, size, stream);
}

int backend::memset_d8(device_ptr dst, uint8_t value, size_t size, stream_id stream) {
  if (size == 0) return ok;
  std::lock_guard<std::mutex> lock(mutex_);
  int device = -1;
  VS_TRY(check_stream("memset_d8", stream, &device));
  if (overflows(dst, size)) return fail(err_invalid_argument, "memset_d8: destination 0x%" PRIxPTR " + %zu overflows", dst, size);
  int res_device = -1;
  VS_TRY(find_reservation("memset_d8", dst, size, &res_device));
  VS_TRY(check_mapped("memset_d8", dst, size, static_cast<int>(access_flags::read_write)));
  return do_memset_d8(res_device, dst, value, size, stream);
}

int backend::copy_d2d(device_ptr dst, device_ptr src, size_t size, stream_id stream) {
  if (size == 0) return ok;
  std::lock_guard<std::mutex> lock(mutex_);
  int device = -1;
  VS_TRY(check_stream("copy_d2d", stream, &device));
  if (overflows(src, size) || overflows(dst, size)) {
    return fail(err_invalid_argument, "copy_d2d: 0x%" PRIxPTR " -> 0x%" PRIxPTR " + %zu overflows", src, dst, size);
  }
  if (src < dst + size && dst < src + size) {
    return fail(err_invalid_argument, "copy_d2d: source 0x%" PRIxPTR " and destination 0x%" PRIxPTR " (%zu bytes) overlap", src,
                dst, size);
  }
  int src_device = -1, dst_device = -1;
  VS_TRY(find_reservation("copy_d2d", src, size, &src_device));
  VS_TRY(find_reservation("copy_d2d", dst, size, &dst_device));
  if (src_device != device || dst_device != device) {
    return fail(err_invalid_argument, "copy_d2d: source (device %d) and destination (device %d) must both be on the stream's device %d",
                src_device, dst_device, device);
  }
  VS_TRY(check_mapped("copy_d2d", src, size, static_cast<int>(access_flags::read)));
  VS_TRY(check_mapped("copy_d2d", dst, size, static_cast<int>(access_flags::read_write)));
  return do_copy_d2d(device, dst, src, size, stream);
}

int backend::event_create(int device, event_id* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  VS_TRY(check_device("event_create", device));
  event_id e = 0;
  VS_TRY(do_event_create(device, &e));
  events_.emplace(e, device);
  *out = e;
  return ok;
}

int backend::event_destroy(event_id event) {
  std::lock_guard<std::mutex> lock(mutex_);
  VS_TRY(check_event("event_destroy", event));
  VS_TRY(do_event_destroy(event));
  events_.erase(event);
  return ok;
}

int backend::event_record(event_id event, stream_id stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  VS_TRY(check_event("event_record", event));
  VS_TRY(check_stream("event_record", stream, nullptr));
  return do_event_record(event, stream);
}

int backend::event_synchronize(event_id event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    VS_TRY(check_event("event_synchronize", event));
  }
  return do_event_synchronize(event);
}

int backend::event_query(event_id event, bool* complete) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    VS_TRY(check_event("event_query", event));
  }
  return do_event_query(event, complete);
}

int backend::stream_wait_event(stream_id stream, event_id event) {
  std::lock_guard<std::mutex> lock(mutex_);
  VS_TRY(check_stream("stream_wait_event", stream, nullptr));
  VS_TRY(check_event("stream_wait_event", event));
  return do_stream_wait_event(stream, event);
}

int backend::device_synchronize(int device) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    VS_TRY(check_device("device_synchronize", device));
  }
  return do_device_synchronize(device);
}

int backend::app_stream_capturing(int device, uintptr_t app_stream, bool* capturing) {
  if (capturing == nullptr) return fail(err_invalid_argument, "app_stream_capturing(device %d): capturing is null", device);
  // Asked on every stream-ordered allocation and free: a device known to exist needs no mutex.
  if (const int count = device_count_.load(std::memory_order_acquire); device < 0 || device >= count) {
    std::lock_guard<std::mutex> lock(mutex_);
    VS_TRY(check_device("app_stream_capturing", device));
  }
  *capturing = false;
  return do_app_stream_capturing(device, app_stream, capturing);
}

}  // namespace vramswap::detail
