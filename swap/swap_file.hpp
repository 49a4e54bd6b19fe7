// swap_file: one process's swap file for one device, driven through io_uring.
//
// The file. Created unlinked (open(dir, O_TMPFILE | O_RDWR | O_DIRECT, 0600)), so it has no
// name for anyone to open and disappears with the process, however it ends. It is divided
// into extents of one page each; it grows by `grow_step` at a time with fallocate(), so a
// full filesystem is found when space is reserved (ENOSPC from fallocate), not halfway
// through a page's write. Free extents are kept in a free-space map (lowest offset first, so
// the file stays compact) and reused before the file grows again.
//   A growth drains the queue: fallocate() on ext4 and xfs takes the inode lock and waits
// for every O_DIRECT request in flight (inode_dio_wait). Measured on the 2-core VM (8 GiB
// spill, 1 GiB steps): 7 growths cost 0.06-0.11 s of a 3-4 s spill, drains included; and
// doubling the step each time (3 growths) gave no measurable gain (bench/results/disk_tier.md).
//
// The directory must accept O_TMPFILE and O_DIRECT. A filesystem without O_DIRECT is
// refused with err_unavailable and a detail that says so and what to do: buffered I/O
// would copy every page through the page cache, which costs the very host memory the
// budget is there to save and makes the disk's rate unpredictable. (Decision; see
// docs/swap.md.) A missing or unwritable directory is refused the same way.
//
// The ring. One io_uring per file with `queue_depth` entries, the file registered
// (IOSQE_FIXED_FILE) and the caller's pinned memory registered as fixed buffers
// (add_buffer(): a sparse table filled as host chunks appear), so O_DIRECT transfers go
// straight between the disk and pinned memory with no page pinning per request. If the
// kernel refuses buffer registration (RLIMIT_MEMLOCK for unprivileged users), plain
// IORING_OP_READ/WRITE are used instead and the log says so once.
//
// Requests. submit() takes a whole page (one extent) and splits it into `block_size`
// blocks; at most `queue_depth` blocks are in flight, the rest wait in a queue and go out
// as completions come back, so the disk always has `queue_depth` requests to work on.
// A block that completes short is resubmitted for its remainder; -EAGAIN and -EINTR are
// retried; a block that makes no progress several times in a row fails as a short
// transfer. A request completes when all of its blocks have: ok, or the first error
// (err_no_space for ENOSPC/EDQUOT, err_io otherwise), with a detail naming the page, the
// offset and the cause. Completions are collected by reap().
//
// Faults. Tests replace the io_faults seam to turn the Nth completion into -EIO or a short
// count, or to make the directory look like one without O_DIRECT. It is a constructor
// argument, not an environment variable: nothing a user sets can trip it.
//
// Not thread-safe: the owner (tiered_store) serializes every call.
#pragma once

#include <liburing.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace vramswap {

// The test seam between the disk tier and the kernel. Default: everything passes through.
class io_faults {
 public:
  virtual ~io_faults() = default;
  // Before the swap file is opened with `flags`: return 0 to go ahead, or -errno to make
  // open() fail with that error.
  virtual int on_open(int flags) {
    (void)flags;
    return 0;
  }
  // For every completed block transfer, numbered from 0 per file and direction: return the
  // result the disk tier should see (the kernel's `res`, or -EIO, or fewer bytes).
  virtual int on_complete(bool write, uint64_t nth, uint64_t offset, unsigned len, int res) {
    (void)write, (void)nth, (void)offset, (void)len;
    return res;
  }
};

struct swap_file_config {
  std::string dir;              // where to create the file
  size_t extent_size = 0;       // bytes per extent: one page (a multiple of 4 KiB)
  unsigned queue_depth = 32;    // blocks in flight
  size_t block_size = 1 << 20;  // bytes per request (a page is split into blocks)
  uint64_t grow_step = 1ull << 30;  // preallocation step, rounded up to whole extents
  io_faults* faults = nullptr;  // tests only
  std::string label;            // for messages: "device 0"
};

class swap_file {
 public:
  // A finished request: its tag and 0 or a negative status (the detail is in `detail`).
  struct completion {
    uint64_t tag;
    int status;
    std::string detail;
  };

  // err_unavailable (with the reason) when the directory cannot hold a swap file;
  // err_invalid_argument for bad sizes; err_system when io_uring cannot be set up.
  static int open(const swap_file_config& cfg, std::unique_ptr<swap_file>* out);
  ~swap_file();  // waits for requests in flight: the kernel may still be using buffers
  swap_file(const swap_file&) = delete;
  swap_file& operator=(const swap_file&) = delete;

  // Register [base, base+bytes) (pinned, page aligned) for fixed-buffer I/O. Best effort:
  // memory that is not registered is transferred with plain reads and writes.
  void add_buffer(void* base, size_t bytes);

  // An extent for one page, growing the file if none is free. err_no_space when the
  // filesystem is full, err_io for other fallocate failures.
  int alloc_extent(uint64_t* extent);
  void free_extent(uint64_t extent);

  // Queue a whole-extent transfer between `buf` (extent_size bytes) and `extent`.
  void submit(bool write, uint64_t extent, void* buf, uint64_t tag);
  // Collect finished requests into `out` (appended). wait: block until at least one
  // request finishes (returns at once when none is in flight).
  int reap(bool wait, std::vector<completion>* out);
  // Requests (pages) submitted and not yet reaped.
  size_t requests_in_flight() const noexcept { return requests_; }

  uint64_t extents_used() const noexcept { return extents_total_ - free_.size(); }
  uint64_t file_bytes() const noexcept { return extents_total_ * cfg_.extent_size; }
  bool fixed_buffers() const noexcept { return fixed_buffers_; }
  const std::string& dir() const noexcept { return cfg_.dir; }

  // Where the time goes (for benchmarks): blocks in the ring integrated over time.
  struct io_stats {
    uint64_t submits = 0;      // io_uring_submit calls
    uint64_t sqes = 0;         // blocks put in the ring
    uint64_t waits = 0;        // io_uring_wait_cqe calls
    uint64_t grows = 0;        // fallocate calls
    double grow_s = 0;         // seconds in fallocate
    double busy_s = 0;         // seconds with at least one block in the ring
    double full_s = 0;         // seconds with queue_depth blocks in the ring
    double depth_s = 0;        // integral of blocks in the ring over time (block-seconds)
  };
  const io_stats& stats() const noexcept { return stats_; }

 private:
  struct request;
  struct block {
    request* req;
    uint64_t offset;  // in the file
    char* buf;
    unsigned len;     // bytes still to move
    unsigned stalls;  // completions in a row without progress
  };
  struct request {
    uint64_t tag;
    bool write;
    uint64_t extent;
    unsigned blocks_left;
    int error;  // first -errno (or -EIO for short), 0 if none
    uint64_t error_offset;
    bool short_transfer;
  };

  explicit swap_file(const swap_file_config& cfg) : cfg_(cfg) {}
  int setup();
  void pump();                      // move queued blocks into the ring, up to queue_depth
  void handle(struct io_uring_cqe* cqe, std::vector<completion>* out);
  int buffer_index(const char* p, unsigned len) const;  // -1 if not registered

  swap_file_config cfg_;
  int fd_ = -1;
  struct io_uring ring_ {};
  bool ring_ready_ = false;
  bool fixed_file_ = false;
  bool fixed_buffers_ = false;
  unsigned next_buffer_ = 0;
  std::map<uintptr_t, std::pair<size_t, int>> buffers_;  // base -> (bytes, index)
  std::deque<block*> queued_;                           // not yet in the ring
  unsigned in_ring_ = 0;
  size_t requests_ = 0;
  uint64_t nth_[2] = {0, 0};  // completions per direction, for io_faults
  uint64_t extents_total_ = 0;
  std::set<uint64_t> free_;  // the free-space map
  io_stats stats_;
  double depth_since_ = 0;   // when in_ring_ last changed
  void account_depth();      // before in_ring_ changes
};

}  // namespace vramswap
