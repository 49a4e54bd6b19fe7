// The io_uring ceiling of a directory's disk, for the benchmarks that put the swap file's
// rates beside it (bench_disk_tier, bench_host_pool_spill): a plain O_DIRECT writer and
// reader with no vramswap code, measured in the same run as what it is compared with.
#pragma once

#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "support/bench_util.hpp"

namespace vramswap::detail::bench {

inline double gbps(uint64_t bytes, double s) { return static_cast<double>(bytes) / s / 1e9; }

// The plain writer/reader of (a) and (v): `qd` blocks of `block` bytes in flight through
// io_uring, from one buffer of huge pages registered as a fixed buffer, into a registered file.
class plain_io {
 public:
  plain_io(unsigned qd, size_t block) : qd_(qd), block_(block) {
    // Huge pages, like the tier's slots: a 1 MiB request from 4 KiB pages has 256 segments
    // and virtio splits it, which would make the ceiling look lower than the disk is.
    buf_ = ::mmap(nullptr, qd * block, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ::madvise(buf_, qd * block, MADV_HUGEPAGE);
    std::memset(buf_, 0xA5, qd * block);
  }
  ~plain_io() {
    close_file();
    ::munmap(buf_, qd_ * block_);
  }
  // A new unlinked O_DIRECT file in `dir`, with its own ring.
  bool open_file(const std::string& dir) {
    close_file(wait_close_);
    wait_close_ = true;
    fd_ = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    if (fd_ < 0) {
      std::fprintf(stderr, "plain writer: %s: %s\n", dir.c_str(), std::strerror(errno));
      return false;
    }
    io_uring_queue_init(qd_, &ring_, 0);
    struct iovec iov {buf_, qd_ * block_};
    fixed_ = io_uring_register_buffers(&ring_, &iov, 1) == 0;
    io_uring_register_files(&ring_, &fd_, 1);
    return true;
  }
  // Close the file. wait (the default): unregister it from the ring first, so that close()
  // drops the last reference and frees its blocks before it returns, as the tier's swap file
  // does. Otherwise io_uring's ring teardown (asynchronous) keeps the file, and its blocks are
  // freed (on ext4 with `discard`: discarded) in the background while whatever runs next
  // writes: that is how the ceiling's file used to be closed right before the tier's spill.
  void close_file(bool wait = true) {
    if (fd_ < 0) return;
    if (wait) {
      if (fixed_) io_uring_unregister_buffers(&ring_);
      io_uring_unregister_files(&ring_);
    }
    io_uring_queue_exit(&ring_);
    ::close(fd_);
    fd_ = -1;
  }
  // The next open_file() closes the current file without waiting (see close_file).
  void next_close_in_background() { wait_close_ = false; }
  bool fallocate(uint64_t offset, uint64_t bytes) {
    if (::fallocate(fd_, 0, static_cast<off_t>(offset), static_cast<off_t>(bytes)) == 0) return true;
    std::fprintf(stderr, "plain writer: fallocate of %" PRIu64 " bytes at %" PRIu64 ": %s\n", bytes, offset, std::strerror(errno));
    return false;
  }
  // One sequential pass over [0, size). grow_step > 0 (writes only): the file is reserved
  // `grow_step` bytes at a time, each just before the first block past the reserved end is
  // queued (what was queued is submitted first, so the fallocate meets a full ring).
  bool pass(bool write, uint64_t size, uint64_t grow_step = 0) {
    uint64_t next = 0, done = 0, reserved = 0;
    unsigned inflight = 0;
    while (done < size) {
      while (inflight < qd_ && next < size) {
        if (grow_step > 0 && next >= reserved) {
          io_uring_submit(&ring_);
          const uint64_t n = std::min(grow_step, size - reserved);
          if (!fallocate(reserved, n)) return false;
          reserved += n;
        }
        struct io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        char* b = static_cast<char*>(buf_) + (next / block_ % qd_) * block_;
        if (write) {
          fixed_ ? io_uring_prep_write_fixed(sqe, 0, b, block_, next, 0) : io_uring_prep_write(sqe, 0, b, block_, next);
        } else {
          fixed_ ? io_uring_prep_read_fixed(sqe, 0, b, block_, next, 0) : io_uring_prep_read(sqe, 0, b, block_, next);
        }
        sqe->flags |= IOSQE_FIXED_FILE;
        next += block_;
        ++inflight;
      }
      io_uring_submit(&ring_);
      struct io_uring_cqe* cqe = nullptr;
      io_uring_wait_cqe(&ring_, &cqe);
      while (cqe != nullptr) {
        if (cqe->res != static_cast<int>(block_)) {
          std::fprintf(stderr, "plain writer: %s returned %d\n", write ? "write" : "read", cqe->res);
          return false;
        }
        io_uring_cqe_seen(&ring_, cqe);
        --inflight;
        done += block_;
        cqe = nullptr;
        io_uring_peek_cqe(&ring_, &cqe);
      }
    }
    return true;
  }

 private:
  unsigned qd_;
  size_t block_;
  void* buf_ = nullptr;
  int fd_ = -1;
  struct io_uring ring_ {};
  bool fixed_ = false;
  bool wait_close_ = true;
};

// Between measurements (untimed): the files closed so far are freed (close_file waits for
// that), then syncfs() commits the filesystem's journal, which on ext4 with `discard` also
// waits for the discards of the freed blocks. Every measurement starts on a quiet disk: none
// pays for the cleanup of the one before. Returns the seconds it took.
inline double settle(const std::string& dir) {
  const double t0 = seconds_now();
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::syncfs(fd);
    ::close(fd);
  }
  return seconds_now() - t0;
}
inline double settle_s = 0;  // the time settle() took in all, printed for the record

// (a) Sequential O_DIRECT transfer of `size` bytes at depth `qd` with `block` blocks into a
// file reserved with one fallocate before the timer starts.
inline bool ceiling(const std::string& dir, uint64_t size, unsigned qd, size_t block, double* write_s, double* read_s) {
  plain_io io(qd, block);
  if (!io.open_file(dir) || !io.fallocate(0, size)) return false;
  for (int pass = 0; pass < 2; ++pass) {
    const bool write = pass == 0;
    const double t0 = seconds_now();
    if (!io.pass(write, size)) return false;
    (write ? *write_s : *read_s) = seconds_now() - t0;
  }
  const double t0 = seconds_now();
  io.close_file();
  settle_s += seconds_now() - t0 + settle(dir);
  return true;
}

}  // namespace vramswap::detail::bench
