// pager::remap_pages: move resident pages into other frames without changing an address.
//
// Oversubscription (docs/oversubscription.md) moves an oversubscribed process's pages from
// pool frames into host frames when a lock holder needs the pool frames (demotion), and
// back when pool frames are free again (promotion). Either way a page's bytes move from
// frame A to frame B, both mapped at some point, and the page's address must then lead to B.
//
// Per batch of up to `copies_in_flight` pages, with a scratch reservation of as many frames:
//   1. take B, map it at a scratch slot, queue the copy page -> slot (copy_d2d);
//   2. wait for the batch's copies;
//   3. per page: unmap the slot; unmap A at the page's address, map B there, grant access
//      (if that fails, A goes back at the page's address, untouched: nothing is lost);
//      then map A at the slot and queue its scrub when the source wants one;
//   4. wait for the scrubs, unmap the slots, give each A back.
// A is scrubbed only after B is the page's home, so a failure at any step leaves every page
// with its bytes in the frame mapped at its address.
#include <chrono>
#include <cinttypes>

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

  struct move {
    uint64_t page;
    frame_id from;
    frame_id to;
    bool switched = false;
  };
  int failure = ok;
  std::string failure_detail;
  auto note = [&](int rc) {
    if (rc != ok && failure == ok) {
      failure = rc;
      failure_detail = last_error();
    }
    return rc;
  };
  for (size_t first = 0; first < pages.size() && failure == ok; first += batch) {
    std::vector<move> moves;
    // 1. New frames, filled through the scratch slots.
    for (size_t i = 0; i < batch && first + i < pages.size(); ++i) {
      const uint64_t p = pages[first + i];
      frame_id nf = 0;
      lap(&spent.fill_s);
      const int got = new_frame(&nf);
      lap(&spent.new_frames_s);
      if (note(got) != ok) break;
      const device_ptr slot = scratch_ + i * frame_size_;
      int rc = be_.map(slot, frame_size_, nf, 0);
      if (rc == ok && (rc = be_.set_access(slot, frame_size_, access_flags::read_write)) != ok) be_.unmap(slot, frame_size_);
      if (rc == ok && (rc = be_.copy_d2d(slot, arena_.page_address(p), frame_size_, out_stream_)) != ok) be_.unmap(slot, frame_size_);
      if (note(rc) != ok) {
        frames_.give_back(nf);
        break;
      }
      moves.push_back({p, table_[p].frame, nf});
    }
    // 2. The copies must be complete before any page changes frames.
    lap(&spent.fill_s);
    const int copied = be_.stream_synchronize(out_stream_);
    lap(&spent.copy_wait_s);
    if (const int rc = copied; rc != ok) {
      note(rc);
      for (size_t i = 0; i < moves.size(); ++i) {
        be_.unmap(scratch_ + i * frame_size_, frame_size_);
        frames_.give_back(moves[i].to);
      }
      break;
    }
    // 3. Switch each page to its new frame; the old frame moves to the slot to be scrubbed.
    for (size_t i = 0; i < moves.size(); ++i) {
      move& m = moves[i];
      const device_ptr slot = scratch_ + i * frame_size_;
      const device_ptr va = arena_.page_address(m.page);
      be_.unmap(slot, frame_size_);
      int rc = be_.unmap(va, frame_size_);
      if (rc == ok) {
        rc = be_.map(va, frame_size_, m.to, 0);
        if (rc == ok && (rc = be_.set_access(va, frame_size_, access_flags::read_write)) != ok) be_.unmap(va, frame_size_);
        if (rc != ok) {
          // Put the old frame back where it was: its bytes were never touched.
          note(rc);
          if (be_.map(va, frame_size_, m.from, 0) != ok || be_.set_access(va, frame_size_, access_flags::read_write) != ok) {
            log(log_level::error, "remap_pages: page %" PRIu64 " (0x%" PRIxPTR ") could not be mapped again: %s", m.page, va,
                last_error());
          }
        }
      } else {
        note(rc);
      }
      if (rc != ok) {
        frames_.give_back(m.to);
        continue;
      }
      m.switched = true;
      table_[m.page].frame = m.to;
      ++done;
      if (frames_.scrub_before_give_back(m.from)) {
        // Zero the old frame before another process gets it: map it at the free slot.
        int s = be_.map(slot, frame_size_, m.from, 0);
        if (s == ok && (s = be_.set_access(slot, frame_size_, access_flags::read_write)) != ok) be_.unmap(slot, frame_size_);
        if (s == ok && (s = be_.memset_d8(slot, 0, frame_size_, out_stream_)) != ok) be_.unmap(slot, frame_size_);
        if (s != ok) {
          // Not zeroed: keep it out of the pool rather than hand our bytes to someone else.
          log(log_level::error, "remap_pages: scrubbing the old frame of page %" PRIu64 " failed (%s); the frame is kept",
              m.page, last_error());
          m.switched = false;
        }
      }
    }
    // 4. Scrubs done: unmap the slots, give the old frames back.
    lap(&spent.switch_s);
    const int scrubbed = note(be_.stream_synchronize(out_stream_));
    for (size_t i = 0; i < moves.size(); ++i) {
      const move& m = moves[i];
      if (!m.switched) continue;
      const bool scrub = frames_.scrub_before_give_back(m.from);
      if (scrub) be_.unmap(scratch_ + i * frame_size_, frame_size_);
      if (scrubbed != ok && scrub) {
        log(log_level::error, "remap_pages: the scrub of page %" PRIu64 "'s old frame may not have completed; the frame is kept", m.page);
      } else {
        if (const int rc = frames_.give_back(m.from); rc != ok) log(log_level::warn, "remap_pages: giving back a frame: %s", last_error());
      }
    }
    lap(&spent.scrub_wait_s);
  }
  if (timing != nullptr) *timing = spent;
  stats_.pages_remapped += done;
  if (moved != nullptr) *moved = done;
  if (failure != ok) {
    return fail(failure, "remap_pages: %zu of %zu page(s) moved; the others stay in their frames: %s", done, pages.size(),
                failure_detail.c_str());
  }
  return ok;
}

}  // namespace vramswap::detail
