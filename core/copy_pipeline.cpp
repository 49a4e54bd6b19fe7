#include "core/copy_pipeline.hpp"

#include <utility>

#include "core/status.hpp"

namespace vramswap::detail {

copy_pipeline::copy_pipeline(backend& be, stream_id stream, const std::vector<event_id>& copied_events,
                             const std::vector<event_id>& followed_events, handlers on)
    : be_(be), stream_(stream), copied_events_(copied_events), followed_events_(followed_events), on_(std::move(on)) {}

copy_pipeline::~copy_pipeline() { complete_all(); }

void copy_pipeline::note_failure(int rc) {
  if (rc != ok && failure_ == ok) {
    failure_ = rc;
    failure_detail_ = last_error();
  }
}

void copy_pipeline::drain_stream() {
  // Best effort: when even this fails there is nothing more to wait with, and the failure
  // that brought us here is the one reported.
  be_.stream_synchronize(stream_);
}

void copy_pipeline::make_room() {
  if (full()) complete_oldest();
}

int copy_pipeline::queue(uint64_t page, const queue_fn& copy, const queue_fn& follow) {
  make_room();
  const size_t slot = next_slot_;
  if (failed()) {
    on_.not_copied(page, slot);
    return failure_;
  }
  int rc = copy(stream_);
  if (rc == ok) rc = be_.event_record(copied_events_[slot], stream_);
  if (rc != ok) {
    // The copy may be queued without its event: nothing may still run for the page when it
    // is undone.
    note_failure(rc);
    drain_stream();
    on_.not_copied(page, slot);
    return failure_;
  }
  bool followed = false;
  if (follow) {
    rc = follow(stream_);
    if (rc == ok) rc = be_.event_record(followed_events_[slot], stream_);
    if (rc != ok) {
      // The copy is queued with its event, and perhaps the follow-up without one: once the
      // stream is done the page completes by its copy's event alone.
      note_failure(rc);
      drain_stream();
    } else {
      followed = true;
    }
  }
  in_flight_.push_back({page, slot, followed});
  next_slot_ = (next_slot_ + 1) % copied_events_.size();
  return rc == ok ? ok : failure_;
}

bool copy_pipeline::complete_front(bool wait) {
  const in_flight f = in_flight_.front();
  const event_id last = f.followed ? followed_events_[f.slot] : copied_events_[f.slot];
  bool done = true;
  const int rc = wait ? be_.event_synchronize(last) : be_.event_query(last, &done);
  if (rc == ok && !done) return false;
  in_flight_.pop_front();
  if (rc == ok) {
    note_failure(on_.copied(f.page, f.slot, f.followed));
    return true;
  }
  note_failure(rc);
  // Not confirmed as a whole: wait until nothing queued for the page can still run, then
  // see whether the copy alone was.
  drain_stream();
  if (f.followed && be_.event_synchronize(copied_events_[f.slot]) == ok) {
    note_failure(on_.copied(f.page, f.slot, false));
  } else {
    on_.not_copied(f.page, f.slot);
  }
  return true;
}

void copy_pipeline::complete_oldest() {
  if (!in_flight_.empty()) complete_front(/*wait=*/true);
}

void copy_pipeline::complete_finished() {
  while (!in_flight_.empty() && complete_front(/*wait=*/false)) {
  }
}

void copy_pipeline::complete_all() {
  while (!in_flight_.empty()) complete_front(/*wait=*/true);
}

}  // namespace vramswap::detail
