#include "runtime/placement_policy.hpp"

#include <algorithm>
#include <cmath>

#include "runtime/use_tracker.hpp"

namespace vramswap::detail {
namespace {

// A resident page as the decision sees it: its place in the observation, its smoothed rate.
struct ranked {
  size_t at = 0;  // index into the observation's pages
  double rate = 0;
};

}  // namespace

bool placement_policy::cooling(const page_state& s, uint64_t now_ns) const noexcept {
  if (s.moves == 0) return false;
  const unsigned doublings = std::min<unsigned>(s.moves - 1, k_cooldown_doublings);
  return now_ns - s.moved_at_ns < (k_cooldown_ns << doublings);
}

size_t placement_policy::budget_pages(uint64_t page_size) const noexcept {
  const double by_time = link_rate_ * k_round_copy_s;
  const uint64_t bytes = std::clamp<uint64_t>(static_cast<uint64_t>(by_time), k_round_min_bytes, k_round_max_bytes);
  return static_cast<size_t>(std::max<uint64_t>(1, bytes / page_size));
}

// One observation's resident pages, ranked for the pairing: host pages most used first,
// pool pages least used first.
struct placement_policy::ranking {
  const std::vector<placement_page>& pages;
  std::vector<ranked> host;
  std::vector<ranked> pool;

  double margin_of(const ranked& h, const ranked& c) const {
    return pages[h.at].temporary ? 1.0 : pages[c.at].temporary ? k_margin * k_margin : k_margin;
  }
  bool beats_at(const ranked& h, const ranked& c) const {
    const double margin = margin_of(h, c);
    // Sampled counts are noisy (a count of n samples of weight w is off by about w*sqrt(n)):
    // among many pages used alike, the most used host page and the least used pool page
    // differ by chance, so the difference must also stand out of that noise.
    const double noise = std::sqrt((h.rate + c.rate) * use_tracking::k_sample_every / k_averaged_s);
    return h.rate > margin * c.rate && h.rate - c.rate >= std::max(k_min_uses_per_s, k_noise_sigmas * noise);
  }
};

placement_plan placement_policy::observe(uint64_t now_ns, const std::vector<placement_page>& pages, uint64_t page_size) {
  placement_plan plan;
  const ranking r = rank(now_ns, pages);
  const bool pending = update_streaks(r);
  const double saving = pair_pages(now_ns, r, page_size, &plan);
  decide(now_ns, page_size, saving, pending, &plan);
  return plan;
}

placement_policy::ranking placement_policy::rank(uint64_t now_ns, const std::vector<placement_page>& pages) {
  ++observation_;
  const double period_s = last_observed_ns_ != 0 && now_ns > last_observed_ns_ ? (now_ns - last_observed_ns_) / 1e9
                                                                               : k_base_interval_ns / 1e9;
  last_observed_ns_ = now_ns;
  if (next_round_ns_ == 0) next_round_ns_ = now_ns;

  ranking r{pages, {}, {}};
  for (size_t i = 0; i < pages.size(); ++i) {
    const placement_page& p = pages[i];
    if (p.page >= state_.size()) state_.resize(p.page + 1);
    page_state& s = state_[p.page];
    const bool known = s.seen != 0 && s.seen + 1 == observation_;
    if (!known) s = page_state{};  // not resident in the last observation: a new allocation, a new history
    // The tracker halves its counts at each observation, so the uses of this period are
    // what the count holds beyond half the last one.
    const uint32_t carried = known ? s.heat / 2 : 0;
    const double fresh = (p.heat > carried ? p.heat - carried : 0) / period_s;
    s.rate = known ? s.rate + k_smoothing * (fresh - s.rate) : fresh;
    s.fresh = fresh;
    s.heat = p.heat;
    s.seen = observation_;
    (p.in_pool ? r.pool : r.host).push_back({i, s.rate});
  }
  std::stable_sort(r.host.begin(), r.host.end(), [](const ranked& a, const ranked& b) { return a.rate > b.rate; });
  std::stable_sort(r.pool.begin(), r.pool.end(), [](const ranked& a, const ranked& b) { return a.rate < b.rate; });
  return r;
}

bool placement_policy::update_streaks(const ranking& r) {
  const std::vector<placement_page>& pages = r.pages;
  const std::vector<ranked>& host = r.host;
  const std::vector<ranked>& pool = r.pool;
  // Streaks: the host pages that win their rank's pairing in this observation, whatever
  // their cooldowns (a page's wanting to move is what must be sustained), by their smoothed
  // rate and by this period's uses alone (a burst of uses long past does not keep winning).
  size_t winners = 0;
  while (winners < std::min(host.size(), pool.size()) && r.beats_at(host[winners], pool[winners])) ++winners;
  bool pending = false;  // a page is winning, not yet long enough
  for (size_t i = 0; i < host.size(); ++i) {
    page_state& s = state_[pages[host[i].at].page];
    // A streak grows in a period in which the page was used more than its victim, and ends
    // when its smoothed rate no longer wins (a period without uses, in a step longer than
    // the period, neither).
    const bool wins = i < winners;
    if (!wins) {
      s.streak = 0;
    } else if (s.fresh > r.margin_of(host[i], pool[i]) * pool[i].rate) {
      s.streak = static_cast<uint8_t>(std::min(255, s.streak + 1));
    }
    pending = pending || (wins && s.streak < k_sustain);
  }
  return pending;
}

double placement_policy::pair_pages(uint64_t now_ns, const ranking& r, uint64_t page_size, placement_plan* out) {
  placement_plan& plan = *out;
  const std::vector<placement_page>& pages = r.pages;
  const std::vector<ranked>& host = r.host;
  const std::vector<ranked>& pool = r.pool;
  // The eligible pairs: sustained winners out of their cooldown against pool pages out of theirs.
  const size_t budget = budget_pages(page_size);
  double saving = 0;  // link bytes per second
  size_t c = 0;
  for (size_t h = 0; h < host.size() && plan.in.size() < budget; ++h) {
    const page_state& hs = state_[pages[host[h].at].page];
    if (hs.streak < k_sustain || cooling(hs, now_ns)) continue;
    while (c < pool.size() && cooling(state_[pages[pool[c].at].page], now_ns)) ++c;
    if (c == pool.size() || !r.beats_at(host[h], pool[c])) break;
    plan.in.push_back(pages[host[h].at]);
    plan.out.push_back(pages[pool[c].at]);
    saving += (host[h].rate - pool[c].rate) * static_cast<double>(page_size);
    ++c;
  }
  plan.saving_bytes_per_s = static_cast<uint64_t>(saving);
  return saving;
}

void placement_policy::decide(uint64_t now_ns, uint64_t page_size, double saving, bool pending, placement_plan* out) {
  placement_plan& plan = *out;
  // The use pattern changed: what a round could gain grew well past what it could when the
  // rounds backed off.
  if (interval_ns_ > k_base_interval_ns && plan.saving_bytes_per_s > 2 * saving_when_backed_off_ && !plan.in.empty()) {
    interval_ns_ = k_base_interval_ns;
    next_round_ns_ = now_ns;
  }
  if (now_ns < next_round_ns_) {
    plan.in.clear();
    plan.out.clear();
    plan.what = placement_plan::verdict::not_due;
    return;
  }
  auto back_off = [&] {
    saving_when_backed_off_ = plan.saving_bytes_per_s;
    interval_ns_ = std::min(interval_ns_ * 2, k_max_interval_ns);
    next_round_ns_ = now_ns + interval_ns_;
    plan.in.clear();
    plan.out.clear();
  };
  if (plan.in.empty() && pending) {
    plan.what = placement_plan::verdict::not_due;  // not stable: look again at the next observation
    return;
  }
  if (plan.in.empty()) {
    plan.what = placement_plan::verdict::stable;
    back_off();
    return;
  }
  // The moved pages stay put for their cooldown at least (the shortest, a first move's), or
  // until the next round when that is later.
  plan.horizon_s = std::max(interval_ns_, k_cooldown_ns) / 1e9;
  plan.gain_s = saving * plan.horizon_s / link_rate_;
  plan.cost_s = 2.0 * static_cast<double>(plan.in.size() * page_size) / link_rate_ + gate_s_;
  if (plan.gain_s <= plan.cost_s) {
    plan.what = placement_plan::verdict::skipped_by_model;
    const double gain = plan.gain_s;
    const double cost = plan.cost_s;
    back_off();
    plan.gain_s = gain;
    plan.cost_s = cost;
    return;
  }
  plan.what = placement_plan::verdict::run;
  interval_ns_ = k_base_interval_ns;  // the placement is changing: look again soon
  next_round_ns_ = now_ns + interval_ns_;
}

void placement_policy::ran(uint64_t now_ns, const placement_plan& plan, size_t moved_in, size_t moved_out, double closed_s,
                           double copy_s, uint64_t bytes_copied) {
  auto mark = [&](const std::vector<placement_page>& pages, size_t n) {
    for (size_t i = 0; i < std::min(n, pages.size()); ++i) {
      if (pages[i].page >= state_.size()) continue;
      page_state& s = state_[pages[i].page];
      s.moved_at_ns = now_ns;
      s.moves = static_cast<uint8_t>(std::min(255, s.moves + 1));
      s.streak = 0;
    }
  };
  mark(plan.in, moved_in);
  mark(plan.out, moved_out);
  // The first measurement replaces the prior; later ones are averaged in.
  if (bytes_copied > 0 && copy_s > 0) {
    const double rate = bytes_copied / copy_s;
    link_rate_ = rate_measured_ ? (link_rate_ + rate) / 2 : rate;
    rate_measured_ = true;
  }
  if (moved_in + moved_out > 0) {
    const double overhead = std::max(0.0, closed_s - copy_s);
    gate_s_ = gate_measured_ ? (gate_s_ + overhead) / 2 : overhead;
    gate_measured_ = true;
  }
}

}  // namespace vramswap::detail
