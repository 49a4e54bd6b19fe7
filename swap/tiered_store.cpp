#include "swap/tiered_store.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace vramswap::detail {

tiered_store::tiered_store(backend& be, const tiered_config& cfg)
    : be_(be),
      slot_size_(cfg.slot_size),
      chunk_slots_(cfg.chunk_slots == 0 ? 1 : cfg.chunk_slots),
      write_window_(cfg.write_window),
      spill_ahead_(cfg.spill_ahead),
      read_ahead_(cfg.read_ahead) {}

int tiered_store::create(backend& be, tiered_config cfg, std::unique_ptr<tiered_store>* out) {
  if (cfg.slot_size == 0 || cfg.slot_size % 4096 != 0) {
    return fail(err_invalid_argument, "tiered store: page size %zu is not a positive multiple of 4 KiB", cfg.slot_size);
  }
  if (cfg.host_limit == 0) VS_TRY(option_size(option_id::host_limit, &cfg.host_limit, physical_ram()));
  if (cfg.swap_dir.empty()) cfg.swap_dir = option_text(option_id::swap_dir);
  if (cfg.queue_depth == 0) {
    uint64_t v = 0;
    VS_TRY(option_uint(option_id::swap_queue_depth, &v));
    cfg.queue_depth = static_cast<unsigned>(v);
  }
  if (cfg.block_size == 0) {
    uint64_t v = 0;
    VS_TRY(option_size(option_id::swap_block, &v));  // its form: a multiple of 4 KiB, 4 KiB..1 GiB
    cfg.block_size = static_cast<size_t>(v);
  }
  if (cfg.grow_step == 0) VS_TRY(option_size(option_id::swap_extent, &cfg.grow_step));

  std::unique_ptr<tiered_store> s(new tiered_store(be, cfg));
  const unsigned pages_per_queue =
      static_cast<unsigned>((static_cast<uint64_t>(cfg.queue_depth) * std::min(cfg.block_size, cfg.slot_size) + cfg.slot_size - 1) /
                            cfg.slot_size);
  const unsigned ahead = std::max(4u, 2 * pages_per_queue);  // >= 4 pages keeps the queue full between pages
  if (s->spill_ahead_ == 0) s->spill_ahead_ = ahead;
  if (s->read_ahead_ == 0) s->read_ahead_ = ahead;
  s->staging_slots_ = s->read_ahead_ + 1;
  s->budget_slots_ = static_cast<size_t>(cfg.host_limit / cfg.slot_size);
  const size_t least = s->write_window_ + s->staging_slots_ + 1;
  if (s->budget_slots_ < least) {
    // Pages whose copy in may still be running cannot go to disk, and restores need their
    // staging slots: the budget must have room for both and one more page.
    log(log_level::warn,
        "VRAMSWAP_HOST_LIMIT: %" PRIu64 " bytes hold fewer than %zu pages of %zu bytes (%u copies that may be in flight, %zu "
        "staging slots for reading back, one more); using %" PRIu64 " bytes",
        cfg.host_limit, least, cfg.slot_size, s->write_window_, s->staging_slots_, static_cast<uint64_t>(least) * cfg.slot_size);
    s->budget_slots_ = least;
  }
  s->spill_ahead_ = static_cast<unsigned>(std::min<size_t>(s->spill_ahead_, s->budget_slots_ - s->staging_slots_ - s->write_window_));

  swap_file_config fc;
  fc.dir = cfg.swap_dir;
  fc.extent_size = cfg.slot_size;
  fc.queue_depth = cfg.queue_depth;
  fc.block_size = cfg.block_size;
  fc.grow_step = cfg.grow_step;
  fc.faults = cfg.faults;
  fc.label = cfg.label;
  VS_TRY(swap_file::open(fc, &s->file_));
  log(log_level::debug,
      "tiered store for %s: pages of %zu bytes, host budget %zu pages (%" PRIu64 " bytes), swap file in %s, queue depth %u, "
      "blocks of %zu bytes, spill ahead %u pages, read ahead %u pages",
      cfg.label.c_str(), cfg.slot_size, s->budget_slots_, s->host_limit(), cfg.swap_dir.c_str(), cfg.queue_depth, cfg.block_size,
      s->spill_ahead_, s->read_ahead_);
  *out = std::move(s);
  return ok;
}

tiered_store::~tiered_store() {
  file_.reset();  // waits for requests in flight: the kernel may still be using our slots
  for (const chunk& c : chunks_) {
    be_.host_unregister(c.base);
    ::munmap(c.base, c.bytes);
  }
}

// --- slots ---------------------------------------------------------------------------------

int tiered_store::grow_locked(size_t slots) {
  const size_t bytes = slot_size_ * slots;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return fail(err_out_of_memory, "tiered store: cannot map %zu more bytes of host memory (%s)", bytes, std::strerror(errno));
  }
  ::madvise(p, bytes, MADV_HUGEPAGE);
  if (::madvise(p, bytes, MADV_POPULATE_WRITE) != 0) {
    if (errno != EINVAL) {
      const int e = errno;
      ::munmap(p, bytes);
      return fail(err_out_of_memory, "tiered store: cannot fault in %zu bytes of host memory (%s)", bytes, std::strerror(e));
    }
    std::memset(p, 0, bytes);
  }
  const int rc = be_.host_register(p, bytes);
  if (rc != ok) {
    ::munmap(p, bytes);
    return add_context(rc, "tiered store: pinning a %zu-byte chunk: ", bytes);
  }
  file_->add_buffer(p, bytes);
  chunks_.push_back(chunk{static_cast<char*>(p), bytes});
  stats_.pinned_bytes += bytes;
  for (size_t i = slots; i-- > 0;) free_.push_back(static_cast<char*>(p) + i * slot_size_);
  return ok;
}

bool tiered_store::protected_locked(const entry& e) const {
  return e.seq != 0 && e.seq + write_window_ > write_seq_;
}

void tiered_store::touch_locked(uint64_t key, entry& e) {
  if (e.slot != nullptr) lru_.splice(lru_.end(), lru_, e.lru);
  (void)key;
}

void tiered_store::drop_slot_locked(entry& e) {
  if (e.slot == nullptr) return;
  lru_.erase(e.lru);
  free_.push_back(e.slot);
  e.slot = nullptr;
  e.host_valid = false;
  e.lent = false;
  --slots_used_;
}

void tiered_store::drop_extent_locked(entry& e) {
  if (e.extent < 0) return;
  file_->free_extent(static_cast<uint64_t>(e.extent));
  e.extent = -1;
  e.disk_valid = false;
}

int tiered_store::start_spill_locked(uint64_t key, entry& e) {
  uint64_t extent = 0;
  VS_TRY(file_->alloc_extent(&extent));
  e.extent = static_cast<int64_t>(extent);
  e.disk_valid = false;
  e.state = io::writing;
  ++writes_in_flight_;
  file_->submit(true, extent, e.slot, key);
  return ok;
}

// A free slot for a new saved copy (for_write) or a read from disk. Under the budget: take
// one. At the budget: drop a clean page, or write the oldest pages out and wait for one.
int tiered_store::take_slot_locked(bool for_write, char** out) {
  // Saved pages may fill the budget less the staging slots; reads back may use those too.
  const size_t limit = for_write ? budget_slots_ - staging_slots_ : budget_slots_;
  for (;;) {
    VS_TRY(reap_locked(false));
    if (slots_used_ < limit) {
      if (free_.empty()) {
        const size_t pinned = slots_used_;  // all pinned slots are in use
        VS_TRY(grow_locked(std::min(chunk_slots_, budget_slots_ - pinned)));
      }
      break;
    }
    bool dropped = false;
    int spill_rc = ok;
    for (auto it = lru_.begin(); it != lru_.end();) {
      const uint64_t key = *it++;
      entry& e = pages_.at(key);
      if (e.state != io::none || e.lent || !e.host_valid || protected_locked(e)) continue;
      if (e.disk_valid) {
        drop_slot_locked(e);
        ++stats_.pages_dropped_clean;
        dropped = true;
        break;
      }
      if (!for_write || writes_in_flight_ >= spill_ahead_) continue;  // reads never cause writes
      if ((spill_rc = start_spill_locked(key, e)) != ok) break;
    }
    if (dropped) continue;
    if (for_write && pending_error_ != ok) {
      const int rc = pending_error_;
      pending_error_ = ok;
      return fail(rc, "%s", pending_detail_.c_str());
    }
    if (writes_in_flight_ > 0 || reads_in_flight_ > 0) {
      VS_TRY(reap_locked(true));
      continue;
    }
    if (spill_rc != ok) return spill_rc;  // e.g. err_no_space, with its detail
    // Nothing may go to disk: every slot is lent out or may still be being copied into.
    if (!overrun_logged_) {
      overrun_logged_ = true;
      log(log_level::info,
          "tiered store: going past VRAMSWAP_HOST_LIMIT (%" PRIu64 " bytes) for slots the caller still holds (%s); the "
          "caller can give them back earlier with read_done()",
          host_limit(), for_write ? "the newest copies" : "pages it restored");
    }
    ++stats_.budget_overruns;
    if (free_.empty()) VS_TRY(grow_locked(chunk_slots_));
    break;
  }
  *out = free_.back();
  free_.pop_back();
  ++slots_used_;
  return ok;
}

// Keep `spill_ahead_` pages of room coming: free slots under the budget plus writes in flight.
void tiered_store::spill_ahead_locked() {
  const size_t room = slots_used_ < budget_slots_ ? budget_slots_ - slots_used_ : 0;
  if (room + writes_in_flight_ >= spill_ahead_) return;
  size_t want = spill_ahead_ - room - writes_in_flight_;
  for (auto it = lru_.begin(); it != lru_.end() && want > 0;) {
    const uint64_t key = *it++;
    entry& e = pages_.at(key);
    if (e.state != io::none || e.lent || !e.host_valid || e.disk_valid || protected_locked(e)) continue;
    if (start_spill_locked(key, e) != ok) {
      clear_error();  // the slot_for_write that needs the room will meet the error itself
      return;
    }
    --want;
  }
}

// Start reading the next disk-only pages after `after` into free slots under the budget.
void tiered_store::read_ahead_locked(uint64_t after) {
  unsigned scanned = 0;
  for (auto it = pages_.upper_bound(after); it != pages_.end() && reads_in_flight_ < read_ahead_ && scanned < 4 * read_ahead_;
       ++it, ++scanned) {
    entry& e = it->second;
    if (e.slot != nullptr || !e.disk_valid || e.state != io::none) continue;
    if (slots_used_ >= budget_slots_) return;  // the staging slots are in use
    if (free_.empty() && grow_locked(std::min(chunk_slots_, budget_slots_ - slots_used_)) != ok) {
      clear_error();
      return;
    }
    e.slot = free_.back();
    free_.pop_back();
    ++slots_used_;
    e.lru = lru_.insert(lru_.end(), it->first);
    e.host_valid = false;
    e.state = io::reading;
    ++reads_in_flight_;
    file_->submit(false, static_cast<uint64_t>(e.extent), e.slot, it->first);
  }
}

int tiered_store::reap_locked(bool wait) {
  std::vector<swap_file::completion> done;
  VS_TRY(file_->reap(wait, &done));
  for (const auto& c : done) on_complete(c);
  return ok;
}

void tiered_store::on_complete(const swap_file::completion& c) {
  entry& e = pages_.at(c.tag);
  if (e.state == io::writing) {
    --writes_in_flight_;
    e.state = io::none;
    if (c.status == ok) {
      e.disk_valid = true;
      stats_.bytes_written += slot_size_;
      if (!e.lent && !protected_locked(e)) drop_slot_locked(e);
    } else {
      drop_extent_locked(e);
      if (pending_error_ == ok) {
        pending_error_ = c.status;
        pending_detail_ = c.detail + "; the page stays in host memory, nothing lost";
      }
      log(log_level::warn, "tiered store: %s", c.detail.c_str());
    }
  } else if (e.state == io::reading) {
    --reads_in_flight_;
    e.state = io::none;
    e.read_status = c.status;
    e.read_detail = c.detail;
    if (c.status == ok) {
      e.host_valid = true;
      stats_.bytes_read += slot_size_;
    } else {
      drop_slot_locked(e);
      log(log_level::warn, "tiered store: %s", c.detail.c_str());
    }
  }
}

int tiered_store::wait_idle_locked(uint64_t key) {
  while (pages_.at(key).state != io::none) VS_TRY(reap_locked(true));
  return ok;
}

// --- page_store -----------------------------------------------------------------------------

int tiered_store::slot_for_write(uint64_t key, size_t size, void** host) {
  if (size > slot_size_) {
    return fail(err_invalid_argument, "tiered store: page %" PRIu64 " of %zu bytes does not fit a %zu-byte slot", key, size,
                slot_size_);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pages_.find(key);
  if (it != pages_.end()) {
    VS_TRY(wait_idle_locked(key));
    entry& e = it->second;
    if (e.slot == nullptr) {
      char* slot = nullptr;
      VS_TRY(take_slot_locked(true, &slot));
      e.slot = slot;
      e.lru = lru_.insert(lru_.end(), key);
    }
    drop_extent_locked(e);  // the caller is about to write new bytes: the disk copy is stale
    e.host_valid = true;
    e.lent = false;
    e.seq = ++write_seq_;
    touch_locked(key, e);
    *host = e.slot;
  } else {
    char* slot = nullptr;
    VS_TRY(take_slot_locked(true, &slot));
    entry& e = pages_[key];
    e.slot = slot;
    e.lru = lru_.insert(lru_.end(), key);
    e.host_valid = true;
    e.seq = ++write_seq_;
    *host = slot;
  }
  spill_ahead_locked();
  return ok;
}

int tiered_store::slot_for_read(uint64_t key, void** host) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pages_.find(key);
  if (it == pages_.end()) return fail(err_invalid_argument, "tiered store: no saved copy of page %" PRIu64, key);
  entry& e = it->second;
  if (e.state == io::reading) VS_TRY(wait_idle_locked(key));  // read ahead: let it finish
  if (e.slot != nullptr && e.host_valid) {
    e.lent = true;
    touch_locked(key, e);
    *host = e.slot;
    read_ahead_locked(key);
    return ok;
  }
  // Only on disk: read it into a slot (a staging buffer for the caller's copy to the device).
  char* slot = nullptr;
  const int rc = take_slot_locked(false, &slot);
  if (rc != ok) return add_context(rc, "tiered store: reading page %" PRIu64 " back from disk (it stays there): ", key);
  e.slot = slot;
  e.lru = lru_.insert(lru_.end(), key);
  e.host_valid = false;
  e.state = io::reading;
  ++reads_in_flight_;
  file_->submit(false, static_cast<uint64_t>(e.extent), slot, key);
  read_ahead_locked(key);
  VS_TRY(wait_idle_locked(key));
  if (e.read_status != ok) {
    return fail(e.read_status, "%s; page %" PRIu64 " stays on disk, nothing lost", e.read_detail.c_str(), key);
  }
  e.lent = true;
  *host = e.slot;
  return ok;
}

void tiered_store::read_done(uint64_t key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pages_.find(key);
  if (it == pages_.end()) return;
  entry& e = it->second;
  e.lent = false;
  if (e.slot != nullptr && e.disk_valid && e.state == io::none) {
    drop_slot_locked(e);  // the disk copy stays the page's home until release
    ++stats_.pages_dropped_clean;
  }
}

int tiered_store::release(uint64_t key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pages_.find(key);
  if (it == pages_.end()) return ok;
  VS_TRY(wait_idle_locked(key));  // the kernel may be using its slot
  drop_slot_locked(it->second);
  drop_extent_locked(it->second);
  pages_.erase(it);
  return ok;
}

bool tiered_store::holds(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pages_.count(key) != 0;
}

uint64_t tiered_store::bytes_held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<uint64_t>(pages_.size()) * slot_size_;
}

uint64_t tiered_store::bytes_on_disk() const {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t n = 0;
  for (const auto& [key, e] : pages_) n += e.slot == nullptr ? 1 : 0;
  return n * slot_size_;
}

bool tiered_store::on_disk(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pages_.find(key);
  return it != pages_.end() && it->second.slot == nullptr;
}

int tiered_store::flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  while (writes_in_flight_ > 0 || reads_in_flight_ > 0) VS_TRY(reap_locked(true));
  if (pending_error_ != ok) {
    const int rc = pending_error_;
    pending_error_ = ok;
    return fail(rc, "%s", pending_detail_.c_str());
  }
  return ok;
}

int tiered_store::expect_saves(uint64_t pages) {
  std::lock_guard<std::mutex> lock(mutex_);
  // After the saves, at most `room` saved pages have a host slot (the rest of the budget is
  // for reading back); every other page needs an extent, and some pages have one already.
  const uint64_t room = budget_slots_ - staging_slots_;
  const uint64_t total = pages_.size() + pages;
  uint64_t with_extent = 0;
  for (const auto& [key, e] : pages_) with_extent += e.extent >= 0 ? 1 : 0;
  if (total <= room + with_extent) return ok;
  // Writes run up to spill_ahead pages ahead of need.
  const uint64_t extents = total - room - with_extent + spill_ahead_;
  const int rc = file_->reserve(extents);
  if (rc != ok) log(log_level::info, "tiered store: reserving disk space for %" PRIu64 " pages ahead: %s", extents, last_error());
  return rc;
}

int tiered_store::spill_all() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::vector<uint64_t> keys(lru_.begin(), lru_.end());  // reaping below changes lru_
    uint64_t dirty = 0;
    for (const uint64_t key : keys) {
      const entry& e = pages_.at(key);
      dirty += e.state == io::none && !e.lent && e.host_valid && !e.disk_valid && !protected_locked(e) ? 1 : 0;
    }
    // One reservation for all of them; if it fails, each page meets the error on its own.
    if (file_->reserve(dirty) != ok) clear_error();
    for (const uint64_t key : keys) {
      entry& e = pages_.at(key);
      if (e.state != io::none || e.lent || !e.host_valid || protected_locked(e)) continue;
      if (e.disk_valid) {
        drop_slot_locked(e);
        ++stats_.pages_dropped_clean;
        continue;
      }
      while (writes_in_flight_ >= spill_ahead_) VS_TRY(reap_locked(true));
      VS_TRY(start_spill_locked(key, e));
    }
  }
  return flush();
}

tiered_stats tiered_store::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  tiered_stats s = stats_;
  for (const auto& [key, e] : pages_) (e.slot == nullptr ? s.disk_bytes : s.host_bytes) += slot_size_;
  s.file_bytes = file_->file_bytes();
  return s;
}

}  // namespace vramswap::detail

namespace vramswap::detail {
swap_file::io_stats tiered_store::io_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return file_->stats();
}
}  // namespace vramswap::detail
