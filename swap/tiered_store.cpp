#include "swap/tiered_store.hpp"

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <cstring>

#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "swap/pinned_slots.hpp"

namespace vramswap::detail {

namespace {
uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}
}  // namespace

tiered_store::tiered_store(tier_chain chain)
    : slots_(std::move(chain.slots)),
      slot_size_(slots_->slot_size()),
      budget_slots_(chain.budget_slots),
      write_window_(chain.write_window),
      spill_ahead_(chain.spill_ahead),
      read_ahead_(chain.read_ahead),
      make_ahead_(chain.make_ahead),
      file_(std::move(chain.backing)) {}

int tiered_store::create(backend& be, tiered_config cfg, std::unique_ptr<tiered_store>* out) {
  if (cfg.slot_size == 0 || cfg.slot_size % 4096 != 0) {
    return fail(err_invalid_argument, "tiered store: page size %zu is not a positive multiple of 4 KiB", cfg.slot_size);
  }
  if (cfg.host_limit == 0) VS_TRY(option_size(option_id::host_limit, &cfg.host_limit, physical_ram()));
  swap_file_config fc;
  VS_TRY(swap_file_config_from_options(cfg, &fc));
  tier_chain chain;
  chain.budget_slots = std::max<size_t>(1, static_cast<size_t>(cfg.host_limit / cfg.slot_size));
  chain.slots = std::make_unique<pinned_slots>(be, cfg.slot_size, cfg.chunk_slots, chain.budget_slots, "tiered store for " + cfg.label);
  chain.write_window = cfg.write_window;
  chain.spill_ahead = cfg.spill_ahead;
  chain.read_ahead = cfg.read_ahead;
  chain.make_ahead = cfg.make_ahead;
  chain.label = cfg.label;
  VS_TRY(swap_file::open(fc, &chain.backing));
  return assemble(std::move(chain), out);
}

int swap_file_config_from_options(const tiered_config& cfg, swap_file_config* out) {
  swap_file_config fc;
  fc.dir = cfg.swap_dir.empty() ? option_text(option_id::swap_dir) : cfg.swap_dir;
  fc.queue_depth = cfg.queue_depth;
  if (fc.queue_depth == 0) {
    uint64_t v = 0;
    VS_TRY(option_uint(option_id::swap_queue_depth, &v));
    fc.queue_depth = static_cast<unsigned>(v);
  }
  fc.block_size = cfg.block_size;
  if (fc.block_size == 0) {
    uint64_t v = 0;
    VS_TRY(option_size(option_id::swap_block, &v));  // its form: a multiple of 4 KiB, 4 KiB..1 GiB
    fc.block_size = static_cast<size_t>(v);
  }
  fc.grow_step = cfg.grow_step;
  if (fc.grow_step == 0) VS_TRY(option_size(option_id::swap_extent, &fc.grow_step));
  fc.extent_size = cfg.slot_size;
  fc.faults = cfg.faults;
  fc.label = cfg.label;
  *out = fc;
  return ok;
}

unsigned pages_ahead(const swap_file_config& fc, size_t slot_size) {
  const unsigned pages_per_queue =
      static_cast<unsigned>((static_cast<uint64_t>(fc.queue_depth) * std::min(fc.block_size, slot_size) + slot_size - 1) / slot_size);
  return std::max(4u, 2 * pages_per_queue);  // >= 4 pages keeps the queue full between pages
}

int tiered_store::assemble(tier_chain chain, std::unique_ptr<tiered_store>* out) {
  if (!chain.slots) return fail(err_invalid_argument, "tiered store for %s: a chain needs a slot provider", chain.label.c_str());
  if (chain.budget_slots != 0 && !chain.backing) {
    return fail(err_invalid_argument, "tiered store for %s: a host budget needs a backing tier to spill to", chain.label.c_str());
  }
  const size_t slot_size = chain.slots->slot_size();
  const std::string label = chain.label;
  std::unique_ptr<tiered_store> s(new tiered_store(std::move(chain)));
  if (s->file_) {
    const unsigned ahead = pages_ahead(s->file_->config(), slot_size);
    if (s->spill_ahead_ == 0) s->spill_ahead_ = ahead;
    if (s->read_ahead_ == 0) s->read_ahead_ = ahead;
    swap_file* file = s->file_.get();
    s->slots_->watch_regions([file](char* base, size_t bytes) { file->add_buffer(base, bytes); });
  }
  if (s->budget_slots_ != 0) {
    s->staging_slots_ = s->read_ahead_ + 1;
    const size_t least = s->write_window_ + s->staging_slots_ + 1;
    if (s->budget_slots_ < least) {
      // Pages whose copy in may still be running cannot go to disk, and restores need their
      // staging slots: the budget must have room for both and one more page.
      log(log_level::warn,
          "VRAMSWAP_HOST_LIMIT: %" PRIu64 " bytes hold fewer than %zu pages of %zu bytes (%u copies that may be in flight, %zu "
          "staging slots for reading back, one more); using %" PRIu64 " bytes",
          static_cast<uint64_t>(s->budget_slots_) * slot_size, least, slot_size, s->write_window_, s->staging_slots_,
          static_cast<uint64_t>(least) * slot_size);
      s->budget_slots_ = least;
    }
    s->spill_ahead_ = static_cast<unsigned>(std::min<size_t>(s->spill_ahead_, s->budget_slots_ - s->staging_slots_ - s->write_window_));
  }
  if (s->file_) {
    const swap_file_config& fc = s->file_->config();
    log(log_level::debug,
        "tiered store for %s: pages of %zu bytes, %s slots, host budget %zu pages, swap file in %s, queue depth %u, blocks of %zu "
        "bytes, spill ahead %u pages, read ahead %u pages",
        label.c_str(), slot_size, s->slots_->shared() ? "shared host pool" : "own pinned", s->budget_slots_, fc.dir.c_str(),
        fc.queue_depth, fc.block_size, s->spill_ahead_, s->read_ahead_);
  }
  *out = std::move(s);
  return ok;
}

tiered_store::~tiered_store() {
  slots_->stop_making_ahead();  // its thread tells the swap file of the chunks it makes
  file_.reset();  // waits for requests in flight: the kernel may still be using our slots
  for (auto& [key, e] : pages_) {
    if (e.slot != nullptr) slots_->give_back(e.slot);
  }
}

// --- slots ---------------------------------------------------------------------------------

void tiered_store::give_slot_locked(char* slot) {
  slots_->give_back(slot);
  --slots_used_;
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
  give_slot_locked(e.slot);
  e.slot = nullptr;
  e.host_valid = false;
  e.lent = false;
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

// A free slot for a new saved copy (for_write) or a read from disk. Under the budget and
// while the provider has one: take it. Otherwise drop a clean page, or write the oldest
// pages out and wait for one. With nothing to write out: go past the budget (own memory),
// or wait for another process to give a slot of the shared pool back (`wait`; else err_busy).
int tiered_store::take_slot_locked(std::unique_lock<std::mutex>& lock, bool for_write, bool wait, char** out) {
  // Saved pages may fill the budget less the staging slots; reads back may use those too.
  const size_t limit = budget_slots_ == 0 ? SIZE_MAX : for_write ? budget_slots_ - staging_slots_ : budget_slots_;
  const uint64_t start_ns = now_ns();
  bool waited_with_error = false;  // for the writes in flight, with a write's failure pending
  for (;;) {
    VS_TRY(reap_locked(false));
    const uint32_t given_back = slots_->give_back_count();  // before take: a give-back after it ends the wait
    // A slot that cannot be made (host memory that cannot be mapped or pinned) is a full
    // host tier for now: with a disk behind it, the oldest pages go there and their slots
    // are taken instead. Without one, that is the error. After such a failure the tier is
    // not grown again for k_grow_retry_ns while it has no free slot: each try maps and
    // faults in a whole chunk (under a memory cgroup, up to its limit) only to fail again.
    const bool no_free_slot = slots_used_ * slot_size_ >= slots_->bytes_pinned();
    bool cannot_grow = grow_failed_ns_ != 0 && now_ns() - grow_failed_ns_ < k_grow_retry_ns && no_free_slot;
    if (slots_used_ < limit && !cannot_grow) {
      const int rc = slots_->take(false, out);
      if (rc == ok) break;
      if (rc != err_busy && !file_) return rc;
      if (rc != err_busy) {
        cannot_grow = true;
        if (grow_failed_ns_ == 0) log(log_level::warn, "tiered store: %s; saved pages go to the swap file instead", last_error());
        grow_failed_ns_ = now_ns();
      }
    }
    int spill_rc = ok;
    if (drop_or_spill_locked(for_write, cannot_grow, &spill_rc)) continue;
    // A write that failed: the writes in flight (its page's rewrite among them, which ends the
    // failure when it succeeds) are waited for once; a failure that outlasts them is the
    // caller's, so that writes that keep failing are not retried without end.
    const bool in_flight = writes_in_flight_ > 0 || reads_in_flight_ > 0;
    const bool report = for_write && pending_error_ != ok && (waited_with_error || !in_flight);
    if (report) return take_pending_error_locked();
    if (in_flight) {
      waited_with_error = waited_with_error || pending_error_ != ok;
      VS_TRY(reap_locked(true));
      continue;
    }
    if (spill_rc != ok) return spill_rc;  // e.g. err_no_space, with its detail
    // Nothing may go to disk: every slot is lent out, may still be being copied into, or
    // there is no disk. Own memory goes past its limit; a shared pool waits for others.
    const int rc = slots_->take(true, out);
    if (rc == ok) {
      if (budget_slots_ != 0) note_overrun_locked(for_write);
      break;
    }
    if (rc != err_busy || !slots_->shared()) return rc;
    if (!wait) return err_busy;  // a hint to the caller, not an error: no detail
    // Other threads of this process may release (and so free slots) while we sleep.
    lock.unlock();
    const int wrc = slots_->wait_for_give_back(given_back, now_ns() - start_ns);
    lock.lock();
    VS_TRY(wrc);
  }
  ++slots_used_;
  return ok;
}

// Make room on disk, oldest pages first: drop the slot of a page saved on disk already
// (true), or start writes out up to spill_ahead_ in flight (*spill_rc: a start that failed).
bool tiered_store::drop_or_spill_locked(bool for_write, bool cannot_grow, int* spill_rc) {
  for (auto it = lru_.begin(); file_ && it != lru_.end();) {
    const uint64_t key = *it++;
    entry& e = pages_.at(key);
    if (e.state != io::none || e.lent || !e.host_valid || protected_locked(e)) continue;
    if (e.disk_valid) {
      drop_slot_locked(e);
      ++stats_.pages_dropped_clean;
      return true;
    }
    // Reads cause no writes while the tier may grow past its budget instead (below); when
    // it cannot grow at all, a page written out is the only room a read can have.
    if ((!for_write && !cannot_grow) || writes_in_flight_ >= spill_ahead_) continue;
    if ((*spill_rc = start_spill_locked(key, e)) != ok) break;
  }
  return false;
}

// A slot taken past VRAMSWAP_HOST_LIMIT: counted, and said once.
void tiered_store::note_overrun_locked(bool for_write) {
  if (!overrun_logged_) {
    overrun_logged_ = true;
    log(log_level::info,
        "tiered store: going past VRAMSWAP_HOST_LIMIT (%" PRIu64 " bytes) for slots the caller still holds (%s); the "
        "caller can give them back earlier with read_done()",
        host_limit(), for_write ? "the newest copies" : "pages it restored");
  }
  ++stats_.budget_overruns;
}

// Keep `spill_ahead_` pages of room coming: free slots under the budget plus writes in flight.
void tiered_store::spill_ahead_locked() {
  if (!file_) return;
  const size_t free_slots = slots_->free_now();
  const size_t under_budget = budget_slots_ == 0 ? SIZE_MAX : slots_used_ < budget_slots_ ? budget_slots_ - slots_used_ : 0;
  const size_t room = std::min(free_slots, under_budget);
  if (room >= spill_ahead_ || room + writes_in_flight_ >= spill_ahead_) return;
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
  if (!file_) return;
  unsigned scanned = 0;
  for (auto it = pages_.upper_bound(after); it != pages_.end() && reads_in_flight_ < read_ahead_ && scanned < 4 * read_ahead_;
       ++it, ++scanned) {
    entry& e = it->second;
    if (e.slot != nullptr || !e.disk_valid || e.state != io::none) continue;
    if (budget_slots_ != 0 && slots_used_ >= budget_slots_) return;  // the staging slots are in use
    char* slot = nullptr;
    if (const int rc = slots_->take(false, &slot); rc != ok) {
      if (rc != err_busy) clear_error();
      return;
    }
    e.slot = slot;
    ++slots_used_;
    e.lru = lru_.insert(lru_.end(), it->first);
    e.host_valid = false;
    e.state = io::reading;
    ++reads_in_flight_;
    file_->submit(false, static_cast<uint64_t>(e.extent), e.slot, it->first);
  }
}

int tiered_store::take_pending_error_locked() {
  const int rc = pending_error_;
  pending_error_ = ok;
  return fail(rc, "%s", pending_detail_.c_str());
}

int tiered_store::reap_locked(bool wait) {
  if (!file_) return ok;
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
      // The page whose write failed is on disk after all: that failure no longer stands, and
      // its detail ("stays in host memory") would no longer be true.
      if (pending_error_ != ok && c.tag == pending_key_) pending_error_ = ok;
    } else {
      drop_extent_locked(e);
      if (pending_error_ == ok) {
        pending_error_ = c.status;
        pending_key_ = c.tag;
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

int tiered_store::write_slot(uint64_t key, size_t size, bool wait, void** host) {
  if (size > slot_size_) {
    return fail(err_invalid_argument, "tiered store: page %" PRIu64 " of %zu bytes does not fit a %zu-byte slot", key, size,
                slot_size_);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = pages_.find(key);
  if (it != pages_.end()) VS_TRY(wait_idle_locked(key));
  if (it == pages_.end() || it->second.slot == nullptr) {
    char* slot = nullptr;
    VS_TRY(take_slot_locked(lock, true, wait, &slot));
    // Found again: the lock may have been let go while waiting for a shared slot.
    entry& e = pages_[key];
    if (e.slot == nullptr) {
      e.slot = slot;
      e.lru = lru_.insert(lru_.end(), key);
    } else {
      give_slot_locked(slot);
    }
    it = pages_.find(key);
  }
  entry& e = it->second;
  drop_extent_locked(e);  // the caller is about to write new bytes: a disk copy is stale
  e.host_valid = true;
  e.lent = false;
  e.seq = ++write_seq_;
  touch_locked(key, e);
  *host = e.slot;
  spill_ahead_locked();
  return ok;
}

int tiered_store::slot_for_write(uint64_t key, size_t size, void** host) { return write_slot(key, size, true, host); }

int tiered_store::try_slot_for_write(uint64_t key, size_t size, void** host) { return write_slot(key, size, false, host); }

int tiered_store::slot_for_read(uint64_t key, void** host) {
  std::unique_lock<std::mutex> lock(mutex_);
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
  const int rc = take_slot_locked(lock, false, true, &slot);
  if (rc != ok) return add_context(rc, "tiered store: reading page %" PRIu64 " back from disk (it stays there): ", key);
  it = pages_.find(key);  // the lock may have been let go while waiting for a shared slot
  if (it == pages_.end() || it->second.slot != nullptr || it->second.state != io::none) {
    give_slot_locked(slot);
    if (it == pages_.end()) return fail(err_invalid_argument, "tiered store: page %" PRIu64 " was released while it was read", key);
    lock.unlock();
    return slot_for_read(key, host);
  }
  entry& r = it->second;
  r.slot = slot;
  r.lru = lru_.insert(lru_.end(), key);
  r.host_valid = false;
  r.state = io::reading;
  ++reads_in_flight_;
  file_->submit(false, static_cast<uint64_t>(r.extent), slot, key);
  read_ahead_locked(key);
  VS_TRY(wait_idle_locked(key));
  if (r.read_status != ok) {
    return fail(r.read_status, "%s; page %" PRIu64 " stays on disk, nothing lost", r.read_detail.c_str(), key);
  }
  r.lent = true;
  *host = r.slot;
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
  if (pending_error_ != ok && key == pending_key_) pending_error_ = ok;  // the page whose write failed is gone
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

uint64_t tiered_store::host_bytes_pinned() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slots_->bytes_pinned();
}

unsigned tiered_store::tier_of(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pages_.find(key);
  return it != pages_.end() && it->second.slot == nullptr ? 1 : 0;
}

uint64_t tiered_store::bytes_in_tier(unsigned tier) const {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t n = 0;
  for (const auto& [key, e] : pages_) n += (e.slot == nullptr ? 1u : 0u) == tier ? 1 : 0;
  return n * slot_size_;
}

const char* tiered_store::tier_name(unsigned tier) const {
  if (tier == 0) return slots_->shared() ? "host pool" : "host";
  return tier == 1 && file_ ? "swap file" : "?";
}

size_t tiered_store::pages_with_slot() const { return slots_used_; }

int tiered_store::flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!file_) return ok;
  while (writes_in_flight_ > 0 || reads_in_flight_ > 0) VS_TRY(reap_locked(true));
  return pending_error_ != ok ? take_pending_error_locked() : ok;
}

void tiered_store::may_save(uint64_t pages) {
  if (!make_ahead_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  // Past the budget, pages go to disk: slots beyond it would never be used.
  slots_->make_ahead(static_cast<size_t>(budget_slots_ != 0 ? std::min<uint64_t>(pages, budget_slots_) : pages));
}

void tiered_store::owner_mapping(bool mapping) {
  if (!make_ahead_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  slots_->owner_mapping(mapping);
}

int tiered_store::expect_saves(uint64_t pages) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!file_) return ok;
  // After the saves, at most `room` saved pages have a host slot (the rest of the budget is
  // for reading back; without a budget, what the provider has free now besides the slots
  // held); every other page needs an extent, and some pages have one already.
  const uint64_t free_slots = slots_->free_now();
  const uint64_t room = budget_slots_ != 0 ? budget_slots_ - staging_slots_
                        : free_slots == SIZE_MAX ? UINT64_MAX / 2
                                                 : slots_used_ + free_slots;
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
    if (!file_) return ok;
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
  s.pinned_bytes = slots_->bytes_pinned();
  s.file_bytes = file_ ? file_->file_bytes() : 0;
  return s;
}

}  // namespace vramswap::detail

namespace vramswap::detail {
swap_file::io_stats tiered_store::io_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return file_ ? file_->stats() : swap_file::io_stats{};
}
}  // namespace vramswap::detail
