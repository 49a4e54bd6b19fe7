// pager::remap_pages: move resident pages into other frames without changing an address.
//
// Oversubscription (docs/oversubscription.md) moves an oversubscribed process's pages from
// pool frames into host frames when a lock holder needs the pool frames (demotion), and
// back when pool frames are free again (promotion). Either way a page's bytes move from
// frame A to frame B, both mapped at some point, and the page's address must then lead to B.
//
// Per batch of up to `copies_in_flight` pages, with a scratch reservation of as many frames
// (one per slot of the copy window, core/copy_pipeline.hpp):
//   1. a fill group (a quarter of the batch) at a time: take B for each page of the group,
//      map it at the page's scratch slot; grant access to the group's slots (one call:
//      consecutive slots are one range); queue each copy page -> slot (copy_d2d) with its
//      event. The group's copies then run while the next group is mapped and granted;
//   2. wait for the batch's copies; a page whose copy is not confirmed stays in A, and B
//      goes back unused;
//   3. for each copied page: unmap the slot; unmap A at the page's address, map B there;
//      then grant access once per run of consecutive page addresses (if that fails, the
//      run's pages get A back at their addresses, untouched: nothing is lost); then map each
//      A at its slot, grant access to those slots (again per run), and queue A's scrub when
//      the source wants one;
//   4. wait for the scrubs, unmap the slots, give each A back.
// Granting access is the costly VMM call (it changes the device's page tables), and the
// driver takes one range over several mappings, so it is made once per run of addresses,
// not once per page.
// A is scrubbed only after B is the page's home, so a failure at any step leaves every page
// with its bytes in the frame mapped at its address.
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

int pager::remap_pages(const std::vector<frame_id>& old_frames, const std::function<int(frame_id*)>& new_frame, size_t* moved,
                       remap_timing* timing) {
  std::lock_guard<std::mutex> lock(mutex_);
  remap_timing spent;
  auto lap = [last = std::chrono::steady_clock::now()](double* into) mutable {
    const auto now = std::chrono::steady_clock::now();
    *into += std::chrono::duration<double>(now - last).count();
    last = now;
  };
  size_t done = 0;
  if (moved != nullptr) *moved = 0;
  std::vector<uint64_t> pages;
  for (uint64_t p = 0; p < table_.size(); ++p) {
    if (table_[p].state != page_state::resident) continue;
    for (frame_id f : old_frames) {
      if (table_[p].frame == f) {
        pages.push_back(p);
        break;
      }
    }
  }
  if (pages.empty()) return ok;
  const size_t batch = copies_in_flight_;
  // New frames are granted and their copies queued in groups of a quarter of the batch.
  const size_t fill_group = (batch + 3) / 4;
  if (scratch_ == 0) {
    VS_TRY(add_context(be_.reserve(device_, batch * frame_size_, 0, &scratch_), "remap_pages: a scratch range of %zu frames: ", batch));
    scratch_size_ = batch * frame_size_;
  }
  // Work queued earlier by this process may still be writing these pages.
  lap(&spent.fill_s);  // the scratch reservation, once per pager
  VS_TRY(add_context(be_.device_synchronize(device_), "remap_pages: synchronizing device %d: ", device_));
  lap(&spent.drain_s);

  // A page's move; a batch's are indexed by their slot of the copy window, which is also
  // their scratch slot (the window is the batch).
  struct move {
    uint64_t page = 0;
    frame_id from = 0;
    frame_id to = 0;
    bool switched = false;
  };
  std::vector<move> moves(batch);
  auto slot_address = [&](size_t slot) { return scratch_ + slot * frame_size_; };
  // A slot whose mapping cannot be removed would make every later map there fail: the
  // scratch range is left behind (with the frame mapped in it, which therefore never goes
  // back) and the next remap reserves another.
  bool scratch_lost = false;
  std::string scratch_why;
  auto unmap_slot = [&](device_ptr slot) {
    if (be_.unmap(slot, frame_size_) == ok) return true;
    if (!scratch_lost) scratch_why = last_error();
    scratch_lost = true;
    return false;
  };
  // A new frame that does not become its page's home goes back, but it may hold some or all
  // of the page's bytes (its copy ran, or ran in part): a source that hands frames to other
  // processes gets it zeroed first, or not at all. `at_slot`: it is still mapped at `slot`.
  auto return_new_frame = [&](frame_id f, device_ptr slot, bool at_slot) {
    if (!frames_.scrub_before_give_back(f)) {
      if (!at_slot || unmap_slot(slot)) frames_.give_back(f);
      return;
    }
    int s = ok;
    if (!at_slot) {
      s = be_.map(slot, frame_size_, f, 0);
      if (s == ok && (s = be_.set_access(slot, frame_size_, access_flags::read_write)) != ok) unmap_slot(slot);
      at_slot = s == ok;
    }
    if (s == ok && (s = be_.memset_d8(slot, 0, frame_size_, out_stream_)) == ok) s = be_.stream_synchronize(out_stream_);
    if (at_slot && !unmap_slot(slot)) return;  // mapped there still: kept with the scratch range
    if (s != ok) {
      log(log_level::error, "remap_pages: a new frame that holds page bytes could not be zeroed (%s); the frame is kept",
          last_error());
      return;
    }
    frames_.give_back(f);
  };
  // Access is granted once per run of consecutive addresses (the driver takes a range that
  // covers several mappings), not once per page: for the new frames at their slots, for the
  // pages at their addresses, and for the old frames at the slots to scrub them. `at[i]` in
  // increasing order; `grant(first, n)` gets each run, and its first failure ends the walk
  // (*failed_from: the index where the failing run began, at.size() when none failed).
  auto grant_runs = [&](const std::vector<device_ptr>& at, size_t* failed_from) -> int {
    *failed_from = at.size();
    for (size_t i = 0; i < at.size();) {
      size_t n = 1;
      while (i + n < at.size() && at[i + n] == at[i] + n * frame_size_) ++n;
      if (const int rc = be_.set_access(at[i], n * frame_size_, access_flags::read_write); rc != ok) {
        *failed_from = i;
        return rc;
      }
      i += n;
    }
    return ok;
  };
  // Put page m's old frame back at its address (its bytes were never touched), after its
  // new frame could not become its home there (`new_mapped`: the new frame is mapped at
  // the address, without access or with it).
  auto restore_old = [&](move& m, bool new_mapped) {
    const device_ptr va = arena_.page_address(m.page);
    if (new_mapped) be_.unmap(va, frame_size_);
    if (be_.map(va, frame_size_, m.from, 0) != ok || be_.set_access(va, frame_size_, access_flags::read_write) != ok) {
      log(log_level::error, "remap_pages: page %" PRIu64 " (0x%" PRIxPTR ") could not be mapped again: %s", m.page, va,
          last_error());
    }
  };
  std::vector<char> copied(batch, 0);
  copy_pipeline::handlers on;
  on.copied = [&](uint64_t, size_t slot, bool) {
    copied[slot] = 1;  // switched below, with the batch's other pages
    return ok;
  };
  on.not_copied = [&](uint64_t, size_t slot) {
    // The page never left its old frame: the new one goes back, with whatever part of the
    // copy reached it zeroed.
    return_new_frame(moves[slot].to, slot_address(slot), /*at_slot=*/true);
  };
  copy_pipeline copies(be_, out_stream_, events_, {}, std::move(on));
  for (size_t first = 0; first < pages.size() && !copies.failed(); first += batch) {
    std::vector<size_t> slots;  // the batch's, in page order (consecutive slots of the window)
    const size_t first_slot = copies.next_slot();
    // 1. New frames mapped at the scratch slots, access to them granted, their copies queued,
    // a group at a time, so that a group's copies run while the next group is mapped and
    // granted. A failure to have, map or grant a frame, or to queue a copy, ends the batch
    // there; the pages queued before it still move, and the failure is noted after them.
    int fill_failure = ok;
    std::string fill_why;
    const size_t in_batch = std::min(batch, pages.size() - first);
    for (size_t g = 0; g < in_batch && fill_failure == ok;) {
      const size_t group_end = std::min(in_batch, g + fill_group);
      const size_t group_first = slots.size();
      for (; g < group_end; ++g) {
        const uint64_t p = pages[first + g];
        frame_id nf = 0;
        lap(&spent.fill_s);
        const int got = new_frame(&nf);
        lap(&spent.new_frames_s);
        if (got != ok) {
          fill_failure = got;
          fill_why = last_error();
          break;
        }
        const size_t slot = (first_slot + g) % batch;
        if (const int rc = be_.map(slot_address(slot), frame_size_, nf, 0); rc != ok) {
          fill_failure = rc;
          fill_why = last_error();
          frames_.give_back(nf);
          break;
        }
        moves[slot] = {p, table_[p].frame, nf, false};
        copied[slot] = 0;
        slots.push_back(slot);
      }
      std::vector<device_ptr> at;
      for (size_t k = group_first; k < slots.size(); ++k) at.push_back(slot_address(slots[k]));
      size_t failed_from = 0;
      if (const int rc = grant_runs(at, &failed_from); rc != ok) {
        // None of this group's copies is queued yet: its new frames go back unwritten.
        if (fill_failure == ok) {
          fill_failure = rc;
          fill_why = last_error();
        }
        for (size_t k = group_first; k < slots.size(); ++k) {
          if (unmap_slot(slot_address(slots[k]))) frames_.give_back(moves[slots[k]].to);
        }
        slots.resize(group_first);
        break;
      }
      for (size_t k = group_first; k < slots.size(); ++k) {
        const size_t slot = slots[k];
        const device_ptr at_slot = slot_address(slot);
        const uint64_t p = moves[slot].page;
        const auto copy_over = [&](stream_id s) { return be_.copy_d2d(at_slot, arena_.page_address(p), frame_size_, s); };
        if (copies.queue(p, copy_over) != ok) {
          // That page is decided (not copied); the ones after it were never queued.
          for (size_t j = k + 1; j < slots.size(); ++j) return_new_frame(moves[slots[j]].to, slot_address(slots[j]), /*at_slot=*/true);
          slots.resize(k + 1);
          g = in_batch;  // the pipeline has failed: nothing more is queued
          break;
        }
      }
    }
    if (fill_failure != ok) copies.note_failure(fail(fill_failure, "%s", fill_why.c_str()));
    // 2. Each page changes frames only once its copy is complete.
    lap(&spent.fill_s);
    copies.complete_all();
    lap(&spent.copy_wait_s);
    // 3. Switch the copied pages: new frame at the page's address, in place of the old.
    std::vector<size_t> at_va;  // slots whose new frame is mapped at the page's address, without access yet
    for (size_t slot : slots) {
      if (!copied[slot]) continue;
      move& m = moves[slot];
      const device_ptr va = arena_.page_address(m.page);
      if (!unmap_slot(slot_address(slot))) {
        // The new frame stays mapped at the slot: the page stays in its old frame.
        copies.note_failure(fail(err_cuda, "remap_pages: unmapping scratch slot 0x%" PRIxPTR " (page %" PRIu64 "'s new frame): %s",
                                 slot_address(slot), m.page, scratch_why.c_str()));
        continue;
      }
      int rc = be_.unmap(va, frame_size_);
      if (rc == ok && (rc = be_.map(va, frame_size_, m.to, 0)) != ok) {
        const std::string why = last_error();
        restore_old(m, /*new_mapped=*/false);
        fail(rc, "%s", why.c_str());
      }
      if (rc != ok) {
        const std::string why = last_error();
        return_new_frame(m.to, slot_address(slot), /*at_slot=*/false);  // it holds the page's whole copy
        copies.note_failure(fail(rc, "%s", why.c_str()));
        continue;
      }
      at_va.push_back(slot);
    }
    {
      std::vector<device_ptr> at;
      for (size_t slot : at_va) at.push_back(arena_.page_address(moves[slot].page));
      size_t failed_from = 0;
      if (const int rc = grant_runs(at, &failed_from); rc != ok) {
        // The pages of the failing run and after it go back to their old frames (the runs
        // before it have access: they are switched).
        const std::string why = last_error();
        for (size_t k = failed_from; k < at_va.size(); ++k) {
          move& m = moves[at_va[k]];
          restore_old(m, /*new_mapped=*/true);
          return_new_frame(m.to, slot_address(at_va[k]), /*at_slot=*/false);
        }
        copies.note_failure(fail(rc, "%s", why.c_str()));
        at_va.resize(failed_from);
      }
    }
    std::vector<size_t> to_scrub;
    for (size_t slot : at_va) {
      move& m = moves[slot];
      m.switched = true;
      table_[m.page].frame = m.to;
      ++done;
      if (!frames_.scrub_before_give_back(m.from)) continue;
      // Zero the old frame before another process gets it: map it at the free slot.
      if (const int rc = be_.map(slot_address(slot), frame_size_, m.from, 0); rc != ok) {
        log(log_level::error, "remap_pages: scrubbing the old frame of page %" PRIu64 " failed (%s); the frame is kept", m.page,
            last_error());
        m.switched = false;  // not zeroed: kept out of the pool rather than hand our bytes to someone else
        continue;
      }
      to_scrub.push_back(slot);
    }
    {
      std::vector<device_ptr> at;
      for (size_t slot : to_scrub) at.push_back(slot_address(slot));
      size_t failed_from = 0;
      const int granted = grant_runs(at, &failed_from);
      for (size_t k = 0; k < to_scrub.size(); ++k) {
        move& m = moves[to_scrub[k]];
        const device_ptr slot = slot_address(to_scrub[k]);
        int rc = k < failed_from ? ok : granted;
        if (rc == ok) rc = be_.memset_d8(slot, 0, frame_size_, out_stream_);
        if (rc != ok) {
          log(log_level::error, "remap_pages: scrubbing the old frame of page %" PRIu64 " failed (%s); the frame is kept", m.page,
              last_error());
          unmap_slot(slot);
          m.switched = false;
        }
      }
    }
    lap(&spent.switch_s);
    // 4. Scrubs done: unmap the slots, give the old frames back.
    const int scrubbed = be_.stream_synchronize(out_stream_);
    copies.note_failure(scrubbed);
    for (size_t slot : slots) {
      const move& m = moves[slot];
      if (!m.switched) continue;
      const bool scrub = frames_.scrub_before_give_back(m.from);
      if (scrub && !unmap_slot(slot_address(slot))) continue;  // mapped there still: kept
      if (scrubbed != ok && scrub) {
        log(log_level::error, "remap_pages: the scrub of page %" PRIu64 "'s old frame may not have completed; the frame is kept", m.page);
      } else {
        if (const int rc = frames_.give_back(m.from); rc != ok) log(log_level::warn, "remap_pages: giving back a frame: %s", last_error());
      }
    }
    lap(&spent.scrub_wait_s);
    if (scratch_lost) break;
  }
  if (scratch_lost) {
    log(log_level::error, "remap_pages: a scratch slot could not be unmapped (%s); its range is left behind, with the frame mapped there, and the next remap reserves another",
        scratch_why.c_str());
    copies.note_failure(fail(err_cuda, "remap_pages: a scratch slot could not be unmapped: %s", scratch_why.c_str()));
    scratch_ = 0;
    scratch_size_ = 0;
  }
  if (timing != nullptr) *timing = spent;
  stats_.pages_remapped += done;
  if (moved != nullptr) *moved = done;
  if (copies.failed()) {
    return fail(copies.failure(), "remap_pages: %zu of %zu page(s) moved; the others stay in their frames: %s", done, pages.size(),
                copies.failure_detail().c_str());
  }
  return ok;
}

}  // namespace vramswap::detail
