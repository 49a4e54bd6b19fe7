// frame_source: where the pager gets frames to back resident pages, and gives them back.
//
// In a single process (and in tests) frames are made and released on demand
// (local_frame_source). In time-sharing, frames come from the per-device pool shared by all
// processes instead (pool/pool_frame_source.hpp), through the same interface.
#pragma once

#include <cstddef>

#include "core/backend.hpp"

namespace vramswap::detail {

class frame_source {
 public:
  virtual ~frame_source() = default;
  // A frame of `size` bytes on `device`; err_out_of_memory when none can be had. May block
  // while other processes evict frames this process asked for (see prepare).
  virtual int take(int device, size_t size, frame_id* out) = 0;
  // Like take, but never waits for another process: err_busy, with no detail recorded, when
  // no frame is free now (a shared pool). The pager's restore asks this first, so that
  // before it blocks it can finish its copies in flight and give their saved copies back
  // to a host store shared with the processes that are evicting for it (page_store::
  // try_slot_for_write has the other half of the argument).
  virtual int try_take(int device, size_t size, frame_id* out) { return take(device, size, out); }
  // A frame for memory allocated while the pager is not resident (its process does not hold
  // the device): only a frame that is nobody's now, taken without waiting and without asking
  // anyone; err_busy, with a detail that says why and what to do, when there is none. The
  // frame must remain one that a process needing it can have back (a shared pool: it is
  // this process's idle frame, as if used at its last turn). By default there is none: such
  // pages are backed at the next restore_all().
  virtual int try_take_not_resident(int /*device*/, size_t /*size*/, frame_id* /*out*/);
  virtual int give_back(frame_id frame) = 0;
  // The caller is about to take `count` frames: a shared pool starts asking other
  // processes to evict idle frames now, so their evictions overlap our copies in.
  virtual int prepare(int /*device*/, size_t /*count*/) { return 0; }
  // Must `frame` be zeroed before it is given back? (A shared pool hands it to another
  // process next: no data may cross between processes through it.)
  virtual bool scrub_before_give_back(frame_id /*frame*/) const { return false; }
};

// Frames created with the backend on demand and released when given back.
class local_frame_source final : public frame_source {
 public:
  explicit local_frame_source(backend& be) : be_(be) {}
  int take(int device, size_t size, frame_id* out) override { return be_.create_frame(device, size, out); }
  int give_back(frame_id frame) override { return be_.release_frame(frame); }

 private:
  backend& be_;
};

}  // namespace vramswap::detail
