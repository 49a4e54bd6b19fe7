#include "pool/member_frames.hpp"

namespace vramswap::detail {
using namespace pool_layout;

member_frames::member_frames(pool_segment& pool, uint32_t me, std::vector<frame_id> local)
    : pool_(pool), me_(me), local_(std::move(local)) {
  for (uint32_t i = 0; i < local_.size(); ++i) index_of_.emplace(local_[i], i);
}

bool member_frames::index_of(frame_id frame, uint32_t* index) const {
  auto it = index_of_.find(frame);
  if (it == index_of_.end()) return false;
  *index = it->second;
  return true;
}

bool member_frames::take_free(frame_state state, frame_id* out, uint32_t* index) {
  uint32_t f = 0;
  if (!pool_.take_free(state, me_, &scan_hint_, &f)) return false;
  *out = local_[f];
  if (index != nullptr) *index = f;
  return true;
}

std::vector<frame_id> member_frames::requested_of_me() const {
  std::vector<frame_id> out;
  for (uint32_t f = 0; f < pool_.frame_count(); ++f) {
    const frame_word w = frame_word::decode(pool_.read(f));
    if (w.state == frame_requested && w.owner == me_) out.push_back(local_[f]);
  }
  return out;
}

bool member_frames::asked_by_me() const {
  for (uint32_t f = 0; f < pool_.frame_count(); ++f) {
    const frame_word w = frame_word::decode(pool_.read(f));
    if (w.state == frame_requested && w.requester == me_) return true;
  }
  return false;
}

uint32_t member_frames::owned() const {
  uint32_t n = 0;
  for (uint32_t f = 0; f < pool_.frame_count(); ++f) {
    const frame_word w = frame_word::decode(pool_.read(f));
    n += w.owner == me_ && w.state != frame_free;
  }
  return n;
}

uint32_t member_frames::free_frames() const {
  uint32_t n = 0;
  for (uint32_t f = 0; f < pool_.frame_count(); ++f) n += frame_word::decode(pool_.read(f)).state == frame_free;
  return n;
}

}  // namespace vramswap::detail
