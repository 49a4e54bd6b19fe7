// The stream-ordered allocator (runtime/stream_allocator.hpp) over a real pager on the host
// backend, where device memory is this process's memory: random sizes split and merged
// with every live block's bytes kept, streams kept apart, CUDA graph captures (reported by
// the fault layer, as cuStreamIsCapturing would), trims giving whole segments and their
// frames back, and allocation outside the lock backed at once or refused.
#include "runtime/stream_allocator.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "support/backends.hpp"
#include "support/faulty_backend.hpp"
#include "support/random_bytes.hpp"
#include "swap/host_tier.hpp"

namespace vramswap::detail {
namespace {

constexpr uint64_t KiB = 1ull << 10;
constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t k_frame = 2 * MiB;
constexpr uintptr_t s1 = 0x1000, s2 = 0x2000, s3 = 0x3000;

// Frames made on demand, at most `cap` at a time: a pool of that size with no other process.
// Outside the lock it hands out free ones too (a shared pool's free frames).
class capped_frames final : public frame_source {
 public:
  capped_frames(backend& be, size_t cap) : be_(be), cap_(cap) {}
  int take(int device, size_t size, frame_id* out) override {
    if (taken_ >= cap_) return fail(err_out_of_memory, "capped_frames: all %zu frames are taken", cap_);
    VS_TRY(be_.create_frame(device, size, out));
    ++taken_;
    return ok;
  }
  int try_take_not_resident(int device, size_t size, frame_id* out) override {
    if (taken_ >= cap_) return fail(err_busy, "capped_frames: no free frame among its %zu", cap_);
    return take(device, size, out);
  }
  int give_back(frame_id frame) override {
    VS_TRY(be_.release_frame(frame));
    --taken_;
    return ok;
  }
  size_t taken() const { return taken_; }

 private:
  backend& be_;
  const size_t cap_;
  size_t taken_ = 0;
};

class StreamAllocatorOverPager : public ::testing::Test {
 protected:
  void make(size_t frames, bool advise_at_release) {
    std::string why;
    backend* real = test::shared_backend(backend_kind::host, &why);
    ASSERT_NE(real, nullptr) << why;
    alloc.reset();
    pg.reset();
    be = std::make_unique<test::faulty_backend>(*real);
    store = std::make_unique<host_tier>(*be, k_frame, 4);
    source = std::make_unique<capped_frames>(*be, frames);
    pager_config cfg;
    cfg.frame_size = k_frame;
    cfg.arena_size = 512 * MiB;
    cfg.copies_in_flight = 4;
    ASSERT_EQ(pager::create(*be, 0, *store, *source, cfg, &pg), ok) << last_error();
    alloc = std::make_unique<stream_allocator>(*be, 0, *pg, advise_at_release);
  }
  void TearDown() override {
    alloc.reset();
    pg.reset();
  }
  device_ptr get(uint64_t size, uintptr_t stream) {
    device_ptr p = 0;
    EXPECT_EQ(alloc->allocate(size, stream, &p), ok) << last_error();
    EXPECT_EQ(alloc->check_invariants(), ok) << last_error();
    return p;
  }
  void put(device_ptr p, uintptr_t stream) {
    EXPECT_EQ(alloc->deallocate(p, stream), ok) << last_error();
    EXPECT_EQ(alloc->check_invariants(), ok) << last_error();
  }
  static void* host(device_ptr p) { return reinterpret_cast<void*>(p); }

  std::unique_ptr<test::faulty_backend> be;
  std::unique_ptr<host_tier> store;
  std::unique_ptr<capped_frames> source;
  std::unique_ptr<pager> pg;
  std::unique_ptr<stream_allocator> alloc;
};

// Random sizes in both pools on three streams, freed in random order (now and then on another
// stream), with trims between: no two live blocks overlap, and every byte of every live block
// keeps its own pattern while its neighbours are split off, freed and merged around it.
TEST_F(StreamAllocatorOverPager, RandomSizesSplitAndMergeWithoutTouchingALiveByte) {
  make(96, true);
  std::mt19937_64 rng(2024);
  struct held {
    uint64_t size;
    uintptr_t stream;
    uint64_t seed;
  };
  std::map<device_ptr, held> live;
  const uintptr_t streams[] = {s1, s2, s3};
  uint64_t seed = 1;
  auto verify = [&](device_ptr p, const held& h) {
    ASSERT_EQ(test::first_mismatch(host(p), h.size, h.seed), h.size) << "block 0x" << std::hex << p << " lost bytes";
  };
  for (int op = 0; op < 600; ++op) {
    if (live.size() < 40 && (live.empty() || rng() % 5 < 3)) {
      const bool small = rng() % 4 != 0;
      const uint64_t lo = small ? 256 : MiB + 1, hi = small ? MiB : 3 * MiB;
      // Log-uniform between lo and hi.
      const double f = std::uniform_real_distribution<double>(0, 1)(rng);
      const uint64_t size = static_cast<uint64_t>(static_cast<double>(lo) * std::pow(static_cast<double>(hi) / lo, f));
      const uintptr_t stream = streams[rng() % 3];
      device_ptr p = 0;
      ASSERT_EQ(alloc->allocate(size, stream, &p), ok) << last_error();
      ASSERT_EQ(alloc->check_invariants(), ok) << last_error();
      auto next = live.lower_bound(p);
      ASSERT_TRUE(next == live.end() || next->first >= p + size) << "overlaps the next live block";
      ASSERT_TRUE(next == live.begin() || std::prev(next)->first + std::prev(next)->second.size <= p) << "overlaps the previous one";
      test::fill_random(host(p), size, ++seed);
      live.emplace(p, held{size, stream, seed});
    } else {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      verify(it->first, it->second);
      const uintptr_t on = rng() % 8 == 0 ? streams[rng() % 3] : it->second.stream;
      ASSERT_EQ(alloc->deallocate(it->first, on), ok) << last_error();
      ASSERT_EQ(alloc->check_invariants(), ok) << last_error();
      live.erase(it);
    }
    if (op % 150 == 149) {
      for (auto& [p, h] : live) verify(p, h);
      ASSERT_EQ(alloc->trim(), ok) << last_error();
      ASSERT_EQ(alloc->check_invariants(), ok) << last_error();
    }
  }
  for (auto& [p, h] : live) verify(p, h);
  const stream_allocator_stats st = alloc->stats();
  EXPECT_GT(st.hits, st.misses * 4) << "the segments served most requests";
  for (auto& [p, h] : live) ASSERT_EQ(alloc->deallocate(p, h.stream), ok) << last_error();
  ASSERT_EQ(alloc->trim(), ok);
  EXPECT_EQ(alloc->stats().segments, 0u);
  EXPECT_EQ(pg->stats().allocated_bytes, 0u);
  EXPECT_EQ(source->taken(), 0u) << "every frame back";
  EXPECT_EQ(pg->check_invariants(), ok) << last_error();
}

TEST_F(StreamAllocatorOverPager, FreeBlocksOfOneStreamServeAnotherOnlyAfterATrim) {
  make(64, true);
  const device_ptr a = get(3 * MiB, s1);
  const device_ptr keep = get(3 * MiB, s1);  // keeps the segment from going back
  put(a, s1);
  const device_ptr b = get(3 * MiB, s2);
  EXPECT_NE(b, a) << "s1's free block must not serve s2 before a synchronization";
  EXPECT_EQ(alloc->stats().segments, 2u);
  put(b, s2);
  ASSERT_EQ(alloc->trim(), ok);
  EXPECT_EQ(alloc->stats().segments, 1u) << "s2's whole free segment went back; s1's holds a live block";
  const device_ptr c = get(3 * MiB, s1);
  EXPECT_EQ(c, a) << "after the trim the free block is its segment's again";
  put(c, s1);
  put(keep, s1);
}

// A trim gives back whole free segments (their frames return to the pool) and keeps the
// segments that hold a live block; when a new segment does not fit, the allocation trims and
// retries, then takes a segment of its own size.
TEST_F(StreamAllocatorOverPager, TrimsGiveWholeSegmentsAndTheirFramesBack) {
  make(24, true);  // 48 MiB
  std::vector<device_ptr> big;
  for (int i = 0; i < 4; ++i) big.push_back(get(9 * MiB, s1));  // two 20 MiB segments
  EXPECT_EQ(alloc->stats().segments, 2u);
  EXPECT_EQ(source->taken(), 20u);
  for (int i = 0; i < 3; ++i) put(big[i], s1);
  ASSERT_EQ(alloc->trim(), ok);
  EXPECT_EQ(alloc->stats().segments, 1u);
  EXPECT_EQ(source->taken(), 10u) << "the free segment's frames went back";
  EXPECT_EQ(alloc->stats().trims, 1u);
  const device_ptr x = get(20 * MiB, s2);
  EXPECT_EQ(source->taken(), 20u);
  put(x, s2);  // s2's, cached
  const device_ptr y = get(24 * MiB, s3);  // 24 MiB more do not fit: the trim gives x's segment back
  EXPECT_GE(alloc->stats().trims, 2u);
  EXPECT_EQ(alloc->stats().segments, 2u);
  // 8 MiB on s3 fit s1's free 9 MiB block once a trim has synchronized; 10 MiB fit nowhere.
  const device_ptr w = get(8 * MiB, s3);
  EXPECT_EQ(w, big[2]);
  device_ptr z = 0;
  EXPECT_EQ(alloc->allocate(10 * MiB, s3, &z), err_out_of_memory) << "the pool is full";
  EXPECT_NE(std::string(last_error()).find("malloc_async(10485760 bytes"), std::string::npos) << last_error();
  EXPECT_EQ(alloc->check_invariants(), ok) << last_error();
  put(w, s3);
  put(y, s3);
  put(big[3], s1);
  ASSERT_EQ(alloc->trim(), ok);
  EXPECT_EQ(source->taken(), 0u);
}

// Blocks of a capture belong to the graph for good: never reused, never given back, and the
// segment that holds them stays; memory freed during a capture likewise.
TEST_F(StreamAllocatorOverPager, BlocksOfACaptureAreNeverReusedNorGivenBack) {
  make(64, true);
  const device_ptr before = get(64 * KiB, s1);
  be->set_capturing(s1);
  const device_ptr in_graph = get(64 * KiB, s1);
  put(in_graph, s1);
  put(before, s1);  // freed while its stream is captured: the graph may use it
  const device_ptr next = get(64 * KiB, s1);
  EXPECT_NE(next, in_graph);
  EXPECT_NE(next, before);
  be->set_capturing(0);
  put(next, s1);  // allocated during the capture: the graph's
  EXPECT_EQ(alloc->stats().graph_bytes, 3 * 64 * KiB);
  ASSERT_EQ(alloc->trim(), ok);
  EXPECT_EQ(alloc->stats().segments, 1u) << "the segment holding graph blocks is never given back";
  for (int i = 0; i < 20; ++i) {
    const device_ptr p = get(64 * KiB, s1);
    EXPECT_TRUE(p != in_graph && p != before && p != next) << "a graph's block was handed out again";
  }
  EXPECT_EQ(alloc->deallocate(in_graph, s1), err_invalid_argument) << "a graph's block is not live any more";
}

// Outside the lock (not resident): new segments and reused free blocks are backed at once
// from free frames, or the allocation fails saying why; a free block whose pages an
// eviction dropped comes back (zero-filled), and a live neighbour on a page it shares keeps
// its bytes: the page was copied, not dropped.
TEST_F(StreamAllocatorOverPager, OutsideTheLockBlocksAreBackedAtOnceOrRefused) {
  make(4, true);
  const device_ptr a = get(256 * KiB, s1);
  const device_ptr b = get(256 * KiB, s1);  // same small segment, same 2 MiB page as a
  test::fill_random(host(a), 256 * KiB, 11);
  test::fill_random(host(b), 256 * KiB, 12);
  put(b, s1);
  const device_ptr big = get(4 * MiB, s1);  // a 20 MiB segment would not fit; 4 MiB does
  EXPECT_EQ(alloc->stats().segment_bytes, 2 * MiB + 4 * MiB);
  test::fill_random(host(big), 4 * MiB, 13);
  ASSERT_EQ(alloc->advise_cached(), ok) << last_error();  // what a release does
  ASSERT_EQ(pg->evict_all(), ok) << last_error();  // now not resident, every frame free
  EXPECT_EQ(pg->stats().bytes_out, 3 * k_frame) << "the small segment's page holds a live block: copied, with big's two";
  EXPECT_EQ(source->taken(), 0u);
  const device_ptr b2 = get(256 * KiB, s1);  // reuses b's bytes, outside the lock
  EXPECT_EQ(b2, b);
  EXPECT_EQ(source->taken(), 1u) << "backed at once";
  EXPECT_EQ(test::first_mismatch(host(a), 256 * KiB, 11), 256 * KiB) << "a's bytes came back with the page";
  device_ptr c = 0;
  EXPECT_EQ(alloc->allocate(8 * MiB, s2, &c), err_out_of_memory) << "3 free frames cannot back 8 MiB";
  EXPECT_NE(std::string(last_error()).find("does not hold the device lock"), std::string::npos) << last_error();
  EXPECT_EQ(alloc->check_invariants(), ok) << last_error();
  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  EXPECT_EQ(test::first_mismatch(host(big), 4 * MiB, 13), 4 * MiB);
  put(a, s1);
  put(b2, s1);
  put(big, s1);
}

// Advice at release: an eviction copies only pages that hold live bytes; pages holding only
// free blocks are dropped, and a block freed and taken again within a hold costs no advice.
TEST_F(StreamAllocatorOverPager, EvictionsCopyPagesWithLiveBytesOnly) {
  make(64, true);
  const device_ptr live = get(3 * MiB, s1);   // [0, 3 MiB) of a 20 MiB segment: pages 0-1
  const device_ptr dead = get(12 * MiB, s1);  // [3, 15 MiB)
  test::fill_random(host(live), 3 * MiB, 21);
  put(dead, s1);
  ASSERT_EQ(alloc->advise_cached(), ok) << last_error();
  ASSERT_EQ(pg->evict_all(), ok) << last_error();
  EXPECT_EQ(pg->stats().bytes_out, 2 * k_frame) << "pages 2-9 hold only free bytes";
  EXPECT_EQ(pg->stats().pages_discarded, 8u);
  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  EXPECT_EQ(test::first_mismatch(host(live), 3 * MiB, 21), 3 * MiB);
  const device_ptr again = get(12 * MiB, s1);
  EXPECT_EQ(again, dead);
  test::fill_random(host(again), 12 * MiB, 22);
  ASSERT_EQ(pg->evict_all(), ok) << last_error();
  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  EXPECT_EQ(test::first_mismatch(host(again), 12 * MiB, 22), 12 * MiB) << "reuse advised it normal again";
  put(again, s1);
  put(live, s1);
}

// Within a hold, a step that allocates what the previous one freed costs the pager no advice
// after the first take of each advised block: taking only part of an advised block normal
// left the merge of that part, freed again, with the advised rest "some", and every later
// take from it advised again.
TEST_F(StreamAllocatorOverPager, BlocksTakenAgainWithinAHoldCostNoAdvice) {
  make(64, true);
  const device_ptr keep = get(3 * MiB, s1);     // [0, 3 MiB) of a 20 MiB segment
  const device_ptr first = get(4 * MiB, s1);    // [3, 7 MiB): the rest stays free
  put(first, s1);
  ASSERT_EQ(alloc->advise_cached(), ok) << last_error();  // a release: every free block advised
  const uint64_t before = alloc->stats().advice_calls;
  for (int step = 0; step < 50; ++step) {
    const device_ptr a = get(2 * MiB, s1);
    const device_ptr b = get(5 * MiB, s1);
    const device_ptr c = get(512 * KiB + 7, s1);
    put(b, s1);
    put(a, s1);
    put(c, s1);
  }
  EXPECT_LE(alloc->stats().advice_calls - before, 2u) << "advice per allocation within one hold";
  ASSERT_EQ(alloc->advise_cached(), ok) << last_error();
  EXPECT_EQ(alloc->check_invariants(), ok) << last_error();
  // What stayed free is advised again at the release: an eviction drops its pages.
  ASSERT_EQ(pg->evict_all(), ok) << last_error();
  EXPECT_EQ(pg->stats().bytes_out, 2 * k_frame) << "only the pages of the live 3 MiB are copied";
  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  put(keep, s1);
}

// The busy time (read from the CPU's counter, converted at the rate measured against the
// steady clock): a loop of nothing but allocations and frees is mostly busy time, and never
// more than the loop's wall time.
TEST_F(StreamAllocatorOverPager, BusyTimeIsTheCallsTime) {
  make(16, true);
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t before = alloc->stats().busy_ns;
  for (int i = 0; i < 20000; ++i) {
    device_ptr p = 0;
    ASSERT_EQ(alloc->allocate(4 * KiB + static_cast<uint64_t>(i % 7) * 512, s1, &p), ok) << last_error();
    ASSERT_EQ(alloc->deallocate(p, s1), ok) << last_error();
  }
  const uint64_t busy = alloc->stats().busy_ns - before;
  const auto wall = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  EXPECT_GT(busy, wall / 5) << "busy " << busy << " ns of " << wall << " ns";
  EXPECT_LE(busy, wall + wall / 10 + 1000000) << "busy " << busy << " ns of " << wall << " ns";
}

}  // namespace
}  // namespace vramswap::detail
