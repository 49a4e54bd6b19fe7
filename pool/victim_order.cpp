#include "pool/victim_order.hpp"

#include <algorithm>

namespace vramswap::detail::victim_order {
using namespace pool_layout;

mean_gap_of_members mean_gap(const pool_segment& pool) noexcept {
  struct mean {
    uint64_t sum = 0, n = 0;
  } one_gap, rhythm;  // members with one gap, and with two or more
  for (uint32_t m = 0; m < k_member_count; ++m) {
    const member_slot& s = pool.member(m);
    const uint32_t gaps = s.idle_gaps.load(std::memory_order_relaxed);
    if (s.state.load(std::memory_order_acquire) != member_live || gaps == 0) continue;
    mean& into = gaps >= 2 ? rhythm : one_gap;
    into.sum += s.idle_gap_ns.load(std::memory_order_relaxed);
    ++into.n;
  }
  if (rhythm.n > 0) return {rhythm.sum / rhythm.n, true};
  return {one_gap.n == 0 ? 0 : one_gap.sum / one_gap.n, false};
}

prediction predict(const pool_segment& pool, uint32_t member, uint64_t now_ns, const mean_gap_of_members& others) noexcept {
  const member_slot& s = pool.member(member);
  prediction p;
  p.released_ns = s.released_ns.load(std::memory_order_relaxed);
  const uint32_t phase = s.phase.load(std::memory_order_relaxed);
  if (phase != phase_idle || s.holding.load(std::memory_order_relaxed) != 0) {
    p.at_lock = true;
    const uint64_t asked = s.asked_ns.load(std::memory_order_relaxed);
    p.next_ns = asked != 0 && asked < now_ns ? asked : now_ns;
    return p;
  }
  if (p.released_ns == 0) {
    p.next_ns = now_ns;
    return p;
  }
  // One gap, the one after the first turn, says less than another member's rhythm does.
  const uint32_t gaps = s.idle_gaps.load(std::memory_order_relaxed);
  const bool own = gaps >= 2 || (gaps == 1 && !others.settled);
  p.from_history = own;
  p.next_ns = p.released_ns + (own ? s.idle_gap_ns.load(std::memory_order_relaxed) : others.ns);
  return p;
}

std::vector<uint32_t> order(const pool_segment& pool, uint64_t now_ns, const options& o) {
  const mean_gap_of_members others = mean_gap(pool);
  struct owner_key {
    bool known = false;
    bool eligible = false;
    prediction p;
  };
  std::vector<owner_key> owners(k_member_count);
  struct candidate {
    uint32_t frame;
    uint32_t owner;
    bool lent;
  };
  std::vector<candidate> found;
  for (uint32_t f = 0; f < pool.frame_count(); ++f) {
    const frame_word w = frame_word::decode(pool.read(f));
    if (w.owner == o.me || w.owner >= k_member_count) continue;
    if (w.state == frame_lent) {
      if (o.lent) found.push_back({f, w.owner, true});
      continue;
    }
    if (w.state != frame_idle) continue;
    owner_key& k = owners[w.owner];
    if (!k.known) {
      k.known = true;
      k.p = predict(pool, w.owner, now_ns, others);
      k.eligible = o.only_after_ns == 0 || (!k.p.at_lock && (o.asker_queued || k.p.next_ns > o.only_after_ns));
    }
    if (k.eligible) found.push_back({f, w.owner, false});
  }
  std::sort(found.begin(), found.end(), [&](const candidate& a, const candidate& b) {
    if (a.lent != b.lent) return a.lent;
    if (a.lent || a.owner == b.owner) return a.frame < b.frame;
    const prediction& pa = owners[a.owner].p;
    const prediction& pb = owners[b.owner].p;
    if (pa.at_lock != pb.at_lock) return pb.at_lock;  // those at the lock last
    if (pa.next_ns != pb.next_ns) return pa.next_ns > pb.next_ns;
    if (pa.released_ns != pb.released_ns) return pa.released_ns > pb.released_ns;
    return a.owner < b.owner;
  });
  std::vector<uint32_t> out;
  out.reserve(found.size());
  for (const candidate& c : found) out.push_back(c.frame);
  return out;
}

}  // namespace vramswap::detail::victim_order
