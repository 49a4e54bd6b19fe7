// pager: one process's memory on one device, allocated from an arena and moved between
// device frames and a page store without ever changing an address.
//
// Allocation (malloc/free/advise) goes through the arena. While the pager is resident,
// pages that a new allocation touches get frames at once. While it is not (its process
// does not hold the device), a new allocation's pages are backed at once only from frames
// that are nobody's now (frame_source::try_take_not_resident), all of them or none, so that
// memory allocated and written between turns works while frames are free; a page of the
// allocation that was saved (shared with an older allocation) is brought back into such a
// frame too. When not all can be had the pages stay unbacked until restore_all()
// (backing::when_free) or the allocation fails (backing::required). A page that no live
// allocation touches gives its frame (or its saved copy) back immediately.
//
// evict_all(): synchronize the device, then for every resident page
//   - discardable advice: unmap, give the frame back, copy nothing (restored zero-filled);
//   - a still-valid saved copy (read_mostly pages restored earlier): unmap, copy nothing;
//   - otherwise: copy out into a pinned slot of the page store, zero the frame behind the
//     copy on the same stream (when the frame source asks for it), and unmap and give the
//     frame back as soon as both are known to have completed.
// Copies are queued on one stream, up to `copies_in_flight` ahead, each followed by an
// event (and by its scrub and a second event); unmapping page i overlaps the copies of
// pages i+1.. still on the wire.
//
// restore_all(): for every live page that is not resident (nor asleep), take a frame, map it at the
// page's address, grant access and queue the copy in (or a zero fill); mapping page i+1
// overlaps the copy of page i. Each page's saved copy is released as soon as its copy in
// is known complete (its event, polled each step), except for read_mostly pages, whose
// copy is kept so that the next eviction is free. One synchronize at the end.
//
// Waiting on other processes (a shared pool): before either loop blocks for a frame
// (restore) or a host slot (eviction), it finishes the copies it has in flight and gives
// back what they free (saved copies, frames), so two processes trading memory through a
// shared frame pool and a shared host pool never wait on each other while each holds what
// the other needs (docs/swap.md, "Shared host pool").
//
// Failure never loses data: a page's frame is scrubbed and unmapped only after its bytes are
// known to be in the store (a page whose copy completed leaves its frame even when a later
// page failed), and a saved copy is released only after the page is resident again and its
// copy in completed. A failed evict_all()/restore_all() leaves every page's bytes in
// exactly one place, resident or saved, and can simply be called again.
//
// Thread-safe: one mutex serializes every call (they are rare and long, or cheap).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/arena.hpp"
#include "core/backend.hpp"
#include "core/frame_source.hpp"
#include "core/page_store.hpp"
#include "core/page_table.hpp"

namespace vramswap::detail {

class copy_pipeline;

// What malloc does with a new allocation's pages while the pager is not resident.
enum class backing {
  when_free,  // back them now if every page gets a free frame, else at the next restore_all()
  required,   // back them now, or fail with err_out_of_memory (nothing changes then)
};

struct pager_config {
  uint64_t frame_size = 0;         // 0: VRAMSWAP_FRAME_SIZE
  uint64_t arena_size = 0;         // 0: VRAMSWAP_ARENA_SIZE (default ten times the device's memory)
  unsigned copies_in_flight = 16;  // eviction copies queued ahead of the unmaps
  bool start_resident = true;      // false: new allocations stay unbacked until restore_all()
};

// Fill in the zeros of `cfg` from the options and check them against `device`:
// the frame size must be a power-of-two multiple of the granularity.
int resolve_pager_config(backend& be, int device, pager_config* cfg);

struct pager_stats {
  uint64_t allocated_bytes = 0;  // live allocations (rounded to 256 B)
  uint64_t allocations = 0;
  uint64_t resident_bytes = 0;   // pages mapped in frames
  uint64_t pages_not_resident = 0;  // live pages not in a frame nor asleep: what the next restore_all() needs frames for
  uint64_t pages_asleep = 0;        // live pages put to sleep (sleep), not counted above
  uint64_t host_bytes = 0;       // pages saved in the page store
  uint64_t bytes_out = 0;        // copied device -> host, total
  uint64_t bytes_in = 0;         // copied host -> device, total
  uint64_t pages_evicted = 0;
  uint64_t pages_restored = 0;
  uint64_t pages_discarded = 0;  // evicted without a copy: discardable
  uint64_t pages_clean = 0;      // evicted without a copy: saved copy still valid (read_mostly)
  uint64_t pages_remapped = 0;   // moved into other frames by remap_pages (oversubscription)
  double evict_seconds = 0;      // total time in evict_all
  double restore_seconds = 0;    // total time in restore_all
  // The last restore_all that found no free frame for a page (it then waits for frames that
  // other processes evict for it): when that first happened, and when the first frame came
  // after it (CLOCK_MONOTONIC ns; both 0 when that restore never waited). Their gap is
  // what the first eviction asked of another process takes to hand over a frame.
  uint64_t last_restore_waited_ns = 0;
  uint64_t last_restore_frame_after_wait_ns = 0;
  // The last restore_all's end, in steps (CLOCK_MONOTONIC ns; 0 when it restored nothing):
  // when it took its last frame, and when its last copy was queued; the copies still
  // running then drain before it returns. They split a switch's tail after the owners'
  // last eviction into waiting for frames, mapping and queueing, and copies draining.
  uint64_t last_restore_last_frame_ns = 0;
  uint64_t last_restore_queued_ns = 0;
};

class pager {
 public:
  // `store` and `frames` must outlive the pager.
  static int create(backend& be, int device, page_store& store, frame_source& frames, pager_config cfg,
                    std::unique_ptr<pager>* out);
  ~pager();
  pager(const pager&) = delete;
  pager& operator=(const pager&) = delete;

  // cudaMalloc-like: 256-byte aligned; size 0 is an error. err_out_of_memory when the arena
  // is full, (while resident) no frame can be had, or (not resident, backing::required) no
  // free frame is there for every page; nothing changes then.
  int malloc(uint64_t size, device_ptr* out, backing when_not_resident = backing::when_free);
  // Make the pages of [ptr, ptr + size) resident now, as malloc with backing::required does
  // for a new allocation (a block reused while not resident, whose pages an eviction may
  // have dropped). Nothing to do while resident. err_out_of_memory when no free frame is
  // there for every page that needs one; nothing changes then.
  int back_now(device_ptr ptr, uint64_t size);
  // The pointer malloc (or malloc_at) returned; interior pointers and double frees are
  // errors naming it.
  int free(device_ptr ptr);
  // The driver's virtual memory API as a program under the shim uses it (arena::reserve):
  // reserve() holds addresses with nothing behind them; malloc_at() is malloc at an address
  // the caller chooses inside a reservation (the program's cuMemMap), its pages backed as
  // malloc's are; free() takes it out again; unreserve() gives a reservation with nothing in
  // it back.
  int reserve(uint64_t size, uint64_t alignment, device_ptr* out);
  int unreserve(device_ptr ptr);
  int malloc_at(device_ptr ptr, uint64_t size, backing when_not_resident = backing::when_free);
  int advise(device_ptr ptr, uint64_t size, advice a);

  int evict_all();
  // Every live page that is not resident and not asleep gets a frame (see the top).
  int restore_all();
  // Sleep and wake (runtime/memory_tags.hpp uses them for memory classes): the live pages of
  // `ranges` leave their frames and stay out, whatever restore_all() does, until wake().
  // Offload (discard false) saves their bytes in the store as an eviction does; discard
  // drops them (the pages come back zero-filled). Pages not resident already just fall
  // asleep (a discarded one's saved copy is dropped). On failure the pages that left their
  // frames are brought back when that can be done (the error says which happened): a failed
  // sleep leaves the memory as it was or asleep and whole, never half of a page lost.
  int sleep(const std::vector<page_range>& ranges, bool discard);
  // The pages of `ranges` are awake again: brought back now while the pager is resident
  // (frames taken as restore_all() takes them), else at the next restore_all(). On failure
  // the pages not brought back stay asleep (their bytes where they were), and the call may
  // simply be repeated.
  int wake(const std::vector<page_range>& ranges);
  // Pages of `ranges` asleep now.
  uint64_t asleep_pages_in(const std::vector<page_range>& ranges) const;
  // The pages [ptr, ptr + size) overlaps (no check: a range of the arena).
  page_range pages_of(device_ptr ptr, uint64_t size) const { return arena_.pages_of(ptr, size); }
  // Evict only the pages backed by these frames (a shared pool's owner serving another
  // process's request). Frames not backing a resident page are ignored.
  int evict_frames(const std::vector<frame_id>& frames);
  // Move the resident pages backed by `old_frames` into new frames, bytes and addresses
  // kept (oversubscription: demotion into host frames, promotion back into pool frames;
  // core/pager_migrate.cpp). `new_frame` gives each new frame; when it fails the pages not
  // yet moved stay where they are and its error is returned. Each old frame is scrubbed if
  // the frame source says so, then given back. *moved (optional): pages moved; *timing
  // (optional): where the time went.
  // The caller guarantees that no work of this process touches the memory meanwhile (the
  // launch gate, core/launch_gate.hpp, closed); the device is synchronized first.
  struct remap_timing {
    double drain_s = 0;       // waiting for this process's work queued before (synchronize)
    double new_frames_s = 0;  // in new_frame()
    double fill_s = 0;        // mapping old frames at scratch slots and the pages' addresses to new frames, granting access, queueing the copies
    double fill_map_s = 0;    // of fill_s: the driver's map and unmap calls (scratch slots, the pages' addresses)
    double fill_grant_s = 0;  // of fill_s: granting access (to the scratch slots, to the pages' new frames)
    double copy_wait_s = 0;   // waiting for the copies
    double switch_s = 0;      // the copied pages' new frames recorded, the old frames' scrubs queued
    double scrub_wait_s = 0;  // waiting for the scrubs, unmapping, giving old frames back
    remap_timing& operator+=(const remap_timing& o) {
      drain_s += o.drain_s;
      new_frames_s += o.new_frames_s;
      fill_s += o.fill_s;
      fill_map_s += o.fill_map_s;
      fill_grant_s += o.fill_grant_s;
      copy_wait_s += o.copy_wait_s;
      switch_s += o.switch_s;
      scrub_wait_s += o.scrub_wait_s;
      return *this;
    }
  };
  int remap_pages(const std::vector<frame_id>& old_frames, const std::function<int(frame_id*)>& new_frame, size_t* moved = nullptr,
                  remap_timing* timing = nullptr);
  // Old frames a remap could not make fit to go back (their scrub failed or was not
  // confirmed, or a second mapping could not be removed): they hold this process's bytes,
  // so they are kept, never handed to anyone, and tried again at each remap_pages, which
  // fails while any is kept.
  size_t frames_held_back() const;
  // The frames backing resident pages now.
  std::vector<frame_id> resident_frames() const;
  // What placement by use decides from (runtime/use_tracker.hpp): the live allocations in
  // address order, and each resident page as (page index, frame, how many times the
  // allocations on it were freed: a page freed and made again period after period holds a
  // temporary), in page order.
  struct resident_page {
    uint64_t page = 0;
    frame_id frame = 0;
    uint32_t frees = 0;
  };
  void placement_view(std::vector<range_allocation>* allocations, std::vector<resident_page>* resident) const;
  // Leave pages where they are, but back new allocations only at the next restore_all():
  // what a process does when it releases the device lock without evicting.
  void set_not_resident();
  bool resident() const;
  // The same without the mutex, for a signal handler's report (runtime/fault_report).
  bool resident_now() const noexcept { return resident_.load(std::memory_order_acquire); }

  pager_stats stats() const;
  uint64_t frame_size() const noexcept { return frame_size_; }
  device_ptr arena_base() const noexcept { return arena_.base(); }
  uint64_t arena_size() const noexcept { return arena_.size(); }
  page_state state_of(device_ptr ptr) const;
  // Verify page table, arena and store agree (tests call it after every step).
  int check_invariants() const;

 private:
  pager(backend& be, int device, page_store& store, frame_source& frames, const pager_config& cfg);

  int map_frame(uint64_t page, frame_id f);       // map f at the page, grant access (f given back on failure)
  // Scrub (unless `scrubbed`, or the frame source does not ask for it), unmap, give the
  // frame back; the page is `now`.
  int unback_page(uint64_t page, page_state now, bool scrubbed = false);
  // unback_page(page, host, scrubbed) for a page whose saved copy holds its bytes; when the
  // frame cannot be left (a scrub may already have zeroed it), the bytes are put back from
  // the saved copy and the page stays resident and whole.
  int unback_saved_page(uint64_t page, bool scrubbed);
  // Not resident: back every live page of `pages` that is not resident with frames no one
  // uses (all or none), filling saved and discarded ones; err_busy (detail set) when not
  // every page gets a frame, any other error from the backend or store. On failure every
  // page is where it was.
  int back_not_resident(page_range pages);
  void drop_saved_copy(uint64_t page);            // release the store's copy, if any
  // The saved copy of a page mapped at its address has been copied into its frame: the copy
  // is released (read_mostly pages keep it, valid); the frame holds the bytes.
  void settle_copied_in(uint64_t page);
  // Copy a mapped page's saved bytes into its frame and wait for them.
  int copy_saved_copy_in(uint64_t page);
  // Neither leaving the frame nor copying the saved bytes back worked: the saved copy is the
  // page's only home until repair_stale_page() or an eviction.
  void mark_stale(uint64_t page);
  int repair_stale_page(uint64_t page);  // copy_saved_copy_in, then settle; the error says what was kept
  void invalidate_saved_copies(page_range pages);
  // malloc's steps, once the arena has placed the allocation [ptr, ptr + size) whose new
  // pages are `fresh`. Each fails with the allocation undone (deallocated, its pages given
  // back, live_pages_ as before).
  // Stale pages the allocation shares get their saved bytes back before it is written.
  int repair_stale_pages_of(device_ptr ptr, uint64_t size);
  // Not resident: back the pages now if frames are free (see `backing`).
  int back_new_allocation(device_ptr ptr, uint64_t size, const std::vector<page_range>& fresh, backing when_not_resident);
  int back_new_not_resident(device_ptr ptr, uint64_t size, const std::vector<page_range>& fresh, backing when_not_resident);
  // Resident: back every fresh page with a frame.
  int back_fresh_pages(device_ptr ptr, uint64_t size, const std::vector<page_range>& fresh);
  // Where back_fresh_pages' time goes, for its debug line.
  struct backing_times {
    uint64_t taking_ns = 0;
    uint64_t mapping_ns = 0;
    uint64_t access_ns = 0;
  };
  // Back one run of fresh pages; on failure its pages go back as they came (the runs
  // backed before it are the caller's to undo), else they are added to `backed`.
  int back_fresh_run(const page_range& r, backing_times* times, std::vector<uint64_t>* backed);
  // Evict the resident pages for which `chosen(page)` is true (all when it is null).
  int evict_locked(const std::vector<bool>* chosen);
  // Bring in the live pages, not resident and not asleep, for which `chosen(page)` is true
  // (all when it is null); restore_all's and wake's body.
  int restore_locked(const std::vector<bool>* chosen);
  // sleep's steps: the chosen live pages, and dropping (discard) what they hold.
  std::vector<bool> live_pages_of(const std::vector<page_range>& ranges) const;
  int discard_pages(const std::vector<bool>& chosen);
  void set_asleep(uint64_t page, bool asleep);
  // evict_locked's steps. Tell the store how many of the chosen pages will be saved.
  void expect_saves_for(const std::vector<bool>* chosen);
  // Evict resident page `p`: it leaves its frame now, or its copy out is queued on
  // `copies`. False when the eviction stops there (the failure noted on `copies`).
  bool evict_page(uint64_t p, copy_pipeline& copies);
  // A page that leaves its frame with no copy out (*left): discardable, its frame stale, or
  // a read_mostly page with a valid saved copy. Its status then; ok and !*left otherwise.
  int evict_without_copy(uint64_t p, bool* left);
  // restore_all's steps. A page's copy in has completed.
  void restored_copied_in(uint64_t p);
  // A page's copy in is not known complete: it goes back to its saved copy.
  void restored_not_copied_in(uint64_t p);
  // Bring non-resident live page `p` back (a frame, then its copy in queued on `copies` or
  // its zero fill). False when the restore stops there (the failure noted on `copies`).
  bool restore_page(uint64_t p, copy_pipeline& copies);
  // A frame for the page being restored, finishing copies in flight while none is free.
  int take_frame_for_restore(copy_pipeline& copies, frame_id* f);

  backend& be_;
  const int device_;
  page_store& store_;
  frame_source& frames_;
  const uint64_t frame_size_;
  const unsigned copies_in_flight_;
  mutable std::mutex mutex_;
  arena arena_;
  page_table table_;
  std::atomic<bool> resident_{true};  // read without the mutex by resident_now()
  // Counts kept with every change, so that an acquire with nothing to bring in, and stats(),
  // cost O(1) instead of a walk over the page table (thousands of pages).
  uint64_t live_pages_ = 0;      // pages some live allocation touches
  uint64_t resident_pages_ = 0;  // pages mapped in a frame
  uint64_t stale_pages_ = 0;     // resident pages whose frame does not hold their bytes (page_entry::frame_stale)
  uint64_t asleep_pages_ = 0;    // live pages put to sleep (page_entry::asleep)
  stream_id out_stream_ = 0;
  stream_id in_stream_ = 0;
  stream_id scrub_stream_ = 0;  // scrubs made on their own (unback_page), never behind queued copies
  std::vector<event_id> events_;        // ring for eviction copies
  std::vector<event_id> scrub_events_;  // ring for the scrubs queued behind them
  device_ptr scratch_ = 0;        // remap_pages: where new frames are filled before they swap in
  size_t scratch_size_ = 0;
  // remap_pages' old frames that could not go back (frames_held_back()).
  struct held_frame {
    frame_id frame = 0;
    device_ptr mapped_at = 0;  // an abandoned scratch slot it is still mapped at (0: none)
    bool scrubbed = false;     // zeroed already (only its mapping kept it)
  };
  std::vector<held_frame> held_back_;
  int held_back_status_ = 0;  // why the first of them was kept
  std::string held_back_why_;
  void hold_back(frame_id frame, device_ptr mapped_at, bool scrubbed);  // the current error says why
  int reserve_scratch();   // scratch_ (one slot per copy in flight), unless there is one
  void abandon_scratch();  // a slot of it stays mapped: the range is left behind, the next remap reserves another
  // Make each held-back frame fit and give it back: unmap its slot, scrub it at a scratch
  // slot (when the source asks for scrubs), give it back. Those that fail stay.
  void release_held_back();
  // One remap_pages call's state and steps (core/pager_migrate.cpp).
  class remap_run;
  pager_stats stats_;
};

}  // namespace vramswap::detail
