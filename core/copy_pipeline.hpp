// copy_pipeline: page copies queued on one stream, a bounded window of them in flight,
// completed in the order they were queued.
//
// The pager moves pages in three places: eviction (device to host), restore (host to
// device) and remap_pages (frame to frame). All three keep the link busy the same way: each
// page's copy is queued on one of the pager's streams with an event recorded behind it, up
// to `window` pages ahead, and the oldest page is completed (its event waited for, or
// polled) before its slot of the window is needed again. A page may have work queued right
// behind its copy (the eviction's scrub of the frame the page leaves), with a second event
// behind that; stream order runs it only after the copy, and queued there it costs the
// transfer nothing.
//
// What differs between the three is what to do with a page whose copy completed and what
// to undo for one whose copy did not: the user's two handlers. The pipeline decides which
// of them runs, always by the same rule:
//   - A page is decided only once nothing queued for it can still run: its last event
//     completed, or, when waiting for it failed or queueing failed part-way, the whole
//     stream has been waited for (a late scrub would otherwise zero whatever its frame holds
//     next).
//   - A page whose copy is confirmed (its copy's event completed) is `copied`, also after
//     another page failed: its bytes are at the destination, and leaving them there
//     unused would leave the page's only good bytes where the failure path must not look.
//     `followed` says whether the work behind the copy is confirmed too.
//   - A page whose copy is not confirmed is `not_copied`: its source is still its home,
//     and the handler undoes what was prepared for the copy (a slot, a frame, a mapping).
//   - Every page queued is decided, in order, even after a failure; complete_all() before
//     deciding anything about the operation as a whole (the destructor does it too).
// The first failure, the pipeline's own or one its user notes, is kept with its detail for
// the operation's error message; the pipeline keeps going after it only to decide the
// pages in flight.
//
// No wait is added to what a copy loop needs: a page's event is waited for only when its
// slot is needed again, when the user asks (complete_oldest, complete_all), or polled
// (complete_finished); the whole stream only on a failure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "core/backend.hpp"

namespace vramswap::detail {

class copy_pipeline {
 public:
  struct handlers {
    // The page's copy is confirmed; `followed`: the work queued behind it is confirmed too
    // (false when there was none). `slot` is the page's slot of the window (0..window-1),
    // for users with per-slot resources. Non-ok is noted as a failure (the first one wins).
    std::function<int(uint64_t page, size_t slot, bool followed)> copied;
    // The page's copy is not confirmed (or was never queued) and nothing queued for it runs
    // any more: undo what was prepared for it, so that its source stays its home.
    std::function<void(uint64_t page, size_t slot)> not_copied;
  };
  // Queues work for one page on the pipeline's stream (passed in).
  using queue_fn = std::function<int(stream_id stream)>;

  // `copied_events`: one per slot of the window (their count is the window); recorded
  // behind each copy. `followed_events`: as many, recorded behind the work that follows a
  // copy, or empty when no page has any. The events must outlive the pipeline.
  copy_pipeline(backend& be, stream_id stream, const std::vector<event_id>& copied_events,
                const std::vector<event_id>& followed_events, handlers on);
  // Decides what is still in flight (complete_all()).
  ~copy_pipeline();
  copy_pipeline(const copy_pipeline&) = delete;
  copy_pipeline& operator=(const copy_pipeline&) = delete;

  bool empty() const noexcept { return in_flight_.empty(); }
  bool full() const noexcept { return in_flight_.size() == copied_events_.size(); }
  // The slot the next queued page gets.
  size_t next_slot() const noexcept { return next_slot_; }

  // Completes the oldest page when the window is full, so that queue() need not wait.
  void make_room();
  // Queue `page`: `copy` queues its copy, then the copy's event is recorded; `follow`
  // (optional) queues work behind it, then the second event. When the window is full the
  // oldest page is completed first. Returns ok, or the failure (noted):
  //   - the pipeline has failed (perhaps completing the oldest): nothing is queued, the
  //     page is not_copied;
  //   - `copy` or its event failed: the stream is waited for, the page is not_copied;
  //   - `follow` or its event failed: the stream is waited for, and the page stays in
  //     flight with its copy alone (it completes as copied, not followed, if the copy's
  //     event confirms it).
  int queue(uint64_t page, const queue_fn& copy, const queue_fn& follow = nullptr);
  // Wait for the oldest page and decide it. Nothing to do when none is in flight.
  void complete_oldest();
  // Decide the oldest pages whose work has completed, without waiting.
  void complete_finished();
  // Decide every page in flight, oldest first.
  void complete_all();

  // Record a failure of the user's (the first one is kept, with last_error()'s detail).
  void note_failure(int rc);
  bool failed() const noexcept { return failure_ != 0; }
  int failure() const noexcept { return failure_; }
  const std::string& failure_detail() const noexcept { return failure_detail_; }

 private:
  struct in_flight {
    uint64_t page;
    size_t slot;
    bool followed;  // work queued behind the copy, its event recorded
  };
  // Decide the oldest page once its last event completed (wait: wait for it). False when it
  // has not completed yet (only without waiting).
  bool complete_front(bool wait);
  // Wait for everything queued on the stream: before deciding a page whose own events
  // cannot say that nothing queued for it still runs.
  void drain_stream();

  backend& be_;
  const stream_id stream_;
  const std::vector<event_id> copied_events_;  // copies of the ids (a few), the events stay the caller's
  const std::vector<event_id> followed_events_;
  handlers on_;
  std::deque<in_flight> in_flight_;
  size_t next_slot_ = 0;
  int failure_ = 0;
  std::string failure_detail_;
};

}  // namespace vramswap::detail
