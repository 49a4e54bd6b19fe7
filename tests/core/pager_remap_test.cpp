// pager::remap_pages, how oversubscription moves pages between pool frames and host frames:
// exactly the pages of the old frames move, each into the new frame made for it, at the
// same address and with every byte; the other pages stay where they are; every old frame is
// scrubbed before it is given back. When a new frame cannot be had the pages not yet moved
// stay in their frames, and a failure at any step (support/faulty_backend.hpp) leaves every
// page resident, in its old frame or its new one, with every byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "support/pager_frames_fixture.hpp"

namespace vramswap::detail {
namespace {

using test::fault_op;
using test::k_fixture_page;

class PagerRemap : public test::PagerFramesTest {
 protected:
  // Pages moved by the tests: more than the copy window (4), so that they go in batches.
  const std::vector<uint64_t> moving = {0, 1, 2, 4, 5, 6, 7, 9};

  std::vector<frame_id> frames_of(const std::vector<uint64_t>& pages) const {
    const std::vector<frame_id> all = page_frames();
    std::vector<frame_id> out;
    for (uint64_t i : pages) out.push_back(all.at(i));
    return out;
  }
  bool moves(uint64_t i) const { return std::find(moving.begin(), moving.end(), i) != moving.end(); }

  // A new_frame for remap_pages: frames in `where`, recorded in the order asked for; the
  // call numbered `fail_at` (0-based) fails.
  struct frame_maker {
    test::keeping_frames* frames;
    frame_location where;
    size_t fail_at = SIZE_MAX;
    std::vector<frame_id> made;
    int operator()(frame_id* out) {
      if (made.size() == fail_at) return fail(err_out_of_memory, "no host frame: the test refuses new frame #%zu", fail_at);
      VS_TRY(frames->make(0, k_fixture_page, where, out));
      made.push_back(*out);
      return ok;
    }
  };
  int remap(const std::vector<frame_id>& old_frames, frame_maker& maker, size_t* moved) {
    return pg->remap_pages(old_frames, [&](frame_id* out) { return maker(out); }, moved);
  }
};

TEST_P(PagerRemap, PagesMoveIntoTheirNewFramesAndBackWithEveryByte) {
  write_all(51);
  const std::vector<frame_id> before = page_frames();
  // Demotion: into host frames.
  frame_maker to_host{frames.get(), frame_location::host};
  size_t moved = 0;
  ASSERT_EQ(remap(frames_of(moving), to_host, &moved), ok) << last_error();
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
  EXPECT_EQ(moved, moving.size());
  EXPECT_EQ(pg->stats().pages_remapped, moving.size());
  ASSERT_EQ(to_host.made.size(), moving.size());
  std::vector<frame_id> expected = before;
  for (size_t k = 0; k < moving.size(); ++k) expected[moving[k]] = to_host.made[k];
  EXPECT_EQ(page_frames(), expected) << "each page in the frame made for it, in page order; the others where they were";
  for (uint64_t i = 0; i < k_pages; ++i) EXPECT_EQ(pg->state_of(page_address(i)), page_state::resident) << "page " << i;
  for (frame_id f : to_host.made) {
    frame_location at = frame_location::device;
    ASSERT_EQ(be->frame_location_of(f, &at), ok) << last_error();
    EXPECT_EQ(at, frame_location::host);
  }
  std::vector<frame_id> returned = frames->given_back();
  std::vector<frame_id> old_frames;
  for (uint64_t i : moving) old_frames.push_back(before[i]);
  std::sort(returned.begin(), returned.end());
  std::sort(old_frames.begin(), old_frames.end());
  EXPECT_EQ(returned, old_frames) << "every old frame is given back, nothing else";
  for (frame_id f : frames->given_back()) EXPECT_TRUE(zeroed(f));
  EXPECT_TRUE(all_hold(51));

  // Promotion: back into device frames, new bytes first.
  write_all(52);
  const size_t returned_before = frames->given_back().size();
  frame_maker to_device{frames.get(), frame_location::device};
  ASSERT_EQ(remap(to_host.made, to_device, &moved), ok) << last_error();
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
  EXPECT_EQ(moved, moving.size());
  for (size_t k = 0; k < moving.size(); ++k) expected[moving[k]] = to_device.made[k];
  EXPECT_EQ(page_frames(), expected);
  EXPECT_EQ(given_back_since(returned_before).size(), moving.size());
  for (frame_id f : given_back_since(returned_before)) EXPECT_TRUE(zeroed(f));
  EXPECT_TRUE(all_hold(52));

  // The moved pages evict and restore like any other.
  ASSERT_EQ(pg->evict_all(), ok) << last_error();
  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  EXPECT_TRUE(all_hold(52));
}

// Access is granted to two frames' worth per page moved: the old frame at its scratch slot
// (the copy's source, zeroed there afterwards) and the new frame at the page's address,
// against three before (the new frame at its slot, then at the page's address, the old frame
// at a slot again to zero it), and what a grant costs grows with the bytes. Each grant covers
// a run of consecutive addresses within a fill group (a quarter of the batch: one page in
// the fixture's window of 4, so that each copy is queued before the next frame is mapped):
// 2 calls per page here.
TEST_P(PagerRemap, AccessIsGrantedToTwoFramesPerPageMoved) {
  write_all(61);
  frame_maker to_host{frames.get(), frame_location::host};
  be->count_calls();
  size_t moved = 0;
  ASSERT_EQ(remap(frames_of(moving), to_host, &moved), ok) << last_error();
  EXPECT_EQ(moved, moving.size());
  EXPECT_EQ(be->granted_bytes(), 2 * moving.size() * k_fixture_page);
  EXPECT_EQ(be->calls(fault_op::set_access), 2 * moving.size());
  EXPECT_TRUE(all_hold(61));
  for (frame_id f : frames->given_back()) EXPECT_TRUE(zeroed(f));
}

// The copies of a batch start while the rest of it is filled: when the new frame of a page
// is asked for, the copies of the batch's pages before it are already queued (a fill group
// is a quarter of the batch, one page here), so the link is busy while frames are mapped.
TEST_P(PagerRemap, CopiesAreQueuedWhileTheRestOfTheBatchIsFilled) {
  write_all(62);
  std::vector<uint64_t> copies_queued;  // copy_d2d calls made when each new frame was asked for
  frame_maker to_host{frames.get(), frame_location::host};
  be->count_calls();
  size_t moved = 0;
  ASSERT_EQ(pg->remap_pages(frames_of(moving),
                            [&](frame_id* out) {
                              copies_queued.push_back(be->calls(fault_op::copy_d2d));
                              return to_host(out);
                            },
                            &moved),
            ok)
      << last_error();
  EXPECT_EQ(moved, moving.size());
  ASSERT_EQ(copies_queued.size(), moving.size());
  for (size_t k = 0; k < moving.size(); ++k) EXPECT_EQ(copies_queued[k], k) << "new frame #" << k;
  EXPECT_TRUE(all_hold(62));
  for (frame_id f : frames->given_back()) EXPECT_TRUE(zeroed(f));
}

TEST_P(PagerRemap, FramesThatBackNoPageMoveNothing) {
  write_all(61);
  const std::vector<frame_id> before = page_frames();
  frame_id stranger = 0;
  ASSERT_EQ(frames->make(0, k_fixture_page, frame_location::device, &stranger), ok) << last_error();
  frame_maker maker{frames.get(), frame_location::host};
  size_t moved = 99;
  ASSERT_EQ(remap({stranger}, maker, &moved), ok) << last_error();
  EXPECT_EQ(moved, 0u);
  EXPECT_TRUE(maker.made.empty()) << "no new frame is asked for";
  EXPECT_EQ(page_frames(), before);
  EXPECT_TRUE(frames->given_back().empty());
  EXPECT_TRUE(all_hold(61));
}

TEST_P(PagerRemap, ANewFrameThatCannotBeHadLeavesThePagesNotYetMovedInPlace) {
  // Refused in the second batch, and then at the very first frame.
  for (size_t refused : {size_t{5}, size_t{0}}) {
    write_all(70 + refused);
    const std::vector<frame_id> before = page_frames();
    const size_t returned_before = frames->given_back().size();
    frame_maker maker{frames.get(), frame_location::host, refused};
    size_t moved = 99;
    clear_error();
    EXPECT_EQ(remap(frames_of(moving), maker, &moved), err_out_of_memory);
    const std::string why = last_error();
    EXPECT_NE(why.find(std::to_string(refused) + " of " + std::to_string(moving.size()) + " page(s) moved"), std::string::npos) << why;
    EXPECT_NE(why.find("the test refuses new frame"), std::string::npos) << why;
    EXPECT_EQ(moved, refused);
    ASSERT_EQ(pg->check_invariants(), ok) << last_error();
    std::vector<frame_id> expected = before;
    for (size_t k = 0; k < refused; ++k) expected[moving[k]] = maker.made[k];
    EXPECT_EQ(page_frames(), expected) << "refused at frame " << refused;
    EXPECT_EQ(given_back_since(returned_before).size(), refused) << "the old frames of the pages moved, no other";
    for (frame_id f : given_back_since(returned_before)) EXPECT_TRUE(zeroed(f));
    EXPECT_TRUE(all_hold(70 + refused));
  }
}

// An old frame whose scrub fails still holds its page's old bytes: it is held back, never
// given back, and the remap fails (so that the lock holder that asked for it hears why,
// instead of its owner taking the request as served and serving it again and again). The
// next remap, with the fault gone, scrubs it and gives it back.
TEST_P(PagerRemap, AnOldFrameWhoseScrubFailsIsHeldBackUntilAScrubSucceeds) {
  for (const fault_op op : {fault_op::memset_d8, fault_op::stream_synchronize}) {
    write_all(90 + static_cast<unsigned>(op));
    frame_maker maker{frames.get(), frame_location::host};
    size_t moved = 99;
    // The first scrub of an old frame, or the wait for the first batch's scrubs (the copies
    // are waited for on events: a remap's first stream synchronize is that wait).
    const uint64_t nth = 0;
    const std::vector<frame_id> now_before = page_frames();
    const size_t returned_now = frames->given_back().size();
    be->fail_at(op, nth);
    clear_error();
    const int rc = remap(frames_of(moving), maker, &moved);
    be->disarm();
    ASSERT_TRUE(be->fired()) << test::fault_op_name(op);
    const std::string why = last_error();
    EXPECT_NE(rc, ok) << test::fault_op_name(op);
    EXPECT_NE(why.find("injected fault"), std::string::npos) << why;
    // A failed scrub call stops nothing else (every page moves); a failed wait for the scrubs
    // ends the remap after that batch, as any failed wait does.
    if (op == fault_op::memset_d8) {
      EXPECT_NE(why.find("could not be made fit to go back"), std::string::npos) << why;
      EXPECT_EQ(moved, moving.size());
    } else {
      EXPECT_NE(why.find("the others stay in their frames"), std::string::npos) << why;
      EXPECT_GE(moved, 1u);
    }
    const size_t held = pg->frames_held_back();
    EXPECT_GE(held, 1u);
    const std::vector<frame_id> back = given_back_since(returned_now);
    const std::vector<frame_id> after = page_frames();
    size_t old_kept = 0, moved_pages = 0;
    for (uint64_t i : moving) {
      if (after[i] == now_before[i]) continue;
      ++moved_pages;
      if (std::find(back.begin(), back.end(), now_before[i]) == back.end()) ++old_kept;
    }
    EXPECT_EQ(moved_pages, moved);
    EXPECT_EQ(old_kept, held) << "the held frames are old frames of moved pages, not given back";
    EXPECT_EQ(back.size() + held, moved);
    for (frame_id f : back) EXPECT_TRUE(zeroed(f));
    ASSERT_EQ(pg->check_invariants(), ok) << last_error();
    EXPECT_TRUE(all_hold(90 + static_cast<unsigned>(op)));
    // Fault gone: asked again for the same frames (the held ones back no page now), the held
    // frames go back, zeroed, and the pages not moved before move.
    const size_t moved_before = moved;
    const size_t returned_retry = frames->given_back().size();
    std::vector<frame_id> asked_again;
    for (uint64_t i : moving) asked_again.push_back(now_before[i]);
    ASSERT_EQ(remap(asked_again, maker, &moved), ok) << last_error();
    EXPECT_EQ(moved, moving.size() - moved_before);
    EXPECT_EQ(pg->frames_held_back(), 0u);
    const std::vector<frame_id> released = given_back_since(returned_retry);
    EXPECT_EQ(released.size(), held + moved);
    for (frame_id f : released) EXPECT_TRUE(zeroed(f)) << "a held frame went back unscrubbed";
    EXPECT_TRUE(all_hold(90 + static_cast<unsigned>(op)));
  }
}

// A copy that is not confirmed sends its page back to its old frame; when that fails too,
// nothing is lost and no frame goes back while it holds the page's bytes or is still mapped.
// Its address still leading to the new frame: the bytes are copied there again and the new
// frame is the page's home. Its address left unmapped: the old frame stays the page's, and
// is never given back (a free cannot scrub it through the address).
TEST_P(PagerRemap, ACopyNotConfirmedAndAPageThatCannotGoBackLoseNoByteAndGiveBackNoLiveFrame) {
  for (const fault_op second : {fault_op::unmap, fault_op::map}) {
    const uint64_t seed = 120 + static_cast<unsigned>(second);
    write_all(seed);
    const std::vector<frame_id> before = page_frames();
    const size_t returned_before = frames->given_back().size();
    frame_maker maker{frames.get(), frame_location::host};
    size_t moved = 99;
    be->fail_at(fault_op::event_synchronize, 0);  // the first copy's wait: it ran, but is not confirmed
    be->then_fail(second);                        // and the way back fails
    clear_error();
    const int rc = remap(frames_of(moving), maker, &moved);
    const bool both = be->fired() && be->second_fired();
    be->disarm();
    ASSERT_TRUE(both) << test::fault_op_name(second) << ": the faults did not both fire";
    EXPECT_NE(rc, ok);
    const std::vector<frame_id> now = page_frames();
    const uint64_t first = moving[0];  // the page whose copy was not confirmed
    if (second == fault_op::unmap) {
      // Its address kept the new frame, which got the bytes again: every page reads back whole.
      EXPECT_NE(now[first], before[first]) << "the new frame should be the page's home";
      EXPECT_TRUE(all_hold(seed));
      EXPECT_GE(pg->frames_held_back(), 1u) << "its old frame, mapped at an abandoned slot, is held";
    }
    EXPECT_EQ(now[first] == before[first], second == fault_op::map);
    // No frame of a page went back, and every frame given back was zeroed.
    for (frame_id f : given_back_since(returned_before)) {
      EXPECT_TRUE(std::find(now.begin(), now.end(), f) == now.end()) << "a frame given back still backs a page";
      EXPECT_TRUE(zeroed(f));
    }
    if (second == fault_op::map) {
      // The old frame holds the page's bytes though its address leads nowhere: read them there.
      EXPECT_EQ(now[first], before[first]);
      for (uint64_t i = 0; i < k_pages; ++i) {
        if (i == first) continue;
        std::memset(staging, 0x5A, k_fixture_page);
        ASSERT_EQ(real->copy_d2h(staging, page_address(i), k_fixture_page, stream), ok) << last_error();
        ASSERT_EQ(real->stream_synchronize(stream), ok);
        EXPECT_EQ(test::first_mismatch(staging, k_fixture_page, page_seed(seed, i)), k_fixture_page) << "page " << i;
      }
      break;  // the page's address is left unmapped: this pager is not fit for another round
    }
  }
}

// Every operation a remap makes fails once, at every position a clean run reaches.
TEST_P(PagerRemap, AFailureAtAnyStepLeavesEveryPageWholeInItsOldOrItsNewFrame) {
  std::vector<uint64_t> counts;
  {
    write_all(80);
    frame_maker maker{frames.get(), frame_location::host};
    const std::vector<frame_id> request = frames_of(moving);
    be->count_calls();
    ASSERT_EQ(remap(request, maker, nullptr), ok) << last_error();
    for (unsigned op = 0; op < static_cast<unsigned>(fault_op::count_); ++op) counts.push_back(be->calls(static_cast<fault_op>(op)));
  }
  uint64_t seed = 81;
  uint64_t failures = 0;
  for (unsigned op = 0; op < static_cast<unsigned>(fault_op::count_); ++op) {
    const auto o = static_cast<fault_op>(op);
    for (uint64_t n = 0; n < counts[op]; ++n) {
      const std::string where = std::string(test::fault_op_name(o)) + " call #" + std::to_string(n) + " failing";
      write_all(++seed);
      const std::vector<frame_id> before = page_frames();
      const size_t returned_before = frames->given_back().size();
      frame_maker maker{frames.get(), frame_location::host};
      size_t moved = 99;
      be->fail_at(o, n);
      clear_error();
      const int rc = remap(frames_of(moving), maker, &moved);
      be->disarm();
      if (rc != ok) {
        ++failures;
        const std::string why = last_error();
        EXPECT_TRUE(why.find("the others stay in their frames") != std::string::npos ||
                    why.find("could not be made fit to go back") != std::string::npos ||
                    why.find("remap_pages: synchronizing device") != std::string::npos)
            << where << ": " << why;
      }
      ASSERT_EQ(pg->check_invariants(), ok) << where << ": " << last_error();
      const std::vector<frame_id> now = page_frames();
      ASSERT_EQ(now.size(), k_pages) << where << ": every page stays resident";
      size_t changed = 0;
      for (size_t k = 0, i = 0; i < k_pages; ++i) {
        if (!moves(i)) {
          EXPECT_EQ(now[i], before[i]) << where << ": page " << i << " was not asked for";
          continue;
        }
        if (now[i] != before[i]) {
          ++changed;
          EXPECT_TRUE(k < maker.made.size() && now[i] == maker.made[k]) << where << ": page " << i << " is in a frame not made for it";
        }
        ++k;
      }
      EXPECT_EQ(moved, changed) << where;
      // Every frame given back is zeroed: an old frame, and a new one that did not become its
      // page's home (its copy may have reached it in whole or in part).
      for (frame_id f : given_back_since(returned_before)) {
        const bool old_frame = std::find(before.begin(), before.end(), f) != before.end();
        EXPECT_TRUE(zeroed(f)) << where << (old_frame ? ": an old frame" : ": a new frame given back");
      }
      ASSERT_TRUE(all_hold(seed)) << where;
    }
  }
  EXPECT_GT(failures, 10u) << "the sweep must have made remaps fail";
  // Once the faults are gone, the pages still move.
  write_all(99);
  frame_maker maker{frames.get(), frame_location::device};
  std::vector<frame_id> all = page_frames();
  size_t moved = 0;
  ASSERT_EQ(remap(all, maker, &moved), ok) << last_error();
  EXPECT_EQ(moved, k_pages);
  EXPECT_TRUE(all_hold(99));
}

INSTANTIATE_TEST_SUITE_P(Backends, PagerRemap, ::testing::Values(backend_kind::host, backend_kind::cuda), test::param_name);

}  // namespace
}  // namespace vramswap::detail
