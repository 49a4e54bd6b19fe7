// swap_file: one process's swap file for one device, driven through io_uring.
//
// The file. Created unlinked (open(dir, O_TMPFILE | O_RDWR | O_DIRECT, 0600)), so it has no
// name for anyone to open and disappears with the process, however it ends. It is divided
// into extents of one page each. Space is reserved with fallocate() before it is written,
// so a full filesystem is found when space is reserved (ENOSPC from fallocate), not halfway
// through a page's write.
//   Reserving ahead. A spill (an eviction that pushes pages past the host budget) knows how
// many pages it will write; reserve(n) makes sure n extents are free with ONE fallocate,
// before the first write of the spill is submitted. A fallocate while writes are in flight
// drains the queue (ext4 and xfs take the inode lock and wait for every O_DIRECT request,
// inode_dio_wait), and it can itself take hundreds of milliseconds when the filesystem's
// journal is busy (measured: an 8 GiB fallocate took 0.3-0.6 s while another file was
// being freed, 0.007 s on a quiet disk). The file grows geometrically: by at least what is
// missing, at least `grow_step`, and at least half of its size, rounded up to whole
// `grow_step`s, so a process that spills repeatedly makes few, large reservations; the part
// beyond what is missing takes at most half of the filesystem's free space. When no
// reservation was made (or it was too small), alloc_extent() grows the file by the same
// rule. On ENOSPC the attempt is given back (ext4 keeps what a failed fallocate allocated:
// the file is truncated to its previous size), then exactly what is missing is tried, then
// (alloc_extent) one extent; the file's size and every page in it are unchanged by a
// failure.
//   Free space. Free extents are kept in two maps, lowest offset first (so the file stays
// compact): extents that were written before and freed since, and extents reserved and never
// written. Written ones are reused first: overwriting written blocks is cheaper on ext4 than
// writing into fallocate'd (unwritten) ones, which must be converted to written at each
// write's completion (a journal transaction); on the test VM's disk a plain writer overwrote
// at 1.5-1.8 times the rate it wrote a new file (bench/results/disk_tier.md).
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
//   Submission. Whatever SQEs the ring holds are submitted at every submit() and reap(), not
// only when new ones were added, so none is left behind. EAGAIN (the kernel could not
// allocate requests) and EBUSY (its completion queue is full, which reaping frees) are
// retried with pauses growing to 100 ms while completions are reaped; a wait for completions
// lasts at most that long before submitting again. Submission that keeps failing so for
// `submit_patience_ms`, or fails with any other error, fails every block the kernel has not
// taken (those in the ring and those queued) with err_io and a detail "io_uring_submit
// failed: <cause>" naming the file and what to do, instead of waiting for completions that
// cannot come. Such a block's SQE is turned into a no-op (see fail_unsubmitted()), so its
// buffer is never touched: a failed write leaves the page where it was, a failed read fills
// nothing.
//
// Faults. Tests replace the io_faults seam to turn the Nth completion into -EIO or a short
// count, to make io_uring_submit fail (EAGAIN, EBUSY or a hard error), or to make the
// directory look like one without O_DIRECT. It is a constructor argument, not an
// environment variable: nothing a user sets can trip it.
//
// Not thread-safe: the owner (tiered_store) serializes every call.
#pragma once

#include <liburing.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace vramswap::detail {

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
  // Before io_uring_submit would hand the `ready` SQEs in the ring to the kernel (the nth
  // call, numbered from 0 per file): return 0 to go ahead, or -errno to make the call fail
  // with that error as the kernel fails it, having taken none of them (they stay in the ring).
  virtual int on_submit(uint64_t nth, unsigned ready) {
    (void)nth, (void)ready;
    return 0;
  }
};

struct swap_file_config {
  std::string dir;              // where to create the file
  size_t extent_size = 0;       // bytes per extent: one page (a multiple of 4 KiB)
  unsigned queue_depth = 32;    // blocks in flight
  size_t block_size = 1 << 20;  // bytes per request (a page is split into blocks)
  uint64_t grow_step = 1ull << 30;  // least growth (and its unit), rounded up to whole extents
  unsigned submit_patience_ms = 5000;  // EAGAIN/EBUSY from io_uring_submit this long: the blocks fail
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
  const swap_file_config& config() const noexcept { return cfg_; }
  ~swap_file();  // waits for requests in flight: the kernel may still be using buffers
  swap_file(const swap_file&) = delete;
  swap_file& operator=(const swap_file&) = delete;

  // Register [base, base+bytes) (pinned, page aligned) for fixed-buffer I/O. Best effort:
  // memory that is not registered is transferred with plain reads and writes. May be called
  // from any thread, while transfers run (a host tier pinning ahead registers its chunks on
  // its own thread: registering pins the pages again, which takes time).
  void add_buffer(void* base, size_t bytes);

  // Make sure `extents` extents are free, growing the file (one fallocate, see above) if
  // fewer are. err_no_space when the filesystem cannot hold what is missing (the file and
  // its pages unchanged), err_io for other fallocate failures.
  int reserve(uint64_t extents);
  // An extent for one page: a free one written before (lowest offset first), else a reserved
  // one never written (lowest first), else the file grows. Errors as reserve().
  int alloc_extent(uint64_t* extent);
  void free_extent(uint64_t extent);

  // Queue a whole-extent transfer between `buf` (extent_size bytes) and `extent`.
  void submit(bool write, uint64_t extent, void* buf, uint64_t tag);
  // Collect finished requests into `out` (appended). wait: block until at least one
  // request finishes (returns at once when none is in flight).
  int reap(bool wait, std::vector<completion>* out);
  // Requests (pages) submitted and not yet reaped.
  size_t requests_in_flight() const noexcept { return requests_; }

  uint64_t extents_used() const noexcept { return extents_total_ - extents_free(); }
  uint64_t extents_free() const noexcept { return free_written_.size() + free_fresh_.size(); }
  uint64_t file_bytes() const noexcept { return extents_total_ * cfg_.extent_size; }
  bool fixed_buffers() const noexcept { return fixed_buffers_; }
  const std::string& dir() const noexcept { return cfg_.dir; }

  // Where the time goes (for benchmarks): blocks in the ring integrated over time.
  struct io_stats {
    uint64_t submits = 0;      // io_uring_submit calls (failed ones included)
    uint64_t sqes = 0;         // blocks put in the ring
    uint64_t waits = 0;        // waits for completions (each at most a slice, see reap())
    uint64_t grows = 0;        // fallocate calls (failed ones included)
    double grow_s = 0;         // seconds in fallocate (and in giving back a failed one)
    uint64_t grows_in_flight = 0;  // of those, made with blocks in the ring (which they drain)
    uint64_t grow_bytes = 0;   // bytes reserved by the fallocate calls that succeeded
    uint64_t largest_grow = 0; // the largest of them, bytes
    uint64_t fresh_writes = 0; // page writes into extents never written before
    uint64_t overwrites = 0;   // page writes into extents written before
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
    unsigned stalls;   // completions in a row without progress
    unsigned retries;  // completions in a row that asked to be tried again (EAGAIN, EINTR)
  };
  struct request {
    uint64_t tag;
    bool write;
    uint64_t extent;
    unsigned blocks_left;
    int error;  // first -errno (or -EIO for short), 0 if none
    uint64_t error_offset;
    bool short_transfer;
    bool retried_out;  // error: EAGAIN or EINTR k_max_retries times in a row
    std::string not_submitted;  // why a block of it never reached the kernel ("" if none)
  };

  explicit swap_file(const swap_file_config& cfg) : cfg_(cfg) {}
  int setup();
  void pump();                      // fill_ring(), then submit_ready()
  void fill_ring();                 // move queued blocks into the ring, up to queue_depth
  void prepare(struct io_uring_sqe* sqe, block* b);
  void submit_ready();              // hand the ring's SQEs to the kernel; see the top
  int submit_once();                // io_uring_submit (or the fault seam's error)
  void forget_taken();              // drop from not_taken_ the SQEs the kernel has taken
  void fail_unsubmitted(int e, const std::string& why);
  void drain_completions();         // every completion the ring holds, through handle()
  void handle(struct io_uring_cqe* cqe);
  void finish_block(block* b);      // done or failed: its request completes with its last one
  void complete(request* r);        // into done_
  int wait_a_slice();               // for a completion, until the next submission is due
  int buffer_index(const char* p, unsigned len) const;  // -1 if not registered
  int grow(uint64_t missing, bool one_at_a_time);      // see reserve()
  int try_fallocate(uint64_t extents);                 // -errno; gives a failed attempt back

  swap_file_config cfg_;
  int fd_ = -1;
  struct io_uring ring_ {};
  bool ring_ready_ = false;
  bool fixed_file_ = false;
  bool fixed_buffers_ = false;
  mutable std::mutex buffers_mutex_;  // next_buffer_ and buffers_: add_buffer may come from any thread
  unsigned next_buffer_ = 0;
  std::map<uintptr_t, std::pair<size_t, int>> buffers_;  // base -> (bytes, index)
  std::deque<block*> queued_;                           // not yet in the ring
  // SQEs in the ring the kernel has not taken, in ring order; nullptr: a failed block's no-op.
  std::deque<std::pair<struct io_uring_sqe*, block*>> not_taken_;
  unsigned in_ring_ = 0;            // SQEs in the ring or with the kernel, no-ops included
  size_t requests_ = 0;
  std::vector<completion> done_;    // finished requests not yet reaped
  bool timed_waits_ = false;        // the kernel waits with a timeout without an SQE (EXT_ARG)
  double submit_failing_since_ = 0;  // first EAGAIN/EBUSY of a run of them, 0 if none
  double submit_retry_at_ = 0;      // when to submit again after one, 0: at once
  double submit_pause_ = 0;         // the pause before that retry, doubling
  unsigned submit_failures_ = 0;    // EAGAIN/EBUSY in the current run
  bool submit_failure_logged_ = false;  // since the last submission that succeeded
  uint64_t nth_[2] = {0, 0};  // completions per direction, for io_faults
  uint64_t extents_total_ = 0;
  std::set<uint64_t> free_written_;  // the free-space map: extents written before
  std::set<uint64_t> free_fresh_;    // and extents reserved, never written
  std::vector<bool> written_;        // per extent: a write to it has completed
  io_stats stats_;
  double depth_since_ = 0;   // when in_ring_ last changed
  void account_depth();      // before in_ring_ changes
};

}  // namespace vramswap::detail
