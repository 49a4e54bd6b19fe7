// Placement by use: an oversubscribed session's pages move between its pool frames and
// its host frames by how much its kernels use them (docs/oversubscription.md, "Placement by
// use"; the observing half is runtime/use_tracker.hpp).
//
// A round (the service thread, at most once per k_placement_period_ns, only while no lock
// holder has asked for frames for a second):
//   1. take the tracker's counts (they decay) and attribute them to pages;
//   2. pair the most used pages in host frames with the least used in pool frames (pages
//      never observed count 0), while a pair pays: the hot page used more than twice as
//      much as the cold one (no ping-pong between near equals), and the link bytes it saves
//      per second (one page per use of the difference) at least repay its move, the two
//      pages' copies, within a second; and the round only when all its pairs save at least
//      k_placement_min_saving bytes per second. At most k_placement_round_bytes move each way;
//   3. host frames for the cold pages are taken with the gate open (spares first), then in
//      one closing of the gate, chunk by chunk: the cold pages move into them, their pool
//      frames stay lent to this process (lending_frame_source::keep_pool_frames), and the
//      hot pages move into those. The host frames the hot pages leave become spares for the
//      next round. The number of pool frames lent does not change.
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

constexpr uint64_t k_placement_round_bytes = 512ull << 20;      // moved each way per round, at most
constexpr uint64_t k_placement_min_saving = 64ull << 20;        // link bytes per second a round must save
constexpr size_t k_placement_chunk = 16;                        // pairs between two looks for a request
// Counts halve each round, about a second: a page used r times a second holds about 2r.
constexpr uint32_t k_counts_per_use_per_second = 2;

struct page_heat {
  uint64_t page = 0;
  frame_id frame = 0;
  uint32_t heat = 0;
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
  std::vector<uint32_t> heat;
  if (!starts_.empty()) use_tracker::attribute(starts_, allocations, memory().arena_base(), memory().frame_size(), &heat);
  std::vector<page_heat> host;
  for (const pager::resident_page& r : resident) {
    if (!frames_->is_pool_frame(r.frame)) host.push_back({r.page, r.frame, r.page < heat.size() ? heat[r.page] : 0});
  }
  std::stable_sort(host.begin(), host.end(), [](const page_heat& a, const page_heat& b) { return a.heat > b.heat; });
  std::vector<frame_id> out;
  for (size_t i = 0; i < host.size() && out.size() < at_most; ++i) out.push_back(host[i].frame);
  return out;
}

int oversubscribed_session::place_by_use() {
  tracker_->take_counts(&starts_);
  const uint64_t fs = memory().frame_size();
  std::vector<range_allocation> allocations;
  std::vector<pager::resident_page> resident;
  memory().placement_view(&allocations, &resident);
  std::vector<uint32_t> heat;
  use_tracker::attribute(starts_, allocations, memory().arena_base(), fs, &heat);
  std::vector<page_heat> host;
  std::vector<page_heat> pool;
  for (const pager::resident_page& r : resident) {
    const page_heat h{r.page, r.frame, r.page < heat.size() ? heat[r.page] : 0};
    (frames_->is_pool_frame(r.frame) ? pool : host).push_back(h);
  }
  if (host.empty() || pool.empty()) return ok;
  std::stable_sort(host.begin(), host.end(), [](const page_heat& a, const page_heat& b) { return a.heat > b.heat; });
  std::stable_sort(pool.begin(), pool.end(), [](const page_heat& a, const page_heat& b) { return a.heat < b.heat; });

  const size_t most = std::max<uint64_t>(1, k_placement_round_bytes / fs);
  size_t pairs = 0;
  uint64_t saving = 0;  // link bytes per second
  for (; pairs < std::min({host.size(), pool.size(), most}); ++pairs) {
    const uint64_t hot = host[pairs].heat;
    const uint64_t cold = pool[pairs].heat;
    if (hot <= 2 * cold) break;
    const uint64_t uses_per_s = (hot - cold) / k_counts_per_use_per_second;
    if (uses_per_s < 2) break;  // two pages cross the link to swap them
    saving += uses_per_s * fs;
  }
  if (pairs == 0 || saving < k_placement_min_saving) return ok;

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<frame_id> ready;  // host frames for the cold pages, with the gate open
  if (frames_->take_host_frames(device_, fs, pairs, &ready) != ok) {
    log(log_level::debug, "device %d: placement by use: %zu of %zu host frame(s): %s", device_, ready.size(), pairs, last_error());
  }
  pairs = std::min(pairs, ready.size());
  size_t moved_out = 0;
  size_t moved_in = 0;
  int failure = ok;
  bool interrupted = false;
  double closed_s = 0;
  const uint32_t seen = member().requests_seen();
  auto request_came = [&] {
    return member().stopping() || member().requests_seen() != seen || !frames_->frames().requested_of_me().empty();
  };
  if (pairs > 0) {
    const auto t_close = std::chrono::steady_clock::now();
    launch_gate::closed gate;
    frames_->keep_pool_frames(true);
    for (size_t at = 0; at < pairs; at += k_placement_chunk) {
      if (request_came()) {
        interrupted = true;
        break;
      }
      const size_t end = std::min(pairs, at + k_placement_chunk);
      std::vector<frame_id> cold;
      std::vector<frame_id> hot;
      for (size_t i = at; i < end; ++i) {
        cold.push_back(pool[i].frame);
        hot.push_back(host[i].frame);
      }
      size_t n = 0;
      int rc = memory().remap_pages(
          cold,
          [&](frame_id* f) -> int {
            if (ready.empty()) return fail(err_out_of_memory, "placement by use: no host frame left for a cold page");
            *f = ready.back();
            ready.pop_back();
            return ok;
          },
          &n);
      moved_out += n;
      if (rc != ok) {
        failure = fail(rc, "moving %zu little-used page(s) into host frames: %s", cold.size(), last_error());
        break;
      }
      if (request_came()) {  // the freed frames go to the pool below, where the holder finds them
        interrupted = true;
        break;
      }
      n = 0;
      rc = memory().remap_pages(
          hot,
          [this](frame_id* f) -> int {
            if (frames_->take_kept_pool_frame(f)) return ok;
            return fail(err_out_of_memory, "placement by use: the pool frames kept for the swap were asked for by a lock holder");
          },
          &n);
      moved_in += n;
      if (rc == err_out_of_memory) {
        interrupted = true;
        break;
      }
      if (rc != ok) {
        failure = fail(rc, "moving %zu much-used page(s) into pool frames: %s", hot.size(), last_error());
        break;
      }
    }
    frames_->keep_pool_frames(false);
    frames_->release_kept_pool_frames();
    closed_s = seconds_since(t_close);
  }
  for (frame_id f : ready) frames_->give_back(f);  // not needed: spares
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (moved_in + moved_out > 0) ++stats_.placement_rounds;
    stats_.pages_placed_in += moved_in;
    stats_.pages_placed_out += moved_out;
    stats_.placement_seconds += closed_s;
  }
  log(moved_in > 0 ? log_level::info : log_level::debug,
      "device %d: placement by use: %zu much-used page(s) into pool frames, %zu little-used into host frames (%" PRIu64
      " MiB/s of link traffic saved, estimated) in %.1f ms, the gate closed %.1f ms%s", device_, moved_in, moved_out,
      saving >> 20, seconds_since(t0) * 1e3, closed_s * 1e3, interrupted ? "; stopped early for a lock holder" : "");
  return failure;
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
      " into host frames, the gate closed %.3f s for it; %" PRIu64 " launch(es) observed, %" PRIu64 " whose arguments could not be read",
      device_, s.placement_rounds, s.pages_placed_in, s.pages_placed_out, s.placement_seconds, s.launches_observed,
      s.launches_unreadable);
}

}  // namespace vramswap::detail
