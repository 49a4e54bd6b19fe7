// The host backend: the cuda backend's semantics in plain Linux, so that every pager, lock
// and pool path runs (and is tested) on machines without a GPU.
//
//   CUDA                                  host emulation
//   device memory (cuMemCreate)           a memfd of the frame's size
//   shareable handle (POSIX fd)           a dup of the memfd; passes between processes the same way
//   cuMemAddressReserve                   mmap(PROT_NONE, MAP_NORESERVE), trimmed to the alignment
//   cuMemMap                              mmap(MAP_FIXED | MAP_SHARED) of the memfd, PROT_NONE
//   cuMemSetAccess                        mprotect(PROT_READ[|PROT_WRITE])
//   cuMemUnmap                            mmap(MAP_FIXED, PROT_NONE, anonymous): back to reserved
//   streams, events, async copies         worker threads running memcpy in order (host_stream)
//   pinned host memory                    pre-faulted anonymous memory (MAP_POPULATE)
//
// Each emulated device has VRAMSWAP_HOST_DEVICE_MEMORY bytes; frames created by this
// process count against it (memory of frames imported from another process counts in the
// process that created them, as the creating process's frames do on a GPU). The device
// "UUID" is "host-N". The granularity is 2 MiB, as on current NVIDIA GPUs, so that sizes
// that work here work there.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "core/backend_impls.hpp"
#include "core/host/host_stream.hpp"
#include "core/options.hpp"
#include "core/status.hpp"

namespace vramswap::detail {
namespace {

constexpr size_t k_host_granularity = 2ull << 20;

class host_backend final : public backend {
 public:
  host_backend(int devices, uint64_t device_memory)
      : backend(backend_kind::host), device_memory_(device_memory), used_(static_cast<size_t>(devices)) {}

  ~host_backend() override {
    // Streams first: their workers may still be copying into memory released below.
    streams_.clear();
    for (auto& [id, f] : frames_) ::close(f.fd);
  }

 private:
  struct frame {
    int fd;
    int device;
    size_t size;
    bool imported;  // does not count against this process's device memory
    bool host = false;  // a host frame (create_host_frame): no device memory either
  };

  int do_device_count(int* count) override {
    *count = static_cast<int>(used_.size());
    return ok;
  }

  int do_device_info(int device, device_info* out) override {
    out->ordinal = device;
    out->name = "vramswap host device " + std::to_string(device);
    out->uuid = "host-" + std::to_string(device);
    out->total_bytes = device_memory_;
    out->free_bytes = device_memory_ - used_[static_cast<size_t>(device)].load();
    out->granularity = k_host_granularity;
    return ok;
  }

  int do_reserve(int, size_t size, size_t alignment, device_ptr* out) override {
    const size_t span = size + alignment;
    void* p = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return fail_errno(errno, "reserve: mmap(PROT_NONE, %zu bytes)", span);
    const auto base = reinterpret_cast<uintptr_t>(p);
    const uintptr_t aligned = (base + alignment - 1) & ~(uintptr_t{alignment} - 1);
    // Give back the slack on both sides so that the reservation is exactly [aligned, +size).
    if (aligned > base) ::munmap(p, aligned - base);
    if (base + span > aligned + size) ::munmap(reinterpret_cast<void*>(aligned + size), base + span - aligned - size);
    *out = aligned;
    return ok;
  }

  int do_unreserve(int, device_ptr va, size_t size) override {
    if (::munmap(reinterpret_cast<void*>(va), size) != 0) return fail_errno(errno, "unreserve: munmap(0x%" PRIxPTR ", %zu)", va, size);
    return ok;
  }

  int do_create_frame(int device, size_t size, frame_id* out) override {
    auto& used = used_[static_cast<size_t>(device)];
    size_t before = used.load();
    do {
      if (size > device_memory_ - before) {
        return fail(err_out_of_memory,
                    "create_frame: host device %d has %zu of %" PRIu64 " bytes free, %zu asked (VRAMSWAP_HOST_DEVICE_MEMORY sets its size)",
                    device, static_cast<size_t>(device_memory_ - before), device_memory_, size);
      }
    } while (!used.compare_exchange_weak(before, before + size));
    const int fd = ::memfd_create("vramswap-frame", MFD_CLOEXEC);
    if (fd < 0) {
      used -= size;
      return fail_errno(errno, "create_frame: memfd_create for a %zu-byte frame on host device %d", size, device);
    }
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      const int e = errno;
      ::close(fd);
      used -= size;
      return fail_errno(e, "create_frame: ftruncate(memfd, %zu) on host device %d", size, device);
    }
    *out = add_frame(frame{fd, device, size, false});
    return ok;
  }

  // On this backend device memory is emulated by host memory, so a host frame is the same
  // memfd; it differs in not counting against the device's memory.
  int do_create_host_frame(int device, size_t size, frame_id* out) override {
    const int fd = ::memfd_create("vramswap-host-frame", MFD_CLOEXEC);
    if (fd < 0) return fail_errno(errno, "create_host_frame: memfd_create for a %zu-byte frame of host device %d", size, device);
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      const int e = errno;
      ::close(fd);
      return fail_errno(e, "create_host_frame: ftruncate(memfd, %zu) for host device %d", size, device);
    }
    *out = add_frame(frame{fd, device, size, false, true});
    return ok;
  }

  int do_export_frame(frame_id id, int* fd_out) override {
    const int fd = ::fcntl(lookup(id).fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return fail_errno(errno, "export_frame: dup of frame %" PRIu64 "'s memfd", id);
    *fd_out = fd;
    return ok;
  }

  int do_import_frame(int device, int fd, size_t size, frame_id* out) override {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return fail_errno(errno, "import_frame: descriptor %d", fd);
    if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != size) {
      return fail(err_invalid_argument,
                  "import_frame: descriptor %d is not a %zu-byte host-backend frame (a %s of %lld bytes); was it exported by "
                  "export_frame() of the host backend?",
                  fd, size, S_ISREG(st.st_mode) ? "file" : "non-file", static_cast<long long>(st.st_size));
    }
    const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) return fail_errno(errno, "import_frame: dup of descriptor %d", fd);
    *out = add_frame(frame{own, device, size, true});
    return ok;
  }

  int do_release_frame(frame_id id) override {
    frame f{};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = frames_.find(id);
      f = it->second;
      frames_.erase(it);
    }
    ::close(f.fd);
    if (!f.imported && !f.host) used_[static_cast<size_t>(f.device)] -= f.size;
    return ok;
  }

  int do_map(int, device_ptr va, size_t size, frame_id id, size_t offset) override {
    void* want = reinterpret_cast<void*>(va);
    void* p = ::mmap(want, size, PROT_NONE, MAP_SHARED | MAP_FIXED, lookup(id).fd, static_cast<off_t>(offset));
    if (p == MAP_FAILED) return fail_errno(errno, "map: mmap(0x%" PRIxPTR ", %zu) of frame %" PRIu64 "", va, size, id);
    return ok;
  }

  int do_unmap(int, device_ptr va, size_t size) override {
    // Replace the mapping by a fresh PROT_NONE one: the range stays reserved, as in CUDA.
    void* p = ::mmap(reinterpret_cast<void*>(va), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return fail_errno(errno, "unmap: mmap(PROT_NONE) over 0x%" PRIxPTR " + %zu", va, size);
    return ok;
  }

  int do_set_access(int, device_ptr va, size_t size, access_flags flags) override {
    const int prot = flags == access_flags::read_write ? PROT_READ | PROT_WRITE : PROT_READ;
    if (::mprotect(reinterpret_cast<void*>(va), size, prot) != 0) {
      return fail_errno(errno, "set_access: mprotect(0x%" PRIxPTR ", %zu)", va, size);
    }
    return ok;
  }

  int do_host_alloc(size_t size, void** out) override {
    // Pre-faulted so that copies never take page faults, as with pinned memory.
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return fail_errno(errno, "host_alloc: mmap(%zu bytes)", size);
    *out = p;
    return ok;
  }

  int do_host_free(void* ptr, size_t size) override {
    if (::munmap(ptr, size) != 0) return fail_errno(errno, "host_free: munmap(%p, %zu)", ptr, size);
    return ok;
  }

  // Registration only changes what counts as pinned (the base's bookkeeping): memcpy does
  // not care, and the pager's "never copy from pageable memory" rule is enforced there.
  int do_host_register(void*, size_t) override { return ok; }
  int do_host_unregister(void*, size_t) override { return ok; }

  int do_stream_create(int device, stream_id* out) override {
    auto s = std::make_shared<host::host_stream>(device);
    std::lock_guard<std::mutex> lock(mutex_);
    const stream_id id = next_id_++;
    streams_.emplace(id, std::move(s));
    *out = id;
    return ok;
  }

  int do_stream_destroy(stream_id id) override {
    std::shared_ptr<host::host_stream> s;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = streams_.find(id);
      s = std::move(it->second);
      streams_.erase(it);
    }
    s->synchronize();
    return ok;  // the worker stops when the last reference goes
  }

  int do_stream_synchronize(stream_id id) override {
    stream(id)->synchronize();
    return ok;
  }

  int do_copy_d2h(int, void* dst, device_ptr src, size_t size, stream_id id) override {
    stream(id)->submit([dst, src, size] { std::memcpy(dst, reinterpret_cast<const void*>(src), size); });
    return ok;
  }

  int do_copy_h2d(int, device_ptr dst, const void* src, size_t size, stream_id id) override {
    stream(id)->submit([dst, src, size] { std::memcpy(reinterpret_cast<void*>(dst), src, size); });
    return ok;
  }

  int do_copy_d2d(int, device_ptr dst, device_ptr src, size_t size, stream_id id) override {
    stream(id)->submit([dst, src, size] { std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), size); });
    return ok;
  }

  int do_memset_d8(int, device_ptr dst, uint8_t value, size_t size, stream_id id) override {
    stream(id)->submit([dst, value, size] { std::memset(reinterpret_cast<void*>(dst), value, size); });
    return ok;
  }

  int do_event_create(int, event_id* out) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const event_id id = next_id_++;
    events_.emplace(id, std::make_shared<host::host_event>());
    *out = id;
    return ok;
  }

  int do_event_destroy(event_id id) override {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.erase(id);  // operations already submitted keep the event alive
    return ok;
  }

  int do_event_record(event_id id, stream_id sid) override {
    auto ev = event(id);
    const uint64_t point = ev->next_point();
    stream(sid)->submit([ev, point] { ev->complete(point); });
    return ok;
  }

  int do_event_synchronize(event_id id) override {
    auto ev = event(id);
    ev->wait(ev->last_point());
    return ok;
  }

  int do_event_query(event_id id, bool* complete) override {
    auto ev = event(id);
    *complete = ev->reached(ev->last_point());
    return ok;
  }

  int do_stream_wait_event(stream_id sid, event_id id) override {
    auto ev = event(id);
    const uint64_t point = ev->last_point();
    stream(sid)->submit([ev, point] { ev->wait(point); });
    return ok;
  }

  int do_device_synchronize(int device) override {
    std::vector<std::shared_ptr<host::host_stream>> mine;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [id, s] : streams_) {
        if (s->device() == device) mine.push_back(s);
      }
    }
    for (auto& s : mine) s->synchronize();
    return ok;
  }

  int do_app_stream_capturing(int, uintptr_t, bool* capturing) override {
    *capturing = false;  // no CUDA graphs here
    return ok;
  }

  // --- tables ----------------------------------------------------------------------------
  frame_id add_frame(const frame& f) {
    std::lock_guard<std::mutex> lock(mutex_);
    const frame_id id = next_id_++;
    frames_.emplace(id, f);
    return id;
  }
  frame lookup(frame_id id) {
    std::lock_guard<std::mutex> lock(mutex_);
    return frames_.at(id);  // the base validated the id
  }
  std::shared_ptr<host::host_stream> stream(stream_id id) {
    std::lock_guard<std::mutex> lock(mutex_);
    return streams_.at(id);
  }
  std::shared_ptr<host::host_event> event(event_id id) {
    std::lock_guard<std::mutex> lock(mutex_);
    return events_.at(id);
  }

  const uint64_t device_memory_;
  std::vector<std::atomic<size_t>> used_;  // bytes of frames created here, per device
  std::mutex mutex_;
  uint64_t next_id_ = 1;
  std::unordered_map<frame_id, frame> frames_;
  std::unordered_map<stream_id, std::shared_ptr<host::host_stream>> streams_;
  std::unordered_map<event_id, std::shared_ptr<host::host_event>> events_;
};

}  // namespace

int make_host_backend(std::unique_ptr<backend>* out) {
  uint64_t devices = 0;
  uint64_t memory = 0;
  VS_TRY(option_uint(option_id::host_devices, &devices));
  VS_TRY(option_size(option_id::host_device_memory, &memory));
  if (memory < k_host_granularity || memory % k_host_granularity != 0) {
    return fail(err_invalid_argument, "VRAMSWAP_HOST_DEVICE_MEMORY: %" PRIu64 " bytes is not a positive multiple of 2 MiB", memory);
  }
  *out = std::make_unique<host_backend>(static_cast<int>(devices), memory);
  return ok;
}

}  // namespace vramswap::detail
