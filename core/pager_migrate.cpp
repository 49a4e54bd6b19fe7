// pager::remap_pages: move resident pages into other frames without changing an address.
//
// Oversubscription (docs/oversubscription.md) moves an oversubscribed process's pages from
// pool frames into host frames when a lock holder needs the pool frames (demotion), and
// back when pool frames are free again (promotion). Either way a page's bytes move from
// frame A to frame B, both mapped at some point, and the page's address must then lead to B.
//
// Per batch of up to `copies_in_flight` pages, with a scratch reservation of as many frames
// (one per slot of the copy window, core/copy_pipeline.hpp):
//   1. take B, map it at the page's scratch slot, queue the copy page -> slot (copy_d2d)
//      with its event;
//   2. wait for each page's copy, in order;
//   3. as each copy completes: unmap the slot; unmap A at the page's address, map B there,
//      grant access (if that fails, A goes back at the page's address, untouched: nothing is
//      lost); then map A at the slot and queue its scrub when the source wants one (behind
//      the batch's copies still on the stream);
//      a page whose copy is not confirmed stays in A, and B goes back unused;
//   4. wait for the scrubs, unmap the slots, give each A back.
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
  // 3. The page's copy is in its new frame: switch the page to it; the old frame moves to
  // the slot to be scrubbed.
  auto switch_page = [&](move& m, device_ptr slot) -> int {
    const device_ptr va = arena_.page_address(m.page);
    if (!unmap_slot(slot)) {
      // The new frame stays mapped at the slot: the page stays in its old frame.
      return fail(err_cuda, "remap_pages: unmapping scratch slot 0x%" PRIxPTR " (page %" PRIu64 "'s new frame): %s", slot, m.page,
                  scratch_why.c_str());
    }
    int rc = be_.unmap(va, frame_size_);
    if (rc == ok) {
      rc = be_.map(va, frame_size_, m.to, 0);
      if (rc == ok && (rc = be_.set_access(va, frame_size_, access_flags::read_write)) != ok) be_.unmap(va, frame_size_);
      if (rc != ok) {
        // Put the old frame back where it was: its bytes were never touched.
        const std::string why = last_error();
        if (be_.map(va, frame_size_, m.from, 0) != ok || be_.set_access(va, frame_size_, access_flags::read_write) != ok) {
          log(log_level::error, "remap_pages: page %" PRIu64 " (0x%" PRIxPTR ") could not be mapped again: %s", m.page, va,
              last_error());
        }
        fail(rc, "%s", why.c_str());
      }
    }
    if (rc != ok) {
      const std::string why = last_error();
      return_new_frame(m.to, slot, /*at_slot=*/false);  // it holds the page's whole copy
      return fail(rc, "%s", why.c_str());
    }
    m.switched = true;
    table_[m.page].frame = m.to;
    ++done;
    if (frames_.scrub_before_give_back(m.from)) {
      // Zero the old frame before another process gets it: map it at the free slot.
      int s = be_.map(slot, frame_size_, m.from, 0);
      if (s == ok && (s = be_.set_access(slot, frame_size_, access_flags::read_write)) != ok) unmap_slot(slot);
      if (s == ok && (s = be_.memset_d8(slot, 0, frame_size_, out_stream_)) != ok) unmap_slot(slot);
      if (s != ok) {
        // Not zeroed: keep it out of the pool rather than hand our bytes to someone else.
        log(log_level::error, "remap_pages: scrubbing the old frame of page %" PRIu64 " failed (%s); the frame is kept", m.page,
            last_error());
        m.switched = false;
      }
    }
    return ok;
  };
  copy_pipeline::handlers on;
  on.copied = [&](uint64_t, size_t slot, bool) {
    lap(&spent.copy_wait_s);
    const int rc = switch_page(moves[slot], slot_address(slot));
    lap(&spent.switch_s);
    return rc;
  };
  on.not_copied = [&](uint64_t, size_t slot) {
    // The page never left its old frame: the new one goes back, with whatever part of the
    // copy reached it zeroed.
    return_new_frame(moves[slot].to, slot_address(slot), /*at_slot=*/true);
  };
  copy_pipeline copies(be_, out_stream_, events_, {}, std::move(on));
  for (size_t first = 0; first < pages.size() && !copies.failed(); first += batch) {
    std::vector<size_t> slots;  // the batch's, in order
    // 1. New frames, filled through the scratch slots.
    for (size_t i = 0; i < batch && first + i < pages.size(); ++i) {
      const uint64_t p = pages[first + i];
      frame_id nf = 0;
      lap(&spent.fill_s);
      const int got = new_frame(&nf);
      lap(&spent.new_frames_s);
      copies.note_failure(got);
      if (got != ok) break;
      const size_t slot = copies.next_slot();
      const device_ptr at = slot_address(slot);
      int rc = be_.map(at, frame_size_, nf, 0);
      if (rc == ok && (rc = be_.set_access(at, frame_size_, access_flags::read_write)) != ok && !unmap_slot(at)) nf = 0;
      if (rc != ok) {
        copies.note_failure(rc);
        if (nf != 0) frames_.give_back(nf);
        break;
      }
      moves[slot] = {p, table_[p].frame, nf, false};
      slots.push_back(slot);
      const auto copy_over = [&](stream_id s) { return be_.copy_d2d(at, arena_.page_address(p), frame_size_, s); };
      if (copies.queue(p, copy_over) != ok) break;
    }
    // 2. Each page changes frames only once its copy is complete (3. above).
    lap(&spent.fill_s);
    copies.complete_all();
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
