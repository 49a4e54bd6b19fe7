// The pager against every backend: bytes survive evict/restore cycles, hints do what they
// promise, bad input changes nothing, and a randomized run keeps every invariant.
#include "core/pager.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/options.hpp"
#include "core/status.hpp"
#include "support/backends.hpp"
#include "support/random_bytes.hpp"
#include "swap/host_tier.hpp"

namespace vramswap::detail {
namespace {

constexpr uint64_t MiB = 1ull << 20;



class PagerTest : public ::testing::TestWithParam<backend_kind> {
 protected:
  void SetUp() override {
    std::string why;
    be = test::shared_backend(GetParam(), &why);
    if (be == nullptr) GTEST_SKIP() << "backend " << backend_kind_name(GetParam()) << " unavailable here: " << why;
    make_pager(2 * MiB, 256 * MiB);
    ASSERT_EQ(be->stream_create(0, &stream), ok);
    ASSERT_EQ(be->host_alloc(staging_size, &staging), ok);
  }
  void TearDown() override {
    if (be == nullptr) return;
    pg.reset();
    tier.reset();
    be->host_free(staging);
    be->stream_destroy(stream);
  }
  void make_pager(uint64_t frame, uint64_t arena_bytes) {
    pg.reset();
    tier = std::make_unique<host_tier>(*be, frame, 4);
    frames = std::make_unique<local_frame_source>(*be);
    pager_config cfg;
    cfg.frame_size = frame;
    cfg.arena_size = arena_bytes;
    cfg.copies_in_flight = 4;
    ASSERT_EQ(pager::create(*be, 0, *tier, *frames, cfg, &pg), ok) << last_error();
  }
  device_ptr alloc(uint64_t size) {
    device_ptr p = 0;
    EXPECT_EQ(pg->malloc(size, &p), ok) << last_error();
    return p;
  }
  // Write fill_random(seed) to [ptr, ptr+size) through pinned staging memory.
  void write(device_ptr ptr, uint64_t size, uint64_t seed) {
    std::vector<unsigned char> data(size);
    test::fill_random(data.data(), size, seed);
    for (uint64_t off = 0; off < size; off += staging_size) {
      const uint64_t n = std::min<uint64_t>(staging_size, size - off);
      std::memcpy(staging, data.data() + off, n);
      ASSERT_EQ(be->copy_h2d(ptr + off, staging, n, stream), ok) << last_error();
      ASSERT_EQ(be->stream_synchronize(stream), ok);
    }
  }
  // Every byte of [ptr, ptr+size) equals fill_random(seed) (or zero with seed 0).
  ::testing::AssertionResult holds(device_ptr ptr, uint64_t size, uint64_t seed) {
    std::vector<unsigned char> want(size, 0);
    if (seed != 0) test::fill_random(want.data(), size, seed);
    for (uint64_t off = 0; off < size; off += staging_size) {
      const uint64_t n = std::min<uint64_t>(staging_size, size - off);
      std::memset(staging, 0x5A, n);
      if (be->copy_d2h(staging, ptr + off, n, stream) != ok) return ::testing::AssertionFailure() << last_error();
      if (be->stream_synchronize(stream) != ok) return ::testing::AssertionFailure() << last_error();
      for (uint64_t i = 0; i < n; ++i) {
        if (static_cast<unsigned char*>(staging)[i] != want[off + i]) {
          return ::testing::AssertionFailure() << "byte " << off + i << " of 0x" << std::hex << ptr << " differs";
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

  backend* be = nullptr;
  std::unique_ptr<host_tier> tier;
  std::unique_ptr<local_frame_source> frames;
  std::unique_ptr<pager> pg;
  stream_id stream = 0;
  void* staging = nullptr;
  static constexpr uint64_t staging_size = 4 * MiB;
};

TEST_P(PagerTest, EvictRestoreCyclesKeepEveryByte) {
  struct block {
    device_ptr ptr;
    uint64_t size;
    uint64_t seed;
  };
  // Small ones sharing pages, one exactly a page, large ones spanning pages with tails.
  std::vector<block> blocks;
  uint64_t seed = 1000;
  for (uint64_t size : std::vector<uint64_t>{1, 4000, 100 * 1024, 2 * MiB, 5 * MiB + 123, 9 * MiB, 300 * 1024}) {
    blocks.push_back({alloc(size), size, ++seed});
    write(blocks.back().ptr, size, seed);
  }
  for (int cycle = 0; cycle < 3; ++cycle) {
    const pager_stats before = pg->stats();
    ASSERT_EQ(pg->evict_all(), ok) << last_error();
    ASSERT_EQ(pg->check_invariants(), ok) << last_error();
    const pager_stats evicted = pg->stats();
    EXPECT_EQ(evicted.resident_bytes, 0u);
    EXPECT_EQ(evicted.host_bytes, before.resident_bytes);
    EXPECT_EQ(evicted.bytes_out - before.bytes_out, before.resident_bytes);
    for (const block& b : blocks) EXPECT_EQ(pg->state_of(b.ptr), page_state::host);
    ASSERT_EQ(pg->restore_all(), ok) << last_error();
    ASSERT_EQ(pg->check_invariants(), ok) << last_error();
    EXPECT_EQ(pg->stats().host_bytes, 0u);
    for (const block& b : blocks) EXPECT_TRUE(holds(b.ptr, b.size, b.seed)) << "cycle " << cycle << " size " << b.size;
    // New contents for the next cycle.
    for (block& b : blocks) write(b.ptr, b.size, b.seed = ++seed);
  }
}

TEST_P(PagerTest, MemoryAtChosenAddressesInAReservationKeepsItsBytesAndAddresses) {
  // A VMM program's pattern on larger pages: granules of half a page mapped side by side in
  // its reservation, one left out, an ordinary allocation beside, then swapped out and back.
  make_pager(4 * MiB, 256 * MiB);
  device_ptr res = 0;
  ASSERT_EQ(pg->reserve(64 * MiB, 0, &res), ok) << last_error();
  EXPECT_EQ(pg->stats().resident_bytes, 0u) << "a reservation has nothing behind it";
  const device_ptr plain = alloc(3 * MiB);
  write(plain, 3 * MiB, 41);
  std::vector<device_ptr> granules;
  for (uint64_t i = 0; i < 12; ++i) {
    if (i == 5) continue;
    const device_ptr at = res + i * 2 * MiB;
    ASSERT_EQ(pg->malloc_at(at, 2 * MiB), ok) << last_error();
    write(at, 2 * MiB, 100 + i);
    granules.push_back(at);
  }
  EXPECT_EQ(pg->stats().resident_bytes, 4 * MiB + 6 * 4 * MiB);
  EXPECT_EQ(pg->malloc_at(res + 4 * MiB, 2 * MiB), err_invalid_argument) << "overlaps a granule";
  EXPECT_EQ(pg->unreserve(res), err_busy);
  for (int cycle = 0; cycle < 2; ++cycle) {
    ASSERT_EQ(pg->evict_all(), ok) << last_error();
    ASSERT_EQ(pg->check_invariants(), ok) << last_error();
    EXPECT_EQ(pg->state_of(res), page_state::host);
    ASSERT_EQ(pg->restore_all(), ok) << last_error();
    ASSERT_EQ(pg->check_invariants(), ok) << last_error();
    for (device_ptr g : granules) EXPECT_TRUE(holds(g, 2 * MiB, 100 + (g - res) / (2 * MiB))) << "cycle " << cycle;
    EXPECT_TRUE(holds(plain, 3 * MiB, 41));
  }
  // Mapped while evicted: backed at the restore, as malloc's pages are.
  ASSERT_EQ(pg->evict_all(), ok);
  ASSERT_EQ(pg->malloc_at(res + 5 * 2 * MiB, 2 * MiB), ok) << last_error();
  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  write(res + 5 * 2 * MiB, 2 * MiB, 105);
  granules.push_back(res + 5 * 2 * MiB);
  for (device_ptr g : granules) EXPECT_TRUE(holds(g, 2 * MiB, 100 + (g - res) / (2 * MiB)));
  for (device_ptr g : granules) ASSERT_EQ(pg->free(g), ok) << last_error();
  EXPECT_EQ(pg->stats().resident_bytes, 4 * MiB) << "only the ordinary allocation's page is left";
  ASSERT_EQ(pg->unreserve(res), ok) << last_error();
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
}

TEST_P(PagerTest, PagesNoAllocationTouchesGiveTheirFrameBack) {
  const device_ptr a = alloc(1000);
  const device_ptr b = alloc(1000);  // same page as a
  EXPECT_EQ(pg->stats().resident_bytes, 2 * MiB);
  const device_ptr big = alloc(6 * MiB);
  EXPECT_EQ(pg->stats().resident_bytes, 8 * MiB);
  ASSERT_EQ(pg->free(a), ok);
  EXPECT_EQ(pg->stats().resident_bytes, 8 * MiB) << "b still lives on that page";
  ASSERT_EQ(pg->free(b), ok);
  EXPECT_EQ(pg->stats().resident_bytes, 6 * MiB);
  ASSERT_EQ(pg->evict_all(), ok);
  ASSERT_EQ(pg->free(big), ok);
  EXPECT_EQ(pg->stats().host_bytes, 0u) << "freeing an evicted allocation drops its saved copy";
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
}

TEST_P(PagerTest, AllocationsWhileEvictedBecomeResidentOnRestore) {
  const device_ptr a = alloc(3 * MiB);
  write(a, 3 * MiB, 7);
  ASSERT_EQ(pg->evict_all(), ok);
  const device_ptr b = alloc(5 * MiB);
  EXPECT_EQ(pg->state_of(b), page_state::unbacked);
  EXPECT_EQ(pg->stats().resident_bytes, 0u);
  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  EXPECT_EQ(pg->state_of(b), page_state::resident);
  write(b, 5 * MiB, 8);
  EXPECT_TRUE(holds(a, 3 * MiB, 7));
  EXPECT_TRUE(holds(b, 5 * MiB, 8));
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
}

TEST_P(PagerTest, DiscardablePagesCopyNothingAndComeBackZeroFilled) {
  const device_ptr scratch = alloc(4 * MiB);
  const device_ptr keep = alloc(4 * MiB);
  write(scratch, 4 * MiB, 21);
  write(keep, 4 * MiB, 22);
  ASSERT_EQ(pg->advise(scratch, 4 * MiB, advice::discardable), ok) << last_error();
  ASSERT_EQ(pg->evict_all(), ok);
  const pager_stats s = pg->stats();
  EXPECT_EQ(s.pages_discarded, 2u);
  EXPECT_EQ(s.bytes_out, 4 * MiB) << "only the normal allocation is copied";
  EXPECT_EQ(pg->state_of(scratch), page_state::discarded);
  ASSERT_EQ(pg->restore_all(), ok);
  EXPECT_TRUE(holds(scratch, 4 * MiB, 0)) << "discarded pages are restored zero-filled";
  EXPECT_TRUE(holds(keep, 4 * MiB, 22));
}

TEST_P(PagerTest, AdviceOnPartOfASharedPageChangesNothingForTheNeighbour) {
  const device_ptr small_scratch = alloc(64 * 1024);
  const device_ptr neighbour = alloc(64 * 1024);  // shares the page
  write(small_scratch, 64 * 1024, 31);
  write(neighbour, 64 * 1024, 32);
  ASSERT_EQ(pg->advise(small_scratch, 64 * 1024, advice::discardable), ok);
  ASSERT_EQ(pg->evict_all(), ok);
  EXPECT_EQ(pg->stats().pages_discarded, 0u);
  ASSERT_EQ(pg->restore_all(), ok);
  EXPECT_TRUE(holds(neighbour, 64 * 1024, 32));
  EXPECT_TRUE(holds(small_scratch, 64 * 1024, 31)) << "the page was copied whole, so its scratch bytes survive too";
}

TEST_P(PagerTest, ReadMostlyPagesKeepTheirCopySoTheNextEvictionIsFree) {
  const device_ptr weights = alloc(6 * MiB);
  write(weights, 6 * MiB, 41);
  ASSERT_EQ(pg->advise(weights, 6 * MiB, advice::read_mostly), ok);
  ASSERT_EQ(pg->evict_all(), ok);
  EXPECT_EQ(pg->stats().bytes_out, 6 * MiB);
  ASSERT_EQ(pg->restore_all(), ok);
  EXPECT_EQ(pg->stats().host_bytes, 6 * MiB) << "copy kept after restore";
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
  ASSERT_EQ(pg->evict_all(), ok);
  const pager_stats s = pg->stats();
  EXPECT_EQ(s.bytes_out, 6 * MiB) << "second eviction copied nothing";
  EXPECT_EQ(s.pages_clean, 3u);
  ASSERT_EQ(pg->restore_all(), ok);
  EXPECT_TRUE(holds(weights, 6 * MiB, 41));
  // Changing the advice drops the kept copy: the next eviction copies again.
  ASSERT_EQ(pg->advise(weights, 6 * MiB, advice::normal), ok);
  EXPECT_EQ(pg->stats().host_bytes, 0u);
  write(weights, 6 * MiB, 42);
  ASSERT_EQ(pg->evict_all(), ok);
  ASSERT_EQ(pg->restore_all(), ok);
  EXPECT_TRUE(holds(weights, 6 * MiB, 42));
  EXPECT_EQ(pg->stats().bytes_out, 12 * MiB);
}

TEST_P(PagerTest, BadInputNamesTheProblemAndChangesNothing) {
  const device_ptr a = alloc(3 * MiB);
  write(a, 3 * MiB, 51);
  const pager_stats before = pg->stats();
  device_ptr p = 0;
  EXPECT_FAILS(pg->malloc(0, &p), err_invalid_argument, "size 0");
  EXPECT_FAILS(pg->malloc(1ull << 40, &p), err_out_of_memory, "1099511627776");
  EXPECT_FAILS(pg->free(a + 256), err_invalid_argument, "interior");
  EXPECT_FAILS(pg->free(0xdead0000), err_invalid_argument, "0xdead0000");
  EXPECT_FAILS(pg->advise(a + 3 * MiB, 100, advice::discardable), err_invalid_argument, "not inside one live allocation");
  EXPECT_FAILS(pg->advise(a, 4 * MiB, advice::discardable), err_invalid_argument, "not inside one live allocation");
  ASSERT_EQ(pg->free(a), ok);
  EXPECT_FAILS(pg->free(a), err_invalid_argument, "freed already");
  const device_ptr b = alloc(3 * MiB);
  write(b, 3 * MiB, 52);
  const pager_stats after = pg->stats();
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.resident_bytes, before.resident_bytes);
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
  EXPECT_TRUE(holds(b, 3 * MiB, 52));
}

TEST_P(PagerTest, FrameSizeMustBeAPowerOfTwoMultipleOfTheGranularity) {
  pager_config cfg;
  cfg.frame_size = 3 * MiB;
  cfg.arena_size = 64 * MiB;
  std::unique_ptr<pager> p;
  EXPECT_FAILS(pager::create(*be, 0, *tier, *frames, cfg, &p), err_invalid_argument, "VRAMSWAP_FRAME_SIZE");
  option_set(option_id::frame_size, "5M");
  cfg.frame_size = 0;
  EXPECT_FAILS(pager::create(*be, 0, *tier, *frames, cfg, &p), err_invalid_argument, "VRAMSWAP_FRAME_SIZE");
  option_set(option_id::frame_size, "lots");
  EXPECT_FAILS(pager::create(*be, 0, *tier, *frames, cfg, &p), err_invalid_argument, "VRAMSWAP_FRAME_SIZE");
  option_set(option_id::frame_size, nullptr);
}

// A seeded random walk over malloc/free/write/advise/evict/restore with a shadow of every
// allocation's contents; invariants after each step, every byte checked after restores.
TEST_P(PagerTest, RandomizedWalkKeepsInvariantsAndBytes) {
  const char* env = std::getenv("VRAMSWAP_FUZZ_STEPS");
  const int steps = env != nullptr ? std::atoi(env) : 400;
  const uint64_t seed = 20261129;
  std::mt19937_64 rng(seed);
  struct live {
    uint64_t size;
    uint64_t seed;  // 0: contents undefined (never written, or discardable and evicted)
    advice adv;
  };
  std::map<device_ptr, live> shadow;
  uint64_t next_seed = 1;
  bool evicted = false;
  auto verify_all = [&] {
    for (auto& [ptr, l] : shadow) {
      if (l.seed != 0) {
        ASSERT_TRUE(holds(ptr, l.size, l.seed)) << "seed " << seed;
      }
    }
  };
  for (int step = 0; step < steps; ++step) {
    const int op = static_cast<int>(rng() % 100);
    if (op < 30) {
      const uint64_t size = rng() % 2 == 0 ? 1 + rng() % (256 * 1024) : 1 + rng() % (7 * MiB);
      device_ptr p = 0;
      const int rc = pg->malloc(size, &p);
      if (rc == err_out_of_memory) continue;
      ASSERT_EQ(rc, ok) << last_error();
      for (auto& [q, l] : shadow) ASSERT_TRUE(p + size <= q || q + l.size <= p) << "overlap";
      shadow[p] = {size, 0, advice::normal};
    } else if (op < 50 && !shadow.empty()) {
      auto it = std::next(shadow.begin(), static_cast<long>(rng() % shadow.size()));
      ASSERT_EQ(pg->free(it->first), ok) << last_error();
      shadow.erase(it);
    } else if (op < 75 && !shadow.empty() && !evicted) {
      auto it = std::next(shadow.begin(), static_cast<long>(rng() % shadow.size()));
      it->second.seed = next_seed++;
      write(it->first, it->second.size, it->second.seed);
      // The read_mostly contract: after writing, advise again so the kept copy is dropped.
      if (it->second.adv == advice::read_mostly) {
        ASSERT_EQ(pg->advise(it->first, it->second.size, advice::read_mostly), ok) << last_error();
      }
    } else if (op < 80 && !shadow.empty()) {
      auto it = std::next(shadow.begin(), static_cast<long>(rng() % shadow.size()));
      const advice a = static_cast<advice>(rng() % 3);
      ASSERT_EQ(pg->advise(it->first, it->second.size, a), ok) << last_error();
      it->second.adv = a;
    } else if (op < 90 && !evicted) {
      ASSERT_EQ(pg->evict_all(), ok) << last_error();
      evicted = true;
      // Discardable bytes are gone; conservatively forget them all (pages shared with
      // normal data keep them, which this shadow does not model).
      for (auto& [p, l] : shadow) {
        if (l.adv == advice::discardable) l.seed = 0;
      }
    } else if (evicted) {
      ASSERT_EQ(pg->restore_all(), ok) << last_error();
      evicted = false;
      verify_all();
    }
    ASSERT_EQ(pg->check_invariants(), ok) << "step " << step << " seed " << seed << ": " << last_error();
  }
  if (evicted) {
    ASSERT_EQ(pg->restore_all(), ok);
  }
  verify_all();
}

// Sleep and wake (memory classes, runtime/memory_tags.hpp): two reservations stand for two
// tags' regions. A sleeping region's pages leave their frames and stay out through turns
// (evict_all / restore_all) until woken; the other region and the bytes of both are intact.
TEST_P(PagerTest, SleepingPagesStayOutThroughTurnsUntilWokenWithEveryByte) {
  device_ptr sleepy = 0, awake = 0;
  ASSERT_EQ(pg->reserve(16 * MiB, 0, &sleepy), ok) << last_error();
  ASSERT_EQ(pg->reserve(16 * MiB, 0, &awake), ok) << last_error();
  ASSERT_EQ(pg->malloc_at(sleepy, 5 * MiB + 300), ok) << last_error();
  ASSERT_EQ(pg->malloc_at(sleepy + 6 * MiB, 4 * MiB), ok) << last_error();
  ASSERT_EQ(pg->malloc_at(awake, 6 * MiB), ok) << last_error();
  write(sleepy, 5 * MiB + 300, 61);
  write(sleepy + 6 * MiB, 4 * MiB, 62);
  write(awake, 6 * MiB, 63);
  const std::vector<page_range> region = {pg->pages_of(sleepy, 16 * MiB)};
  const uint64_t out_before = pg->stats().bytes_out;
  ASSERT_EQ(pg->sleep(region, /*discard=*/false), ok) << last_error();
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
  pager_stats s = pg->stats();
  EXPECT_EQ(s.resident_bytes, 6 * MiB) << "only the awake region keeps frames";
  EXPECT_EQ(s.pages_asleep, 5u);
  EXPECT_EQ(s.pages_not_resident, 0u) << "asleep pages are not what a restore needs";
  EXPECT_EQ(s.bytes_out - out_before, 10 * MiB) << "its five pages copied out";
  EXPECT_EQ(pg->asleep_pages_in(region), 5u);
  for (int turn = 0; turn < 2; ++turn) {
    ASSERT_EQ(pg->evict_all(), ok) << last_error();
    ASSERT_EQ(pg->restore_all(), ok) << last_error();
    ASSERT_EQ(pg->check_invariants(), ok) << last_error();
    EXPECT_EQ(pg->state_of(sleepy), page_state::host) << "turn " << turn << ": a sleeping page stays out";
    EXPECT_TRUE(holds(awake, 6 * MiB, 63)) << "turn " << turn;
  }
  ASSERT_EQ(pg->wake(region), ok) << last_error();
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
  s = pg->stats();
  EXPECT_EQ(s.pages_asleep, 0u);
  EXPECT_EQ(s.resident_bytes, 16 * MiB) << "woken while resident: back at once";
  EXPECT_TRUE(holds(sleepy, 5 * MiB + 300, 61));
  EXPECT_TRUE(holds(sleepy + 6 * MiB, 4 * MiB, 62));
  EXPECT_TRUE(holds(awake, 6 * MiB, 63));
}

TEST_P(PagerTest, DiscardedSleepCopiesNothingAndWakesZeroFilled) {
  device_ptr region = 0;
  ASSERT_EQ(pg->reserve(8 * MiB, 0, &region), ok) << last_error();
  ASSERT_EQ(pg->malloc_at(region, 8 * MiB), ok) << last_error();
  write(region, 8 * MiB, 71);
  const device_ptr other = alloc(3 * MiB);
  write(other, 3 * MiB, 72);
  // Half of it saved first (a turn), so that a discard drops saved copies as well as frames.
  ASSERT_EQ(pg->sleep({pg->pages_of(region, 4 * MiB)}, false), ok) << last_error();
  const uint64_t out_before = pg->stats().bytes_out;
  ASSERT_EQ(pg->sleep({pg->pages_of(region, 8 * MiB)}, /*discard=*/true), ok) << last_error();
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
  EXPECT_EQ(pg->stats().bytes_out, out_before) << "a discard copies nothing";
  EXPECT_EQ(pg->stats().host_bytes, 0u) << "and keeps no saved copy";
  EXPECT_EQ(pg->state_of(region), page_state::discarded);
  ASSERT_EQ(pg->wake({pg->pages_of(region, 8 * MiB)}), ok) << last_error();
  EXPECT_TRUE(holds(region, 8 * MiB, 0)) << "zero-filled";
  EXPECT_TRUE(holds(other, 3 * MiB, 72));
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
}

TEST_P(PagerTest, SleepAndWakeBetweenTurnsActAtTheNextRestore) {
  device_ptr region = 0;
  ASSERT_EQ(pg->reserve(8 * MiB, 0, &region), ok) << last_error();
  ASSERT_EQ(pg->malloc_at(region, 6 * MiB), ok) << last_error();
  write(region, 6 * MiB, 81);
  ASSERT_EQ(pg->evict_all(), ok) << last_error();  // between turns: the pages are saved
  const std::vector<page_range> pages = {pg->pages_of(region, 8 * MiB)};
  ASSERT_EQ(pg->sleep(pages, false), ok) << last_error();
  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  EXPECT_EQ(pg->state_of(region), page_state::host) << "asleep: not brought in by the turn";
  ASSERT_EQ(pg->evict_all(), ok) << last_error();
  ASSERT_EQ(pg->wake(pages), ok) << last_error();
  EXPECT_EQ(pg->state_of(region), page_state::host) << "woken between turns: in at the next restore";
  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  EXPECT_TRUE(holds(region, 6 * MiB, 81));
  // Freed while asleep: the page goes; a new allocation there is fresh and awake.
  ASSERT_EQ(pg->sleep(pages, false), ok) << last_error();
  ASSERT_EQ(pg->free(region), ok) << last_error();
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
  EXPECT_EQ(pg->stats().pages_asleep, 0u);
  EXPECT_EQ(pg->stats().host_bytes, 0u) << "its saved copies went with it";
  ASSERT_EQ(pg->malloc_at(region, 2 * MiB), ok) << last_error();
  write(region, 2 * MiB, 82);
  EXPECT_TRUE(holds(region, 2 * MiB, 82));
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
}

INSTANTIATE_TEST_SUITE_P(Backends, PagerTest, ::testing::Values(backend_kind::host, backend_kind::cuda),
                         test::param_name);

}  // namespace
}  // namespace vramswap::detail
