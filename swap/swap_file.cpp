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
#include <cstdio>
#include <cstring>
#include <ctime>

#include "core/log.hpp"
#include "core/status.hpp"

namespace vramswap::detail {

namespace {
constexpr unsigned k_sparse_buffers = 4096;     // fixed-buffer table entries (one per host chunk)
constexpr size_t k_max_fixed_buffer = 1u << 30;  // the kernel's limit per registered buffer
constexpr unsigned k_max_stalls = 8;            // completions in a row without progress
// Completions in a row that ask to be tried again (-EAGAIN, -EINTR) before the transfer fails:
// a device that answers so for good would otherwise be retried for ever, and the save or the
// restore waiting for it with it.
constexpr unsigned k_max_retries = 256;
constexpr double k_wait_slice_s = 0.1;          // longest wait before the ring's SQEs are submitted again
constexpr double k_first_pause_s = 0.001;       // before retrying a submission, doubling up to a slice

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
  timed_waits_ = (params.features & IORING_FEAT_EXT_ARG) != 0;
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
  auto* req = new request{tag, write, extent, nblocks, 0, 0, false, false, {}};
  if (write) ++(written_[extent] ? stats_.overwrites : stats_.fresh_writes);
  for (unsigned i = 0; i < nblocks; ++i) {
    const uint64_t off = static_cast<uint64_t>(i) * cfg_.block_size;
    const size_t len = std::min(cfg_.block_size, cfg_.extent_size - off);
    queued_.push_back(new block{req, extent * cfg_.extent_size + off, static_cast<char*>(buf) + off, static_cast<unsigned>(len), 0, 0});
  }
  ++requests_;
  pump();
}

void swap_file::pump() {
  fill_ring();
  submit_ready();
}

void swap_file::fill_ring() {
  while (!queued_.empty() && in_ring_ < cfg_.queue_depth) {
    struct io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) break;
    block* b = queued_.front();
    queued_.pop_front();
    prepare(sqe, b);
    not_taken_.emplace_back(sqe, b);
    account_depth();
    ++in_ring_;
    ++stats_.sqes;
  }
}

void swap_file::prepare(struct io_uring_sqe* sqe, block* b) {
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
}

// Submitted whenever the ring holds SQEs, not only when this call added some: SQEs that an
// earlier failed submission left behind would otherwise wait for ever, and so would whoever
// waits for their completions. After EAGAIN or EBUSY the next attempt waits a pause (reap()
// reaps meanwhile, which is what frees a full completion queue); past submit_patience_ms of
// them, or on any other error, the blocks the kernel has not taken fail.
void swap_file::submit_ready() {
  while (io_uring_sq_ready(&ring_) > 0) {
    const double t = now_s();
    if (t < submit_retry_at_) return;
    const int rc = submit_once();
    forget_taken();
    if (rc == -EINTR) continue;
    if (rc > 0) {
      submit_failing_since_ = submit_retry_at_ = submit_pause_ = 0;
      submit_failures_ = 0;
      submit_failure_logged_ = false;
      continue;  // the kernel may have taken only some: the rest go in the next round
    }
    const int e = rc == 0 ? EAGAIN : -rc;  // none taken and no error: as EAGAIN
    char why[256];
    if (e == EAGAIN || e == EBUSY) {
      if (submit_failures_++ == 0) {
        submit_failing_since_ = t;
        log(log_level::debug, "swap file in %s for %s: io_uring_submit: %s; retrying", cfg_.dir.c_str(), cfg_.label.c_str(),
            std::strerror(e));
      }
      if (t - submit_failing_since_ < cfg_.submit_patience_ms / 1000.0) {
        submit_pause_ = std::min(k_wait_slice_s, submit_pause_ == 0 ? k_first_pause_s : 2 * submit_pause_);
        submit_retry_at_ = t + submit_pause_;
        return;
      }
      std::snprintf(why, sizeof why,
                    "io_uring_submit failed: %s, %u times in %.1f s (the kernel could not take requests: short of memory, or "
                    "its completion queue stayed full); free host memory or lower VRAMSWAP_SWAP_QUEUE_DEPTH",
                    std::strerror(e), submit_failures_, t - submit_failing_since_);
    } else {
      std::snprintf(why, sizeof why,
                    "io_uring_submit failed: %s; if it persists, see the kernel log (dmesg) and "
                    "/proc/sys/kernel/io_uring_disabled",
                    std::strerror(e));
    }
    submit_failing_since_ = submit_retry_at_ = submit_pause_ = 0;
    submit_failures_ = 0;
    fail_unsubmitted(e, why);
    return;
  }
}

int swap_file::submit_once() {
  const uint64_t nth = stats_.submits++;
  if (cfg_.faults != nullptr) {
    const int e = cfg_.faults->on_submit(nth, io_uring_sq_ready(&ring_));
    if (e < 0) return e;
  }
  return io_uring_submit(&ring_);
}

// The kernel takes SQEs in ring order, and io_uring_sq_ready() counts those it has not
// taken: they are the last ones prepared.
void swap_file::forget_taken() {
  const unsigned left = io_uring_sq_ready(&ring_);
  while (not_taken_.size() > left) not_taken_.pop_front();
}

// Fail every block the kernel has not taken: those with an SQE in the ring and those queued.
// liburing cannot take an SQE back out of the ring, and the next io_uring_submit hands it to
// the kernel whatever we decided; so each one is rewritten as a no-op that names no block,
// and its completion is skipped. Rewriting it is safe, and after it the kernel can never
// touch the block's buffer: the ring has no SQPOLL thread, so the kernel reads SQEs only
// inside io_uring_enter, called from this thread, and it moves the ring's head past every
// SQE it read before that call returns; an SQE that io_uring_sq_ready() still counts has not
// been read, and no transfer for its buffer exists. So when the request completes with the
// error (after its blocks that the kernel did take), its buffer is the caller's again, as it
// was: a write leaves the page where it was, a read has filled nothing.
void swap_file::fail_unsubmitted(int e, const std::string& why) {
  forget_taken();
  size_t failed = 0;
  auto fail_block = [&](block* b) {
    request* r = b->req;
    if (r->error == 0) {
      r->error = -e;
      r->error_offset = b->offset;
      r->not_submitted = why;
    }
    finish_block(b);
    ++failed;
  };
  for (auto& [sqe, b] : not_taken_) {
    if (b == nullptr) continue;
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, nullptr);
    fail_block(b);
    b = nullptr;
  }
  while (!queued_.empty()) {
    block* b = queued_.front();
    queued_.pop_front();
    fail_block(b);
  }
  if (failed == 0 || submit_failure_logged_) return;
  submit_failure_logged_ = true;  // each request's completion says it too
  log(log_level::error,
      "swap file in %s for %s: %s; the %zu transfers not started fail (failures like it are not logged again until a submission "
      "succeeds)",
      cfg_.dir.c_str(), cfg_.label.c_str(), why.c_str(), failed);
}

void swap_file::drain_completions() {
  struct io_uring_cqe* cqe = nullptr;
  while (io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe != nullptr) {
    handle(cqe);
    cqe = nullptr;
  }
}

void swap_file::handle(struct io_uring_cqe* cqe) {
  block* b = static_cast<block*>(io_uring_cqe_get_data(cqe));
  int res = cqe->res;
  io_uring_cqe_seen(&ring_, cqe);
  account_depth();
  --in_ring_;
  if (b == nullptr) return;  // the no-op of a block that failed unsubmitted
  request* r = b->req;
  if (cfg_.faults != nullptr) res = cfg_.faults->on_complete(r->write, nth_[r->write ? 1 : 0]++, b->offset, b->len, res);
  bool finished = false;
  if ((res == -EAGAIN || res == -EINTR) && ++b->retries < k_max_retries) {
    queued_.push_front(b);  // try again
  } else if (res < 0) {
    if (res == -EAGAIN || res == -EINTR) r->retried_out = true;
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
    if (res > 0) b->stalls = b->retries = 0;
    b->offset += static_cast<unsigned>(res);
    b->buf += res;
    b->len -= static_cast<unsigned>(res);
    queued_.push_front(b);
  }
  if (finished) finish_block(b);
}

void swap_file::finish_block(block* b) {
  request* r = b->req;
  delete b;
  if (--r->blocks_left == 0) complete(r);
}

void swap_file::complete(request* r) {
  completion c{r->tag, ok, {}};
  if (r->error != 0) {
    const int e = -r->error;
    const char* dir = r->write ? "write" : "read";
    c.status = r->not_submitted.empty() && (e == ENOSPC || e == EDQUOT) ? err_no_space : err_io;
    char buf[768];
    if (!r->not_submitted.empty()) {
      std::snprintf(buf, sizeof buf, "swap file in %s for %s: %s at offset %" PRIu64 " (page extent %" PRIu64 ") not submitted: %s",
                    cfg_.dir.c_str(), cfg_.label.c_str(), dir, r->error_offset, r->extent, r->not_submitted.c_str());
    } else if (r->retried_out) {
      std::snprintf(buf, sizeof buf,
                    "swap file in %s for %s: %s at offset %" PRIu64 " (page extent %" PRIu64 ") failed: the kernel answered %s "
                    "%u times in a row",
                    cfg_.dir.c_str(), cfg_.label.c_str(), dir, r->error_offset, r->extent, std::strerror(e), k_max_retries);
    } else if (r->short_transfer) {
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
  done_.push_back(std::move(c));
}

int swap_file::reap(bool wait, std::vector<completion>* out) {
  for (;;) {
    pump();
    drain_completions();
    pump();
    if (!done_.empty()) {
      requests_ -= done_.size();
      for (completion& c : done_) out->push_back(std::move(c));
      done_.clear();
      return ok;
    }
    if (!wait || requests_ == 0) return ok;
    VS_TRY(wait_a_slice());
  }
}

// Never a wait without end: SQEs left in the ring by a failed submission bring no completion
// until they are submitted again, which reap() does after each slice.
int swap_file::wait_a_slice() {
  ++stats_.waits;
  const double wait_s =
      submit_retry_at_ == 0 ? k_wait_slice_s : std::clamp(submit_retry_at_ - now_s(), 0.0, k_wait_slice_s);
  struct io_uring_cqe* cqe = nullptr;
  int rc = 0;
  if (timed_waits_) {
    struct __kernel_timespec ts {};
    ts.tv_sec = 0;
    ts.tv_nsec = static_cast<long long>(wait_s * 1e9);
    rc = io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
  } else if (not_taken_.empty()) {
    // Kernels before 5.11: liburing would time the wait with an SQE of its own, which would
    // go out with ours. With every SQE taken by the kernel, a completion is sure to come.
    rc = io_uring_wait_cqe(&ring_, &cqe);
  } else {
    const struct timespec ts {0, static_cast<long>(wait_s * 1e9)};
    ::nanosleep(&ts, nullptr);
  }
  if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME) {
    return fail(err_system, "swap file in %s for %s: waiting for io_uring completions failed: %s", cfg_.dir.c_str(),
                cfg_.label.c_str(), std::strerror(-rc));
  }
  return ok;
}

}  // namespace vramswap::detail
