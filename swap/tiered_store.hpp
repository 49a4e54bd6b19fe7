// tiered_store: the page store, a chain of tiers.
//
//   slots    a slot provider (swap/slot_provider.hpp): this process's own pinned chunks
//            (pinned_slots), or the slots of the device's shared host pool (pool_slots,
//            with a few pinned slots of its own behind it when there is a swap file:
//            fallback_slots). The pager copies to and from these slots; with a backing
//            tier they are also registered with the swap file's io_uring as fixed
//            buffers, so a page moves device -> slot -> disk and back with no extra copy.
//   budget   optional: at most this many slots are used (VRAMSWAP_HOST_LIMIT); without
//            one, the provider's own size is the limit (a shared pool is full when its
//            slots are all taken; own chunks without a budget grow as needed).
//   backing  optional: a swap_file (swap/swap_file.hpp), one unlinked O_DIRECT file per
//            process and device, extents of one page, io_uring at `queue_depth` requests.
//
// Which tier holds a page is the store's business: tier_of(key) says (page_store's tiers:
// 0 the slots, 1 the backing tier), and core names none of them. The chains in use are
// built from the options by make_page_store (swap/store_chain.hpp).
//
// Without a backing tier a store with no free slot can only wait: for own chunks it never
// has to (they grow); with the shared pool, slot_for_write sleeps until another process
// gives a slot back, up to VRAMSWAP_EVICT_TIMEOUT, and try_slot_for_write answers err_busy
// at once (core/page_store.hpp; the deadlock argument is in docs/swap.md).
//
// Spilling (eviction). slot_for_write() needs a free slot. Under the budget, and while the
// provider has one, it takes one; at the budget or with the provider empty it writes least recently used pages to disk and frees their slots. The
// writes are asynchronous and run ahead: once the free slots fall below `spill_ahead`
// pages, the oldest pages are queued for writing, so the disk is busy while the caller's
// device-to-host copies fill the next slots: both links work at once, and eviction runs at
// the slower one's rate. A clean page (its disk copy is still valid) is dropped without
// a write.
//   What may not be spilled: a slot the caller may still be copying into. The pager keeps
// at most `copies_in_flight` copies queued and asks for each slot just before queueing its
// copy, so the last `write_window` slots handed out by slot_for_write are never spilled;
// write_window must be at least the pager's copies_in_flight (both default to 16). Nor a
// slot handed out by slot_for_read and not yet given back (read_done or release): the
// caller may still be copying out of it.
//
// Reserving disk space (expect_saves). An eviction tells the store how many pages it is about
// to save. The store computes how many of them (with the pages it holds) will not fit the
// host budget and have no disk extent yet, adds spill_ahead pages (writes started ahead of
// need), and reserves that many extents in the swap file with one fallocate before the first
// write goes out; the file grows geometrically beyond that (swap/swap_file.hpp). spill_all
// reserves for the pages it writes the same way. Without a hint, the file grows as it is
// written, by the same rule.
//
// Reading back (restore). slot_for_read() of a page on disk takes a slot (a staging
// buffer: `read_ahead` + 1 slots of the budget are kept for this, so a budget full of
// saved pages can still read back), reads the page into it and returns it; the caller copies it on to the device.
// Pages are restored in ascending key order, so it also starts reading the next
// `read_ahead` disk pages into free slots: the disk reads of pages i+1.. overlap the
// host-to-device copy of page i. read_done(key) gives the slot back as soon as the caller's
// copy is complete (the page stays saved on disk until release), so a restore larger than
// the budget stays within it. Without read_done the slots stay the caller's until release
// and the store goes past the budget for them (it has no choice: the caller may still be
// reading them); it says so once in the log. Reads never cause writes: a read that finds
// no free staging slot drops a clean page, waits for one, or goes past the budget.
//
// LRU. Every slot_for_write and slot_for_read makes the page the most recently used.
//
// Errors never lose a page. A failed write (EIO, ENOSPC, a short write) leaves the page in
// its slot and frees the extent; the error reaches the caller of the slot_for_write that
// needed the room (err_io, err_no_space with the detail), which then keeps its page where
// it was (the pager leaves it resident). A failed read leaves the page on disk and frees
// the slot; slot_for_read returns the error, and can be asked again.
//
// With the shared pool, pages spilled give their pool slots back at once: another process
// may take them. A process whose pool slots are all taken by others stages its pages
// through its own fallback slots.
//
// Thread-safe: one mutex (let go only while waiting for another process's give-back). Completions are collected inside calls (no thread of its own):
// writes that run ahead finish in the kernel and are accounted at the next call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/page_store.hpp"
#include "swap/slot_provider.hpp"
#include "swap/swap_file.hpp"

namespace vramswap::detail {

struct tiered_config {
  size_t slot_size = 0;        // bytes per page (required)
  uint64_t host_limit = 0;     // 0: VRAMSWAP_HOST_LIMIT (size or percent of RAM)
  std::string swap_dir;        // "": VRAMSWAP_SWAP_DIR
  unsigned queue_depth = 0;    // 0: VRAMSWAP_SWAP_QUEUE_DEPTH
  size_t block_size = 0;       // 0: VRAMSWAP_SWAP_BLOCK
  uint64_t grow_step = 0;      // 0: VRAMSWAP_SWAP_EXTENT
  size_t chunk_slots = 16;     // slots per pinned chunk
  unsigned write_window = 16;  // newest slot_for_write slots never spilled (>= pager copies_in_flight)
  unsigned spill_ahead = 0;    // 0: enough pages to keep queue_depth blocks busy, at least 2
  unsigned read_ahead = 0;     // 0: same
  bool make_ahead = false;     // pin slots ahead of need as the owner's memory grows (may_save)
  io_faults* faults = nullptr;  // tests only
  std::string label = "device 0";
};

struct tiered_stats {
  uint64_t host_bytes = 0;      // saved pages with a host copy
  uint64_t disk_bytes = 0;      // saved pages only on disk
  uint64_t pinned_bytes = 0;    // slots pinned, used or free
  uint64_t bytes_written = 0;   // to disk, total
  uint64_t bytes_read = 0;      // from disk, total
  uint64_t pages_dropped_clean = 0;  // freed without a write: disk copy still valid
  uint64_t file_bytes = 0;      // swap file size (reserved)
  uint64_t budget_overruns = 0; // slots taken past the budget (see the class comment)
};

// The swap file's settings from `cfg`, its zeros replaced by the options (VRAMSWAP_SWAP_*).
int swap_file_config_from_options(const tiered_config& cfg, swap_file_config* out);

// Pages written (or read) ahead that keep a swap file of `fc`'s queue busy, for pages of
// `slot_size` bytes: what spill_ahead and read_ahead default to.
unsigned pages_ahead(const swap_file_config& fc, size_t slot_size);

// A chain, as make_page_store and the stores below assemble it.
struct tier_chain {
  std::unique_ptr<slot_provider> slots;  // required
  size_t budget_slots = 0;               // 0: no budget (only with no backing tier or a shared pool)
  std::unique_ptr<swap_file> backing;    // optional
  unsigned write_window = 16;            // as in tiered_config
  unsigned spill_ahead = 0;
  unsigned read_ahead = 0;
  bool make_ahead = false;
  std::string label = "device 0";
};

class tiered_store : public page_store {
 public:
  // The host budget with the swap file behind it, from `cfg` and the options. Opens the
  // swap file at once: a directory that cannot hold it is an error here (err_unavailable
  // with the reason), not at the first eviction.
  static int create(backend& be, tiered_config cfg, std::unique_ptr<tiered_store>* out);
  // Any chain; `spill_ahead`/`read_ahead` 0 are sized from the backing tier's queue.
  static int assemble(tier_chain chain, std::unique_ptr<tiered_store>* out);
  ~tiered_store() override;  // waits for disk requests in flight
  tiered_store(const tiered_store&) = delete;
  tiered_store& operator=(const tiered_store&) = delete;

  int slot_for_write(uint64_t key, size_t size, void** host) override;
  int try_slot_for_write(uint64_t key, size_t size, void** host) override;
  int slot_for_read(uint64_t key, void** host) override;
  int release(uint64_t key) override;
  bool holds(uint64_t key) const override;
  uint64_t bytes_held() const override;
  uint64_t host_bytes_pinned() const override;
  void owner_mapping(bool mapping) override;
  void read_done(uint64_t key) override;
  int expect_saves(uint64_t pages) override;
  // With make_ahead: the slots make ahead, up to `pages` (at most the budget).
  void may_save(uint64_t pages) override;
  unsigned tier_count() const override { return file_ ? 2 : 1; }
  unsigned tier_of(uint64_t key) const override;
  uint64_t bytes_in_tier(unsigned tier) const override;
  const char* tier_name(unsigned tier) const override;

  // Wait for every disk request in flight; returns the first error among them, if any
  // (the pages concerned stay in their slots).
  int flush();
  // Write every page that has no valid disk copy to disk and free its slot, except slots
  // lent out or in the write window. For tests and benchmarks.
  int spill_all();
  tiered_stats stats() const;
  swap_file::io_stats io_stats() const;  // zeros without a backing tier
  uint64_t host_limit() const noexcept { return budget_slots_ * slot_size_; }
  size_t slot_size() const noexcept { return slot_size_; }
  bool has_backing() const noexcept { return file_ != nullptr; }

 protected:
  explicit tiered_store(tier_chain chain);
  // For the stores that add to a chain (host_tier, pool_host_store): under the mutex.
  template <class F>
  auto with_slots(F&& f) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return f(*slots_);
  }
  size_t pages_with_slot() const;

 private:
  enum class io : uint8_t { none, writing, reading };
  struct entry {
    char* slot = nullptr;      // host memory, or nullptr
    int64_t extent = -1;       // disk extent, or -1
    bool host_valid = false;   // slot holds the page (false while a read fills it)
    bool disk_valid = false;   // extent holds the page (false while a write fills it)
    io state = io::none;
    bool lent = false;         // slot handed out by slot_for_read, not yet given back
    uint64_t seq = 0;          // slot_for_write sequence number (0: never)
    std::list<uint64_t>::iterator lru;
    int read_status = 0;       // outcome of the last read, for slot_for_read
    std::string read_detail;
  };

  int write_slot(uint64_t key, size_t size, bool wait, void** host);
  int take_slot_locked(std::unique_lock<std::mutex>& lock, bool for_write, bool wait, char** out);
  // take_slot_locked's steps (tiered_store.cpp).
  bool drop_or_spill_locked(bool for_write, bool cannot_grow, int* spill_rc);
  void note_overrun_locked(bool for_write);
  void give_slot_locked(char* slot);
  int start_spill_locked(uint64_t key, entry& e);
  void spill_ahead_locked();
  void read_ahead_locked(uint64_t after);
  int reap_locked(bool wait);
  void on_complete(const swap_file::completion& c);
  void drop_slot_locked(entry& e);
  void drop_extent_locked(entry& e);
  int wait_idle_locked(uint64_t key);
  bool protected_locked(const entry& e) const;
  void touch_locked(uint64_t key, entry& e);

  std::unique_ptr<slot_provider> slots_;
  const size_t slot_size_;
  size_t budget_slots_ = 0;   // VRAMSWAP_HOST_LIMIT in slots; 0: none
  size_t staging_slots_ = 0;  // of those, kept for reads back from disk (read_ahead + 1)
  unsigned write_window_;
  unsigned spill_ahead_;
  unsigned read_ahead_;
  const bool make_ahead_;
  std::unique_ptr<swap_file> file_;
  mutable std::mutex mutex_;
  size_t slots_used_ = 0;               // slots assigned to entries
  std::map<uint64_t, entry> pages_;     // key -> where its bytes are
  std::list<uint64_t> lru_;             // keys with a slot, oldest first
  uint64_t write_seq_ = 0;
  size_t writes_in_flight_ = 0;
  size_t reads_in_flight_ = 0;
  // When the host tier last failed to grow (0: never): it is not grown again for this long
  // while it has no free slot (take_slot_locked).
  static constexpr uint64_t k_grow_retry_ns = 1'000'000'000;
  uint64_t grow_failed_ns_ = 0;
  // The first failure of a write that ran ahead, for the caller that needs the room it
  // would have made; it lapses when that page is written after all, or released.
  int pending_error_ = 0;
  uint64_t pending_key_ = 0;
  std::string pending_detail_;
  int take_pending_error_locked();  // the pending error (set: caller checked), cleared, as this call's
  bool overrun_logged_ = false;
  tiered_stats stats_;
};

}  // namespace vramswap::detail
