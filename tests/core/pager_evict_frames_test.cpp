// pager::evict_frames, what a process does when a shared pool asks it for some of its idle
// frames: exactly the pages backed by the frames asked for leave them (saved, discarded or
// left for their kept copy), every other page stays in its frame, every frame given back is
// scrubbed, and every byte comes back at the next restore. A failure at any step of it
// (support/faulty_backend.hpp) leaves every page resident or saved, the pages not asked for
// untouched, and no byte lost.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "support/pager_frames_fixture.hpp"

namespace vramswap::detail {
namespace {

using test::fault_op;
using test::k_fixture_page;

class PagerEvictFrames : public test::PagerFramesTest {
 protected:
  // The frames of these pages (indices into the allocation).
  std::vector<frame_id> frames_of(const std::vector<uint64_t>& pages) const {
    const std::vector<frame_id> all = page_frames();
    std::vector<frame_id> out;
    for (uint64_t i : pages) out.push_back(all.at(i));
    return out;
  }
  static bool chosen(const std::vector<uint64_t>& pages, uint64_t i) {
    return std::find(pages.begin(), pages.end(), i) != pages.end();
  }
};

TEST_P(PagerEvictFrames, OnlyThePagesOfTheGivenFramesLeaveThem) {
  write_all(11);
  const std::vector<frame_id> before = page_frames();
  ASSERT_EQ(before.size(), k_pages);
  const std::vector<uint64_t> asked = {1, 2, 5, 9};
  std::vector<frame_id> request = frames_of(asked);
  frame_id stranger = 0;  // a frame that backs no page of this pager: ignored
  ASSERT_EQ(frames->make(0, k_fixture_page, frame_location::device, &stranger), ok) << last_error();
  request.push_back(stranger);
  // As a session does when it releases the device without evicting; the pool then asks.
  pg->set_not_resident();
  const pager_stats s0 = pg->stats();
  ASSERT_EQ(pg->evict_frames(request), ok) << last_error();
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();

  const pager_stats s1 = pg->stats();
  EXPECT_EQ(s1.pages_evicted - s0.pages_evicted, asked.size());
  EXPECT_EQ(s1.bytes_out - s0.bytes_out, asked.size() * k_fixture_page);
  EXPECT_EQ(s1.host_bytes, asked.size() * k_fixture_page);
  std::vector<frame_id> kept;
  for (uint64_t i = 0; i < k_pages; ++i) {
    const page_state s = pg->state_of(page_address(i));
    EXPECT_EQ(s, chosen(asked, i) ? page_state::host : page_state::resident) << "page " << i;
    if (!chosen(asked, i)) kept.push_back(before[i]);
  }
  EXPECT_EQ(page_frames(), kept) << "the pages not asked for stay in their frames";
  std::vector<frame_id> returned = frames->given_back();
  std::vector<frame_id> expected;
  for (uint64_t i : asked) expected.push_back(before[i]);
  std::sort(returned.begin(), returned.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(returned, expected) << "exactly the frames asked for that back a page are given back";
  for (frame_id f : frames->given_back()) EXPECT_TRUE(zeroed(f));

  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
  EXPECT_EQ(pg->stats().host_bytes, 0u);
  EXPECT_TRUE(all_hold(11));
}

TEST_P(PagerEvictFrames, AdviceDecidesWhatAnAskedForPageCosts) {
  // Pages 0-1 discardable (dropped), 2-3 read_mostly with a kept copy (left for it), the
  // rest normal (copied).
  write_all(21);
  ASSERT_EQ(pg->advise(page_address(2), 2 * k_fixture_page, advice::read_mostly), ok) << last_error();
  ASSERT_EQ(pg->evict_all(), ok) << last_error();
  ASSERT_EQ(pg->restore_all(), ok) << last_error();  // read_mostly pages keep their copies
  ASSERT_EQ(pg->advise(page_address(0), 2 * k_fixture_page, advice::discardable), ok) << last_error();
  pg->set_not_resident();
  const pager_stats s0 = pg->stats();
  const size_t returned_before = frames->given_back().size();
  ASSERT_EQ(pg->evict_frames(frames_of({0, 2, 4})), ok) << last_error();
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
  const pager_stats s1 = pg->stats();
  EXPECT_EQ(s1.pages_discarded - s0.pages_discarded, 1u);
  EXPECT_EQ(s1.pages_clean - s0.pages_clean, 1u);
  EXPECT_EQ(s1.bytes_out - s0.bytes_out, k_fixture_page) << "only the normal page is copied";
  EXPECT_EQ(pg->state_of(page_address(0)), page_state::discarded);
  EXPECT_EQ(pg->state_of(page_address(1)), page_state::resident);
  EXPECT_EQ(pg->state_of(page_address(2)), page_state::host);
  EXPECT_EQ(pg->state_of(page_address(3)), page_state::resident);
  EXPECT_EQ(pg->state_of(page_address(4)), page_state::host);
  EXPECT_EQ(given_back_since(returned_before).size(), 3u);
  for (frame_id f : given_back_since(returned_before)) EXPECT_TRUE(zeroed(f));

  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
  // The discarded page comes back zero-filled; rewrite it to compare the rest.
  ASSERT_EQ(real->copy_d2h(staging, page_address(0), k_fixture_page, stream), ok);
  ASSERT_EQ(real->stream_synchronize(stream), ok);
  EXPECT_EQ(std::memcmp(staging, std::vector<unsigned char>(k_fixture_page, 0).data(), k_fixture_page), 0)
      << "a discarded page is restored zero-filled";
  test::fill_random(staging, k_fixture_page, page_seed(21, 0));
  ASSERT_EQ(real->copy_h2d(page_address(0), staging, k_fixture_page, stream), ok);
  ASSERT_EQ(real->stream_synchronize(stream), ok);
  EXPECT_TRUE(all_hold(21));
}

TEST_P(PagerEvictFrames, FramesThatBackNoPageChangeNothing) {
  write_all(31);
  const std::vector<frame_id> before = page_frames();
  frame_id stranger = 0;
  ASSERT_EQ(frames->make(0, k_fixture_page, frame_location::device, &stranger), ok) << last_error();
  pg->set_not_resident();
  const pager_stats s0 = pg->stats();
  ASSERT_EQ(pg->evict_frames({}), ok) << last_error();
  ASSERT_EQ(pg->evict_frames({stranger}), ok) << last_error();
  EXPECT_EQ(pg->stats().pages_evicted, s0.pages_evicted);
  EXPECT_EQ(page_frames(), before);
  EXPECT_TRUE(frames->given_back().empty());
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
  EXPECT_TRUE(all_hold(31));
}

// Every operation the eviction of some frames makes fails once, at every position a clean
// run reaches.
TEST_P(PagerEvictFrames, AFailureAtAnyStepLosesNoByteAndTouchesNoOtherPage) {
  const std::vector<uint64_t> asked = {0, 1, 3, 4, 5, 6, 8};  // more than the copy window
  std::vector<uint64_t> counts;
  {
    write_all(40);
    pg->set_not_resident();
    const std::vector<frame_id> request = frames_of(asked);
    be->count_calls();
    ASSERT_EQ(pg->evict_frames(request), ok) << last_error();
    for (unsigned op = 0; op < static_cast<unsigned>(fault_op::count_); ++op) counts.push_back(be->calls(static_cast<fault_op>(op)));
    ASSERT_EQ(pg->restore_all(), ok) << last_error();
  }
  uint64_t seed = 41;
  uint64_t failures = 0;
  for (unsigned op = 0; op < static_cast<unsigned>(fault_op::count_); ++op) {
    const auto o = static_cast<fault_op>(op);
    for (uint64_t n = 0; n < counts[op]; ++n) {
      const std::string where = std::string(test::fault_op_name(o)) + " call #" + std::to_string(n) + " failing";
      write_all(++seed);
      pg->set_not_resident();
      const std::vector<frame_id> before = page_frames();
      const size_t returned_before = frames->given_back().size();
      be->fail_at(o, n);
      clear_error();
      const int rc = pg->evict_frames(frames_of(asked));
      be->disarm();
      if (rc != ok) {
        ++failures;
        EXPECT_NE(std::string(last_error()).find("nothing lost"), std::string::npos) << where << ": " << last_error();
      }
      ASSERT_EQ(pg->check_invariants(), ok) << where << ": " << last_error();
      const std::vector<page_state> states = page_states();
      std::vector<frame_id> still;  // the frames of the pages still resident, in page order
      for (uint64_t i = 0; i < k_pages; ++i) {
        if (!chosen(asked, i)) {
          EXPECT_EQ(states[i], page_state::resident) << where << ": page " << i << " was not asked for";
        } else {
          EXPECT_TRUE(states[i] == page_state::resident || states[i] == page_state::host)
              << where << ": page " << i << " is " << page_state_name(states[i]);
        }
        if (states[i] == page_state::resident) still.push_back(before[i]);
      }
      EXPECT_EQ(page_frames(), still) << where << ": a page still resident is in its own frame";
      for (frame_id f : given_back_since(returned_before)) EXPECT_TRUE(zeroed(f)) << where;
      ASSERT_EQ(pg->restore_all(), ok) << where << ": " << last_error();
      ASSERT_TRUE(all_hold(seed)) << where;
    }
  }
  EXPECT_GT(failures, 10u) << "the sweep must have made evictions fail";
}

INSTANTIATE_TEST_SUITE_P(Backends, PagerEvictFrames, ::testing::Values(backend_kind::host, backend_kind::cuda), test::param_name);

}  // namespace
}  // namespace vramswap::detail
