// Placement by use: an oversubscribed session's pages move between its pool frames and
// its host frames by how much its kernels use them (docs/oversubscription.md, "Placement by
// use"; the observing half is runtime/use_tracker.hpp).
//
// An observation (the service thread, once per k_placement_period_ns, only while no lock
// holder has asked for frames for a second) takes the tracker's counts (they decay),
// attributes them to pages and hands them to the policy (runtime/placement_policy.hpp),
// which decides across observations whether a round is due, which pairs move, and whether
// their gain pays for the round. A round that runs:
//   1. takes host frames for the cold pages with the gate open (spares first);
//   2. in one closing of the gate, chunk by chunk: the cold pages move into them, their pool
//      frames stay lent to this process (lending_frame_source::keep_pool_frames), and the
//      hot pages move into those. The host frames the hot pages leave become spares for the
//      next round. The number of pool frames lent does not change;
//   3. tells the policy what moved and what the closing cost (its overhead and the link
//      rate of its copies are the model's next estimates).
// A lock holder always wins: the round stops between chunks when a request comes (its
// frames are served by the next wake of the service thread), a kept frame a holder asked
// for is given to the pool, and whatever is kept at the end goes back to the pool.
#include <algorithm>
#include <chrono>
#include <cinttypes>

#include "core/launch_gate.hpp"
#include "core/log.hpp"
#include "core/status.hpp"
#include "lock/process_identity.hpp"
#include "runtime/oversubscribed_session.hpp"

namespace vramswap::detail {
namespace {

constexpr size_t k_placement_chunk = 16;  // pairs between two looks for a request

struct page_heat {
  uint64_t page = 0;
  frame_id frame = 0;
  double heat = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

void oversubscribed_session::start_placement() {
  if (!placement_) {
    log(log_level::debug, "device %d: placement by use is off (VRAMSWAP_OVERSUBSCRIBE_PLACEMENT=0): pages stay where they were "
        "first backed", device_);
    return;
  }
  auto t = std::make_unique<use_tracker>(memory().arena_base(), memory().arena_size(), memory().frame_size());
  if (t->start() != ok) {
    log(log_level::warn, "device %d: placement by use is off: %s", device_, last_error());
    return;
  }
  tracker_ = std::move(t);
  next_placement_ns_ = monotonic_ns() + 1'000'000'000;
}

std::vector<frame_id> oversubscribed_session::host_frames_hottest_first(uint32_t at_most) const {
  std::vector<range_allocation> allocations;
  std::vector<pager::resident_page> resident;
  memory().placement_view(&allocations, &resident);
  // The policy's smoothed rates (one observation's counts are noisy).
  std::vector<page_heat> host;
  for (const pager::resident_page& r : resident) {
    if (!frames_->is_pool_frame(r.frame)) host.push_back({r.page, r.frame, policy_.uses_per_s(r.page)});
  }
  std::stable_sort(host.begin(), host.end(), [](const page_heat& a, const page_heat& b) { return a.heat > b.heat; });
  std::vector<frame_id> out;
  for (size_t i = 0; i < host.size() && out.size() < at_most; ++i) out.push_back(host[i].frame);
  return out;
}

// What a round moved: cold pages into host frames, hot pages into pool frames, and whether
// a lock holder's request stopped it early.
struct oversubscribed_session::placement_moves {
  size_t out = 0;
  size_t in = 0;
  bool interrupted = false;
  pager::remap_timing spent;
};

int oversubscribed_session::place_by_use() {
  const uint64_t fs = memory().frame_size();
  const std::vector<placement_page> pages = observe_pages(fs);
  const placement_plan plan = policy_.observe(monotonic_ns(), pages, fs);
  if (plan.what == placement_plan::verdict::skipped_by_model) {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      ++stats_.placement_rounds_skipped;
    }
    log(log_level::debug, "device %d: placement by use: a round skipped: it would save %.1f ms of link time in %.0f s (%" PRIu64
        " MiB/s) and cost %.1f ms (copies at %.1f GB/s, the gate's overhead %.1f ms)", device_, plan.gain_s * 1e3, plan.horizon_s,
        plan.saving_bytes_per_s >> 20, plan.cost_s * 1e3, policy_.link_bytes_per_s() / 1e9, policy_.gate_overhead_s() * 1e3);
    return ok;
  }
  if (plan.what != placement_plan::verdict::run) return ok;
  return run_placement_round(plan, fs);
}

std::vector<placement_page> oversubscribed_session::observe_pages(uint64_t fs) {
  tracker_->take_counts(&starts_);
  std::vector<range_allocation> allocations;
  std::vector<pager::resident_page> resident;
  memory().placement_view(&allocations, &resident);
  std::vector<uint32_t> heat;
  use_tracker::attribute(starts_, allocations, memory().arena_base(), fs, &heat);
  // Temporaries: pages whose allocation was freed and made again in this period and the one
  // before (the allocator's pattern for a step's scratch tensors).
  if (frees_seen_.size() < heat.size()) {
    frees_seen_.resize(heat.size(), 0);
    freed_periods_.resize(heat.size(), 0);
  }
  std::vector<placement_page> pages;
  pages.reserve(resident.size());
  for (const pager::resident_page& r : resident) {
    bool temporary = false;
    if (r.page < frees_seen_.size()) {
      const bool freed_now = r.frees != frees_seen_[r.page];
      freed_periods_[r.page] = freed_now ? static_cast<uint8_t>(std::min(255, freed_periods_[r.page] + 1)) : 0;
      frees_seen_[r.page] = r.frees;
      temporary = freed_periods_[r.page] >= 2;
    }
    pages.push_back({r.page, r.frame, frames_->is_pool_frame(r.frame), r.page < heat.size() ? heat[r.page] : 0, temporary});
  }
  return pages;
}

int oversubscribed_session::run_placement_round(const placement_plan& plan, uint64_t fs) {
  size_t pairs = plan.in.size();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<frame_id> ready;  // host frames for the cold pages, with the gate open
  if (frames_->take_host_frames(device_, fs, pairs, &ready) != ok) {
    log(log_level::debug, "device %d: placement by use: %zu of %zu host frame(s): %s", device_, ready.size(), pairs, last_error());
  }
  pairs = std::min(pairs, ready.size());
  placement_moves moved;
  int failure = ok;
  double closed_s = 0;
  const uint32_t seen = member().requests_seen();
  if (pairs > 0) {
    const auto t_close = std::chrono::steady_clock::now();
    launch_gate::closed gate;
    frames_->keep_pool_frames(true);
    failure = swap_placement_pairs(plan, pairs, seen, &ready, &moved);
    frames_->keep_pool_frames(false);
    frames_->release_kept_pool_frames();
    closed_s = seconds_since(t_close);
  }
  for (frame_id f : ready) frames_->give_back(f);  // not needed: spares
  const size_t moved_in = moved.in;
  const size_t moved_out = moved.out;
  const double copy_s = moved.spent.fill_s + moved.spent.copy_wait_s;
  policy_.ran(monotonic_ns(), plan, moved_in, moved_out, closed_s, copy_s, uint64_t(moved_in + moved_out) * fs);
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (moved_in + moved_out > 0) ++stats_.placement_rounds;
    stats_.pages_placed_in += moved_in;
    stats_.pages_placed_out += moved_out;
    stats_.placement_seconds += closed_s;
  }
  log(moved_in > 0 ? log_level::info : log_level::debug,
      "device %d: placement by use: %zu much-used page(s) into pool frames, %zu little-used into host frames (%" PRIu64
      " MiB/s of link traffic saved, estimated: %.1f ms of link time in %.0f s against a cost of %.1f ms) in %.1f ms, the gate "
      "closed %.1f ms (copies %.1f)%s",
      device_, moved_in, moved_out, plan.saving_bytes_per_s >> 20, plan.gain_s * 1e3, plan.horizon_s, plan.cost_s * 1e3,
      seconds_since(t0) * 1e3, closed_s * 1e3, copy_s * 1e3, moved.interrupted ? "; stopped early for a lock holder" : "");
  return failure;
}

int oversubscribed_session::swap_placement_pairs(const placement_plan& plan, size_t pairs, uint32_t seen,
                                                 std::vector<frame_id>* ready_frames, placement_moves* moved) {
  std::vector<frame_id>& ready = *ready_frames;
  auto request_came = [&] {
    return member().stopping() || member().requests_seen() != seen || !frames_->frames().requested_of_me().empty();
  };
  for (size_t at = 0; at < pairs; at += k_placement_chunk) {
    if (request_came()) {
      moved->interrupted = true;
      return ok;
    }
    const size_t end = std::min(pairs, at + k_placement_chunk);
    std::vector<frame_id> cold;
    std::vector<frame_id> hot;
    for (size_t i = at; i < end; ++i) {
      cold.push_back(plan.out[i].frame);
      hot.push_back(plan.in[i].frame);
    }
    size_t n = 0;
    pager::remap_timing t;
    int rc = memory().remap_pages(
        cold,
        [&](frame_id* f) -> int {
          if (ready.empty()) return fail(err_out_of_memory, "placement by use: no host frame left for a cold page");
          *f = ready.back();
          ready.pop_back();
          return ok;
        },
        &n, &t);
    moved->out += n;
    moved->spent += t;
    if (rc != ok) return fail(rc, "moving %zu little-used page(s) into host frames: %s", cold.size(), last_error());
    if (request_came()) {  // the freed frames go to the pool below, where the holder finds them
      moved->interrupted = true;
      return ok;
    }
    n = 0;
    t = {};
    rc = memory().remap_pages(
        hot,
        [this](frame_id* f) -> int {
          if (frames_->take_kept_pool_frame(f)) return ok;
          return fail(err_out_of_memory, "placement by use: the pool frames kept for the swap were asked for by a lock holder");
        },
        &n, &t);
    moved->in += n;
    moved->spent += t;
    if (rc == err_out_of_memory) {
      moved->interrupted = true;
      return ok;
    }
    if (rc != ok) return fail(rc, "moving %zu much-used page(s) into pool frames: %s", hot.size(), last_error());
  }
  return ok;
}

uint64_t oversubscribed_session::pool_bytes_of(device_ptr ptr, uint64_t size) const {
  std::vector<range_allocation> allocations;
  std::vector<pager::resident_page> resident;
  memory().placement_view(&allocations, &resident);
  const uint64_t fs = memory().frame_size();
  if (size == 0 || ptr < memory().arena_base()) return 0;
  const uint64_t first = (ptr - memory().arena_base()) / fs;
  const uint64_t last = (ptr + size - 1 - memory().arena_base()) / fs;
  uint64_t pages = 0;
  for (const pager::resident_page& r : resident) {
    if (r.page >= first && r.page <= last && frames_->is_pool_frame(r.frame)) ++pages;
  }
  return pages * fs;
}

void oversubscribed_session::placement_summary() const {
  const oversubscribed_stats s = stats();
  log(log_level::info,
      "device %d: placement by use: %" PRIu64 " round(s), %" PRIu64 " page(s) into pool frames, %" PRIu64
      " into host frames, the gate closed %.3f s for it; %" PRIu64 " launch(es) observed, %" PRIu64 " whose arguments could not be read; "
      "%" PRIu64 " round(s) skipped: their gain was below their cost",
      device_, s.placement_rounds, s.pages_placed_in, s.pages_placed_out, s.placement_seconds, s.launches_observed,
      s.launches_unreadable, s.placement_rounds_skipped);
}

}  // namespace vramswap::detail
