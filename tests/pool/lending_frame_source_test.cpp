// lending_frame_source (pool/lending_frame_source.hpp), an oversubscribed process's frames, in
// one process on the host backend: pool frames first, then host frames up to the limit; host
// frames given back are spares, taken before new ones and counted against the limit;
// threads taking host frames at once never pass the limit; requests of members that left
// are withdrawn. The multi-process story is in tests/cpp_api/oversubscription_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lock/process_identity.hpp"
#include "core/backend.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "pool/lending_frame_source.hpp"
#include "pool/pool_segment.hpp"

namespace vramswap::detail {
namespace {
using namespace pool_layout;

constexpr uint32_t k_pool_frames = 2;

class LendingFrameSource : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = "vslfs" + std::to_string(::getpid()) + "-";
    option_set(option_id::shm_prefix, prefix_.c_str());
    ASSERT_EQ(make_backend(backend_kind::host, &be_), ok) << last_error();
    device_info info;
    ASSERT_EQ(be_->get_device_info(0, &info), ok) << last_error();
    frame_ = info.granularity;
    ASSERT_EQ(pool_segment::create("host-78", k_pool_frames, frame_, 0, ::getpid(), 0, &pool_), ok) << last_error();
    for (uint32_t i = 0; i < k_pool_frames; ++i) {
      frame_id f = 0;
      ASSERT_EQ(be_->create_frame(0, frame_, &f), ok) << last_error();
      local_.push_back(f);
    }
  }
  void TearDown() override {
    source_.reset();
    for (frame_id f : local_) be_->release_frame(f);
    pool_.reset();
    pool_segment::remove("host-78");
    option_set(option_id::shm_prefix, nullptr);
  }
  lending_frame_source& source(uint64_t host_frames_allowed) {
    source_ = std::make_unique<lending_frame_source>(*be_, *pool_, /*me=*/3, local_, host_frames_allowed * frame_);
    return *source_;
  }

  std::string prefix_;
  std::unique_ptr<backend> be_;
  size_t frame_ = 0;
  std::unique_ptr<pool_segment> pool_;
  std::vector<frame_id> local_;
  std::unique_ptr<lending_frame_source> source_;
};

TEST_F(LendingFrameSource, GivesFreePoolFramesFirstThenHostFramesThenTheLimitsError) {
  lending_frame_source& s = source(1);
  std::vector<frame_id> got(4);
  ASSERT_EQ(s.take(0, frame_, &got[0]), ok) << last_error();
  ASSERT_EQ(s.take(0, frame_, &got[1]), ok) << last_error();
  EXPECT_TRUE(s.is_pool_frame(got[0]) && s.is_pool_frame(got[1]));
  EXPECT_EQ(pool_->count(frame_lent), k_pool_frames) << "pool frames taken by an oversubscribed process are lent";
  ASSERT_EQ(s.take(0, frame_, &got[2]), ok) << last_error();
  EXPECT_FALSE(s.is_pool_frame(got[2]));
  EXPECT_EQ(s.host_bytes(), frame_);
  EXPECT_EQ(s.take(0, frame_, &got[3]), err_out_of_memory);
  EXPECT_NE(std::string(last_error()).find("VRAMSWAP_OVERSUBSCRIBE_LIMIT"), std::string::npos) << last_error();
  for (int i = 0; i < 3; ++i) ASSERT_EQ(s.give_back(got[i]), ok) << last_error();
  EXPECT_EQ(s.host_bytes(), 0u);
  EXPECT_EQ(pool_->count(frame_free), k_pool_frames);
}

TEST_F(LendingFrameSource, HostFramesGivenBackAreSparesTakenBeforeNewOnes) {
  lending_frame_source& s = source(1);  // room for one host frame in all, spares included
  frame_id a = 0;
  ASSERT_EQ(s.take_host_frame(0, frame_, &a), ok) << last_error();
  ASSERT_EQ(s.give_back(a), ok) << last_error();
  EXPECT_EQ(s.host_bytes(), 0u);
  EXPECT_EQ(s.spare_bytes(), frame_);
  frame_id b = 0;
  ASSERT_EQ(s.take_host_frame(0, frame_, &b), ok) << "the spare, not a second frame past the limit: " << last_error();
  EXPECT_EQ(b, a);
  EXPECT_EQ(s.host_bytes(), frame_);
  EXPECT_EQ(s.spare_bytes(), 0u);
  frame_id c = 0;
  EXPECT_EQ(s.take_host_frame(0, frame_, &c), err_out_of_memory);
  ASSERT_EQ(s.give_back(b), ok) << last_error();
  EXPECT_EQ(s.release_spares(), 1u);
  EXPECT_EQ(s.spare_bytes(), 0u);
  size_t size = 0;
  EXPECT_NE(be_->frame_size(a, &size), ok) << "a released spare is gone";
}

// Frames made ahead of a reclaim are spares: taken before new ones, within the limit with the
// frames in use, and made no further than the limit allows (quietly: it bounds them).
TEST_F(LendingFrameSource, FramesMadeAheadAreSparesBoundedByTheLimit) {
  lending_frame_source& s = source(3);
  frame_id used = 0;
  ASSERT_EQ(s.take_host_frame(0, frame_, &used), ok) << last_error();
  size_t made = 0;
  ASSERT_EQ(s.make_spares(0, frame_, 5, [] { return false; }, &made), ok) << last_error();
  EXPECT_EQ(made, 2u) << "one in use + two made ahead is the limit of three";
  EXPECT_EQ(s.spare_count(), 2u);
  EXPECT_EQ(s.spare_bytes(), 2 * frame_);
  EXPECT_EQ(s.frames_created(), 1u) << "frames made ahead are not counted as created on demand";
  frame_id more = 0;
  EXPECT_EQ(s.take_host_frame(0, frame_, &more), ok) << "a spare made ahead: " << last_error();
  bool spare = false;
  EXPECT_EQ(s.take_host_frame(0, frame_, &more, &spare), ok) << last_error();
  EXPECT_TRUE(spare);
  EXPECT_EQ(s.frames_created(), 1u) << "both taken from the frames made ahead";
  EXPECT_EQ(s.take_host_frame(0, frame_, &more), err_out_of_memory);
  EXPECT_NE(std::string(last_error()).find("VRAMSWAP_OVERSUBSCRIBE_LIMIT"), std::string::npos) << last_error();
  int asked = 0;
  ASSERT_EQ(s.make_spares(0, frame_, 5, [&] { return ++asked > 0; }, &made), ok);
  EXPECT_EQ(made, 0u) << "stop() is asked before each frame";
}

TEST_F(LendingFrameSource, ReleaseSparesKeepsAsManyAsAsked) {
  lending_frame_source& s = source(8);
  size_t made = 0;
  ASSERT_EQ(s.make_spares(0, frame_, 5, [] { return false; }, &made), ok) << last_error();
  ASSERT_EQ(made, 5u);
  EXPECT_EQ(s.release_spares(3), 2u);
  EXPECT_EQ(s.spare_count(), 3u);
  EXPECT_EQ(s.spare_bytes(), 3 * frame_);
  EXPECT_EQ(s.release_spares(3), 0u);
  EXPECT_EQ(s.release_spares(), 3u);
  EXPECT_EQ(s.spare_bytes(), 0u);
}

TEST_F(LendingFrameSource, TakeHostFramesUsesSparesFirstAndAppends) {
  lending_frame_source& s = source(64);
  std::vector<frame_id> first;
  ASSERT_EQ(s.take_host_frames(0, frame_, 2, &first), ok) << last_error();
  for (frame_id f : first) ASSERT_EQ(s.give_back(f), ok) << last_error();
  std::vector<frame_id> made = {777};  // appended to, never replaced
  size_t spares = 99;
  ASSERT_EQ(s.take_host_frames(0, frame_, 5, &made, &spares), ok) << last_error();
  EXPECT_EQ(spares, 2u);
  ASSERT_EQ(made.size(), 6u);
  EXPECT_EQ(made[0], 777u);
  EXPECT_EQ(std::set<frame_id>(made.begin() + 1, made.end()).size(), 5u);
  EXPECT_EQ(s.host_bytes(), 5 * frame_);
  for (size_t i = 1; i < made.size(); ++i) ASSERT_EQ(s.give_back(made[i]), ok) << last_error();
  EXPECT_EQ(s.host_bytes(), 0u);
  EXPECT_EQ(s.spare_bytes(), 5 * frame_);
}

TEST_F(LendingFrameSource, FourThreadsTakingHostFramesAtOnceStopExactlyAtTheLimit) {
  for (int round = 0; round < 20; ++round) {
    lending_frame_source& s = source(10);
    std::mutex m;
    std::vector<frame_id> made;
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (;;) {
          frame_id f = 0;
          if (s.take_host_frame(0, frame_, &f) != ok) return;
          std::lock_guard<std::mutex> guard(m);
          made.push_back(f);
        }
      });
    }
    for (std::thread& t : threads) t.join();
    ASSERT_EQ(made.size(), 10u) << "round " << round;
    EXPECT_EQ(s.host_bytes(), 10 * frame_);
    for (frame_id f : made) ASSERT_EQ(s.give_back(f), ok) << last_error();
    EXPECT_EQ(s.host_bytes(), 0u);
  }
}

TEST_F(LendingFrameSource, RequestsOfAMemberThatLeftAreWithdrawnAndLiveOnesKept) {
  lending_frame_source& s = source(0);
  frame_id a = 0, b = 0;
  ASSERT_EQ(s.take(0, frame_, &a), ok) << last_error();  // pool frames 0 and 1, lent to member 3
  ASSERT_EQ(s.take(0, frame_, &b), ok) << last_error();
  uint32_t live = 0, gone = 0;
  ASSERT_EQ(pool_->add_member(::getpid(), 1, current_pid_namespace(), &live), ok) << last_error();
  ASSERT_EQ(pool_->add_member(::getpid(), 2, current_pid_namespace(), &gone), ok) << last_error();
  ASSERT_TRUE(pool_->move(0, pool_->read(0), frame_requested, 3, live));
  ASSERT_TRUE(pool_->move(1, pool_->read(1), frame_requested, 3, gone));
  pool_->remove_member(gone);
  EXPECT_EQ(s.frames().requested_of_me().size(), 2u);
  EXPECT_EQ(s.withdraw_abandoned_requests(), 1u);
  const frame_word f0 = frame_word::decode(pool_->read(0));
  const frame_word f1 = frame_word::decode(pool_->read(1));
  EXPECT_EQ(f0.state, frame_requested) << "a live member's request stays";
  EXPECT_EQ(f0.requester, live);
  EXPECT_EQ(f1.state, frame_lent) << "the request of a member that left is withdrawn";
  EXPECT_EQ(f1.owner, 3u);
  EXPECT_EQ(s.frames().requested_of_me(), std::vector<frame_id>{local_[0]});
  EXPECT_EQ(s.withdraw_abandoned_requests(), 0u);
  ASSERT_EQ(s.give_back(a), ok) << last_error();
  ASSERT_EQ(s.give_back(b), ok) << last_error();
  EXPECT_EQ(pool_->count(frame_free), k_pool_frames);
}

}  // namespace
}  // namespace vramswap::detail
