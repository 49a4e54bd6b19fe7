// pool_server's pool: the device frames (created, scrubbed, exported once), the scrub that
// zeroes a frame before it changes owner, and the shared host pool's memfd.
#include "server/pool_server.hpp"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/options.hpp"
#include "core/pinned_chunk.hpp"
#include "core/status.hpp"
#include "pool/pool_segment.hpp"
#include "server/cgroup_memory.hpp"
#include "server/human_size.hpp"

namespace vramswap::detail {
using namespace pool_layout;
namespace {

constexpr size_t k_scrub_batch = 16;      // frames mapped at once while scrubbing

// MemAvailable from /proc/meminfo (bytes); 0 when it cannot be read.
uint64_t available_ram() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace

int pool_server::build_pool(uint64_t pool_bytes) noexcept {
  const size_t count = static_cast<size_t>(pool_bytes / frame_size_);
  // Every frame's descriptor stays open (the host backend keeps one more per frame).
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < 2 * count + 256) {
    return fail(err_system,
                "vramswapd: %zu frames need about %zu descriptors, the limit is %llu (ulimit -n; raise the hard limit or use "
                "larger frames, VRAMSWAP_FRAME_SIZE)",
                count, 2 * count + 256, static_cast<unsigned long long>(lim.rlim_cur));
  }
  frames_.reserve(count);
  exported_.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    frame_id f = 0;
    const int rc = be_->create_frame(device_, frame_size_, &f);
    if (rc != ok) return add_context(rc, "vramswapd: creating frame %zu of %zu: ", i, count);
    frames_.push_back(f);
  }
  frame_count_ = static_cast<uint32_t>(count);
  VS_TRY(prepare_scrub());
  std::vector<uint32_t> all(count);
  for (size_t i = 0; i < count; ++i) all[i] = static_cast<uint32_t>(i);
  VS_TRY(scrub(all.data(), all.size()));
  for (size_t i = 0; i < count; ++i) {
    int fd = -1;
    const int rc = be_->export_frame(frames_[i], &fd);
    if (rc != ok) return add_context(rc, "vramswapd: exporting frame %zu of %zu: ", i, count);
    exported_.push_back(fd);
  }
  return ok;
}

// The scratch reservation and stream of scrub(), made once for the pool's frame size.
int pool_server::prepare_scrub() noexcept {
  if (scratch_ != 0) return ok;
  scratch_frames_ = std::min<size_t>(frame_count_, k_scrub_batch);
  VS_TRY(be_->reserve(device_, scratch_frames_ * frame_size_, 0, &scratch_));
  VS_TRY(be_->stream_create(device_, &stream_));
  return ok;
}

bool pool_server::pool_in_use() const noexcept {
  // A segment claimed but not yet initialized (a start that failed) has no members.
  if (!segment_ || segment_->header()->magic.load(std::memory_order_acquire) != k_magic) return false;
  for (uint32_t m = 0; m < k_member_count; ++m) {
    if (segment_->member(m).state.load(std::memory_order_acquire) == member_live && segment_->member_leased(m)) return true;
  }
  return false;
}

// The shared host pool: one memfd, faulted in here so that its memory is committed before
// any client counts on it (a host without the room fails now, by name, not with SIGBUS or
// the OOM killer in the middle of an eviction). fault_in_writable uses several threads: the
// kernel zeroes every page, ~60 GiB is seconds of memory bandwidth and a client waits for our
// "ready" at most pool_connection::k_start_timeout_s. The server keeps the descriptor and
// no mapping: it never reads or writes slot contents.
int pool_server::build_host_pool(uint64_t bytes) noexcept {
  const uint64_t avail = available_ram();
  if (avail != 0 && bytes > avail) {
    return fail(err_out_of_memory,
                "vramswapd: a shared host pool of %s (VRAMSWAP_HOST_POOL) does not fit this host's available memory (%s of %s "
                "RAM); set a smaller VRAMSWAP_HOST_POOL, or 0 for per-process host tiers",
                human_size(bytes).c_str(), human_size(avail).c_str(), human_size(physical_ram()).c_str());
  }
  // Its pages are charged to this server's memory cgroup (a container's limit, a job's), which
  // the OOM killer enforces silently in the middle of faulting them in.
  if (cgroup_memory cg; read_cgroup_memory(&cg) && bytes > cg.limit - std::min(cg.limit, cg.used)) {
    return fail(err_out_of_memory,
                "vramswapd: a shared host pool of %s (VRAMSWAP_HOST_POOL) does not fit this server's memory cgroup: its limit is "
                "%s (%s), %s of it in use; its pages are charged there. Raise the limit (a DaemonSet's resources.limits.memory: "
                "the host pool plus about 1 GiB), set a smaller VRAMSWAP_HOST_POOL, or 0 for per-process host tiers",
                human_size(bytes).c_str(), human_size(cg.limit).c_str(), cg.where.c_str(), human_size(cg.used).c_str());
  }
  host_pool_fd_ = ::memfd_create("vramswap-host-pool", MFD_CLOEXEC);
  if (host_pool_fd_ < 0) return fail_errno(errno, "vramswapd: memfd_create for the shared host pool");
  if (::ftruncate(host_pool_fd_, static_cast<off_t>(bytes)) != 0) {
    return fail_errno(errno, "vramswapd: sizing the shared host pool's memfd to %s", human_size(bytes).c_str());
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, host_pool_fd_, 0);
  if (p == MAP_FAILED) return fail_errno(errno, "vramswapd: mapping the shared host pool (%s)", human_size(bytes).c_str());
  ::madvise(p, bytes, MADV_HUGEPAGE);  // best effort: shmem huge pages where the kernel allows (shmem_enabled=advise)
  // The memfd is new: no one's bytes are in it yet, so an older kernel may touch its pages.
  const int e = fault_in_writable(p, bytes, populate_fallback::touch);
  ::munmap(p, bytes);
  if (e != 0) {
    return fail(err_out_of_memory, "vramswapd: cannot fault in the shared host pool of %s (VRAMSWAP_HOST_POOL): %s; %s available",
                human_size(bytes).c_str(), std::strerror(e), human_size(available_ram()).c_str());
  }
  host_slots_ = static_cast<uint32_t>(bytes / frame_size_);
  return ok;
}

// Zero the given pool frames: map up to k_scrub_batch at the scratch reservation, memset,
// wait, unmap. A frame is only ever handed to another owner after this.
int pool_server::scrub(const uint32_t* indices, size_t count) noexcept {
  for (size_t done = 0; done < count;) {
    const size_t k = std::min(scratch_frames_, count - done);
    size_t mapped = 0;
    int rc = ok;
    for (; mapped < k && rc == ok; ++mapped) {
      rc = be_->map(scratch_ + mapped * frame_size_, frame_size_, frames_[indices[done + mapped]], 0);
      if (rc != ok) break;
    }
    if (rc == ok) rc = be_->set_access(scratch_, k * frame_size_, access_flags::read_write);
    for (size_t j = 0; j < k && rc == ok; ++j) rc = be_->memset_d8(scratch_ + j * frame_size_, 0, frame_size_, stream_);
    if (rc == ok) rc = be_->stream_synchronize(stream_);
    if (mapped > 0) {
      const int urc = be_->unmap(scratch_, mapped * frame_size_);
      if (rc == ok) rc = urc;
    }
    if (rc != ok) return add_context(rc, "vramswapd: scrubbing frames: ");
    done += k;
  }
  return ok;
}
}  // namespace vramswap::detail
