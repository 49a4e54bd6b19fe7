// victim_order (pool/victim_order.hpp) on a real pool segment, in one process: which idle
// frames a member asks for, in which order, from the hints the members publish in their
// slots. Jobs that take turns in a cycle must lose their frames in the order they will come
// back in: the one that will acquire last is asked first. And whether a member between its
// turns asks ahead of need at all (pool_frame_source::ask_ahead, the order's one user that
// decides by itself when to ask).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/process_identity.hpp"
#include "pool/member_observer.hpp"
#include "pool/pool_frame_source.hpp"
#include "pool/pool_segment.hpp"
#include "pool/victim_order.hpp"

namespace vramswap::detail {
namespace {
using namespace pool_layout;

constexpr uint64_t k_s = 1'000'000'000;
constexpr uint64_t k_now = 1000 * k_s;  // a CLOCK_MONOTONIC instant well after every release below
constexpr uint32_t k_frames = 16;
constexpr uint32_t k_me = 9;  // the member that asks

class VictimOrder : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = "vsvo" + std::to_string(::getpid()) + "-";
    option_set(option_id::shm_prefix, prefix_.c_str());
    ASSERT_EQ(pool_segment::create("host-77", k_frames, 2 << 20, 0, ::getpid(), 0, &pool_), ok) << last_error();
  }
  void TearDown() override {
    pool_.reset();
    pool_segment::remove("host-77");
    option_set(option_id::shm_prefix, nullptr);
  }
  // A live member, idle since `released_ns` (0: never released), with `gaps` idle gaps of
  // mean `gap_ns` measured.
  void member(uint32_t m, uint64_t released_ns, uint64_t gap_ns = 0, uint32_t gaps = 0) {
    member_slot& s = pool_->member(m);
    s.state.store(member_live);
    s.phase.store(phase_idle);
    s.holding.store(0);
    s.released_ns.store(released_ns);
    s.idle_gap_ns.store(gap_ns);
    s.idle_gaps.store(gaps);
    s.asked_ns.store(0);
  }
  // Member `m` asked for the lock at `asked_ns` and waits for it (or holds it).
  void at_lock(uint32_t m, uint64_t asked_ns, member_phase phase = phase_waiting) {
    pool_->member(m).phase.store(phase);
    pool_->member(m).asked_ns.store(asked_ns);
  }
  // The rest of the pool, from frame `first`, active for member 3, which holds the lock: no
  // frame is free, so what an asker needs must come from the idle owners.
  void rest_held_by_3(uint32_t first) {
    member(3, k_now - 60 * k_s);
    at_lock(3, k_now - 1 * k_s, phase_running);
    frames(first, k_frames - first, 3, frame_active);
  }
  // Frames `first`.. `first + count` owned by `owner` in `state`.
  void frames(uint32_t first, uint32_t count, uint32_t owner, frame_state state = frame_idle) {
    for (uint32_t f = first; f < first + count; ++f) ASSERT_TRUE(pool_->move(f, pool_->read(f), state, owner, k_no_member));
  }
  // Members 1 and 2 own two idle frames each (frames 0-3); member 3 holds the lock and the
  // rest of the pool.
  void two_idle_owners_beside_a_holder() {
    frames(0, 2, 1);
    frames(2, 2, 2);
    rest_held_by_3(4);
  }
  // The owners of the frames in the order victim_order gives them, one entry per run of
  // one owner's frames.
  std::vector<uint32_t> owners(const victim_order::options& o) {
    std::vector<uint32_t> out;
    for (uint32_t f : victim_order::order(*pool_, k_now, o)) {
      const uint32_t owner = frame_word::decode(pool_->read(f)).owner;
      if (out.empty() || out.back() != owner) out.push_back(owner);
    }
    return out;
  }
  std::vector<uint32_t> owners() {
    victim_order::options o;
    o.me = k_me;
    return owners(o);
  }

  std::string prefix_;
  std::unique_ptr<pool_segment> pool_;
};

TEST_F(VictimOrder, WithoutHistoryTheMostRecentlyReleasedGoesFirst) {
  member(1, k_now - 30 * k_s);
  member(2, k_now - 10 * k_s);
  member(3, k_now - 20 * k_s);
  frames(0, 2, 1);
  frames(2, 2, 2);
  frames(4, 2, 3);
  EXPECT_EQ(owners(), (std::vector<uint32_t>{2, 3, 1}));
}

TEST_F(VictimOrder, LentFramesFirstOwnFramesAndBusyFramesNever) {
  member(1, k_now - 10 * k_s);
  member(4, 0);  // an oversubscribed job: it never takes turns
  member(k_me, k_now - 5 * k_s);
  frames(0, 2, 1);
  frames(2, 2, 4, frame_lent);
  frames(4, 2, k_me);                 // the asker's own idle frames
  frames(6, 2, 1, frame_active);      // in use by a holder: not idle
  frames(8, 1, 1, frame_requested);   // asked for already
  const std::vector<uint32_t> order = victim_order::order(*pool_, k_now, [] {
    victim_order::options o;
    o.me = k_me;
    return o;
  }());
  EXPECT_EQ(order, (std::vector<uint32_t>{2, 3, 0, 1})) << "lent frames first, then member 1's idle frames, by index";
  victim_order::options no_lent;
  no_lent.me = k_me;
  no_lent.lent = false;
  EXPECT_EQ(owners(no_lent), (std::vector<uint32_t>{1}));
}

TEST_F(VictimOrder, FourJobsInACycleLoseTheirFramesInTheOrderTheyComeBack) {
  // Four periodic jobs, each idle 40 s between turns, released 10 s apart; member 5 holds the
  // lock now. Job 1 released first, so it comes back first (at k_now + 10 s): its frames are
  // the last to go. Job 3 released last and comes back last: its frames go first.
  const uint64_t gap = 40 * k_s;
  member(1, k_now - 30 * k_s, gap, 8);
  member(2, k_now - 20 * k_s, gap, 8);
  member(3, k_now - 10 * k_s, gap, 8);
  member(5, k_now - 40 * k_s, gap, 8);
  at_lock(5, k_now - 1 * k_s, phase_running);
  frames(0, 3, 1);
  frames(3, 3, 2);
  frames(6, 3, 3);
  frames(9, 3, 5);  // the holder's frames it is not using: idle, yet it is at the lock
  EXPECT_EQ(owners(), (std::vector<uint32_t>{3, 2, 1, 5}));
  // Job 2's gaps are long (it comes back at k_now + 100 s): now it is the furthest.
  member(2, k_now - 20 * k_s, 120 * k_s, 8);
  EXPECT_EQ(owners(), (std::vector<uint32_t>{2, 3, 1, 5}));
}

TEST_F(VictimOrder, AMemberWithoutItsOwnGapsIsPredictedWithTheOthersMean) {
  member(1, k_now - 30 * k_s, 20 * k_s, 4);  // back at k_now - 10 s: overdue
  member(2, k_now - 25 * k_s, 60 * k_s, 4);  // back at k_now + 35 s
  member(3, k_now - 20 * k_s);               // one turn only: the mean, 40 s, puts it at k_now + 20 s
  frames(0, 1, 1);
  frames(1, 1, 2);
  frames(2, 1, 3);
  EXPECT_EQ(victim_order::mean_gap(*pool_).ns, 40 * k_s);
  EXPECT_TRUE(victim_order::mean_gap(*pool_).settled);
  EXPECT_EQ(owners(), (std::vector<uint32_t>{2, 3, 1}));
  const victim_order::prediction p = victim_order::predict(*pool_, 3, k_now, victim_order::mean_gap(*pool_));
  EXPECT_FALSE(p.from_history);
  EXPECT_EQ(p.next_ns, k_now + 20 * k_s);
}

TEST_F(VictimOrder, AMemberWithOneGapIsPredictedByTheOthersRhythm) {
  // Member 2's one gap, 100 s, followed its first turn (its setup); member 1 has a rhythm of
  // 10 s. Member 2 released 5 s ago, so by that rhythm it is due at k_now + 5 s, before
  // member 3 (a rhythm of 10 s, released 2 s ago: due at k_now + 8 s). By its one gap it
  // would be due at k_now + 95 s, the furthest, and lose its frames first.
  member(1, k_now - 1 * k_s, 10 * k_s, 4);
  member(2, k_now - 5 * k_s, 100 * k_s, 1);
  member(3, k_now - 2 * k_s, 10 * k_s, 4);
  frames(0, 1, 2);
  frames(1, 1, 3);
  frames(2, 1, 1);
  const victim_order::mean_gap_of_members others = victim_order::mean_gap(*pool_);
  EXPECT_EQ(others.ns, 10 * k_s) << "the rhythm of the members that have one, not member 2's one gap";
  EXPECT_TRUE(others.settled);
  const victim_order::prediction p = victim_order::predict(*pool_, 2, k_now, others);
  EXPECT_FALSE(p.from_history);
  EXPECT_EQ(p.next_ns, k_now + 5 * k_s);
  EXPECT_EQ(owners(), (std::vector<uint32_t>{1, 3, 2}));
}

TEST_F(VictimOrder, WhileNobodyHasARhythmAMemberIsPredictedByItsOneGap) {
  member(1, k_now - 5 * k_s, 100 * k_s, 1);  // due at k_now + 95 s
  member(2, k_now - 5 * k_s, 20 * k_s, 1);   // due at k_now + 15 s
  const victim_order::mean_gap_of_members others = victim_order::mean_gap(*pool_);
  EXPECT_EQ(others.ns, 60 * k_s);
  EXPECT_FALSE(others.settled);
  const victim_order::prediction p = victim_order::predict(*pool_, 1, k_now, others);
  EXPECT_TRUE(p.from_history);
  EXPECT_EQ(p.next_ns, k_now + 95 * k_s);
}

TEST_F(VictimOrder, TheSecondIdleGapReplacesTheFirstAndLaterOnesAreAveraged) {
  // member_observer measures the gaps (release to the next acquire() call) that predict().
  member(k_me, 0);
  member_observer observer(*pool_, k_me);
  auto turn = [&](uint64_t asked_ns, uint64_t released_ns) {
    observer.asked(lock_priority::normal, asked_ns);
    pool_->member(k_me).released_ns.store(released_ns);  // what released() records, without its trace
  };
  turn(k_s, 2 * k_s);  // the first turn: no gap before it
  EXPECT_EQ(pool_->member(k_me).idle_gaps.load(), 0u);
  turn(102 * k_s, 103 * k_s);  // 100 s after its setup
  EXPECT_EQ(pool_->member(k_me).idle_gap_ns.load(), 100 * k_s);
  turn(113 * k_s, 114 * k_s);  // then a rhythm of 10 s
  EXPECT_EQ(pool_->member(k_me).idle_gap_ns.load(), 10 * k_s) << "the setup's gap is not averaged in";
  turn(134 * k_s, 135 * k_s);  // a gap of 20 s: averaged with the rhythm, weight 1/2
  EXPECT_EQ(pool_->member(k_me).idle_gap_ns.load(), 15 * k_s);
  EXPECT_EQ(pool_->member(k_me).idle_gaps.load(), 3u);
}

TEST_F(VictimOrder, OnlyAfterKeepsTheOwnersDueLaterAndNeverOneAtTheLock) {
  // Eviction ahead of need: the member predicted next asks only the owners due after it.
  member(1, k_now - 30 * k_s, 40 * k_s, 4);  // due at k_now + 10 s
  member(2, k_now - 10 * k_s, 40 * k_s, 4);  // due at k_now + 30 s
  member(3, k_now - 5 * k_s, 40 * k_s, 4);   // due at k_now + 35 s, but it waits for the lock now
  at_lock(3, k_now - 1 * k_s);
  frames(0, 2, 1);
  frames(2, 2, 2);
  frames(4, 2, 3);
  victim_order::options o;
  o.me = k_me;
  o.only_after_ns = k_now + 20 * k_s;
  EXPECT_EQ(owners(o), (std::vector<uint32_t>{2}));
  o.only_after_ns = 0;
  EXPECT_EQ(owners(o), (std::vector<uint32_t>{2, 1, 3})) << "with no bound, those at the lock go last";
}

TEST_F(VictimOrder, AnAskerQueuedForTheLockMayAskEveryOwnerNotAtTheLock) {
  // Eviction ahead of need by a member that waits for the lock: every idle owner would queue
  // behind it, whatever its prediction says (here, no history: due at its release, which is
  // before the asker's acquire call), so all of them may be asked, furthest predicted first;
  // one at the lock never.
  member(1, k_now - 30 * k_s);  // due at its release
  member(2, k_now - 10 * k_s);  // due at its release, the later one: asked first
  member(3, k_now - 5 * k_s);
  at_lock(3, k_now - 2 * k_s);  // queued before the asker
  frames(0, 2, 1);
  frames(2, 2, 2);
  frames(4, 2, 3);
  victim_order::options o;
  o.me = k_me;
  o.only_after_ns = k_now - 1 * k_s;  // the asker's acquire call
  EXPECT_TRUE(owners(o).empty()) << "not queued: the owners due before it are kept";
  o.asker_queued = true;
  EXPECT_EQ(owners(o), (std::vector<uint32_t>{2, 1}));
}

TEST_F(VictimOrder, MembersThatLeftOrNeverReleasedAreOrderedSafely) {
  member(1, 0);                 // joined, allocating before its first turn: due now
  member(2, k_now - 10 * k_s);  // released, no history: due at its release (gap 0)
  frames(0, 2, 1);
  frames(2, 2, 2);
  frames(4, 2, 200);  // idle frames of a slot that is not live (a member being repaired)
  // Due now beats due in the past (later is asked first); a tie goes to the lower index. The
  // repaired slot reads as never released: due now, behind member 1.
  EXPECT_EQ(owners(), (std::vector<uint32_t>{1, 200, 2}));
}

// Frames of `owner` that the asker (k_me) has asked for.
uint32_t asked_of(const pool_segment& pool, uint32_t owner) {
  uint32_t n = 0;
  for (uint32_t f = 0; f < pool.frame_count(); ++f) {
    const frame_word w = frame_word::decode(pool.read(f));
    if (w.state == frame_requested && w.requester == k_me && w.owner == owner) ++n;
  }
  return n;
}

TEST_F(VictimOrder, InTheFirstTurnsTheMemberThatReleasedFirstAsksAhead) {
  // Three jobs took one turn each, nobody has an idle gap yet; the asker released first, so
  // in a rotation it comes back first. It asks the one that released last for what it needs.
  member(k_me, k_now - 30 * k_s);
  member(1, k_now - 20 * k_s);
  member(2, k_now - 10 * k_s);
  two_idle_owners_beside_a_holder();
  pool_frame_source source(*pool_, k_me, {}, 10 * k_s, {});
  EXPECT_EQ(source.ask_ahead(2, k_now), 2u);
  EXPECT_EQ(asked_of(*pool_, 2), 2u) << "the owner that released last is asked";
  EXPECT_EQ(asked_of(*pool_, 1), 0u);
  EXPECT_EQ(source.ask_ahead(2, k_now), 0u) << "what it needs is on its way: nothing more is asked";
}

TEST_F(VictimOrder, AMemberThatReleasedAfterTheOthersDoesNotAskAhead) {
  member(1, k_now - 30 * k_s);
  member(k_me, k_now - 20 * k_s);  // member 1 comes back before it
  member(2, k_now - 10 * k_s);
  two_idle_owners_beside_a_holder();
  pool_frame_source source(*pool_, k_me, {}, 10 * k_s, {});
  EXPECT_EQ(source.ask_ahead(2, k_now), 0u);
  member(k_me, 0);  // never released: it is allocating before its first turn
  EXPECT_EQ(source.ask_ahead(2, k_now), 0u);
}

TEST_F(VictimOrder, AMemberWithoutGapsOverdueByMoreThanTheMeanGapDoesNotAskAhead) {
  // Two jobs keep a rhythm of 10 s; the asker took one turn. Released 15 s ago it is due 5 s
  // ago by their mean gap: still within one gap, so it asks. Released 100 s ago it is not
  // keeping their rhythm (a job that finished its work and lives on): asking would evict a
  // live job's memory at every one of its turns.
  member(1, k_now - 5 * k_s, 10 * k_s, 4);  // due at k_now + 5 s
  member(2, k_now - 3 * k_s, 10 * k_s, 4);  // due at k_now + 7 s
  two_idle_owners_beside_a_holder();
  pool_frame_source source(*pool_, k_me, {}, 10 * k_s, {});
  member(k_me, k_now - 100 * k_s);
  EXPECT_EQ(source.ask_ahead(2, k_now), 0u);
  member(k_me, k_now - 15 * k_s);
  EXPECT_EQ(source.ask_ahead(2, k_now), 2u);
  EXPECT_EQ(asked_of(*pool_, 2), 2u) << "the owner due furthest from now is asked first";
}

TEST_F(VictimOrder, LentFramesAreAskedAheadOnlyByAMemberQueuedForTheLock) {
  // An oversubscribed job (member 4) moves its pages back into free frames after a quiet
  // second: frames taken from it for a turn that is only predicted would go back and forth.
  member(k_me, k_now - 30 * k_s);  // released first: predicted next, not queued
  member(2, k_now - 10 * k_s);
  member(4, 0);
  frames(0, 2, 4, frame_lent);
  frames(2, 2, 2);
  rest_held_by_3(4);
  pool_frame_source source(*pool_, k_me, {}, 10 * k_s, {});
  EXPECT_EQ(source.ask_ahead(2, k_now), 2u);
  EXPECT_EQ(asked_of(*pool_, 4), 0u) << "lent frames asked for a predicted turn";
  EXPECT_EQ(asked_of(*pool_, 2), 2u);
  // Queued for the lock, it asks for lent frames first.
  at_lock(k_me, k_now - 1 * k_s);
  EXPECT_EQ(source.ask_ahead(4, k_now), 2u);
  EXPECT_EQ(asked_of(*pool_, 4), 2u) << "a queued member's turn comes: lent frames are the first to ask for";
}

// A member slot reused after its member ended (a job killed, its slot freed by the server's
// repair) keeps nothing of that member: not its failure to evict, which a lock holder waiting
// on the new member quoted as the new member's, nor the rhythm of its turns, which predicted
// the new member's next acquire from the old one's.
TEST_F(VictimOrder, AReusedMemberSlotKeepsNothingOfItsPreviousMember) {
  uint32_t m = 0;
  ASSERT_EQ(pool_->add_member(::getpid(), 1, current_pid_namespace(), &m), ok) << last_error();
  member_slot& s = pool_->member(m);
  s.evict_failed_ns.store(k_now);
  std::snprintf(s.evict_error, sizeof s.evict_error, "the swap file's disk is full");
  s.evict_status.store(err_no_space);
  s.released_ns.store(k_now - 5 * k_s);
  s.asked_ns.store(k_now - 20 * k_s);
  s.idle_gap_ns.store(15 * k_s);
  s.idle_gaps.store(7);
  s.frames_asked_ahead.store(12);
  pool_->remove_member(m);
  uint32_t again = 0;
  ASSERT_EQ(pool_->add_member(::getpid(), 2, current_pid_namespace(), &again), ok) << last_error();
  ASSERT_EQ(again, m);
  const member_slot& t = pool_->member(again);
  EXPECT_EQ(t.evict_status.load(), 0);
  EXPECT_EQ(t.evict_failed_ns.load(), 0u);
  EXPECT_STREQ(t.evict_error, "");
  EXPECT_EQ(t.released_ns.load(), 0u);
  EXPECT_EQ(t.asked_ns.load(), 0u);
  EXPECT_EQ(t.idle_gap_ns.load(), 0u);
  EXPECT_EQ(t.idle_gaps.load(), 0u);
  EXPECT_EQ(t.frames_asked_ahead.load(), 0u);
}

}  // namespace
}  // namespace vramswap::detail
