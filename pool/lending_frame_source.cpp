#include "pool/lending_frame_source.hpp"

#include <cinttypes>
#include <mutex>

#include "core/status.hpp"

namespace vramswap::detail {
using namespace pool_layout;

lending_frame_source::lending_frame_source(backend& be, pool_segment& pool, uint32_t me, std::vector<frame_id> local,
                                           uint64_t host_limit)
    : be_(be), pool_(pool), me_(me), view_(pool, me, std::move(local)), host_limit_(host_limit) {}

bool lending_frame_source::take_pool_frame(frame_id* out) { return view_.take_free(frame_lent, out); }

lending_frame_source::~lending_frame_source() { release_spares(); }

int lending_frame_source::reserve_locked(size_t size) {
  const uint64_t held = host_bytes_.load(std::memory_order_relaxed);
  const uint64_t spare = spare_bytes_.load(std::memory_order_relaxed);
  if (held + spare + size > host_limit_) {
    return fail(err_out_of_memory,
                "oversubscription: the pool has no free frame and this process already holds %" PRIu64 " MiB of host frames "
                "(%" PRIu64 " MiB of them spares, kept for reclaims); %zu MiB more would pass VRAMSWAP_OVERSUBSCRIBE_LIMIT "
                "(%" PRIu64 " MiB). Raise the limit, or free memory",
                (held + spare) >> 20, spare >> 20, size >> 20, host_limit_ >> 20);
  }
  return ok;
}

int lending_frame_source::take_host_frame(int device, size_t size, frame_id* out, bool* was_spare) {
  {
    std::lock_guard<std::mutex> guard(spare_mutex_);
    if (was_spare != nullptr) *was_spare = !spares_.empty();
    if (!spares_.empty()) {
      *out = spares_.back();
      spares_.pop_back();
      spare_bytes_.fetch_sub(size, std::memory_order_relaxed);
      host_bytes_.fetch_add(size, std::memory_order_relaxed);
      return ok;
    }
    // Reserve the bytes first, so that threads creating frames at once never pass the limit.
    VS_TRY(reserve_locked(size));
    host_bytes_.fetch_add(size, std::memory_order_relaxed);
  }
  const int rc = be_.create_host_frame(device, size, out);
  if (rc != ok) {
    host_bytes_.fetch_sub(size, std::memory_order_relaxed);
    return add_context(rc, "oversubscription: a host frame for a page that has no pool frame: ");
  }
  created_.fetch_add(1, std::memory_order_relaxed);
  return ok;
}

int lending_frame_source::make_spares(int device, size_t size, size_t count, const std::function<bool()>& stop, size_t* made) {
  *made = 0;
  for (size_t i = 0; i < count && !stop(); ++i) {
    {
      std::lock_guard<std::mutex> guard(spare_mutex_);
      if (host_bytes_.load(std::memory_order_relaxed) + spare_bytes_.load(std::memory_order_relaxed) + size > host_limit_) {
        return ok;  // the limit bounds the frames made ahead
      }
      spare_bytes_.fetch_add(size, std::memory_order_relaxed);  // reserved: counted as a spare from now
    }
    frame_id f = 0;
    const int rc = be_.create_host_frame(device, size, &f);
    std::lock_guard<std::mutex> guard(spare_mutex_);
    if (rc != ok) {
      spare_bytes_.fetch_sub(size, std::memory_order_relaxed);
      return add_context(rc, "oversubscription: a host frame made ahead of a reclaim (%zu made before it): ", *made);
    }
    spares_.push_back(f);
    ++*made;
  }
  return ok;
}

size_t lending_frame_source::spare_count() const {
  std::lock_guard<std::mutex> guard(spare_mutex_);
  return spares_.size();
}

int lending_frame_source::take_host_frames(int device, size_t size, size_t count, std::vector<frame_id>* out, size_t* spares_used) {
  size_t reused = 0;
  int rc = ok;
  for (size_t i = 0; i < count && rc == ok; ++i) {
    bool spare = false;
    frame_id f = 0;
    rc = take_host_frame(device, size, &f, &spare);
    if (rc == ok) {
      out->push_back(f);
      reused += spare;
    }
  }
  if (spares_used != nullptr) *spares_used = reused;
  return rc;
}

size_t lending_frame_source::release_spares(size_t keep) {
  std::vector<frame_id> spares;
  {
    std::lock_guard<std::mutex> guard(spare_mutex_);
    if (spares_.size() <= keep) return 0;
    spares.assign(spares_.begin() + static_cast<ptrdiff_t>(keep), spares_.end());
    spares_.resize(keep);
  }
  for (frame_id f : spares) {
    size_t size = 0;
    if (be_.frame_size(f, &size) == ok) spare_bytes_.fetch_sub(size, std::memory_order_relaxed);
    be_.release_frame(f);
  }
  return spares.size();
}

int lending_frame_source::take(int device, size_t size, frame_id* out) {
  if (size != pool_.frame_size()) {
    return fail(err_invalid_argument, "pool: a %zu-byte frame was asked for; this pool's frames are %" PRIu64 " bytes", size,
                pool_.frame_size());
  }
  // A free pool frame only while no lock user is on its way to a turn: the free frames are
  // about to be its, and a page of ours in one would be asked back at once.
  if (!lock_user_on_its_way() && take_pool_frame(out)) return ok;
  return take_host_frame(device, size, out);
}

int lending_frame_source::give_back(frame_id frame) {
  uint32_t index = 0;
  if (!view_.index_of(frame, &index)) {
    // A host frame: kept as a spare. Its bytes are this process's own and only this
    // process takes it again, so it needs no scrub.
    size_t size = 0;
    VS_TRY(be_.frame_size(frame, &size));
    std::lock_guard<std::mutex> guard(spare_mutex_);
    spares_.push_back(frame);
    spare_bytes_.fetch_add(size, std::memory_order_relaxed);
    host_bytes_.fetch_sub(size, std::memory_order_relaxed);
    return ok;
  }
  if (keeping_.load(std::memory_order_acquire)) {
    const frame_word w = frame_word::decode(pool_.read(index));
    if (w.state == frame_lent && w.owner == me_) {
      std::lock_guard<std::mutex> guard(spare_mutex_);
      kept_.push_back(frame);
      return ok;
    }
  }
  return pool_.give_back(index, me_);
}

bool lending_frame_source::take_kept_pool_frame(frame_id* out) {
  for (;;) {
    frame_id f = 0;
    {
      std::lock_guard<std::mutex> guard(spare_mutex_);
      if (kept_.empty()) return false;
      f = kept_.back();
      kept_.pop_back();
    }
    uint32_t index = 0;
    if (!view_.index_of(f, &index)) continue;
    const frame_word w = frame_word::decode(pool_.read(index));
    if (w.state == frame_lent && w.owner == me_) {
      *out = f;
      return true;
    }
    pool_.give_back(index, me_);  // a lock holder asked for it meanwhile: it wins
  }
}

size_t lending_frame_source::release_kept_pool_frames() {
  std::vector<frame_id> kept;
  {
    std::lock_guard<std::mutex> guard(spare_mutex_);
    kept.swap(kept_);
  }
  for (frame_id f : kept) {
    uint32_t index = 0;
    if (view_.index_of(f, &index)) pool_.give_back(index, me_);
  }
  return kept.size();
}

uint32_t lending_frame_source::withdraw_abandoned_requests() {
  uint32_t n = 0;
  for (uint32_t f = 0; f < pool_.frame_count(); ++f) {
    const uint64_t raw = pool_.read(f);
    const frame_word w = frame_word::decode(raw);
    if (w.state != frame_requested || w.owner != me_) continue;
    const bool requester_gone =
        w.requester >= k_member_count || pool_.member(w.requester).state.load(std::memory_order_acquire) != member_live;
    if (requester_gone && pool_.move(f, raw, frame_lent, me_, k_no_member)) ++n;
  }
  return n;
}

bool lending_frame_source::lock_user_on_its_way() const noexcept {
  for (uint32_t m = 0; m < k_member_count; ++m) {
    if (m == me_) continue;
    const member_slot& s = pool_.member(m);
    if (s.state.load(std::memory_order_acquire) != member_live) continue;
    const uint32_t phase = s.phase.load(std::memory_order_relaxed);
    if (phase == phase_waiting || phase == phase_restoring) return true;
  }
  return false;
}

}  // namespace vramswap::detail
