// The backend interface: everything the pager needs from a GPU, and nothing more.
//
// Two implementations share it (the mimalloc `prim` idea):
//   cuda  the CUDA driver's virtual memory API, loaded at run time (core/cuda/)
//   host  the same semantics in plain Linux, for machines without a GPU (core/host/)
//
// Shape (RMM's): every public entry point is non-virtual. It validates the arguments
// against bookkeeping kept here, identically for both backends (reservations, mappings,
// frames, pinned host ranges), then calls a private virtual do_*() that does the work.
// So both backends give the same error, with the same words, for the same misuse, and a
// rejected call never reaches the driver or changes any state.
//
// Terms (see docs/architecture.md):
//   reservation  a range of virtual addresses on one device, backed by nothing yet
//   frame        a physical allocation of device memory; exportable as a file descriptor
//   mapping      a frame (or a part of it) mapped at an address inside a reservation;
//                it is inaccessible until set_access() grants access
//   stream       an ordered queue of asynchronous copies; events mark points in it
//
// Every function returns 0 (vramswap::detail::ok) or a negative vramswap::detail::status, and on failure
// records a detail for last_error() that names the call, its arguments and, for the cuda
// backend, the CUDA error. Functions are thread-safe unless stated otherwise.
//
// Fork: a backend must not be used in a child created by fork() after it was made
// (CUDA forbids it, and the host backend's worker threads do not survive fork). Start
// helper processes with posix_spawn/exec and hand them frames as descriptors.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <unordered_map>

namespace vramswap::detail {

enum class backend_kind { host, cuda };
const char* backend_kind_name(backend_kind kind) noexcept;
// For GoogleTest's parameter printing and for logs.
inline void PrintTo(backend_kind kind, std::ostream* os) { *os << backend_kind_name(kind); }

// Opaque handles; 0 is never a valid handle.
using frame_id = uint64_t;
using stream_id = uint64_t;
using event_id = uint64_t;

// Device virtual address. On the host backend it is also a host address.
using device_ptr = uintptr_t;

struct device_info {
  int ordinal = -1;
  std::string name;          // the driver's name for the device, or "vramswap host device 0"
  std::string uuid;          // "GPU-8a3f..." (cuda) or "host-0" (host): stable per device
  uint64_t total_bytes = 0;  // device memory
  uint64_t free_bytes = 0;   // as the driver reports it now
  uint64_t granularity = 0;  // allocation/mapping granularity (2 MiB on current NVIDIA GPUs)
};

enum class access_flags { read = 1, read_write = 3 };

// Where a frame's memory is: on the device, or in host memory that the device reaches over
// its link (oversubscription puts what does not fit the pool there, at the same addresses).
enum class frame_location { device, host };

class backend {
 public:
  virtual ~backend();
  backend(const backend&) = delete;
  backend& operator=(const backend&) = delete;
  backend(backend&&) = delete;
  backend& operator=(backend&&) = delete;

  backend_kind kind() const noexcept { return kind_; }
  const char* name() const noexcept { return backend_kind_name(kind_); }

  // --- devices --------------------------------------------------------------------------
  int device_count(int* count);
  int get_device_info(int device, device_info* out);

  // --- virtual address space ------------------------------------------------------------
  // Reserve `size` bytes (a multiple of the granularity) aligned to `alignment` (0: the
  // granularity; else a power of two multiple of it). Nothing is mapped.
  int reserve(int device, size_t size, size_t alignment, device_ptr* out);
  // Free a whole reservation made by reserve(); nothing may be mapped inside it.
  int unreserve(device_ptr va, size_t size);

  // --- frames ---------------------------------------------------------------------------
  // Create a frame of `size` bytes (a multiple of the granularity) on `device`. Frames are
  // always exportable. Contents are undefined until written.
  int create_frame(int device, size_t size, frame_id* out);
  // Create a frame of `size` bytes (a multiple of the device's granularity) in host memory
  // (the host NUMA node nearest `device`), to be mapped into `device`'s reservations like any
  // frame: kernels and copies on the device reach it over the link (PCIe), at a fraction of
  // device memory's speed. It does not use device memory. Process-local: never exportable.
  int create_host_frame(int device, size_t size, frame_id* out);
  int frame_location_of(frame_id frame, frame_location* out);
  // A new descriptor for the frame; the caller owns it (close it when done). Frames this
  // process created only: a host frame, or one it imported, is err_invalid_argument (the
  // CUDA driver does not export an imported allocation; pass on the descriptor instead).
  int export_frame(frame_id frame, int* fd_out);
  // Import a frame exported by this or another process. `size` must be the frame's size.
  // The descriptor stays the caller's: close it after import if no longer needed.
  int import_frame(int device, int fd, size_t size, frame_id* out);
  // Drop this process's reference; the memory is freed when no process references it.
  // The frame must not be mapped.
  int release_frame(frame_id frame);
  int frame_size(frame_id frame, size_t* out);

  // --- mappings -------------------------------------------------------------------------
  // Map the whole of `frame` at `va`: `offset` must be 0 and `size` the frame's size (CUDA's
  // cuMemMap supports nothing else today; the parameters are there for when it does). `va`
  // must be a multiple of the granularity and [va, va+size) must lie inside one reservation
  // of the frame's device and overlap no mapping. The new mapping is inaccessible until
  // set_access().
  int map(device_ptr va, size_t size, frame_id frame, size_t offset);
  // Unmap [va, va+size), which must be exactly a run of whole mappings.
  int unmap(device_ptr va, size_t size);
  // Grant access to [va, va+size), which must be entirely mapped, by one mapping or by
  // several side by side (one driver call for all: cuMemSetAccess takes a range covering
  // several mappings).
  int set_access(device_ptr va, size_t size, access_flags flags);

  // --- pinned host memory ---------------------------------------------------------------
  // Copies only ever use pinned memory (pageable copies run at a fraction of the link's
  // rate): a host buffer given to copy_* must come from host_alloc or host_register.
  int host_alloc(size_t size, void** out);
  int host_free(void* ptr);
  int host_register(void* ptr, size_t size);
  int host_unregister(void* ptr);
  bool is_pinned(const void* ptr, size_t size);

  // --- streams, copies, events ----------------------------------------------------------
  int stream_create(int device, stream_id* out);
  int stream_destroy(stream_id stream);  // waits for the stream's work first
  int stream_synchronize(stream_id stream);
  // Asynchronous copies; ordered with everything else on `stream`. The device range must
  // be mapped and accessible (read for d2h, read_write for h2d and memset).
  int copy_d2h(void* dst, device_ptr src, size_t size, stream_id stream);
  int copy_h2d(device_ptr dst, const void* src, size_t size, stream_id stream);
  int memset_d8(device_ptr dst, uint8_t value, size_t size, stream_id stream);
  // Device to device, both ranges in reservations of the stream's device (either may be
  // backed by a host frame: oversubscription moves pages between the two kinds this way).
  // The ranges must not overlap.
  int copy_d2d(device_ptr dst, device_ptr src, size_t size, stream_id stream);

  int event_create(int device, event_id* out);
  int event_destroy(event_id event);
  int event_record(event_id event, stream_id stream);
  // Until `event`'s last recorded point completes; returns at once if never recorded.
  int event_synchronize(event_id event);
  int event_query(event_id event, bool* complete);
  // Later work on `stream` waits for `event`'s last recorded point.
  int stream_wait_event(stream_id stream, event_id event);
  // All work on the device issued by this process.
  int device_synchronize(int device);
  // Whether `app_stream`, a stream of the application's own (a CUstream / cudaStream_t as a
  // number; 0 is the legacy default stream), is being captured into a CUDA graph: memory
  // handed out for such a stream belongs to the graph. The host backend has no application
  // streams: never.
  int app_stream_capturing(int device, uintptr_t app_stream, bool* capturing);

 protected:
  explicit backend(backend_kind kind) : kind_(kind) {}

  // What the caller left behind, from the base's books (the one record of what exists), for
  // an implementation's destructor to undo. Destructors only: the derived destructor runs
  // before this class's, so the books are still whole, and no other thread may use the
  // backend by then. Each visits under mutex_, so `visit` must not call back into the base.
  template <class Visit>  // visit(device_ptr va, size_t size, int device)
  void visit_mappings(Visit&& visit);
  template <class Visit>  // visit(device_ptr va, size_t size, int device)
  void visit_reservations(Visit&& visit);
  template <class Visit>  // visit(void* ptr, size_t size, bool allocated): host_alloc'd, else registered
  void visit_pinned(Visit&& visit);

 private:
  // --- the work, per implementation. Arguments are already validated. ------------------
  virtual int do_device_count(int* count) = 0;
  virtual int do_device_info(int device, device_info* out) = 0;
  virtual int do_reserve(int device, size_t size, size_t alignment, device_ptr* out) = 0;
  virtual int do_unreserve(int device, device_ptr va, size_t size) = 0;
  virtual int do_create_frame(int device, size_t size, frame_id* out) = 0;
  virtual int do_create_host_frame(int device, size_t size, frame_id* out) = 0;
  virtual int do_export_frame(frame_id frame, int* fd_out) = 0;
  virtual int do_import_frame(int device, int fd, size_t size, frame_id* out) = 0;
  virtual int do_release_frame(frame_id frame) = 0;
  virtual int do_map(int device, device_ptr va, size_t size, frame_id frame, size_t offset) = 0;
  // Exactly one whole mapping: unmap() takes a run of them one at a time (CUDA's cuMemUnmap
  // is documented for whole mappings only), so both backends fail alike part way through.
  virtual int do_unmap(int device, device_ptr va, size_t size) = 0;
  virtual int do_set_access(int device, device_ptr va, size_t size, access_flags flags) = 0;
  virtual int do_host_alloc(size_t size, void** out) = 0;
  virtual int do_host_free(void* ptr, size_t size) = 0;
  virtual int do_host_register(void* ptr, size_t size) = 0;
  virtual int do_host_unregister(void* ptr, size_t size) = 0;
  virtual int do_stream_create(int device, stream_id* out) = 0;
  virtual int do_stream_destroy(stream_id stream) = 0;
  virtual int do_stream_synchronize(stream_id stream) = 0;
  virtual int do_copy_d2h(int device, void* dst, device_ptr src, size_t size, stream_id stream) = 0;
  virtual int do_copy_h2d(int device, device_ptr dst, const void* src, size_t size, stream_id stream) = 0;
  virtual int do_memset_d8(int device, device_ptr dst, uint8_t value, size_t size, stream_id stream) = 0;
  virtual int do_copy_d2d(int device, device_ptr dst, device_ptr src, size_t size, stream_id stream) = 0;
  virtual int do_event_create(int device, event_id* out) = 0;
  virtual int do_event_destroy(event_id event) = 0;
  virtual int do_event_record(event_id event, stream_id stream) = 0;
  virtual int do_event_synchronize(event_id event) = 0;
  virtual int do_event_query(event_id event, bool* complete) = 0;
  virtual int do_stream_wait_event(stream_id stream, event_id event) = 0;
  virtual int do_device_synchronize(int device) = 0;
  virtual int do_app_stream_capturing(int device, uintptr_t app_stream, bool* capturing) = 0;

  // --- bookkeeping shared by both implementations (guarded by mutex_) -------------------
  struct reservation_rec {
    size_t size;
    int device;
  };
  struct mapping_rec {
    size_t size;
    frame_id frame;
    int access;  // 0 (none) or an access_flags value
  };
  struct frame_rec {
    int device;
    size_t size;
    int mappings;  // how many mappings reference it
    frame_location location = frame_location::device;
    bool imported = false;  // import_frame's: not exportable again (CUDA refuses it)
  };
  struct pinned_rec {
    size_t size;
    bool allocated;  // host_alloc'd (vs registered)
  };

  int check_device(const char* fn, int device);
  int granularity_of(const char* fn, int device, size_t* out);
  // The reservation holding all of [va, va+size); err_not_mapped naming the range if none.
  int find_reservation(const char* fn, device_ptr va, size_t size, int* device);
  // [va, va+size) is fully covered by mappings with at least `need` access.
  int check_mapped(const char* fn, device_ptr va, size_t size, int need);
  int check_pinned(const char* fn, const void* ptr, size_t size);
  int check_stream(const char* fn, stream_id stream, int* device);
  int check_event(const char* fn, event_id event);
  // create_frame / create_host_frame: the checks, the implementation's work, the record.
  int create_frame_in(const char* fn, frame_location where, int device, size_t size, frame_id* out);

  const backend_kind kind_;
  std::mutex mutex_;
  // Cached on first use (written under mutex_); atomic so that app_stream_capturing, asked
  // on every stream-ordered allocation and free, checks the device without the mutex.
  std::atomic<int> device_count_{-1};
  std::unordered_map<int, size_t> granularity_;  // per device, cached
  std::map<device_ptr, reservation_rec> reservations_;
  std::map<device_ptr, mapping_rec> mappings_;
  std::unordered_map<frame_id, frame_rec> frames_;
  std::map<uintptr_t, pinned_rec> pinned_;
  std::unordered_map<stream_id, int> streams_;  // stream -> device
  std::unordered_map<event_id, int> events_;    // event -> device
};

template <class Visit>
void backend::visit_mappings(Visit&& visit) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [va, m] : mappings_) {
    const auto f = frames_.find(m.frame);  // map() recorded the frame; release_frame() refuses while mapped
    if (f != frames_.end()) visit(va, m.size, f->second.device);
  }
}

template <class Visit>
void backend::visit_reservations(Visit&& visit) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [va, r] : reservations_) visit(va, r.size, r.device);
}

template <class Visit>
void backend::visit_pinned(Visit&& visit) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [p, rec] : pinned_) visit(reinterpret_cast<void*>(p), rec.size, rec.allocated);
}

// Make a backend of the given kind. err_unavailable (with the reason: no libcuda, no GPU,
// built without cuda.h, ...) when it cannot work on this machine.
int make_backend(backend_kind kind, std::unique_ptr<backend>* out);

// What VRAMSWAP_BACKEND=`text` selects, made anew (default_backend() caches this).
int select_backend(const std::string& text, std::unique_ptr<backend>* out);

// The process-wide backend chosen by VRAMSWAP_BACKEND (host | cuda | auto): made on the
// first call, the choice said once in the log. A malformed value, or an explicit `cuda`
// that cannot work here, is an error every time it is asked for.
int default_backend(backend** out);

}  // namespace vramswap::detail
