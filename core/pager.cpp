#include "core/pager.hpp"

#include <time.h>

#include <chrono>
#include <cinttypes>

#include "core/copy_pipeline.hpp"
#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"

namespace vramswap::detail {

const char* page_state_name(page_state s) noexcept {
  switch (s) {
    case page_state::unbacked: return "unbacked";
    case page_state::resident: return "resident";
    case page_state::host: return "host";
    case page_state::discarded: return "discarded";
  }
  return "?";
}

int frame_source::try_take_not_resident(int, size_t, frame_id*) {
  return fail(err_busy, "this frame source backs memory allocated while not resident only at the next restore_all()");
}

namespace {
double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }
uint64_t clock_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The store hears that this thread maps device memory for the scope's length
// (page_store::owner_mapping), when `on`: a malloc backing its pages, a restore.
class store_mapping_scope {
 public:
  store_mapping_scope(page_store& store, bool on) : store_(on ? &store : nullptr) {
    if (store_ != nullptr) store_->owner_mapping(true);
  }
  ~store_mapping_scope() {
    if (store_ != nullptr) store_->owner_mapping(false);
  }
  store_mapping_scope(const store_mapping_scope&) = delete;
  store_mapping_scope& operator=(const store_mapping_scope&) = delete;

 private:
  page_store* const store_;
};
}  // namespace

int resolve_pager_config(backend& be, int device, pager_config* cfg) {
  device_info info;
  VS_TRY(be.get_device_info(device, &info));
  if (cfg->frame_size == 0) VS_TRY(option_size(option_id::frame_size, &cfg->frame_size));
  if (cfg->frame_size % info.granularity != 0 || !is_pow2(cfg->frame_size / info.granularity)) {
    return fail(err_invalid_argument,
                "VRAMSWAP_FRAME_SIZE: %" PRIu64 " bytes is not a power-of-two multiple of device %d's allocation granularity (%" PRIu64
                " bytes); use e.g. 2MiB, 32MiB (the default), 64MiB or 256MiB",
                cfg->frame_size, device, info.granularity);
  }
  if (cfg->arena_size == 0) VS_TRY(option_size(option_id::arena_size, &cfg->arena_size, info.total_bytes));
  cfg->arena_size = (cfg->arena_size + cfg->frame_size - 1) / cfg->frame_size * cfg->frame_size;
  if (cfg->arena_size == 0) return fail(err_invalid_argument, "VRAMSWAP_ARENA_SIZE: the arena must hold at least one frame");
  if (cfg->copies_in_flight == 0) cfg->copies_in_flight = 1;
  return ok;
}

pager::pager(backend& be, int device, page_store& store, frame_source& frames, const pager_config& cfg)
    : be_(be),
      device_(device),
      store_(store),
      frames_(frames),
      frame_size_(cfg.frame_size),
      copies_in_flight_(cfg.copies_in_flight),
      resident_(cfg.start_resident) {}

int pager::create(backend& be, int device, page_store& store, frame_source& frames, pager_config cfg, std::unique_ptr<pager>* out) {
  VS_TRY(resolve_pager_config(be, device, &cfg));
  std::unique_ptr<pager> p(new pager(be, device, store, frames, cfg));
  VS_TRY(p->arena_.init(be, device, cfg.arena_size, cfg.frame_size));
  p->table_ = page_table(p->arena_.page_count());
  VS_TRY(be.stream_create(device, &p->out_stream_));
  VS_TRY(be.stream_create(device, &p->in_stream_));
  VS_TRY(be.stream_create(device, &p->scrub_stream_));
  p->events_.resize(cfg.copies_in_flight);
  for (event_id& e : p->events_) VS_TRY(be.event_create(device, &e));
  p->scrub_events_.resize(cfg.copies_in_flight);
  for (event_id& e : p->scrub_events_) VS_TRY(be.event_create(device, &e));
  log(log_level::debug, "pager: device %d, arena 0x%" PRIxPTR " + %" PRIu64 " bytes, frames of %" PRIu64 " bytes", device,
      p->arena_.base(), p->arena_.size(), cfg.frame_size);
  *out = std::move(p);
  return ok;
}

pager::~pager() {
  // Teardown tolerates failures (the driver may be shutting down): give back what we can.
  if (in_stream_ != 0) be_.stream_synchronize(in_stream_);
  if (out_stream_ != 0) be_.stream_synchronize(out_stream_);
  if (scrub_stream_ != 0) be_.stream_synchronize(scrub_stream_);
  for (uint64_t p = 0; p < table_.size(); ++p) {
    if (table_[p].state == page_state::resident) unback_page(p, page_state::unbacked);
    drop_saved_copy(p);
  }
  // Frames a remap held back: given back now if they can be made fit; the others stay this
  // process's until it exits (its pool server scrubs a member's frames then).
  release_held_back();
  if (!held_back_.empty()) {
    log(log_level::warn, "pager: %zu frame(s) held back by a remap are still not fit to go back (%s); they go when this process exits",
        held_back_.size(), held_back_why_.c_str());
  }
  for (event_id e : events_) {
    if (e != 0) be_.event_destroy(e);
  }
  for (event_id e : scrub_events_) {
    if (e != 0) be_.event_destroy(e);
  }
  if (scratch_ != 0) be_.unreserve(scratch_, scratch_size_);
  if (in_stream_ != 0) be_.stream_destroy(in_stream_);
  if (out_stream_ != 0) be_.stream_destroy(out_stream_);
  if (scrub_stream_ != 0) be_.stream_destroy(scrub_stream_);
}

// --- page moves -------------------------------------------------------------------------

int pager::map_frame(uint64_t page, frame_id f) {
  const device_ptr va = arena_.page_address(page);
  int rc = be_.map(va, frame_size_, f, 0);
  if (rc == ok) {
    rc = be_.set_access(va, frame_size_, access_flags::read_write);
    if (rc != ok) be_.unmap(va, frame_size_);
  }
  if (rc != ok) {
    const std::string why = last_error();
    frames_.give_back(f);
    return fail(rc, "%s", why.c_str());
  }
  table_[page].frame = f;
  table_[page].state = page_state::resident;
  ++resident_pages_;
  return ok;
}

int pager::unback_page(uint64_t page, page_state now, bool scrubbed) {
  page_entry& e = table_[page];
  const device_ptr va = arena_.page_address(page);
  if (!scrubbed && frames_.scrub_before_give_back(e.frame)) {
    // The frame goes to another process next: zero it while it is still ours to write.
    VS_TRY(be_.memset_d8(va, 0, frame_size_, scrub_stream_));
    VS_TRY(be_.stream_synchronize(scrub_stream_));
  }
  VS_TRY(be_.unmap(va, frame_size_));
  const int rc = frames_.give_back(e.frame);
  e.frame = 0;
  e.state = now;
  --resident_pages_;
  if (e.frame_stale) {  // the frame's bytes were not the page's: nothing of them is missed
    e.frame_stale = false;
    --stale_pages_;
  }
  if (rc != ok) log(log_level::warn, "pager: giving back the frame of page %" PRIu64 " failed: %s", page, last_error());
  return ok;
}

void pager::drop_saved_copy(uint64_t page) {
  store_.release(page);
  page_entry& e = table_[page];
  e.host_copy_valid = false;
  if (e.frame_stale) {  // the page's bytes are given up (freed, discardable): its frame's do
    e.frame_stale = false;
    --stale_pages_;
  }
}

void pager::settle_copied_in(uint64_t page) {
  page_entry& e = table_[page];
  if (arena_.page_advice(page) == advice::read_mostly) {
    store_.read_done(page);
    e.host_copy_valid = true;  // the caller promised not to write: keep the copy
  } else {
    store_.release(page);
    e.host_copy_valid = false;
  }
  if (e.frame_stale) {
    e.frame_stale = false;
    --stale_pages_;
  }
}

int pager::copy_saved_copy_in(uint64_t page) {
  void* host = nullptr;
  VS_TRY(store_.slot_for_read(page, &host));
  VS_TRY(be_.copy_h2d(arena_.page_address(page), host, frame_size_, in_stream_));
  return be_.stream_synchronize(in_stream_);
}

void pager::mark_stale(uint64_t page) {
  page_entry& e = table_[page];
  e.host_copy_valid = false;  // not a spare of the frame's bytes: their only home
  if (!e.frame_stale) {
    e.frame_stale = true;
    ++stale_pages_;
  }
}

int pager::repair_stale_page(uint64_t page) {
  const int rc = copy_saved_copy_in(page);
  if (rc != ok) {
    return fail(rc, "page %" PRIu64 " (0x%" PRIxPTR ") does not hold its bytes in its frame (an earlier move could neither leave the "
                "frame nor copy them back), and copying its saved copy in again failed: %s; nothing lost, the saved copy is kept "
                "and tried again at the next restore",
                page, arena_.page_address(page), last_error());
  }
  settle_copied_in(page);
  return ok;
}

void pager::invalidate_saved_copies(page_range pages) {
  for (uint64_t p = pages.first; p < pages.first + pages.count; ++p) {
    if (table_[p].host_copy_valid) drop_saved_copy(p);
  }
}

// --- allocation -------------------------------------------------------------------------

int pager::malloc(uint64_t size, device_ptr* out, backing when_not_resident) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A frame a free could not leave may still be mapped where the new pages go.
  if (!held_back_.empty()) release_held_back();
  std::vector<page_range> fresh;
  device_ptr ptr = 0;
  VS_TRY(arena_.allocate(size, &ptr, &fresh));
  VS_TRY(back_new_allocation(ptr, size, fresh, when_not_resident));
  *out = ptr;
  return ok;
}

int pager::malloc_at(device_ptr ptr, uint64_t size, backing when_not_resident) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!held_back_.empty()) release_held_back();
  std::vector<page_range> fresh;
  VS_TRY(arena_.allocate_at(ptr, size, &fresh));
  return back_new_allocation(ptr, size, fresh, when_not_resident);
}

int pager::reserve(uint64_t size, uint64_t alignment, device_ptr* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  return arena_.reserve(size, alignment, out);
}

int pager::unreserve(device_ptr ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  return arena_.unreserve(ptr);
}

// The new allocation [ptr, ptr + size), whose pages `fresh` went live, gets its pages: at
// once while resident, else as `when_not_resident` says. On failure it is freed again.
int pager::back_new_allocation(device_ptr ptr, uint64_t size, const std::vector<page_range>& fresh, backing when_not_resident) {
  VS_TRY(repair_stale_pages_of(ptr, size));
  // New bytes on a page make a kept copy of it stale.
  invalidate_saved_copies(arena_.pages_of(ptr, size));
  for (const page_range& r : fresh) live_pages_ += r.count;
  if (!fresh.empty()) store_.may_save(live_pages_);
  // The store's pinning ahead (which may_save just woke) waits while this maps.
  const store_mapping_scope mapping(store_, !fresh.empty());
  if (!resident_) return back_new_not_resident(ptr, size, fresh, when_not_resident);
  return back_fresh_pages(ptr, size, fresh);
}

int pager::repair_stale_pages_of(device_ptr ptr, uint64_t size) {
  // A page of the new range whose frame does not hold its bytes gets them now, before the
  // caller writes the new allocation's part of it (a repair later would overwrite that).
  if (stale_pages_ == 0) return ok;
  const page_range pages = arena_.pages_of(ptr, size);
  for (uint64_t p = pages.first; p < pages.first + pages.count; ++p) {
    if (!table_[p].frame_stale) continue;
    const int rc = repair_stale_page(p);
    if (rc == ok) continue;
    const std::string why = last_error();
    arena_.deallocate(ptr, nullptr);
    return fail(rc, "malloc(%" PRIu64 "): it shares a page with older memory, and %s", size, why.c_str());
  }
  return ok;
}

int pager::back_new_not_resident(device_ptr ptr, uint64_t size, const std::vector<page_range>& fresh, backing when_not_resident) {
  const int rc = back_not_resident(arena_.pages_of(ptr, size));
  if (rc == ok || (rc == err_busy && when_not_resident == backing::when_free)) {
    // Not all could be had: the pages wait for restore_all(), as they always may.
    if (rc != ok) clear_error();
    return ok;
  }
  const std::string why = last_error();
  arena_.deallocate(ptr, nullptr);
  for (const page_range& f : fresh) live_pages_ -= f.count;
  return fail(rc == err_busy ? err_out_of_memory : rc, "malloc(%" PRIu64 "): backing its pages now (not resident): %s", size,
              why.c_str());
}

int pager::back_fresh_pages(device_ptr ptr, uint64_t size, const std::vector<page_range>& fresh) {
  uint64_t count = 0;
  for (const page_range& r : fresh) count += r.count;
  // Where a large allocation's time goes (debug level): asking the frames' owners, waiting
  // for frames, mapping them, granting access. A pool's frames may come from other
  // processes, and then most of an allocation is theirs.
  const uint64_t t_start = clock_ns();
  // Ask for all the frames at once: a shared pool then asks their owners for all of them in
  // one request (one eviction, or one demotion of an oversubscribed job, instead of one per
  // page), and their copies overlap our mapping.
  int rc = count > 1 ? frames_.prepare(device_, count) : ok;
  const uint64_t t_asked = clock_ns();
  backing_times times;
  std::vector<uint64_t> backed;
  for (const page_range& r : fresh) {
    if (rc != ok) break;
    rc = back_fresh_run(r, &times, &backed);
  }
  if (rc != ok) {
    // Undo: every page backed so far, then the allocation itself.
    const std::string why = last_error();
    for (uint64_t q : backed) unback_page(q, page_state::unbacked);
    arena_.deallocate(ptr, nullptr);
    for (const page_range& f : fresh) live_pages_ -= f.count;
    return fail(rc, "malloc(%" PRIu64 "): backing the new allocation's %" PRIu64 " page(s) (%zu backed): %s", size, count,
                backed.size(), why.c_str());
  }
  if (count > 0) {
    log(log_level::debug,
        "pager: malloc(%" PRIu64 " bytes): %" PRIu64 " page(s) backed in %.2f ms (asking for frames %.2f, waiting for them %.2f, "
        "mapping %.2f, granting access %.2f)",
        size, count, (clock_ns() - t_start) / 1e6, (t_asked - t_start) / 1e6, times.taking_ns / 1e6, times.mapping_ns / 1e6,
        times.access_ns / 1e6);
  }
  return ok;
}

int pager::back_fresh_run(const page_range& r, backing_times* times, std::vector<uint64_t>* backed) {
  // Map the run's pages, then grant access to all of them in one call (the driver takes
  // a range over several mappings, and granting access is the costly VMM call).
  int rc = ok;
  uint64_t mapped = 0;
  for (; mapped < r.count; ++mapped) {
    const uint64_t p = r.first + mapped;
    frame_id f = 0;
    const uint64_t t_take = clock_ns();
    rc = frames_.take(device_, frame_size_, &f);
    const uint64_t t_map = clock_ns();
    times->taking_ns += t_map - t_take;
    if (rc != ok) break;
    rc = be_.map(arena_.page_address(p), frame_size_, f, 0);
    times->mapping_ns += clock_ns() - t_map;
    if (rc != ok) {
      frames_.give_back(f);
      break;
    }
    table_[p].frame = f;  // resident once access is granted
  }
  if (rc == ok) {
    const uint64_t t_access = clock_ns();
    rc = be_.set_access(arena_.page_address(r.first), r.count * frame_size_, access_flags::read_write);
    times->access_ns += clock_ns() - t_access;
  }
  if (rc != ok) {
    // These pages were never accessible, so nothing was written to their frames: they go
    // back as they came (a frame that cannot be unmapped is kept).
    const std::string why = last_error();
    for (uint64_t k = 0; k < mapped; ++k) {
      const uint64_t p = r.first + k;
      if (be_.unmap(arena_.page_address(p), frame_size_) == ok) {
        frames_.give_back(table_[p].frame);
      } else {
        log(log_level::error, "malloc: page %" PRIu64 " could not be unmapped (%s); its frame is kept", p, last_error());
      }
      table_[p].frame = 0;
    }
    return fail(rc, "%s", why.c_str());
  }
  for (uint64_t p = r.first; p < r.first + r.count; ++p) {
    table_[p].state = page_state::resident;
    ++resident_pages_;
    backed->push_back(p);
  }
  return ok;
}

int pager::back_now(device_ptr ptr, uint64_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (resident_) return ok;
  if (ptr < arena_.base() || size == 0 || size > arena_.size() || ptr - arena_.base() > arena_.size() - size) {
    return fail(err_invalid_argument, "back_now(0x%" PRIxPTR ", %" PRIu64 "): not a range of the arena", ptr, size);
  }
  const int rc = back_not_resident(arena_.pages_of(ptr, size));
  if (rc == ok) return ok;
  return fail(rc == err_busy ? err_out_of_memory : rc, "backing 0x%" PRIxPTR " + %" PRIu64 " bytes now (not resident): %s", ptr, size,
              last_error());
}

int pager::back_not_resident(page_range pages) {
  struct todo {
    uint64_t page;
    page_state was;
    frame_id frame;
  };
  std::vector<todo> pending;
  for (uint64_t p = pages.first; p < pages.first + pages.count; ++p) {
    if (table_[p].state != page_state::resident && !table_[p].asleep && arena_.page_live_count(p) > 0) {
      pending.push_back({p, table_[p].state, 0});
    }
  }
  if (pending.empty()) return ok;
  // Every frame first, so that a shortfall changes nothing.
  for (size_t i = 0; i < pending.size(); ++i) {
    const int rc = frames_.try_take_not_resident(device_, frame_size_, &pending[i].frame);
    if (rc != ok) {
      const std::string why = last_error();
      for (size_t j = 0; j < i; ++j) frames_.give_back(pending[j].frame);
      return fail(rc, "%zu of the %zu frame(s) needed were free: %s", i, pending.size(), why.c_str());
    }
  }
  // Map and fill each page; `mapped` counts the pages that reached the map step.
  int rc = ok;
  size_t mapped = 0;
  while (mapped < pending.size() && rc == ok) {
    todo& t = pending[mapped++];
    if ((rc = map_frame(t.page, t.frame)) != ok) {
      t.frame = 0;  // map_frame gave it back
      break;
    }
    const device_ptr va = arena_.page_address(t.page);
    if (t.was == page_state::host) {
      void* host = nullptr;
      rc = store_.slot_for_read(t.page, &host);
      if (rc == ok) rc = be_.copy_h2d(va, host, frame_size_, in_stream_);
    } else if (t.was == page_state::discarded) {
      rc = be_.memset_d8(va, 0, frame_size_, in_stream_);
    }
    // (A fresh page's frame is zero already: the pool scrubs every frame it frees.)
  }
  if (const int sync = be_.stream_synchronize(in_stream_); sync != ok && rc == ok) rc = sync;
  if (rc != ok) {
    // Back where they were: saved pages keep their saved copies, the rest go unbacked again.
    const std::string why = last_error();
    for (size_t i = 0; i < pending.size(); ++i) {
      const todo& t = pending[i];
      if (i < mapped && table_[t.page].state == page_state::resident) {
        // A page that cannot leave its frame may hold part of its copy in: its saved copy
        // stays its home, repaired before use.
        if (unback_page(t.page, t.was) != ok && t.was == page_state::host) mark_stale(t.page);
      } else if (i >= mapped && t.frame != 0) {
        frames_.give_back(t.frame);
      }
    }
    return fail(rc, "%s", why.c_str());
  }
  for (const todo& t : pending) {
    if (t.was != page_state::host) continue;
    settle_copied_in(t.page);
    stats_.bytes_in += frame_size_;
    ++stats_.pages_restored;
  }
  return ok;
}

int pager::free(device_ptr ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<page_range> dead;
  VS_TRY(arena_.deallocate(ptr, &dead));
  for (const page_range& r : dead) {
    live_pages_ -= r.count;
    for (uint64_t p = r.first; p < r.first + r.count; ++p) {
      page_entry& e = table_[p];
      if (e.state == page_state::resident && unback_page(p, page_state::unbacked) != ok) {
        // Its frame could not be left (perhaps not scrubbed): held back, still mapped here,
        // and given back once it can be unmapped and scrubbed (release_held_back: before
        // the next malloc maps pages, at the next remap, at the end).
        log(log_level::warn, "pager: free(0x%" PRIxPTR "): page %" PRIu64 " could not leave its frame (%s); the frame is held back until it can",
            ptr, p, last_error());
        hold_back(e.frame, arena_.page_address(p), /*scrubbed=*/false);
        e.frame = 0;
        --resident_pages_;
      }
      drop_saved_copy(p);
      set_asleep(p, false);
      table_[p].state = page_state::unbacked;
      ++table_[p].frees;
    }
  }
  return ok;
}

int pager::advise(device_ptr ptr, uint64_t size, advice a) {
  std::lock_guard<std::mutex> lock(mutex_);
  VS_TRY(arena_.advise(ptr, size, a));
  // A copy kept under earlier advice may not match what the new advice lets the caller do.
  invalidate_saved_copies(arena_.pages_of(ptr, size));
  return ok;
}

// --- eviction ---------------------------------------------------------------------------

int pager::evict_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = evict_locked(nullptr);
  // Even a failed eviction may have saved some pages: restore_all() brings them back, and
  // until then new allocations wait for it too.
  resident_ = false;
  stats_.evict_seconds += since(t0);
  return rc;
}

int pager::evict_frames(const std::vector<frame_id>& frames) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<bool> chosen(table_.size(), false);
  bool any = false;
  for (uint64_t p = 0; p < table_.size(); ++p) {
    if (table_[p].state != page_state::resident) continue;
    for (frame_id f : frames) {
      if (table_[p].frame == f) {
        chosen[p] = true;
        any = true;
        break;
      }
    }
  }
  const int rc = any ? evict_locked(&chosen) : ok;
  stats_.evict_seconds += since(t0);
  return rc;
}

void pager::set_not_resident() {
  std::lock_guard<std::mutex> lock(mutex_);
  resident_ = false;
}

int pager::evict_locked(const std::vector<bool>* chosen) {
  // The caller's kernels may still be writing the memory we are about to copy.
  VS_TRY(add_context(be_.device_synchronize(device_), "evict: synchronizing device %d failed before any page moved, nothing lost: ", device_));

  // A page's copy out, then (when the frame source asks for it) its frame's scrub, queued
  // on out_stream behind it (core/copy_pipeline.hpp): the scrub runs only after the copy
  // completed (stream order), and queued right behind it, it costs the transfer nothing.
  // Pages in flight are completed even after another page failed: a copy that completed
  // saved the page, which then leaves its frame like any other (a page whose copy
  // completed and that stayed mapped would hold its only good bytes in a slot that the
  // failure path must not drop).
  copy_pipeline::handlers on;
  on.copied = [&](uint64_t page, size_t, bool scrubbed) {
    // A scrub not confirmed is done again (or the bytes put back) by unback_saved_page.
    const int rc = unback_saved_page(page, scrubbed);
    if (rc == ok) {
      stats_.bytes_out += frame_size_;
      ++stats_.pages_evicted;
    }
    return rc;
  };
  on.not_copied = [&](uint64_t page, size_t) {
    // The copy is not known to have completed, so neither has the scrub behind it: the
    // frame still holds the page's bytes; the partial copy is dropped.
    store_.release(page);
  };
  copy_pipeline copies(be_, out_stream_, events_, scrub_events_, std::move(on));

  expect_saves_for(chosen);
  for (uint64_t p = 0; p < table_.size() && !copies.failed(); ++p) {
    const page_entry& e = table_[p];
    if (e.state != page_state::resident || (chosen != nullptr && !(*chosen)[p])) continue;
    if (!evict_page(p, copies)) break;
  }
  copies.complete_all();
  if (copies.failed()) {
    return fail(copies.failure(), "evict: stopped with %" PRIu64 " page(s) still resident, nothing lost: %s",
                table_.count(page_state::resident), copies.failure_detail().c_str());
  }
  return ok;
}

void pager::expect_saves_for(const std::vector<bool>* chosen) {
  // Tell the store how many pages will be saved, so a store with a disk tier reserves the
  // space for what goes past its host budget in one piece, before its first write. A hint:
  // if it fails, each save meets the error itself.
  uint64_t to_save = 0;
  for (uint64_t p = 0; p < table_.size(); ++p) {
    const page_entry& e = table_[p];
    if (e.state != page_state::resident || (chosen != nullptr && !(*chosen)[p])) continue;
    const advice adv = arena_.page_advice(p);
    to_save += adv == advice::discardable || e.frame_stale || (e.host_copy_valid && adv == advice::read_mostly) ? 0 : 1;
  }
  if (to_save > 0 && store_.expect_saves(to_save) != ok) clear_error();
}

bool pager::evict_page(uint64_t p, copy_pipeline& copies) {
  page_entry& e = table_[p];
  bool left = false;
  if (const int rc = evict_without_copy(p, &left); left) {
    if (rc != ok) copies.note_failure(rc);
    return rc == ok;
  }
  if (e.host_copy_valid) drop_saved_copy(p);  // stale under the current advice
  copies.make_room();
  if (copies.failed()) return false;
  void* host = nullptr;
  // A store shared with other processes may have no slot free now: one comes back when a
  // process restoring (perhaps into the frames we free) completes a copy in. Finish our
  // copies one at a time (each gives its frame back) and look again in between, so we
  // block only once none is left: we never wait holding frames that process could use.
  int rc;
  for (;;) {
    rc = store_.try_slot_for_write(p, frame_size_, &host);
    if (rc != err_busy || copies.empty()) break;
    copies.complete_oldest();
    if (copies.failed()) break;
  }
  if (copies.failed()) return false;  // rc is err_busy: no slot was taken for p
  if (rc == err_busy) rc = store_.slot_for_write(p, frame_size_, &host);
  if (rc != ok) {
    copies.note_failure(rc);  // p keeps its frame, untouched
    return false;
  }
  const device_ptr va = arena_.page_address(p);
  const auto copy_out = [&](stream_id s) { return be_.copy_d2h(host, va, frame_size_, s); };
  const auto scrub = [&](stream_id s) { return be_.memset_d8(va, 0, frame_size_, s); };
  // On failure the pipeline has waited for the stream and dropped p's slot (the copy only
  // read the frame, so the page is whole where it is), or keeps p in flight with its copy
  // alone (its scrub failed to queue).
  return copies.queue(p, copy_out, frames_.scrub_before_give_back(e.frame) ? copy_pipeline::queue_fn(scrub) : nullptr) == ok;
}

int pager::evict_without_copy(uint64_t p, bool* left) {
  page_entry& e = table_[p];
  const advice adv = arena_.page_advice(p);
  if (adv == advice::discardable) {
    *left = true;
    drop_saved_copy(p);
    VS_TRY(unback_page(p, page_state::discarded));
    ++stats_.pages_discarded;
    ++stats_.pages_evicted;
    return ok;
  }
  if (e.frame_stale) {
    // Its saved copy holds its bytes, its frame does not: the frame goes without a copy out.
    *left = true;
    VS_TRY(unback_page(p, page_state::host));
    ++stats_.pages_evicted;
    return ok;
  }
  if (e.host_copy_valid && adv == advice::read_mostly) {
    *left = true;
    VS_TRY(unback_saved_page(p, /*scrubbed=*/false));
    e.host_copy_valid = false;  // the copy is now the page's only home, not a spare
    ++stats_.pages_clean;
    ++stats_.pages_evicted;
    return ok;
  }
  return ok;
}

int pager::unback_saved_page(uint64_t page, bool scrubbed) {
  const int rc = unback_page(page, page_state::host, scrubbed);
  if (rc == ok || table_[page].state != page_state::resident) return rc;
  // The page is still mapped, but a scrub may have zeroed its frame (or part of it): its
  // saved copy holds the only sure bytes. Copy them back so that the page is
  // whole where it is, then drop the copy (a read_mostly copy stays, as it was).
  const std::string why = last_error();
  const device_ptr va = arena_.page_address(page);
  if (copy_saved_copy_in(page) != ok) {
    // Both the frame and the way back failed: the saved copy holds the page's only sure
    // bytes; the page is marked so that nothing drops it, and it is copied in before use.
    log(log_level::error, "pager: page %" PRIu64 " (0x%" PRIxPTR ") could not leave its frame (%s) nor get its bytes back (%s); its saved "
        "copy is kept and copied in again at the next restore", page, va, why.c_str(), last_error());
    mark_stale(page);
    return fail(rc, "page %" PRIu64 " (0x%" PRIxPTR "): %s; putting its saved bytes back failed too: %s", page, va, why.c_str(), last_error());
  }
  settle_copied_in(page);
  return fail(rc, "page %" PRIu64 " (0x%" PRIxPTR ") stays resident, its bytes put back from its saved copy: %s", page, va, why.c_str());
}

// --- restore ----------------------------------------------------------------------------

int pager::restore_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = restore_locked(nullptr);
  stats_.restore_seconds += since(t0);
  if (rc == ok) resident_ = true;
  return rc;
}

int pager::restore_locked(const std::vector<bool>* chosen) {
  // Every page that needs a frame: all of them when the counts say none does (a resident
  // page is always live: freeing the last allocation on a page unbacks it).
  size_t needed = live_pages_ - resident_pages_ - asleep_pages_;
  if (chosen != nullptr && needed > 0) {
    needed = 0;
    for (uint64_t p = 0; p < table_.size(); ++p) {
      const page_entry& e = table_[p];
      needed += (*chosen)[p] && e.state != page_state::resident && !e.asleep && arena_.page_live_count(p) > 0;
    }
  }
  if (needed == 0 && stale_pages_ == 0) return ok;
  const store_mapping_scope mapping(store_, true);  // a switch's restore is the lock's critical path
  copy_pipeline::handlers on;
  on.copied = [&](uint64_t p, size_t, bool) {
    restored_copied_in(p);
    return ok;
  };
  on.not_copied = [&](uint64_t p, size_t) { restored_not_copied_in(p); };
  copy_pipeline copies(be_, in_stream_, events_, {}, std::move(on));
  stats_.last_restore_waited_ns = stats_.last_restore_frame_after_wait_ns = 0;
  stats_.last_restore_last_frame_ns = stats_.last_restore_queued_ns = 0;
  // Pages whose frames do not hold their bytes first: they need no frame.
  for (uint64_t p = 0; p < table_.size() && stale_pages_ > 0 && !copies.failed(); ++p) {
    if (table_[p].frame_stale) copies.note_failure(repair_stale_page(p));
  }
  if (needed > 0 && !copies.failed()) copies.note_failure(frames_.prepare(device_, needed));
  for (uint64_t p = 0; p < table_.size() && !copies.failed(); ++p) {
    if (chosen != nullptr && !(*chosen)[p]) continue;
    if (!restore_page(p, copies)) break;
  }
  stats_.last_restore_queued_ns = clock_ns();
  // The zero fills have no events: one synchronize for them (and the copies) at the end.
  copies.note_failure(be_.stream_synchronize(in_stream_));
  copies.complete_all();
  if (copies.failed()) {
    // Pages whose copy in completed keep their frames (they are resident and whole); the
    // others keep their saved copies.
    return fail(copies.failure(), "restore_all: stopped, nothing lost (pages not restored keep their saved copies): %s",
                copies.failure_detail().c_str());
  }
  return ok;
}

// --- sleep and wake -----------------------------------------------------------------------

void pager::set_asleep(uint64_t page, bool asleep) {
  page_entry& e = table_[page];
  if (e.asleep == asleep) return;
  e.asleep = asleep;
  if (asleep) {
    ++asleep_pages_;
  } else {
    --asleep_pages_;
  }
}

std::vector<bool> pager::live_pages_of(const std::vector<page_range>& ranges) const {
  std::vector<bool> chosen(table_.size(), false);
  for (const page_range& r : ranges) {
    for (uint64_t p = r.first; p < r.first + r.count && p < table_.size(); ++p) chosen[p] = arena_.page_live_count(p) > 0;
  }
  return chosen;
}

int pager::discard_pages(const std::vector<bool>& chosen) {
  // The caller's kernels may still be writing the frames we are about to give away.
  VS_TRY(add_context(be_.device_synchronize(device_), "sleep: synchronizing device %d failed before any page moved, nothing lost: ",
                     device_));
  for (uint64_t p = 0; p < table_.size(); ++p) {
    if (!chosen[p]) continue;
    page_entry& e = table_[p];
    if (e.state == page_state::resident) VS_TRY(unback_page(p, page_state::discarded));
    drop_saved_copy(p);
    // An unbacked page stays so: it comes back as a fresh page, zero-filled like a discarded one.
    if (e.state == page_state::host) e.state = page_state::discarded;
    ++stats_.pages_discarded;
    set_asleep(p, true);
  }
  return ok;
}

int pager::sleep(const std::vector<page_range>& ranges, bool discard) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<bool> chosen = live_pages_of(ranges);
  int rc = discard ? discard_pages(chosen) : evict_locked(&chosen);
  if (!discard) {
    // Whatever left its frame (or never had one) is asleep now.
    for (uint64_t p = 0; p < table_.size(); ++p) {
      if (chosen[p] && table_[p].state != page_state::resident) set_asleep(p, true);
    }
  }
  stats_.evict_seconds += since(t0);
  if (rc == ok) return ok;
  const std::string why = last_error();
  if (discard || !resident_) {
    // Discarded bytes cannot come back; and while not resident the pages that slept are
    // where an eviction would have put them. Either way no byte is lost: they stay asleep.
    return fail(rc, "sleep: stopped: %s; the pages that left their frames stay asleep, the rest are as they were (sleep again "
                "to finish, or wake)", why.c_str());
  }
  // Resident: put back what slept, so that the memory is as before the call.
  for (uint64_t p = 0; p < table_.size(); ++p) {
    if (chosen[p]) set_asleep(p, false);
  }
  const int back = restore_locked(&chosen);
  if (back != ok) {
    for (uint64_t p = 0; p < table_.size(); ++p) {
      if (chosen[p] && table_[p].state != page_state::resident) set_asleep(p, true);
    }
    return fail(rc, "sleep: stopped: %s; bringing back what had slept failed too (%s): those pages stay asleep with their bytes "
                "saved (wake them to try again)", why.c_str(), last_error());
  }
  return fail(rc, "sleep: stopped: %s; the memory was brought back and is awake, nothing lost", why.c_str());
}

int pager::wake(const std::vector<page_range>& ranges) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<bool> chosen = live_pages_of(ranges);
  for (uint64_t p = 0; p < table_.size(); ++p) {
    if (chosen[p]) set_asleep(p, false);
  }
  if (!resident_) return ok;  // brought in with the rest at the next restore_all()
  const int rc = restore_locked(&chosen);
  stats_.restore_seconds += since(t0);
  if (rc == ok) return ok;
  const std::string why = last_error();
  uint64_t left = 0;
  for (uint64_t p = 0; p < table_.size(); ++p) {
    if (chosen[p] && table_[p].state != page_state::resident) {
      set_asleep(p, true);
      ++left;
    }
  }
  return fail(rc, "wake: %" PRIu64 " page(s) of %" PRIu64 " MiB stay asleep, their bytes where they were: %s", left, frame_size_ >> 20,
              why.c_str());
}

void pager::restored_copied_in(uint64_t p) {
  // Its saved copy is given back at once (or kept, for read_mostly pages), so that a store
  // shared with other processes can hand the slot to a process evicting during this same
  // handoff, and a store with a budget reuses it.
  settle_copied_in(p);
  stats_.bytes_in += frame_size_;
  ++stats_.pages_restored;
}

void pager::restored_not_copied_in(uint64_t p) {
  // Its saved copy stays its home.
  if (table_[p].state != page_state::resident || unback_page(p, page_state::host) == ok) return;
  // The frame could not be left (and its scrub may have run): complete the copy in
  // instead, so that the page is whole where it is.
  if (copy_saved_copy_in(p) == ok) {
    restored_copied_in(p);
  } else {
    log(log_level::error, "pager: page %" PRIu64 " could neither leave its frame nor get its bytes in (%s); its saved copy is kept "
        "and copied in again at the next restore", p, last_error());
    mark_stale(p);
  }
}

bool pager::restore_page(uint64_t p, copy_pipeline& copies) {
  page_entry& e = table_[p];
  if (e.state == page_state::resident || e.asleep || arena_.page_live_count(p) == 0) return true;
  const page_state was = e.state;
  void* host = nullptr;
  if (was == page_state::host) {
    copies.note_failure(store_.slot_for_read(p, &host));
    if (copies.failed()) return false;
  }
  // Give back the saved copies of what has arrived, without waiting.
  copies.complete_finished();
  if (copies.failed()) return false;
  frame_id f = 0;
  int rc = take_frame_for_restore(copies, &f);
  if (copies.failed()) return false;  // rc is err_busy: no frame was taken for p
  if (rc == ok) rc = map_frame(p, f);
  if (rc != ok) {
    copies.note_failure(rc);
    return false;
  }
  const device_ptr va = arena_.page_address(p);
  if (was == page_state::host) {
    // Waits for the oldest copy first when the window is full; on failure the pipeline
    // puts p back (unmapped, its saved copy its home).
    const auto copy_in = [&](stream_id s) { return be_.copy_h2d(va, host, frame_size_, s); };
    if (copies.queue(p, copy_in) != ok) return false;
  } else if (was == page_state::discarded) {
    rc = be_.memset_d8(va, 0, frame_size_, in_stream_);
    if (rc != ok) {
      // Not zero-filled: the page goes back to discarded (restored zero-filled later).
      copies.note_failure(rc);
      be_.stream_synchronize(in_stream_);
      unback_page(p, page_state::discarded);
      return false;
    }
  }
  return true;
}

int pager::take_frame_for_restore(copy_pipeline& copies, frame_id* f) {
  // No frame free: another process must free one, perhaps one evicting into a host store
  // shared with us that waits for our slots. Finish our copies one at a time (each gives
  // its saved copy back) and look again in between, so we block only once none is left:
  // we never wait holding slots it could use, and a frame that comes free meanwhile is
  // taken without emptying the copy pipeline.
  int rc;
  bool waited = false;
  while ((rc = frames_.try_take(device_, frame_size_, f)) == err_busy) {
    if (!waited && stats_.last_restore_waited_ns == 0) stats_.last_restore_waited_ns = clock_ns();
    waited = true;
    if (copies.empty()) {
      rc = frames_.take(device_, frame_size_, f);
      break;
    }
    copies.complete_oldest();
    if (copies.failed()) return rc;
  }
  if (rc == ok) {
    const uint64_t now = clock_ns();
    if (waited && stats_.last_restore_frame_after_wait_ns == 0) stats_.last_restore_frame_after_wait_ns = now;
    stats_.last_restore_last_frame_ns = now;
  }
  return rc;
}

// --- queries ------------------------------------------------------------------------------

uint64_t pager::asleep_pages_in(const std::vector<page_range>& ranges) const {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t n = 0;
  for (const page_range& r : ranges) {
    for (uint64_t p = r.first; p < r.first + r.count && p < table_.size(); ++p) n += table_[p].asleep;
  }
  return n;
}

bool pager::resident() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return resident_;
}

pager_stats pager::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  pager_stats s = stats_;
  s.allocated_bytes = arena_.allocator().bytes_allocated();
  s.allocations = arena_.allocator().allocation_count();
  s.resident_bytes = resident_pages_ * frame_size_;
  s.host_bytes = store_.bytes_held();
  s.pages_not_resident = live_pages_ - resident_pages_ - asleep_pages_;
  s.pages_asleep = asleep_pages_;
  return s;
}

page_state pager::state_of(device_ptr ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ptr < arena_.base() || ptr >= arena_.base() + arena_.size()) return page_state::unbacked;
  const uint64_t page = (ptr - arena_.base()) / frame_size_;
  return table_[page].state;
}

int pager::check_invariants() const {
  std::lock_guard<std::mutex> lock(mutex_);
  VS_TRY(arena_.allocator().check_invariants());
  uint64_t live_count = 0;
  for (uint64_t p = 0; p < table_.size(); ++p) live_count += arena_.page_live_count(p) > 0;
  uint64_t stale_count = 0, asleep_count = 0;
  for (uint64_t p = 0; p < table_.size(); ++p) {
    stale_count += table_[p].frame_stale;
    asleep_count += table_[p].asleep;
  }
  if (asleep_count != asleep_pages_) {
    return fail(err_internal, "pager: counted %" PRIu64 " pages asleep, the table has %" PRIu64, asleep_pages_, asleep_count);
  }
  if (stale_count != stale_pages_) {
    return fail(err_internal, "pager: counted %" PRIu64 " pages with stale frames, the table has %" PRIu64, stale_pages_, stale_count);
  }
  if (live_count != live_pages_ || table_.count(page_state::resident) != resident_pages_) {
    return fail(err_internal, "pager: counted %" PRIu64 " live / %" PRIu64 " resident pages, the table has %" PRIu64 " / %" PRIu64,
                live_pages_, resident_pages_, live_count, table_.count(page_state::resident));
  }
  for (uint64_t p = 0; p < table_.size(); ++p) {
    const page_entry& e = table_[p];
    const bool live = arena_.page_live_count(p) > 0;
    const bool saved = store_.holds(p);
    auto broken = [&](const char* what) {
      return fail(err_internal, "pager: page %" PRIu64 " (%s, live %d, saved %d, copy valid %d): %s", p, page_state_name(e.state),
                  live, saved, e.host_copy_valid, what);
    };
    if (!live && (e.state != page_state::unbacked || saved)) return broken("a dead page holds a frame or a saved copy");
    if ((e.state == page_state::resident) != (e.frame != 0)) return broken("frame and state disagree");
    if (e.state == page_state::host && !saved) return broken("saved page has no copy in the store");
    if (e.host_copy_valid && !(e.state == page_state::resident && saved)) return broken("copy marked valid but not kept");
    if (e.frame_stale && !(e.state == page_state::resident && saved)) return broken("frame marked stale, but no saved copy to repair it from");
    if (e.frame_stale && e.host_copy_valid) return broken("frame marked stale, and its copy marked as equal to it");
    if (e.state == page_state::resident && saved && !e.host_copy_valid && !e.frame_stale) return broken("resident page holds a stale copy");
    if (resident_ && e.frame_stale) return broken("pager is resident but a page's frame does not hold its bytes");
    if (e.asleep && (!live || e.state == page_state::resident)) return broken("a page marked asleep is dead or resident");
    if (resident_ && live && e.state != page_state::resident && !e.asleep) return broken("pager is resident but a live page is not");
  }
  return ok;
}

void pager::placement_view(std::vector<range_allocation>* allocations, std::vector<resident_page>* resident) const {
  std::lock_guard<std::mutex> lock(mutex_);
  allocations->clear();
  arena_.allocator().overlapping(arena_.base(), arena_.base() + arena_.size(), allocations);
  resident->clear();
  resident->reserve(resident_pages_);
  for (uint64_t p = 0; p < table_.size(); ++p) {
    if (table_[p].state == page_state::resident) resident->push_back({p, table_[p].frame, table_[p].frees});
  }
}

}  // namespace vramswap::detail
