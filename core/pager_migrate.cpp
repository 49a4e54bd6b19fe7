// pager::remap_pages: move resident pages into other frames without changing an address.
//
// Oversubscription (docs/oversubscription.md) moves an oversubscribed process's pages from
// pool frames into host frames when a lock holder needs the pool frames (demotion), and
// back when pool frames are free again (promotion). Either way a page's bytes move from
// frame A to frame B, both mapped at some point, and the page's address must then lead to B.
//
// A frame may be mapped at two addresses at once. Per batch of up to `copies_in_flight`
// pages, with a scratch reservation of as many frames (one per slot of the copy window,
// core/copy_pipeline.hpp), a fill group (a quarter of the batch) at a time:
//   1. take B for each page of the group and map its A at the page's scratch slot too (A
//      stays at the page's address); grant access to the group's slots (one call:
//      consecutive slots are one range);
//   2. unmap A at each page's address and map B there; grant access once per run of
//      consecutive page addresses (a failure gives the pages of the failing run and after
//      it A back at their addresses: A was never written, nothing is lost);
//   3. queue each copy slot (A) -> page address (B) (copy_d2d) with its event. The group's
//      copies run while the next group is filled.
// Then for the batch:
//   4. wait for the copies; a page whose copy is not confirmed gets A back at its address
//      (B zeroed first when the source hands frames to others, since the copy may have
//      reached it), and B goes back;
//   5. B is the home of each copied page: zero A at its slot (mapped and granted there
//      already) when the source wants it, wait for the scrubs, unmap the slots, give each A
//      back.
// Granting access is the costly VMM call (it changes the device's page tables; its cost
// grows with the bytes granted), so each page costs two frames' worth of grants: A at its
// slot, B at the page's address. The driver takes one range over several mappings, so
// each is made once per run of addresses.
// A is only read until B is the page's home, and scrubbed after, so a failure at any step
// leaves every page with its bytes in a frame mapped at its address. An A whose scrub fails
// (or is not confirmed), or whose slot cannot be unmapped, still holds the page's old bytes:
// it is held back (never given back) and tried again at the next remap, which fails while
// any is held, so that the process that asked for it hears why instead of waiting on a
// request its owner takes as served.
#include <algorithm>
#include <chrono>
#include <cinttypes>

#include "core/copy_pipeline.hpp"
#include "core/log.hpp"
#include "core/pager.hpp"
#include "core/status.hpp"

namespace vramswap::detail {

std::vector<frame_id> pager::resident_frames() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<frame_id> out;
  for (uint64_t p = 0; p < table_.size(); ++p) {
    if (table_[p].state == page_state::resident) out.push_back(table_[p].frame);
  }
  return out;
}

size_t pager::frames_held_back() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_back_.size();
}

void pager::hold_back(frame_id frame, device_ptr mapped_at, bool scrubbed) {
  if (held_back_.empty()) {
    held_back_status_ = err_cuda;
    held_back_why_ = last_error();
  }
  held_back_.push_back({frame, mapped_at, scrubbed});
}

int pager::reserve_scratch() {
  if (scratch_ != 0) return ok;
  VS_TRY(add_context(be_.reserve(device_, copies_in_flight_ * frame_size_, 0, &scratch_),
                     "remap_pages: a scratch range of %u frames: ", copies_in_flight_));
  scratch_size_ = copies_in_flight_ * frame_size_;
  return ok;
}

void pager::abandon_scratch() {
  scratch_ = 0;
  scratch_size_ = 0;
}

void pager::release_held_back() {
  for (size_t i = 0; i < held_back_.size();) {
    held_frame& h = held_back_[i];
    int rc = ok;
    if (h.mapped_at != 0) {
      rc = be_.unmap(h.mapped_at, frame_size_);
      if (rc == ok) h.mapped_at = 0;
    }
    if (rc == ok && !h.scrubbed && frames_.scrub_before_give_back(h.frame)) {
      rc = reserve_scratch();
      if (rc == ok && (rc = be_.map(scratch_, frame_size_, h.frame, 0)) == ok) {
        rc = be_.set_access(scratch_, frame_size_, access_flags::read_write);
        if (rc == ok) rc = be_.memset_d8(scratch_, 0, frame_size_, out_stream_);
        if (rc == ok) rc = be_.stream_synchronize(out_stream_);
        const std::string why = last_error();
        if (be_.unmap(scratch_, frame_size_) != ok) {
          // Left mapped at the slot: the range is abandoned with it (as in remap_pages).
          h.mapped_at = scratch_;
          abandon_scratch();
          if (rc == ok) rc = err_cuda;
        } else if (rc != ok) {
          fail(rc, "%s", why.c_str());
        }
        if (rc == ok) h.scrubbed = true;
      }
    }
    if (rc != ok) {
      held_back_status_ = rc;
      held_back_why_ = last_error();
      ++i;
      continue;
    }
    if (frames_.give_back(h.frame) != ok) log(log_level::warn, "remap_pages: giving back a frame held back before: %s", last_error());
    held_back_.erase(held_back_.begin() + static_cast<ptrdiff_t>(i));
  }
}

// One remap_pages call: the state its steps share (the batch's moves, the copy window,
// whether a scratch slot was lost, the time spent), so that remap_pages reads as its steps
// and each step, with the failure paths it owns, is a function with a name. It works on the
// pager's table, frames and scratch range under the lock remap_pages holds.
class pager::remap_run {
 public:
  remap_run(pager& pg, const std::function<int(frame_id*)>& new_frame);
  std::vector<uint64_t> pages_backed_by(const std::vector<frame_id>& old_frames) const;
  int held_back_failure(size_t done_now, size_t asked) const;
  int prepare();
  void move_batch(const std::vector<uint64_t>& pages, size_t first);
  bool copies_failed() const { return copies_.failed(); }
  bool scratch_lost() const { return scratch_lost_; }
  int finish(size_t asked, size_t* moved, remap_timing* timing);

 private:
  // A page's move; a batch's are indexed by their slot of the copy window, which is also
  // their scratch slot (the window is the batch).
  struct move {
    uint64_t page = 0;
    frame_id from = 0;
    frame_id to = 0;
    bool copied = false;  // its copy is confirmed: the new frame is the page's home
  };
  // How far restore_old got (logged, the error set, when not all the way).
  enum class restored { yes, new_frame_still_there, address_left_unmapped };

  void lap(double* into);
  template <class Call>
  static int timed(double* into, Call&& call);
  device_ptr slot_address(size_t slot) const { return pg_.scratch_ + slot * pg_.frame_size_; }
  bool unmap_slot(device_ptr slot);
  int grant_runs(const std::vector<device_ptr>& at, size_t* failed_from);
  restored restore_old(move& m, bool new_mapped);
  void undo(size_t slot, bool at_va, bool written);
  void note(int rc);
  copy_pipeline::handlers pipeline_handlers();

  void fill_group(const std::vector<uint64_t>& pages, size_t first, size_t first_slot, size_t begin, size_t end,
                  std::vector<size_t>* slots);
  std::vector<size_t> map_old_at_slots(const std::vector<uint64_t>& pages, size_t first, size_t first_slot, size_t begin,
                                       size_t end);
  bool grant_slots(const std::vector<size_t>& group);
  std::vector<size_t> switch_addresses(const std::vector<size_t>& group);
  void grant_addresses(std::vector<size_t>* at_va);
  void queue_copies(const std::vector<size_t>& at_va, std::vector<size_t>* slots);
  std::vector<size_t> settle_copied(const std::vector<size_t>& slots);
  void give_old_frames_back(const std::vector<size_t>& to_give);

  pager& pg_;
  const std::function<int(frame_id*)>& new_frame_;
  const size_t batch_;
  // New frames are granted and their copies queued in groups of a quarter of the batch.
  const size_t fill_group_;
  remap_timing spent_;
  std::chrono::steady_clock::time_point last_lap_ = std::chrono::steady_clock::now();
  size_t done_ = 0;
  std::vector<move> moves_;
  // A slot whose mapping cannot be removed would make every later map there fail: the
  // scratch range is left behind (with the frame mapped in it, which therefore never goes
  // back) and the next remap reserves another.
  bool scratch_lost_ = false;
  std::string scratch_why_;
  // The batch's first fill failure and its detail (move_batch).
  int fill_failure_ = ok;
  std::string fill_why_;
  // Last: its destructor decides what is in flight, with the state above still there.
  copy_pipeline copies_;
};

pager::remap_run::remap_run(pager& pg, const std::function<int(frame_id*)>& new_frame)
    : pg_(pg),
      new_frame_(new_frame),
      batch_(pg.copies_in_flight_),
      fill_group_((batch_ + 3) / 4),
      moves_(batch_),
      copies_(pg.be_, pg.out_stream_, pg.events_, {}, pipeline_handlers()) {}

// The time since the last lap, added to `into`.
void pager::remap_run::lap(double* into) {
  const auto now = std::chrono::steady_clock::now();
  *into += std::chrono::duration<double>(now - last_lap_).count();
  last_lap_ = now;
}

// A driver call's time, added to `into` (a part of the lap it runs in).
template <class Call>
int pager::remap_run::timed(double* into, Call&& call) {
  const auto start = std::chrono::steady_clock::now();
  const int rc = call();
  *into += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return rc;
}

// One pass over the page table, each resident page's frame looked up among the old ones
// (sorted): the table has thousands of pages, a demotion's request tens of frames.
std::vector<uint64_t> pager::remap_run::pages_backed_by(const std::vector<frame_id>& old_frames) const {
  std::vector<frame_id> wanted(old_frames);
  std::sort(wanted.begin(), wanted.end());
  std::vector<uint64_t> pages;
  for (uint64_t p = 0; p < pg_.table_.size(); ++p) {
    if (pg_.table_[p].state == page_state::resident && std::binary_search(wanted.begin(), wanted.end(), pg_.table_[p].frame)) {
      pages.push_back(p);
    }
  }
  return pages;
}

// While old frames are held back the remap fails (after moving what it can): the process
// that asked for them waits for them, and must hear why.
int pager::remap_run::held_back_failure(size_t done_now, size_t asked) const {
  // The cause last: a member slot keeps the start and the end of a long error.
  return fail(pg_.held_back_status_,
              "remap_pages: %zu of %zu page(s) moved; %zu old frame(s) held back (they hold this process's bytes; tried again "
              "at each request, the asker waits until its VRAMSWAP_EVICT_TIMEOUT): they could not be made fit to go back: %s",
              done_now, asked, pg_.held_back_.size(), pg_.held_back_why_.c_str());
}

// The scratch range, and the device drained: work queued earlier by this process may still
// be writing these pages.
int pager::remap_run::prepare() {
  VS_TRY(pg_.reserve_scratch());  // one slot per page of the batch
  lap(&spent_.fill_s);            // the scratch reservation, once per pager
  VS_TRY(add_context(pg_.be_.device_synchronize(pg_.device_), "remap_pages: synchronizing device %d: ", pg_.device_));
  lap(&spent_.drain_s);
  return ok;
}

bool pager::remap_run::unmap_slot(device_ptr slot) {
  if (pg_.be_.unmap(slot, pg_.frame_size_) == ok) return true;
  if (!scratch_lost_) scratch_why_ = last_error();
  scratch_lost_ = true;
  return false;
}

// Access is granted once per run of consecutive addresses (the driver takes a range that
// covers several mappings), not once per page: for the new frames at their slots, for the
// pages at their addresses, and for the old frames at the slots to scrub them. `at[i]` in
// increasing order; each run is granted, and the first failure ends the walk
// (*failed_from: the index where the failing run began, at.size() when none failed).
int pager::remap_run::grant_runs(const std::vector<device_ptr>& at, size_t* failed_from) {
  *failed_from = at.size();
  for (size_t i = 0; i < at.size();) {
    size_t n = 1;
    while (i + n < at.size() && at[i + n] == at[i] + n * pg_.frame_size_) ++n;
    if (const int rc = pg_.be_.set_access(at[i], n * pg_.frame_size_, access_flags::read_write); rc != ok) {
      *failed_from = i;
      return rc;
    }
    i += n;
  }
  return ok;
}

// Put page m's old frame back at its address (its bytes were never touched: it was only
// read), after its new frame could not become its home there (`new_mapped`: the new frame
// is mapped at the address, without access or with it).
pager::remap_run::restored pager::remap_run::restore_old(move& m, bool new_mapped) {
  const device_ptr va = pg_.arena_.page_address(m.page);
  if (new_mapped && pg_.be_.unmap(va, pg_.frame_size_) != ok) {
    log(log_level::error, "remap_pages: page %" PRIu64 " (0x%" PRIxPTR ") could not be unmapped from its new frame to go back to "
        "its old one: %s", m.page, va, last_error());
    return restored::new_frame_still_there;
  }
  if (pg_.be_.map(va, pg_.frame_size_, m.from, 0) != ok || pg_.be_.set_access(va, pg_.frame_size_, access_flags::read_write) != ok) {
    log(log_level::error, "remap_pages: page %" PRIu64 " (0x%" PRIxPTR ") could not be mapped again: %s", m.page, va,
        last_error());
    return restored::address_left_unmapped;
  }
  return restored::yes;
}

// A page that does not move after its old frame was mapped at its slot: the old frame's
// second mapping goes, and the new frame goes back. `written`: the new frame is mapped at
// the page's address with access, and a copy may have reached it (whole or in part): a
// source that hands frames to other processes gets it zeroed there first, or not at all.
// Otherwise the new frame was never written. The page's address leads to the old frame
// again first (`at_va`: the new frame is mapped there).
void pager::remap_run::undo(size_t slot, bool at_va, bool written) {
  move& m = moves_[slot];
  bool give = true;
  if (written && pg_.frames_.scrub_before_give_back(m.to)) {
    const device_ptr va = pg_.arena_.page_address(m.page);
    give = pg_.be_.memset_d8(va, 0, pg_.frame_size_, pg_.out_stream_) == ok && pg_.be_.stream_synchronize(pg_.out_stream_) == ok;
    if (!give) {
      log(log_level::error, "remap_pages: a new frame that holds page bytes could not be zeroed (%s); the frame is kept",
          last_error());
    }
  }
  const restored r = at_va ? restore_old(m, /*new_mapped=*/true) : restored::yes;
  if (r != restored::yes) {
    // The old frame stays mapped at its slot, so the slot's range is left behind (as for a
    // slot that cannot be unmapped).
    if (!scratch_lost_) scratch_why_ = "page " + std::to_string(m.page) + " could not be put back in its old frame: " + last_error();
    scratch_lost_ = true;
  }
  if (r == restored::new_frame_still_there) {
    // The page's address still leads to the new frame (with access): copy the old frame's
    // bytes there once more, from the slot, and the new frame is the page's home after
    // all. The old frame backs nothing then: held back, still mapped at its slot.
    const device_ptr va = pg_.arena_.page_address(m.page);
    int rc = pg_.be_.copy_d2d(va, slot_address(slot), pg_.frame_size_, pg_.out_stream_);
    if (rc == ok) rc = pg_.be_.stream_synchronize(pg_.out_stream_);
    if (rc != ok) {
      log(log_level::error, "remap_pages: page %" PRIu64 " (0x%" PRIxPTR ") stays in a frame its bytes may not have fully reached: "
          "%s", m.page, va, last_error());
    }
    pg_.table_[m.page].frame = m.to;
    ++done_;
    fail(err_cuda, "page %" PRIu64 "'s old frame, left at a scratch slot: %s", m.page, scratch_why_.c_str());
    pg_.hold_back(m.from, slot_address(slot), /*scrubbed=*/false);
    return;
  }
  // The address left unmapped: the page's bytes are in its old frame, mapped only at the
  // slot, which stays; it remains the page's frame (a later scrub through the unmapped
  // address fails, so it is never given back unscrubbed). Otherwise the old frame is mapped
  // at the page's address, and its slot mapping goes. The new frame is at no address either
  // way: it goes back (zeroed) or is held.
  if (r == restored::yes) unmap_slot(slot_address(slot));
  if (give) {
    pg_.frames_.give_back(m.to);
  } else {
    pg_.hold_back(m.to, 0, /*scrubbed=*/false);  // it may hold part of the page's bytes
  }
}

// The batch's first fill failure is kept, with its detail, for the error noted after the
// pages queued before it.
void pager::remap_run::note(int rc) {
  if (fill_failure_ == ok) {
    fill_failure_ = rc;
    fill_why_ = last_error();
  }
}

copy_pipeline::handlers pager::remap_run::pipeline_handlers() {
  copy_pipeline::handlers on;
  on.copied = [this](uint64_t, size_t slot, bool) {
    moves_[slot].copied = true;  // its old frame is scrubbed below, with the batch's others
    return ok;
  };
  on.not_copied = [this](uint64_t, size_t slot) {
    // The page's bytes are in its old frame still: its address leads there again.
    undo(slot, /*at_va=*/true, /*written=*/true);
  };
  return on;
}

void pager::remap_run::move_batch(const std::vector<uint64_t>& pages, size_t first) {
  std::vector<size_t> slots;  // the batch's queued pages, in page order (consecutive slots of the window)
  const size_t first_slot = copies_.next_slot();
  // 1. A fill group (a quarter of the batch) at a time: each page's old frame mapped at its
  // scratch slot too, access to the slots granted; each page's address unmapped from the
  // old frame and mapped to the new one, access granted per run of addresses; the copies
  // old frame (slot) -> new frame (the page's address) queued. A group's copies run while
  // the next group is filled. The first failure ends the batch there: the pages queued
  // before it still move, the others stay in their old frames, and it is noted after them.
  // Queued pages are therefore a prefix of the batch, in the window's slot order.
  fill_failure_ = ok;
  fill_why_.clear();
  const size_t in_batch = std::min(batch_, pages.size() - first);
  for (size_t g = 0; g < in_batch && fill_failure_ == ok && !copies_.failed(); g += fill_group_) {
    fill_group(pages, first, first_slot, g, std::min(in_batch, g + fill_group_), &slots);
  }
  if (fill_failure_ != ok) copies_.note_failure(fail(fill_failure_, "%s", fill_why_.c_str()));
  // 2. Each page is home in its new frame once its copy is complete.
  lap(&spent_.fill_s);
  copies_.complete_all();
  lap(&spent_.copy_wait_s);
  const std::vector<size_t> to_give = settle_copied(slots);
  lap(&spent_.switch_s);
  give_old_frames_back(to_give);
  lap(&spent_.scrub_wait_s);
}

// The pages [begin, end) of the batch (a fill group): their old frames at their slots, their
// addresses switched to their new frames, their copies queued (into *slots). A failure is
// noted and ends the group there.
void pager::remap_run::fill_group(const std::vector<uint64_t>& pages, size_t first, size_t first_slot, size_t begin, size_t end,
                                  std::vector<size_t>* slots) {
  const std::vector<size_t> group = map_old_at_slots(pages, first, first_slot, begin, end);
  if (!grant_slots(group)) return;
  std::vector<size_t> at_va = switch_addresses(group);
  grant_addresses(&at_va);
  queue_copies(at_va, slots);
}

// A new frame for each page of the group, and its old frame mapped at the page's scratch
// slot too (it stays at the page's address): the slots where the old frame is mapped too.
std::vector<size_t> pager::remap_run::map_old_at_slots(const std::vector<uint64_t>& pages, size_t first, size_t first_slot,
                                                       size_t begin, size_t end) {
  std::vector<size_t> group;  // slots where the old frame is mapped too
  for (size_t g = begin; g < end; ++g) {
    const uint64_t p = pages[first + g];
    frame_id nf = 0;
    lap(&spent_.fill_s);
    const int got = new_frame_(&nf);
    lap(&spent_.new_frames_s);
    if (got != ok) {
      note(got);
      break;
    }
    const size_t slot = (first_slot + g) % batch_;
    if (const int rc = timed(&spent_.fill_map_s, [&] { return pg_.be_.map(slot_address(slot), pg_.frame_size_, pg_.table_[p].frame, 0); });
        rc != ok) {
      note(rc);
      pg_.frames_.give_back(nf);
      break;
    }
    moves_[slot] = {p, pg_.table_[p].frame, nf, false};
    group.push_back(slot);
  }
  return group;
}

// Access to the group's slots, so that the copies can read the old frames there; on a
// failure the whole group stays in its old frames.
bool pager::remap_run::grant_slots(const std::vector<size_t>& group) {
  std::vector<device_ptr> at;
  for (size_t slot : group) at.push_back(slot_address(slot));
  size_t failed_from = 0;
  if (const int rc = timed(&spent_.fill_grant_s, [&] { return grant_runs(at, &failed_from); }); rc != ok) {
    note(rc);
    for (size_t slot : group) undo(slot, /*at_va=*/false, /*written=*/false);
    return false;
  }
  return true;
}

// Each page's address unmapped from its old frame and mapped to its new one: the slots
// whose page's address leads to the new frame, without access yet.
std::vector<size_t> pager::remap_run::switch_addresses(const std::vector<size_t>& group) {
  std::vector<size_t> at_va;  // slots whose page's address leads to the new frame, without access yet
  for (size_t k = 0; k < group.size(); ++k) {
    const size_t slot = group[k];
    move& m = moves_[slot];
    const device_ptr va = pg_.arena_.page_address(m.page);
    int rc = timed(&spent_.fill_map_s, [&] { return pg_.be_.unmap(va, pg_.frame_size_); });
    if (rc == ok && (rc = timed(&spent_.fill_map_s, [&] { return pg_.be_.map(va, pg_.frame_size_, m.to, 0); })) != ok) {
      const std::string why = last_error();
      restore_old(m, /*new_mapped=*/false);
      fail(rc, "%s", why.c_str());
    }
    if (rc != ok) {
      // This page and the group's later ones stay in their old frames.
      note(rc);
      for (size_t j = k; j < group.size(); ++j) undo(group[j], /*at_va=*/false, /*written=*/false);
      break;
    }
    at_va.push_back(slot);
  }
  return at_va;
}

// Access to the new frames at the pages' addresses, once per run of addresses.
void pager::remap_run::grant_addresses(std::vector<size_t>* at_va) {
  std::vector<device_ptr> at;
  for (size_t slot : *at_va) at.push_back(pg_.arena_.page_address(moves_[slot].page));
  size_t failed_from = 0;
  if (const int rc = timed(&spent_.fill_grant_s, [&] { return grant_runs(at, &failed_from); }); rc != ok) {
    // The pages of the failing run and after it go back to their old frames (the runs
    // before it have access: their copies are queued).
    note(rc);
    for (size_t k = failed_from; k < at_va->size(); ++k) undo((*at_va)[k], /*at_va=*/true, /*written=*/false);
    at_va->resize(failed_from);
  }
}

// The copies old frame (slot) -> new frame (the page's address), each behind the last in the
// copy window; they run while the next group is filled.
void pager::remap_run::queue_copies(const std::vector<size_t>& at_va, std::vector<size_t>* slots) {
  for (size_t k = 0; k < at_va.size(); ++k) {
    const size_t slot = at_va[k];
    const device_ptr from = slot_address(slot);
    const device_ptr to = pg_.arena_.page_address(moves_[slot].page);
    const auto copy_over = [&](stream_id s) { return pg_.be_.copy_d2d(to, from, pg_.frame_size_, s); };
    if (copies_.queue(moves_[slot].page, copy_over) != ok) {
      // That page is decided (not copied: undone); the ones after it were never queued.
      for (size_t j = k + 1; j < at_va.size(); ++j) undo(at_va[j], /*at_va=*/true, /*written=*/false);
      break;
    }
    slots->push_back(slot);
  }
}

// 3. The old frames of the copied pages: zeroed at their slots (already mapped there,
// with access) when the source wants it, before another process gets them. Each copied
// page's new frame is recorded as its home; the slots whose old frame may go back once the
// scrubs are done are returned.
std::vector<size_t> pager::remap_run::settle_copied(const std::vector<size_t>& slots) {
  std::vector<size_t> to_give;
  for (size_t slot : slots) {
    move& m = moves_[slot];
    if (!m.copied) continue;  // undone: the page is in its old frame
    pg_.table_[m.page].frame = m.to;
    ++done_;
    if (pg_.frames_.scrub_before_give_back(m.from)) {
      if (pg_.be_.memset_d8(slot_address(slot), 0, pg_.frame_size_, pg_.out_stream_) != ok) {
        log(log_level::error, "remap_pages: scrubbing the old frame of page %" PRIu64 " failed (%s); the frame is held back", m.page,
            last_error());
        // Kept out of the pool rather than hand our bytes to someone else.
        const std::string why = last_error();
        const bool unmapped = unmap_slot(slot_address(slot));
        fail(err_cuda, "scrubbing the old frame of page %" PRIu64 ": %s", m.page, why.c_str());
        pg_.hold_back(m.from, unmapped ? 0 : slot_address(slot), /*scrubbed=*/false);
        continue;
      }
    }
    to_give.push_back(slot);
  }
  return to_give;
}

// 4. Scrubs done: unmap the slots, give the old frames back.
void pager::remap_run::give_old_frames_back(const std::vector<size_t>& to_give) {
  const int scrubbed = pg_.be_.stream_synchronize(pg_.out_stream_);
  const std::string scrub_why = scrubbed != ok ? last_error() : "";
  copies_.note_failure(scrubbed);
  for (size_t slot : to_give) {
    const move& m = moves_[slot];
    const bool unscrubbed = scrubbed != ok && pg_.frames_.scrub_before_give_back(m.from);
    if (!unmap_slot(slot_address(slot))) {  // mapped there still: held back
      const std::string why = last_error();
      fail(err_cuda, "unmapping the old frame of page %" PRIu64 " from its scratch slot: %s", m.page, why.c_str());
      pg_.hold_back(m.from, slot_address(slot), !unscrubbed);
      continue;
    }
    if (unscrubbed) {
      log(log_level::error, "remap_pages: the scrub of page %" PRIu64 "'s old frame may not have completed; the frame is held back", m.page);
      fail(err_cuda, "the scrub of page %" PRIu64 "'s old frame may not have completed: %s", m.page, scrub_why.c_str());
      pg_.hold_back(m.from, 0, /*scrubbed=*/false);
    } else if (const int rc = pg_.frames_.give_back(m.from); rc != ok) {
      log(log_level::warn, "remap_pages: giving back a frame: %s", last_error());
    }
  }
}

// The call's outcome: a lost scratch slot's range left behind, the time and the count
// reported, and the first failure (a copy's, a fill's, a held-back frame's) returned.
int pager::remap_run::finish(size_t asked, size_t* moved, remap_timing* timing) {
  if (scratch_lost_) {
    log(log_level::error, "remap_pages: a scratch slot is left in use (%s); its range is left behind, with the frame mapped there, and the next remap reserves another",
        scratch_why_.c_str());
    copies_.note_failure(fail(err_cuda, "remap_pages: a scratch slot is left in use: %s", scratch_why_.c_str()));
    pg_.abandon_scratch();
  }
  if (timing != nullptr) *timing = spent_;
  pg_.stats_.pages_remapped += done_;
  if (moved != nullptr) *moved = done_;
  if (copies_.failed()) {
    return fail(copies_.failure(), "remap_pages: %zu of %zu page(s) moved; the others stay in their frames: %s", done_, asked,
                copies_.failure_detail().c_str());
  }
  if (!pg_.held_back_.empty()) return held_back_failure(done_, asked);
  return ok;
}

int pager::remap_pages(const std::vector<frame_id>& old_frames, const std::function<int(frame_id*)>& new_frame, size_t* moved,
                       remap_timing* timing) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!held_back_.empty()) release_held_back();
  remap_run run(*this, new_frame);  // its clock starts here: the page scan is part of the first fill lap
  if (moved != nullptr) *moved = 0;
  const std::vector<uint64_t> pages = run.pages_backed_by(old_frames);
  if (pages.empty()) return held_back_.empty() ? ok : run.held_back_failure(0, 0);
  VS_TRY(run.prepare());
  for (size_t first = 0; first < pages.size() && !run.copies_failed(); first += copies_in_flight_) {
    run.move_batch(pages, first);
    if (run.scratch_lost()) break;
  }
  return run.finish(pages.size(), moved, timing);
}

}  // namespace vramswap::detail
