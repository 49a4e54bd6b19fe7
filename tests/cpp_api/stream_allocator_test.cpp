// Stream-ordered allocation (vramswap_malloc_async / vramswap_free_async, the C++ and C
// faces) on the host backend: requests carved out of segments, same-stream reuse, no reuse
// across streams until a trim, splitting and merging, misuse refused without changing
// anything, room made by trimming when the arena is full, free blocks dropped by an eviction
// while live blocks come back byte for byte, and a training loop's mixed sizes fitting a pool
// just large enough. (runtime/stream_allocator.hpp's own tests: stream_allocator_unit_test.)
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpp_api/api_test_env.hpp"
#include "runtime/runtime.hpp"
#include "support/random_bytes.hpp"
#include "vramswap/vramswap.h"
#include "vramswap/vramswap.hpp"
#include "support/test_env.hpp"

namespace {
constexpr size_t MiB = size_t{1} << 20;
// Streams are only keys on the host backend: any distinct numbers do.
void* const s1 = reinterpret_cast<void*>(0x1000);
void* const s2 = reinterpret_cast<void*>(0x2000);

class StreamAllocator : public ::testing::Test {
 protected:
  void TearDown() override { env_.end(); }
  vramswap::detail::test::api_test_env env_;
};

// cudaStreamPerThread (0x2) is a different stream on every thread: a block one thread frees
// on it never serves another thread's allocation on it (its kernels may still use the block:
// nothing orders the two streams), while the thread itself gets it back at once. The legacy
// default stream is one stream for all threads: its block is shared.
TEST_F(StreamAllocator, ThePerThreadDefaultStreamIsEachThreadsOwn) {
  void* const per_thread = reinterpret_cast<void*>(0x2);
  void* freed_by_a = nullptr;
  void* again_in_a = nullptr;
  std::thread a([&] {
    freed_by_a = vramswap::malloc_async(4 * MiB, per_thread);
    vramswap::free_async(freed_by_a, per_thread);
    again_in_a = vramswap::malloc_async(4 * MiB, per_thread);
    vramswap::free_async(again_in_a, per_thread);
  });
  a.join();
  EXPECT_EQ(again_in_a, freed_by_a) << "a thread reuses its own stream's block at once";
  void* in_b = nullptr;
  std::thread b([&] {
    in_b = vramswap::malloc_async(4 * MiB, per_thread);
    vramswap::free_async(in_b, per_thread);
  });
  b.join();
  EXPECT_NE(in_b, freed_by_a) << "another thread's per-thread stream got a block with no ordering against the first's";
  void* legacy = nullptr;
  std::thread c([&] {
    legacy = vramswap::malloc_async(4 * MiB, nullptr);
    vramswap::free_async(legacy, nullptr);
  });
  c.join();
  std::thread d([&] {
    void* p = vramswap::malloc_async(4 * MiB, nullptr);
    EXPECT_EQ(p, legacy) << "the legacy default stream is one stream for every thread";
    vramswap::free_async(p, nullptr);
  });
  d.join();
}

// Sizes round to 512 B; requests up to 1 MiB come from 2 MiB segments, larger ones from
// 20 MiB segments (below 10 MiB) or segments of 16 frames shared by the large requests,
// split into blocks.
TEST_F(StreamAllocator, RequestsAreCarvedOutOfSegmentsOfTheirPool) {
  void* a = vramswap::malloc_async(513, s1);
  void* b = vramswap::malloc_async(700, s1);
  EXPECT_EQ(reinterpret_cast<char*>(b), reinterpret_cast<char*>(a) + 1024) << "513 bytes take a 1024-byte block";
  EXPECT_EQ(vramswap::get_stats(0).allocated_bytes, 2 * MiB) << "one small segment";
  void* c = vramswap::malloc_async(MiB + 1, s1);
  void* d = vramswap::malloc_async(3 * MiB, s1);
  EXPECT_EQ(reinterpret_cast<char*>(d), reinterpret_cast<char*>(c) + MiB + 512);
  EXPECT_EQ(vramswap::get_stats(0).allocated_bytes, 22 * MiB) << "a small segment and a large one";
  void* e = vramswap::malloc_async(17 * MiB + 3, s1);  // more than the large segment has left
  EXPECT_EQ(vramswap::get_stats(0).allocated_bytes, 54 * MiB) << "a request of 10 MiB or more: a segment of 16 frames of 2 MiB";
  void* f = vramswap::malloc_async(11 * MiB, s1);  // the rest of that segment
  EXPECT_EQ(reinterpret_cast<char*>(f), reinterpret_cast<char*>(e) + 17 * MiB + 512);
  EXPECT_EQ(vramswap::get_stats(0).allocated_bytes, 54 * MiB) << "large requests share their segment";
  const vramswap::stats s = vramswap::get_stats(0);
  EXPECT_EQ(s.cache_misses, 3u);
  EXPECT_EQ(s.cache_hits, 3u);
  EXPECT_EQ(s.cached_bytes, 54 * MiB - 1024 - 1024 - (MiB + 512) - 3 * MiB - (17 * MiB + 512) - 11 * MiB);
  for (void* p : {a, b, c, d, e, f}) vramswap::free_async(p, s1);
  EXPECT_EQ(vramswap::get_stats(0).cached_bytes, 54 * MiB);
  vramswap::release_cached(0);
  EXPECT_EQ(vramswap::get_stats(0).allocated_bytes, 0u) << "whole free segments go back";
}

TEST_F(StreamAllocator, SameStreamReusesAtOnceOtherStreamsDoNot) {
  void* a = vramswap::malloc_async(MiB, s1);
  vramswap::free_async(a, s1);
  EXPECT_EQ(vramswap::get_stats(0).cached_bytes, 2 * MiB) << "its segment is free";
  void* other = vramswap::malloc_async(MiB, s2);
  EXPECT_NE(other, a) << "a block freed on one stream must not serve another stream before a synchronization";
  void* again = vramswap::malloc_async(MiB, s1);
  EXPECT_EQ(again, a) << "a block freed on a stream serves that stream's next allocation of its size";
  EXPECT_EQ(vramswap::get_stats(0).cached_bytes, 2 * MiB);
  vramswap::free_async(again, s1);
  vramswap::free_async(other, s2);
  EXPECT_EQ(vramswap::get_stats(0).cached_bytes, 4 * MiB);
  const uint64_t allocated = vramswap::get_stats(0).allocated_bytes;
  vramswap::release_cached(0);
  const vramswap::stats s = vramswap::get_stats(0);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.allocated_bytes, allocated - 4 * MiB) << "release_cached gives the segments back to the pager";
}

// A block freed on another stream than its segment's serves that stream; after a trim it
// goes back to its segment's stream and merges with its free neighbours.
TEST_F(StreamAllocator, AFreeBlockIsSplitAndMergedWithItsNeighbours) {
  void* a = vramswap::malloc_async(8 * MiB, s1);
  vramswap::free_async(a, s1);
  void* b = vramswap::malloc_async(4 * MiB, s1);
  void* c = vramswap::malloc_async(4 * MiB, s1);
  EXPECT_EQ(b, a) << "best fit: the segment's free block, split";
  EXPECT_EQ(reinterpret_cast<char*>(c), reinterpret_cast<char*>(a) + 4 * MiB);
  vramswap::free_async(b, s1);
  vramswap::free_async(c, s1);
  void* whole = vramswap::malloc_async(20 * MiB - 4096, s1);
  EXPECT_EQ(whole, a) << "freed neighbours merge back into the whole segment";
  EXPECT_EQ(vramswap::get_stats(0).cache_misses, 1u);
  vramswap::free_async(whole, s2);  // now s2's
  void* on_s1 = vramswap::malloc_async(4 * MiB, s1);
  EXPECT_NE(on_s1, a) << "freed on s2: not s1's until a synchronization";
  void* on_s2 = vramswap::malloc_async(4 * MiB, s2);
  EXPECT_EQ(on_s2, a) << "freed on s2: s2's at once";
  vramswap::free_async(on_s1, s1);
  vramswap::free_async(on_s2, s2);
  vramswap::release_cached(0);
  EXPECT_EQ(vramswap::get_stats(0).allocated_bytes, 0u);
}

TEST_F(StreamAllocator, MisuseIsRefusedAndChangesNothing) {
  void* a = nullptr;
  ASSERT_EQ(vramswap_malloc_async(&a, MiB, 0, s1), VRAMSWAP_OK) << vramswap_last_error();
  // A block from malloc_async does not go back through plain free.
  EXPECT_EQ(vramswap_free(a, 0), VRAMSWAP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(vramswap_last_error()).find("free_async"), std::string::npos) << vramswap_last_error();
  ASSERT_EQ(vramswap_free_async(a, 0, s1), VRAMSWAP_OK) << vramswap_last_error();
  EXPECT_EQ(vramswap_free(a, 0), VRAMSWAP_ERR_INVALID_ARGUMENT) << "a free block is the allocator's: not for plain free";
  EXPECT_EQ(vramswap_free_async(a, 0, s1), VRAMSWAP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(vramswap_last_error()).find("double free"), std::string::npos) << vramswap_last_error();
  EXPECT_EQ(vramswap_free_async(reinterpret_cast<char*>(a) + 256, 0, s1), VRAMSWAP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(vramswap_malloc_async(&a, 0, 0, s1), VRAMSWAP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(vramswap_malloc_async(nullptr, MiB, 0, s1), VRAMSWAP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(vramswap_free_async(nullptr, 0, s1), VRAMSWAP_OK) << "NULL is ignored, as free(NULL)";
  EXPECT_EQ(vramswap::get_stats(0).cached_bytes, 2 * MiB) << "the refused calls changed the cache";
  void* b = nullptr;
  ASSERT_EQ(vramswap_malloc_async(&b, MiB, 0, s1), VRAMSWAP_OK);
  EXPECT_EQ(b, a) << "the cached block is still good after the refused calls";
  ASSERT_EQ(vramswap_free_async(b, 0, s1), VRAMSWAP_OK);
}

TEST_F(StreamAllocator, AFullArenaIsMadeRoomInByGivingTheCachesBack) {
  vramswap::detail::test::set_env("VRAMSWAP_ARENA_SIZE", "64MiB");
  std::vector<void*> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(vramswap::malloc_async(8 * MiB, s1));
  for (void* p : blocks) vramswap::free_async(p, s1);
  EXPECT_EQ(vramswap::get_stats(0).cached_bytes, 60 * MiB) << "three 20 MiB segments";
  // 60 MiB cached for s1; 40 MiB for s2 fits only if the segments are given back.
  void* big = vramswap::malloc_async(40 * MiB, s2);
  EXPECT_NE(big, nullptr);
  EXPECT_EQ(vramswap::get_stats(0).cached_bytes, 0u);
  try {
    vramswap::malloc_async(40 * MiB, s2);
    FAIL() << "the arena cannot hold two 40 MiB blocks";
  } catch (const vramswap::out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("malloc_async"), std::string::npos) << e.what();
  }
  vramswap::free_async(big, s2);
  vramswap::detail::test::unset_env("VRAMSWAP_ARENA_SIZE");
}

// Threads allocating and freeing on their own streams (and across them, as a framework's
// garbage collector does), in an arena small enough that allocations must trim: no block is
// ever handed out while another live block overlaps it, and at the end every byte is back.
TEST_F(StreamAllocator, ConcurrentStreamsNeverShareALiveBlock) {
  vramswap::detail::test::set_env("VRAMSWAP_ARENA_SIZE", "112MiB");
  // The arena is what must run short here, not the pool: outside the lock each block is
  // backed at once from free frames, so the pool holds the whole arena.
  vramswap::detail::test::set_env("VRAMSWAP_POOL_SIZE", "128MiB");
  std::mutex m;
  std::map<uintptr_t, size_t> live;  // every block handed out and not yet freed
  std::atomic<int> overlaps{0}, failures{0};
  auto claim = [&](void* p, size_t size) {
    std::lock_guard<std::mutex> g(m);
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto next = live.lower_bound(a);
    if (next != live.end() && next->first < a + size) ++overlaps;
    if (next != live.begin() && std::prev(next)->first + std::prev(next)->second > a) ++overlaps;
    live.emplace(a, size);
  };
  auto drop = [&](void* p) {
    std::lock_guard<std::mutex> g(m);
    live.erase(reinterpret_cast<uintptr_t>(p));
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t + 1);
      void* const mine = reinterpret_cast<void*>(0x100 * (t + 1));
      void* const other = reinterpret_cast<void*>(0x100 * ((t + 1) % 4 + 1));
      std::vector<std::pair<void*, size_t>> held;
      for (int i = 0; i < 400; ++i) {
        if (held.size() < 6 && rng() % 3 != 0) {
          const size_t size = (rng() % 2 ? 4096 : 3 * MiB) + rng() % 5000;
          void* p = nullptr;
          if (vramswap_malloc_async(&p, size, 0, mine) != VRAMSWAP_OK) {
            // 4 threads x 6 blocks of ~3 MiB (two 2 MiB pages each at worst) fit in 112 MiB
            // once the caches are trimmed: a failure here is a trim that did not happen.
            ++failures;
            continue;
          }
          claim(p, size);
          held.emplace_back(p, size);
        } else if (!held.empty()) {
          const size_t k = rng() % held.size();
          drop(held[k].first);
          // Now and then freed on another stream: cached for that one.
          if (vramswap_free_async(held[k].first, 0, rng() % 4 == 0 ? other : mine) != VRAMSWAP_OK) ++failures;
          held.erase(held.begin() + static_cast<long>(k));
        }
      }
      for (auto& [p, size] : held) {
        drop(p);
        if (vramswap_free_async(p, 0, mine) != VRAMSWAP_OK) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(overlaps.load(), 0) << "a block was handed out while an overlapping one was live";
  EXPECT_EQ(failures.load(), 0) << vramswap_last_error();
  vramswap::release_cached(0);
  const vramswap::stats s = vramswap::get_stats(0);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.allocated_bytes, 0u) << "every block given back";
  vramswap::detail::test::unset_env("VRAMSWAP_ARENA_SIZE");
  vramswap::detail::test::set_env("VRAMSWAP_POOL_SIZE", "64MiB");
}

// Eager release evicts everything at unlock: live blocks are copied out and come back
// intact; a cached block is discardable and costs no copy.
TEST_F(StreamAllocator, EvictionCopiesLiveBlocksAndDropsCachedOnes) {
  vramswap::detail::test::set_env("VRAMSWAP_EAGER_RELEASE", "1");
  const size_t size = 8 * MiB;  // whole 2 MiB frames: no page shared between the two
  void* live = vramswap::malloc_async(size, s1);
  void* dead = vramswap::malloc_async(size, s1);
  std::vector<uint8_t> bytes(size);
  vramswap::detail::test::fill_random(bytes.data(), size, 7);
  {
    vramswap::gpu_lock g(0);
    ASSERT_EQ(vramswap::detail::rt::copy_to_device(0, reinterpret_cast<uintptr_t>(live), bytes.data(), size), 0);
    ASSERT_EQ(vramswap::detail::rt::copy_to_device(0, reinterpret_cast<uintptr_t>(dead), bytes.data(), size), 0);
  }
  const uint64_t out_before = vramswap::get_stats(0).bytes_out;
  vramswap::free_async(dead, s1);
  { vramswap::gpu_lock g(0); }  // restore, then evict again at unlock
  const uint64_t copied = vramswap::get_stats(0).bytes_out - out_before;
  EXPECT_EQ(copied, size) << "only the live block's pages are copied out; the cached block's are dropped";
  {
    vramswap::gpu_lock g(0);
    std::vector<uint8_t> back(size);
    ASSERT_EQ(vramswap::detail::rt::copy_from_device(0, back.data(), reinterpret_cast<uintptr_t>(live), size), 0);
    EXPECT_EQ(std::memcmp(back.data(), bytes.data(), size), 0) << "a live block lost bytes across the eviction";
    void* reused = vramswap::malloc_async(size, s1);
    EXPECT_EQ(reused, dead);
    vramswap::free_async(reused, s1);
  }
  vramswap::free_async(live, s1);
  vramswap::detail::test::unset_env("VRAMSWAP_EAGER_RELEASE");
}

// The path vramswap.torch takes for every tensor: a success must not leave anything behind
// in the thread's error detail (it once grew by a prefix per call, to megabytes).
TEST_F(StreamAllocator, ManySuccessfulPairsLeaveTheErrorDetailAlone) {
  vramswap::free_async(vramswap::malloc_async(4096, s1), s1);  // the session is open (starting a server records details)
  ASSERT_EQ(vramswap_malloc_async(nullptr, MiB, 0, s1), VRAMSWAP_ERR_INVALID_ARGUMENT);
  const std::string failure = vramswap_last_error();
  ASSERT_FALSE(failure.empty());
  for (int i = 0; i < 50000; ++i) {
    void* p = vramswap::malloc_async(4096, s1);
    ASSERT_NE(p, nullptr);
    vramswap::free_async(p, s1);
  }
  EXPECT_EQ(std::string(vramswap_last_error()), failure) << "successful calls changed the last error's text";
  vramswap::release_cached(0);
}

}  // namespace

namespace {
// A training loop's pattern, scaled to 2 MiB frames: long-lived parameters, gradients and
// optimizer state in mixed sizes (the state made after the first step's activations were
// freed, as AdamW makes it), and per step activations of mixed sizes allocated in forward
// order and freed in backward order, each with a short-lived temporary beside it, in an
// order that changes from step to step. Returns the first allocation that failed (its size
// in the message), or an empty string.
std::string run_training_pattern(int steps, uint64_t* peak_resident) {
  std::mt19937 rng(42);
  const size_t KiB = 1024;
  const std::vector<size_t> param_sizes = {2 * MiB + 768 * KiB, 2 * MiB + 256 * KiB, 12 * KiB, 4 * MiB + 256 * KiB, 256 * KiB, 2 * MiB + 768 * KiB};
  const std::vector<size_t> act_sizes = {130 * KiB, 700 * KiB, 2 * MiB + 768 * KiB, 2 * MiB + 256 * KiB, 4 * MiB + 512 * KiB, 6 * MiB + 256 * KiB, 48 * KiB};
  std::vector<void*> kept;
  auto take = [&](size_t size, std::string* failed) -> void* {
    void* p = nullptr;
    if (vramswap_malloc_async(&p, size, 0, s1) != VRAMSWAP_OK) {
      *failed = std::to_string(size) + " bytes: " + vramswap_last_error();
      return nullptr;
    }
    std::memset(p, 0x5A, std::min<size_t>(size, 4096));  // touched, as a kernel would
    *peak_resident = std::max(*peak_resident, vramswap::get_stats(0).resident_bytes);
    return p;
  };
  std::string failed;
  for (size_t s : param_sizes) {
    for (int copy = 0; copy < 2 && failed.empty(); ++copy) {  // parameter, gradient
      if (void* p = take(s, &failed)) kept.push_back(p);
    }
  }
  for (int step = 0; step < steps && failed.empty(); ++step) {
    std::vector<size_t> order;
    for (int layer = 0; layer < 3; ++layer) order.insert(order.end(), act_sizes.begin(), act_sizes.end());
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::pair<void*, size_t>> acts;
    for (size_t s : order) {
      void* a = take(s, &failed);
      if (a == nullptr) break;
      acts.emplace_back(a, s);
      void* t = take(act_sizes[rng() % act_sizes.size()], &failed);
      if (t == nullptr) break;
      vramswap_free_async(t, 0, s1);
    }
    while (!acts.empty() && failed.empty()) {  // backward: last in, first out, with gradient temporaries
      void* g = take(acts.back().second, &failed);
      if (g == nullptr) break;
      vramswap_free_async(acts.back().first, 0, s1);
      vramswap_free_async(g, 0, s1);
      acts.pop_back();
    }
    for (auto& [a, s] : acts) vramswap_free_async(a, 0, s1);
    if (step == 0) {
      for (size_t s : param_sizes) {  // AdamW's two moments, made at the first optimizer step
        for (int copy = 0; copy < 2 && failed.empty(); ++copy) {
          if (void* p = take(s, &failed)) kept.push_back(p);
        }
      }
    }
  }
  for (void* p : kept) vramswap_free_async(p, 0, s1);
  return failed;
}
}  // namespace

// The pool is just large enough for the pattern's live bytes at their peak and a little
// room: an allocator that holds freed blocks only for requests of about their size, or that
// gives each request whole pages of its own, does not fit it.
TEST_F(StreamAllocator, ATrainingPatternOfMixedSizesFitsAPoolJustLargeEnough) {
  vramswap::detail::test::set_env("VRAMSWAP_POOL_SIZE", "128MiB");
  uint64_t peak = 0;
  {
    vramswap::gpu_lock g(0);
    const std::string failed = run_training_pattern(8, &peak);
    EXPECT_EQ(failed, "") << "at " << peak / MiB << " MiB resident";
  }
  vramswap::release_cached(0);
  EXPECT_EQ(vramswap::get_stats(0).allocated_bytes, 0u) << "every segment given back";
  vramswap::detail::test::set_env("VRAMSWAP_POOL_SIZE", "64MiB");
}
