#include "swap/swap_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstring>

#include "core/log.hpp"
#include "core/status.hpp"

namespace vramswap::detail {

namespace {
constexpr unsigned k_sparse_buffers = 4096;     // fixed-buffer table entries (one per host chunk)
constexpr size_t k_max_fixed_buffer = 1u << 30;  // the kernel's limit per registered buffer
constexpr unsigned k_max_stalls = 8;            // completions in a row without progress

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int open_tmpfile(const swap_file_config& cfg, int flags) {
  if (cfg.faults != nullptr) {
    const int e = cfg.faults->on_open(flags);
    if (e < 0) {
      errno = -e;
      return -1;
    }
  }
  return ::open(cfg.dir.c_str(), flags, 0600);
}
}  // namespace

int swap_file::open(const swap_file_config& cfg, std::unique_ptr<swap_file>* out) {
  if (cfg.extent_size == 0 || cfg.extent_size % 4096 != 0 || cfg.block_size == 0 || cfg.block_size % 4096 != 0 ||
      cfg.block_size > (1u << 30) || cfg.queue_depth == 0 || cfg.queue_depth > 4096) {
    return fail(err_invalid_argument,
                "swap file: page size %zu and block size %zu must be multiples of 4 KiB (block <= 1 GiB), queue depth %u in 1..4096",
                cfg.extent_size, cfg.block_size, cfg.queue_depth);
  }
  std::unique_ptr<swap_file> f(new swap_file(cfg));
  if (f->cfg_.block_size > f->cfg_.extent_size) f->cfg_.block_size = f->cfg_.extent_size;
  VS_TRY(f->setup());
  *out = std::move(f);
  return ok;
}

int swap_file::setup() {
  const char* dir = cfg_.dir.c_str();
  const char* what = "VRAMSWAP_SWAP_DIR";
  struct stat st {};
  if (::stat(dir, &st) != 0) {
    const int e = errno;
    return fail(err_unavailable, "%s: swap directory \"%s\" for %s is not usable (%s); create it or set %s to a writable directory",
                what, dir, cfg_.label.c_str(), std::strerror(e), what);
  }
  if (!S_ISDIR(st.st_mode)) return fail(err_unavailable, "%s: \"%s\" is not a directory", what, dir);

  fd_ = open_tmpfile(cfg_, O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC);
  if (fd_ < 0) {
    const int e = errno;
    if (e == EACCES || e == EPERM || e == EROFS) {
      return fail(err_unavailable, "%s: cannot create a swap file in \"%s\" (%s): the directory is not writable by this process",
                  what, dir, std::strerror(e));
    }
    if (e == EINVAL) {
      // EINVAL is what open() says for O_DIRECT on a filesystem without it; check that the
      // same open without O_DIRECT works, to name the cause exactly.
      const int probe = open_tmpfile(cfg_, O_TMPFILE | O_RDWR | O_CLOEXEC);
      if (probe >= 0) {
        ::close(probe);
        struct statfs sfs {};
        ::statfs(dir, &sfs);
        return fail(err_unavailable,
                    "%s: the filesystem of \"%s\" (type 0x%lx) does not support O_DIRECT; the disk tier refuses buffered I/O "
                    "(it would spend page-cache memory on every page it saves): set %s to a directory on ext4, xfs or btrfs",
                    what, dir, static_cast<unsigned long>(sfs.f_type), what);
      }
    }
    if (e == EOPNOTSUPP || e == EISDIR || e == EINVAL) {
      return fail(err_unavailable,
                  "%s: the filesystem of \"%s\" cannot create unlinked files (O_TMPFILE: %s); set %s to a directory on ext4, xfs "
                  "or btrfs",
                  what, dir, std::strerror(e), what);
    }
    return fail(err_unavailable, "%s: cannot create a swap file in \"%s\": %s", what, dir, std::strerror(e));
  }

  struct io_uring_params params {};
  int rc = io_uring_queue_init_params(cfg_.queue_depth, &ring_, &params);
  if (rc < 0) {
    return fail(err_system, "swap file: io_uring_queue_init(%u) failed: %s (io_uring disabled? see /proc/sys/kernel/io_uring_disabled)",
                cfg_.queue_depth, std::strerror(-rc));
  }
  ring_ready_ = true;
  fixed_file_ = io_uring_register_files(&ring_, &fd_, 1) == 0;
  rc = io_uring_register_buffers_sparse(&ring_, k_sparse_buffers);
  fixed_buffers_ = rc == 0;
  if (!fixed_buffers_) {
    log(log_level::info, "swap file: io_uring fixed buffers unavailable (%s); using plain O_DIRECT reads and writes",
        std::strerror(-rc));
  }
  log(log_level::debug, "swap file for %s in %s: queue depth %u, blocks of %zu bytes, registered file %d, fixed buffers %d",
      cfg_.label.c_str(), dir, cfg_.queue_depth, cfg_.block_size, fixed_file_, fixed_buffers_);
  return ok;
}

swap_file::~swap_file() {
  if (ring_ready_) {
    std::vector<completion> sink;
    while (requests_ > 0) {
      if (reap(true, &sink) != ok) break;
      sink.clear();
    }
    // Unregister first: these wait for the kernel to drop its references, whereas the
    // ring's own teardown is asynchronous and would keep the file (and its filesystem)
    // busy for a moment after we return.
    if (fixed_buffers_) io_uring_unregister_buffers(&ring_);
    if (fixed_file_) io_uring_unregister_files(&ring_);
    io_uring_queue_exit(&ring_);
  }
  for (block* b : queued_) delete b;
  if (fd_ >= 0) ::close(fd_);
}

void swap_file::add_buffer(void* base, size_t bytes) {
  if (!fixed_buffers_ || bytes > k_max_fixed_buffer) return;
  unsigned index = 0;
  {
    std::lock_guard<std::mutex> lock(buffers_mutex_);
    if (next_buffer_ >= k_sparse_buffers) return;
    index = next_buffer_++;
  }
  // Outside the mutex: transfers look buffers up meanwhile. The kernel orders the update
  // with submissions; until the entry below exists, no transfer names this index.
  struct iovec iov {base, bytes};
  const int rc = io_uring_register_buffers_update_tag(&ring_, index, &iov, nullptr, 1);
  if (rc < 0) {
    log(log_level::debug, "swap file: registering %zu bytes at %p as a fixed buffer failed (%s); plain I/O for them", bytes, base,
        std::strerror(-rc));
    return;
  }
  std::lock_guard<std::mutex> lock(buffers_mutex_);
  buffers_[reinterpret_cast<uintptr_t>(base)] = {bytes, static_cast<int>(index)};
}

int swap_file::buffer_index(const char* p, unsigned len) const {
  std::lock_guard<std::mutex> lock(buffers_mutex_);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = buffers_.upper_bound(a);
  if (it == buffers_.begin()) return -1;
  --it;
  return a + len <= it->first + it->second.first ? it->second.second : -1;
}

int swap_file::try_fallocate(uint64_t extents) {
  const off_t offset = static_cast<off_t>(extents_total_ * cfg_.extent_size);
  const off_t bytes = static_cast<off_t>(extents * cfg_.extent_size);
  const double t0 = now_s();
  const int rc = ::fallocate(fd_, 0, offset, bytes);
  const int e = rc == 0 ? 0 : errno;
  ++stats_.grows;
  if (in_ring_ > 0) ++stats_.grows_in_flight;
  if (e != 0) {
    // ext4 keeps the blocks a failed fallocate did allocate (and the larger size): give them
    // back, so a failure leaves the file as it was and the filesystem's space to others.
    if (::ftruncate(fd_, offset) != 0) {
      log(log_level::warn, "swap file in %s for %s: giving back a failed reservation (ftruncate to %" PRIu64 " bytes): %s",
          cfg_.dir.c_str(), cfg_.label.c_str(), static_cast<uint64_t>(offset), std::strerror(errno));
    }
  }
  stats_.grow_s += now_s() - t0;
  if (e != 0) return -e;
  stats_.grow_bytes += static_cast<uint64_t>(bytes);
  stats_.largest_grow = std::max(stats_.largest_grow, static_cast<uint64_t>(bytes));
  for (uint64_t i = 0; i < extents; ++i) free_fresh_.insert(extents_total_ + i);
  extents_total_ += extents;
  written_.resize(extents_total_, false);
  return 0;
}

// Grow by at least `missing` extents: the geometric size first; on ENOSPC exactly what is
// missing; then, for alloc_extent (one_at_a_time), a single extent.
int swap_file::grow(uint64_t missing, bool one_at_a_time) {
  const uint64_t step = std::max<uint64_t>(1, (cfg_.grow_step + cfg_.extent_size - 1) / cfg_.extent_size);
  uint64_t target = std::max({missing, step, extents_total_ / 2});
  target = (target + step - 1) / step * step;
  if (target > missing) {
    // What goes beyond this spill's need takes at most half of the free space.
    struct statfs sfs {};
    if (::fstatfs(fd_, &sfs) == 0) {
      const uint64_t free_extents = static_cast<uint64_t>(sfs.f_bavail) * static_cast<uint64_t>(sfs.f_bsize) / cfg_.extent_size;
      target = std::max(missing, std::min(target, missing + free_extents / 2));
    }
  }
  std::vector<uint64_t> attempts{target};
  if (missing < target) attempts.push_back(missing);
  if (one_at_a_time && missing > 1) attempts.push_back(1);
  int e = 0;
  for (const uint64_t n : attempts) {
    if ((e = try_fallocate(n)) == 0) return ok;
    if (e != -ENOSPC && e != -EDQUOT) break;
  }
  const uint64_t want = attempts.back();
  if (e == -ENOSPC || e == -EDQUOT) {
    return fail(err_no_space,
                "swap file in %s for %s: the filesystem is full (%s): no room for %" PRIu64 " more bytes, with %" PRIu64
                " bytes in this swap file",
                cfg_.dir.c_str(), cfg_.label.c_str(), std::strerror(-e), want * cfg_.extent_size, file_bytes());
  }
  return fail(err_io, "swap file in %s for %s: fallocate of %" PRIu64 " bytes at %" PRIu64 " failed: %s", cfg_.dir.c_str(),
              cfg_.label.c_str(), want * cfg_.extent_size, file_bytes(), std::strerror(-e));
}

int swap_file::reserve(uint64_t extents) {
  const uint64_t have = extents_free();
  return extents <= have ? ok : grow(extents - have, /*one_at_a_time=*/false);
}

int swap_file::alloc_extent(uint64_t* extent) {
  if (extents_free() == 0) VS_TRY(grow(1, /*one_at_a_time=*/true));
  std::set<uint64_t>& from = free_written_.empty() ? free_fresh_ : free_written_;
  *extent = *from.begin();
  from.erase(from.begin());
  return ok;
}

void swap_file::free_extent(uint64_t extent) { (written_[extent] ? free_written_ : free_fresh_).insert(extent); }

void swap_file::account_depth() {
  const double t = now_s();
  const double dt = depth_since_ == 0 ? 0 : t - depth_since_;
  depth_since_ = t;
  if (in_ring_ > 0) stats_.busy_s += dt;
  if (in_ring_ >= cfg_.queue_depth) stats_.full_s += dt;
  stats_.depth_s += dt * in_ring_;
}

void swap_file::submit(bool write, uint64_t extent, void* buf, uint64_t tag) {
  const unsigned nblocks = static_cast<unsigned>((cfg_.extent_size + cfg_.block_size - 1) / cfg_.block_size);
  auto* req = new request{tag, write, extent, nblocks, 0, 0, false};
  if (write) ++(written_[extent] ? stats_.overwrites : stats_.fresh_writes);
  for (unsigned i = 0; i < nblocks; ++i) {
    const uint64_t off = static_cast<uint64_t>(i) * cfg_.block_size;
    const size_t len = std::min(cfg_.block_size, cfg_.extent_size - off);
    queued_.push_back(new block{req, extent * cfg_.extent_size + off, static_cast<char*>(buf) + off, static_cast<unsigned>(len), 0});
  }
  ++requests_;
  pump();
}

void swap_file::pump() {
  unsigned added = 0;
  while (!queued_.empty() && in_ring_ < cfg_.queue_depth) {
    struct io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) break;
    block* b = queued_.front();
    queued_.pop_front();
    const int fd = fixed_file_ ? 0 : fd_;
    const int index = buffer_index(b->buf, b->len);
    if (b->req->write) {
      if (index >= 0) {
        io_uring_prep_write_fixed(sqe, fd, b->buf, b->len, b->offset, index);
      } else {
        io_uring_prep_write(sqe, fd, b->buf, b->len, b->offset);
      }
    } else {
      if (index >= 0) {
        io_uring_prep_read_fixed(sqe, fd, b->buf, b->len, b->offset, index);
      } else {
        io_uring_prep_read(sqe, fd, b->buf, b->len, b->offset);
      }
    }
    if (fixed_file_) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, b);
    account_depth();
    ++in_ring_;
    ++added;
  }
  if (added == 0) return;
  stats_.sqes += added;
  for (;;) {
    ++stats_.submits;
    const int rc = io_uring_submit(&ring_);
    if (rc >= 0 || (rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)) {
      if (rc < 0) log(log_level::error, "swap file: io_uring_submit failed: %s", std::strerror(-rc));
      return;
    }
    if (rc == -EINTR) continue;
    return;  // EAGAIN/EBUSY: the SQEs stay in the ring and go with the next submit
  }
}

void swap_file::handle(struct io_uring_cqe* cqe, std::vector<completion>* out) {
  block* b = static_cast<block*>(io_uring_cqe_get_data(cqe));
  int res = cqe->res;
  io_uring_cqe_seen(&ring_, cqe);
  account_depth();
  --in_ring_;
  request* r = b->req;
  if (cfg_.faults != nullptr) res = cfg_.faults->on_complete(r->write, nth_[r->write ? 1 : 0]++, b->offset, b->len, res);
  bool finished = false;
  if (res == -EAGAIN || res == -EINTR) {
    queued_.push_front(b);  // try again
  } else if (res < 0) {
    if (r->error == 0) {
      r->error = res;
      r->error_offset = b->offset;
    }
    finished = true;
  } else if (static_cast<unsigned>(res) >= b->len) {
    finished = true;
  } else if (res == 0 && ++b->stalls >= k_max_stalls) {
    if (r->error == 0) {
      r->error = -EIO;
      r->error_offset = b->offset;
      r->short_transfer = true;
    }
    finished = true;
  } else {
    // Short: resubmit the remainder (O_DIRECT short transfers end on a block boundary).
    if (res > 0) b->stalls = 0;
    b->offset += static_cast<unsigned>(res);
    b->buf += res;
    b->len -= static_cast<unsigned>(res);
    queued_.push_front(b);
  }
  if (!finished) return;
  delete b;
  if (--r->blocks_left > 0) return;
  completion c{r->tag, ok, {}};
  if (r->error != 0) {
    const int e = -r->error;
    const char* dir = r->write ? "write" : "read";
    c.status = (e == ENOSPC || e == EDQUOT) ? err_no_space : err_io;
    char buf[512];
    if (r->short_transfer) {
      std::snprintf(buf, sizeof buf,
                    "swap file in %s for %s: short %s at offset %" PRIu64 " (page extent %" PRIu64
                    "): no progress after %u attempts",
                    cfg_.dir.c_str(), cfg_.label.c_str(), dir, r->error_offset, r->extent, k_max_stalls);
    } else {
      std::snprintf(buf, sizeof buf, "swap file in %s for %s: %s at offset %" PRIu64 " (page extent %" PRIu64 ") failed: %s",
                    cfg_.dir.c_str(), cfg_.label.c_str(), dir, r->error_offset, r->extent, std::strerror(e));
    }
    c.detail = buf;
  }
  if (r->write && r->error == 0) written_[r->extent] = true;
  delete r;
  --requests_;
  out->push_back(std::move(c));
}

int swap_file::reap(bool wait, std::vector<completion>* out) {
  const size_t before = out->size();
  for (;;) {
    pump();
    struct io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe != nullptr) {
      handle(cqe, out);
      cqe = nullptr;
    }
    pump();
    if (!wait || out->size() > before || requests_ == 0) return ok;
    ++stats_.waits;
    const int rc = io_uring_wait_cqe(&ring_, &cqe);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN) {
      return fail(err_system, "swap file: waiting for io_uring completions failed: %s", std::strerror(-rc));
    }
  }
}

}  // namespace vramswap::detail
