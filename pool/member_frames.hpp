// member_frames: one pool member's view of the pool's frame table.
//
// Every process imported every pool frame once (pool_connection); pool frame i is local
// frame_id local[i] here. Both frame sources (pool_frame_source: time-sharing,
// lending_frame_source: oversubscription) see the table through this one view: which local
// handle is which pool frame, which frames other members asked this one for, how many are
// free or this member's. The table itself is shared-memory atomics (pool/pool_layout.hpp);
// the view reads it and takes free frames, and holds no state of its own but the handle map
// and a scan hint.
//
// Thread-safety: the reads may run from any thread; take_free() moves the scan hint and is
// called under its frame source's caller's mutex (the pager's).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "core/backend.hpp"
#include "pool/pool_layout.hpp"
#include "pool/pool_segment.hpp"

namespace vramswap::detail {

class member_frames {
 public:
  // `local[i]` is this process's handle of pool frame i; `me` is this process's member index.
  member_frames(pool_segment& pool, uint32_t me, std::vector<frame_id> local);

  pool_segment& pool() const noexcept { return pool_; }
  uint32_t member() const noexcept { return me_; }
  // This process's handle of pool frame `index`.
  frame_id local(uint32_t index) const noexcept { return local_[index]; }
  // The pool index of `frame`, or false when `frame` is not one of the pool's (a host frame).
  bool index_of(frame_id frame, uint32_t* index) const;
  bool is_pool_frame(frame_id frame) const { return index_of_.count(frame) != 0; }

  // A free frame moved to `state` (active, idle or lent) with this member as its owner:
  // its handle and pool index, or false when none is free. Never waits.
  bool take_free(pool_layout::frame_state state, frame_id* out, uint32_t* index = nullptr);

  // Frames other members asked this one to give back (local handles), in pool order.
  std::vector<frame_id> requested_of_me() const;
  // Whether this member has asked for any frame that is still requested.
  bool asked_by_me() const;
  // Frames this member owns in any state but free.
  uint32_t owned() const;
  // Frames nobody owns now.
  uint32_t free_frames() const;

 private:
  pool_segment& pool_;
  const uint32_t me_;
  const std::vector<frame_id> local_;
  std::unordered_map<frame_id, uint32_t> index_of_;
  uint32_t scan_hint_ = 0;
};

}  // namespace vramswap::detail
