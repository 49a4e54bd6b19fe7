// placement_policy: which pages of an oversubscribed process placement by use moves, and
// whether a round of moves pays (docs/oversubscription.md, "Placement by use"). Pure
// decisions: no frames, no gate, no clock of its own; runtime/oversubscribed_placement.cpp
// feeds it one observation per period and carries out the rounds it plans.
//
// An observation is every resident page with its heat (its attributed use count, which the
// tracker halves at each observation: a page used u times per period holds about 2u). The
// policy keeps per page, across observations:
//   - a smoothed use rate (uses per second), so that one observation's sampling noise does
//     not decide anything;
//   - a streak: in how many periods in a row the page, in a host frame, was used more than
//     `k_margin` times as much as the pool page it would displace, by more than the sampling
//     noise of the two rates (k_noise_sigmas) and `k_min_uses_per_s`. A page moves into a
//     pool frame only after k_sustain such periods;
//   - when it last moved and how often: a moved page is not moved again for a cooldown that
//     doubles with each move (a page that keeps being wanted both ways soon stops moving).
// A round (due at an interval that doubles each time a round finds nothing to do or does not
// pay, and goes back to the base period when what could be gained grows: the use pattern
// changed) pairs the eligible host pages, most used first, with the eligible pool pages,
// least used first, within a per-round budget, and runs only when its expected gain (the link
// bytes per second it saves, times the time the moved pages stay put, at the measured link
// rate) exceeds its cost (the bytes it copies both ways at that rate, plus the gate's closing
// overhead measured in the previous rounds).
//
// Temporaries (the allocator's hint): a page the caller marks `temporary` (its allocation is
// freed and made again period after period) is written and read within a step, so it is
// the best use of a pool frame: in a host frame it needs only to be used more than its
// victim (no margin), and in a pool frame it is displaced only by a page used `k_margin`
// times more than it is.
//
// Thread-safety: one thread (the service thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/backend.hpp"

namespace vramswap::detail {

struct placement_page {
  uint64_t page = 0;  // index in the arena
  frame_id frame = 0;
  bool in_pool = false;     // in a pool frame (else a host frame)
  uint32_t heat = 0;        // this observation's attributed count
  bool temporary = false;   // freed and made again period after period
};

struct placement_plan {
  enum class verdict {
    not_due,           // observed; no round due yet
    stable,            // a round found nothing worth moving: the interval doubles
    skipped_by_model,  // a round found moves, but their gain is below their cost
    run,               // move `in` into pool frames and `out` into host frames, pair by pair
  };
  verdict what = verdict::not_due;
  std::vector<placement_page> in;   // pages in host frames to move into pool frames
  std::vector<placement_page> out;  // pages in pool frames to move out (as many as `in`)
  uint64_t saving_bytes_per_s = 0;  // link bytes per second the pairs save, estimated
  double horizon_s = 0;             // how long the gain is counted for
  double gain_s = 0;                // link time saved over the horizon
  double cost_s = 0;                // link time of the copies plus the gate's overhead
};

class placement_policy {
 public:
  static constexpr double k_margin = 2.0;            // a host page must be used this many times more than its victim
  static constexpr double k_min_uses_per_s = 0.5;    // and at least this many uses per second more
  static constexpr unsigned k_sustain = 2;           // in this many observations in a row
  static constexpr double k_smoothing = 0.25;        // weight of a new observation in the smoothed rate
  // The seconds of uses the smoothed rate stands for (k_smoothing / (2 - k_smoothing) of a
  // period's variance), and how many standard deviations of sampling noise a difference needs.
  static constexpr double k_averaged_s = 7.0;
  static constexpr double k_noise_sigmas = 3.0;
  static constexpr uint64_t k_base_interval_ns = 1'000'000'000;   // rounds at most this often
  static constexpr uint64_t k_max_interval_ns = 64'000'000'000;   // the longest back-off
  static constexpr uint64_t k_cooldown_ns = 8'000'000'000;        // after a page's first move; doubles per move
  static constexpr unsigned k_cooldown_doublings = 5;
  static constexpr double k_round_copy_s = 0.05;                  // a round's copies, each way, at the link rate
  static constexpr uint64_t k_round_min_bytes = 64ull << 20;      // the budget's bounds, each way
  static constexpr uint64_t k_round_max_bytes = 2ull << 30;
  // Until a round has measured them: the link rate and the gate's closing overhead.
  static constexpr double k_prior_link_bytes_per_s = 25e9;
  static constexpr double k_prior_gate_s = 0.05;

  // One observation at `now_ns` (monotonic) of the resident pages of pages `page_size`; the
  // plan of a round when one is due.
  placement_plan observe(uint64_t now_ns, const std::vector<placement_page>& pages, uint64_t page_size);
  // A planned round ran: the first `moved_in` of plan.in and `moved_out` of plan.out moved,
  // the gate was closed `closed_s`, of which `copy_s` copying `bytes_copied`.
  void ran(uint64_t now_ns, const placement_plan& plan, size_t moved_in, size_t moved_out, double closed_s, double copy_s,
           uint64_t bytes_copied);

  double link_bytes_per_s() const noexcept { return link_rate_; }
  double gate_overhead_s() const noexcept { return gate_s_; }
  uint64_t interval_ns() const noexcept { return interval_ns_; }
  // A page's smoothed uses per second (0 for one never observed); for tests and logs.
  double uses_per_s(uint64_t page) const noexcept { return page < state_.size() ? state_[page].rate : 0; }

 private:
  struct page_state {
    double rate = 0;         // smoothed uses per second
    double fresh = 0;        // uses per second in the last period
    uint32_t heat = 0;       // the last observation's count
    uint64_t seen = 0;       // the observation it was last resident in
    uint64_t moved_at_ns = 0;
    uint8_t streak = 0;
    uint8_t moves = 0;
  };
  bool cooling(const page_state& s, uint64_t now_ns) const noexcept;
  size_t budget_pages(uint64_t page_size) const noexcept;
  // observe's steps: the pages' smoothed rates, ranked; the host pages' streaks (true: one
  // wins, not yet long enough); the eligible pairs into the plan (returns their saving, link
  // bytes per second); the verdict, and when the next round may come.
  struct ranking;
  ranking rank(uint64_t now_ns, const std::vector<placement_page>& pages);
  bool update_streaks(const ranking& r);
  double pair_pages(uint64_t now_ns, const ranking& r, uint64_t page_size, placement_plan* plan);
  void decide(uint64_t now_ns, uint64_t page_size, double saving, bool pending, placement_plan* plan);

  std::vector<page_state> state_;
  uint64_t observation_ = 0;
  uint64_t last_observed_ns_ = 0;
  uint64_t interval_ns_ = k_base_interval_ns;
  uint64_t next_round_ns_ = 0;
  uint64_t saving_when_backed_off_ = 0;  // what the last round that did nothing could have saved
  double link_rate_ = k_prior_link_bytes_per_s;
  double gate_s_ = k_prior_gate_s;
  bool gate_measured_ = false;
  bool rate_measured_ = false;
};

}  // namespace vramswap::detail
