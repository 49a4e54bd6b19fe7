// placement_policy (runtime/placement_policy.hpp): the decisions of placement by use, fed the
// way the session feeds them: a real use_tracker sampling launches as the shim does (one in
// k_sample_every, per thread), its decaying counts attributed to the live allocations, one
// observation per simulated second. The frames are a plain map here (the moves themselves,
// and their data, are tested with real processes in oversubscription_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/status.hpp"
#include "runtime/placement_policy.hpp"
#include "runtime/use_tracker.hpp"

namespace vramswap::detail {
namespace {
constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t k_page = 2 * MiB;
constexpr device_ptr k_base = 0x7f3400000000ull;
constexpr uint64_t k_second = 1'000'000'000;
using verdict = placement_plan::verdict;

// An arena of `tensors` allocations of `pages_each` pages; the first `pool_pages` pages are in
// pool frames (backed first), the rest in host frames.
class simulated_job {
 public:
  simulated_job(size_t tensors, size_t pages_each, size_t pool_pages)
      : pages_each_(pages_each), tracker_(k_base, tensors * pages_each * k_page, k_page), in_pool_(tensors * pages_each) {
    EXPECT_EQ(tracker_.start(), ok) << last_error();
    for (size_t t = 0; t < tensors; ++t) allocations_.push_back({k_base + t * pages_each * k_page, pages_each * k_page});
    for (size_t p = 0; p < in_pool_.size(); ++p) in_pool_[p] = p < pool_pages;
  }
  // One step's launches: each tensor in `uses` is launched that many times (its start as the
  // argument), in a random order; the shim's sampling picks which launches are recorded.
  void step(const std::vector<std::pair<size_t, unsigned>>& uses) {
    std::vector<size_t> launches;
    for (const auto& [tensor, n] : uses) launches.insert(launches.end(), n, tensor);
    std::shuffle(launches.begin(), launches.end(), rng_);
    for (size_t tensor : launches) {
      if (!use_tracking::sample_this_launch()) continue;
      const uint64_t words[] = {allocations_[tensor].addr, allocations_[tensor].size};
      use_tracking::record_launch_words(words, 2, use_tracking::k_sample_every);
    }
  }
  // `n` uses of a tensor, each recorded (the way oversub_worker declares its uses).
  void use(size_t tensor, unsigned n) {
    const uint64_t words[] = {allocations_[tensor].addr, allocations_[tensor].size};
    for (unsigned i = 0; i < n; ++i) use_tracking::record_launch_words(words, 2);
  }
  // One observation; a planned round is carried out (the pages swap frames).
  placement_plan observe(placement_policy& policy) {
    now_ += k_second;
    std::vector<uint32_t> starts;
    tracker_.take_counts(&starts);
    std::vector<uint32_t> heat;
    use_tracker::attribute(starts, allocations_, k_base, k_page, &heat);
    std::vector<placement_page> pages;
    for (size_t p = 0; p < in_pool_.size(); ++p) pages.push_back({p, p, static_cast<bool>(in_pool_[p]), heat[p], false});
    placement_plan plan = policy.observe(now_, pages, k_page);
    if (plan.what == verdict::run) {
      for (const placement_page& p : plan.in) {
        EXPECT_FALSE(in_pool_[p.page]);
        in_pool_[p.page] = true;
      }
      for (const placement_page& p : plan.out) {
        EXPECT_TRUE(in_pool_[p.page]);
        in_pool_[p.page] = false;
      }
      moved_ += plan.in.size() + plan.out.size();
      // A closing of the gate as the host backend measures one: a few ms besides the copies.
      policy.ran(now_, plan, plan.in.size(), plan.out.size(), 0.005 + 2.0 * plan.in.size() * k_page / 10e9,
                 2.0 * plan.in.size() * k_page / 10e9, 2 * plan.in.size() * k_page);
    }
    return plan;
  }
  size_t pool_pages_of(size_t tensor) const {
    size_t n = 0;
    for (size_t p = tensor * pages_each_; p < (tensor + 1) * pages_each_; ++p) n += in_pool_[p];
    return n;
  }
  size_t moved() const { return moved_; }
  uint64_t now() const { return now_; }

 private:
  size_t pages_each_;
  use_tracker tracker_;
  std::vector<range_allocation> allocations_;
  std::vector<char> in_pool_;
  std::mt19937 rng_{12345};
  uint64_t now_ = 1000 * k_second;
  size_t moved_ = 0;
};

// The shape that never settled on the GPU: every tensor of a step is used, the hot ones are
// more than the pool holds, and the sampling sees each tensor only a few times a step, so a
// used pool page often shows no use in one observation. The placement settles within a
// bounded number of rounds, then moves nothing, and the rounds back off.
TEST(PlacementPolicy, ANoisilySampledHotSetLargerThanThePoolSettlesAndStopsMoving) {
  // 24 tensors of 2 pages (48 pages); 16 pool pages. Tensors 0-7 (in the pool) are used 8
  // times a step, 8-19 (in host frames) 24 times, 20-23 never.
  simulated_job job(24, 2, 16);
  placement_policy policy;
  std::vector<std::pair<size_t, unsigned>> uses;
  for (size_t t = 0; t < 20; ++t) uses.push_back({t, t < 8 ? 8u : 24u});
  size_t runs = 0;
  size_t moved_after_30 = 0;
  for (int second = 0; second < 90; ++second) {
    for (int s = 0; s < 4; ++s) job.step(uses);
    const size_t before = job.moved();
    if (job.observe(policy).what == verdict::run) ++runs;
    if (second >= 30) moved_after_30 += job.moved() - before;
  }
  EXPECT_EQ(moved_after_30, 0u) << "pages still moving after 30 rounds (" << job.moved() << " moved in all)";
  EXPECT_LE(runs, 6u) << "the placement took too many rounds to settle";
  EXPECT_LE(job.moved(), 2u * 16) << "pages moved back and forth";
  size_t hot_in_pool = 0;
  for (size_t t = 8; t < 20; ++t) hot_in_pool += job.pool_pages_of(t);
  EXPECT_GE(hot_in_pool, 12u) << "the most used tensors should hold most of the pool";
  EXPECT_GT(policy.interval_ns(), 8 * k_second) << "a settled placement's rounds should have backed off";
}

// A short burst of uses (one observation) moves nothing: a move needs a sustained difference.
TEST(PlacementPolicy, AOneObservationSpikeMovesNothing) {
  simulated_job job(4, 4, 8);  // tensors 0-1 in pool frames, 2-3 in host frames
  placement_policy policy;
  job.step({{2, 4000}});
  EXPECT_NE(job.observe(policy).what, verdict::run);
  for (int second = 0; second < 5; ++second) job.observe(policy);
  EXPECT_EQ(job.moved(), 0u);
  EXPECT_EQ(job.pool_pages_of(2), 0u);
}

// The same uses, sustained, move the tensor in; when the pattern then flips at once, the
// moved pages stay for their cooldown before the new pattern wins them back.
TEST(PlacementPolicy, SustainedUseMovesPagesAndAMovedPageIsNotMovedBackSoon) {
  simulated_job job(4, 4, 8);
  placement_policy policy;
  int first_run = -1;
  for (int second = 0; second < 4 && first_run < 0; ++second) {
    job.step({{2, 4000}});
    if (job.observe(policy).what == verdict::run) first_run = second;
  }
  ASSERT_GE(first_run, 1) << "moved on the first observation: no sustained difference was asked for";
  EXPECT_EQ(job.pool_pages_of(2), 4u);
  const uint64_t moved_at = job.now();
  // Now only tensor 0, whose pages went out for tensor 2's, is used; tensor 2 not at all.
  uint64_t back_at = 0;
  for (int second = 0; second < 40 && back_at == 0; ++second) {
    job.step({{0, 4000}});
    if (job.observe(policy).what == verdict::run && job.pool_pages_of(0) > 0) back_at = job.now();
  }
  ASSERT_NE(back_at, 0u) << "the new pattern never won its pages back";
  EXPECT_GE(back_at - moved_at, placement_policy::k_cooldown_ns) << "pages moved back within their cooldown";
}

// A difference that is real and sustained but worth less than a closing of the gate: the
// model skips the rounds, backing off, and nothing moves (until the back-off makes the time
// the pages would stay put long enough to pay: beyond this test's 30 s).
TEST(PlacementPolicy, ARoundWhoseGainIsBelowItsCostIsSkipped) {
  simulated_job job(8, 1, 4);  // one-page tensors; 4 in pool frames
  placement_policy policy;
  size_t skipped = 0;
  for (int second = 0; second < 30; ++second) {
    job.use(6, 30);  // 30 uses a second of a page in a host frame: about 60 MiB/s of link traffic
    const placement_plan plan = job.observe(policy);
    if (plan.what == verdict::skipped_by_model) {
      ++skipped;
      EXPECT_LT(plan.gain_s, plan.cost_s);
      EXPECT_GT(plan.gain_s, 0);
    }
  }
  EXPECT_GE(skipped, 3u);
  EXPECT_EQ(job.moved(), 0u);
  EXPECT_GE(policy.interval_ns(), 16 * k_second) << "skipped rounds should back off";
}

// The gate's overhead measured by a round is the next rounds' cost: after a round whose
// closing cost seconds, a round of the same gain is skipped.
TEST(PlacementPolicy, TheGatesMeasuredOverheadIsCounted) {
  placement_policy policy;
  std::vector<placement_page> pages;
  for (uint64_t p = 0; p < 8; ++p) pages.push_back({p, p, p < 4, 0, false});
  uint64_t now = 1000 * k_second;
  auto observe = [&](uint32_t hot_heat, uint64_t hot_page) {
    for (placement_page& p : pages) p.heat = p.page == hot_page ? hot_heat : 0;
    now += k_second;
    return policy.observe(now, pages, k_page);
  };
  // About 100 uses a second of page 4 (in a host frame): worth a round under the prior.
  placement_plan plan;
  for (int i = 0; i < 3 && plan.what != verdict::run; ++i) plan = observe(200, 4);
  ASSERT_EQ(plan.what, verdict::run);
  // That round's closing took 10 s besides its copies.
  policy.ran(now, plan, 1, 1, 10.0, 0.001, 2 * k_page);
  EXPECT_NEAR(policy.gate_overhead_s(), 10.0 - 0.001, 1e-9);
  std::swap(pages[4].in_pool, pages[plan.out[0].page].in_pool);
  // The same use of page 5: skipped now.
  for (int i = 0; i < 3 && plan.what != verdict::skipped_by_model; ++i) plan = observe(200, 5);
  EXPECT_EQ(plan.what, verdict::skipped_by_model);
  EXPECT_GT(plan.cost_s, 9.0);
}

// The allocator's hint: a page freed and made again every period (a step's temporary) takes
// a pool frame from a page it beats by less than the margin; a page that is not one does not.
TEST(PlacementPolicy, ATemporaryNeedsNoMarginToTakeAPoolFrame) {
  for (const bool temporary : {true, false}) {
    placement_policy policy;
    std::vector<placement_page> pages;
    // Pages 0-3 in pool frames, used about 100 times a second; page 4, in a host frame, 180.
    for (uint64_t p = 0; p < 5; ++p) pages.push_back({p, p, p < 4, p < 4 ? 200u : 360u, p == 4 && temporary});
    uint64_t now = 1000 * k_second;
    size_t runs = 0;
    for (int second = 0; second < 10; ++second) {
      now += k_second;
      const placement_plan plan = policy.observe(now, pages, k_page);
      if (plan.what != verdict::run) continue;
      ++runs;
      ASSERT_EQ(plan.in.size(), 1u);
      EXPECT_EQ(plan.in[0].page, 4u);
      policy.ran(now, plan, 1, 1, 0.002, 0.001, 2 * k_page);
      for (placement_page& p : pages) {
        if (p.page == 4 || p.page == plan.out[0].page) p.in_pool = !p.in_pool;
      }
    }
    EXPECT_EQ(runs, temporary ? 1u : 0u) << (temporary ? "a temporary" : "a page that is no temporary");
  }
}

// A settled placement's rounds back off; a new pattern brings them back to every second.
TEST(PlacementPolicy, RoundsBackOffWhenStableAndResumeWhenTheUsePatternChanges) {
  simulated_job job(4, 4, 8);
  placement_policy policy;
  for (int second = 0; second < 20; ++second) {
    job.step({{0, 4000}});  // in the pool already: nothing to do
    EXPECT_NE(job.observe(policy).what, verdict::run);
  }
  EXPECT_GE(policy.interval_ns(), 8 * k_second);
  int run_at = -1;
  for (int second = 0; second < 5 && run_at < 0; ++second) {
    job.step({{0, 4000}, {3, 4000}});
    if (job.observe(policy).what == verdict::run) run_at = second;
  }
  EXPECT_GE(run_at, 0) << "the rounds did not resume when tensor 3 became used";
  EXPECT_LE(run_at, 3);
  EXPECT_EQ(job.pool_pages_of(3), 4u);
  EXPECT_EQ(job.pool_pages_of(0), 4u) << "the used tensor's pages should not be the ones displaced";
}

}  // namespace
}  // namespace vramswap::detail
