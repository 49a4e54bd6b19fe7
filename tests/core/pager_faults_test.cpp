// A failure at any step of an eviction or a restore leaves every page's bytes intact in
// exactly one place. The pager runs over a fault layer (support/faulty_backend.hpp) and a
// page store that can refuse the n-th slot, with frames that are scrubbed before they are
// given back, as a shared pool's are (a scrub that runs too early zeroes a page for good),
// and random bytes in every page. For every operation an eviction or a restore makes, the
// n-th call fails, for every n that a clean run reaches; after each failure the pager's
// invariants hold, every live page is resident or saved, and once the fault is gone the
// next restore brings back every byte, and the next eviction and restore work.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/pager.hpp"
#include "core/status.hpp"
#include "support/backends.hpp"
#include "support/faulty_backend.hpp"
#include "support/random_bytes.hpp"
#include "swap/host_tier.hpp"

namespace vramswap::detail {
namespace {

using test::fault_op;

constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t k_page = 2 * MiB;
constexpr uint64_t k_normal_pages = 6;   // rewritten with new random bytes before every round
constexpr uint64_t k_kept_pages = 2;     // read_mostly: written once, their saved copies kept

// Frames made and released on demand, zeroed before they are given back.
class scrubbing_frames final : public frame_source {
 public:
  explicit scrubbing_frames(backend& be) : be_(be) {}
  int take(int device, size_t size, frame_id* out) override { return be_.create_frame(device, size, out); }
  int give_back(frame_id frame) override { return be_.release_frame(frame); }
  bool scrub_before_give_back(frame_id) const override { return true; }

 private:
  backend& be_;
};

// A host tier whose n-th slot_for_write or slot_for_read fails, as a full disk or a failed
// read would make a store with a disk tier fail.
class faulty_store final : public page_store {
 public:
  explicit faulty_store(backend& be) : tier_(be, k_page, 4) {}
  enum class op { write, read };
  void fail_at(op o, uint64_t n) {
    writes_ = reads_ = 0;
    armed_ = true;
    op_ = o;
    n_ = n;
  }
  void disarm() { armed_ = false; }
  uint64_t writes() const { return writes_; }
  uint64_t reads() const { return reads_; }
  void count_calls() {
    writes_ = reads_ = 0;
    armed_ = false;
  }

  int slot_for_write(uint64_t key, size_t size, void** host) override {
    if (armed_ && op_ == op::write && writes_ == n_) {
      ++writes_;
      return fail(err_no_space, "injected fault: no space for page %llu", static_cast<unsigned long long>(key));
    }
    ++writes_;
    return tier_.slot_for_write(key, size, host);
  }
  int slot_for_read(uint64_t key, void** host) override {
    if (armed_ && op_ == op::read && reads_ == n_) {
      ++reads_;
      return fail(err_io, "injected fault: reading page %llu failed", static_cast<unsigned long long>(key));
    }
    ++reads_;
    return tier_.slot_for_read(key, host);
  }
  int release(uint64_t key) override { return tier_.release(key); }
  bool holds(uint64_t key) const override { return tier_.holds(key); }
  uint64_t bytes_held() const override { return tier_.bytes_held(); }

 private:
  host_tier tier_;
  bool armed_ = false;
  op op_ = op::write;
  uint64_t n_ = 0;
  uint64_t writes_ = 0;
  uint64_t reads_ = 0;
};

class PagerFaults : public ::testing::TestWithParam<backend_kind> {
 protected:
  void SetUp() override {
    std::string why;
    backend* real = test::shared_backend(GetParam(), &why);
    if (real == nullptr) GTEST_SKIP() << "backend " << backend_kind_name(GetParam()) << " unavailable here: " << why;
    be = std::make_unique<test::faulty_backend>(*real);
    store = std::make_unique<faulty_store>(*be);
    frames = std::make_unique<scrubbing_frames>(*be);
    pager_config cfg;
    cfg.frame_size = k_page;
    cfg.arena_size = 64 * MiB;
    cfg.copies_in_flight = 4;
    ASSERT_EQ(pager::create(*be, 0, *store, *frames, cfg, &pg), ok) << last_error();
    ASSERT_EQ(be->stream_create(0, &stream), ok) << last_error();
    ASSERT_EQ(be->host_alloc(k_page, &staging), ok) << last_error();
    ASSERT_EQ(pg->malloc(k_normal_pages * k_page, &normal), ok) << last_error();
    ASSERT_EQ(pg->malloc(k_kept_pages * k_page, &kept), ok) << last_error();
    write(kept, k_kept_pages, 7777);
    ASSERT_EQ(pg->advise(kept, k_kept_pages * k_page, advice::read_mostly), ok) << last_error();
  }
  void TearDown() override {
    if (be == nullptr) return;
    pg.reset();
    store.reset();
    if (staging != nullptr) be->host_free(staging);
    if (stream != 0) be->stream_destroy(stream);
  }

  // Pages of [ptr, +pages) get fill_random(seed * 1000 + page).
  void write(device_ptr ptr, uint64_t pages, uint64_t seed) {
    for (uint64_t i = 0; i < pages; ++i) {
      test::fill_random(staging, k_page, seed * 1000 + i);
      ASSERT_EQ(be->copy_h2d(ptr + i * k_page, staging, k_page, stream), ok) << last_error();
      ASSERT_EQ(be->stream_synchronize(stream), ok) << last_error();
    }
  }
  ::testing::AssertionResult holds(device_ptr ptr, uint64_t pages, uint64_t seed) {
    for (uint64_t i = 0; i < pages; ++i) {
      std::memset(staging, 0x5A, k_page);
      if (be->copy_d2h(staging, ptr + i * k_page, k_page, stream) != ok || be->stream_synchronize(stream) != ok) {
        return ::testing::AssertionFailure() << "reading page " << i << ": " << last_error();
      }
      const size_t at = test::first_mismatch(staging, k_page, seed * 1000 + i);
      if (at != k_page) {
        return ::testing::AssertionFailure() << "page " << i << " of 0x" << std::hex << ptr << std::dec << " differs at byte " << at
                                             << (static_cast<unsigned char*>(staging)[at] == 0 ? " (zero: scrubbed)" : "");
      }
    }
    return ::testing::AssertionSuccess();
  }
  // Every live page is resident or saved, never nowhere; resident pages of normal memory
  // hold no saved copy (the invariants say the rest).
  ::testing::AssertionResult every_page_in_one_place() {
    if (pg->check_invariants() != ok) return ::testing::AssertionFailure() << last_error();
    for (uint64_t i = 0; i < k_normal_pages + k_kept_pages; ++i) {
      const device_ptr p = (i < k_normal_pages ? normal + i * k_page : kept + (i - k_normal_pages) * k_page);
      const page_state s = pg->state_of(p);
      if (s != page_state::resident && s != page_state::host) {
        return ::testing::AssertionFailure() << "page at 0x" << std::hex << p << " is " << page_state_name(s);
      }
    }
    return ::testing::AssertionSuccess();
  }
  // After a failure: fault gone, restore, every byte back; then a whole round works.
  void recover_and_verify(uint64_t seed, const std::string& where) {
    be->disarm();
    store->disarm();
    ASSERT_EQ(pg->restore_all(), ok) << where << ": " << last_error();
    ASSERT_TRUE(holds(normal, k_normal_pages, seed)) << where;
    ASSERT_TRUE(holds(kept, k_kept_pages, 7777)) << where;
    ASSERT_EQ(pg->evict_all(), ok) << where << ": " << last_error();
    ASSERT_EQ(pg->restore_all(), ok) << where << ": " << last_error();
    ASSERT_TRUE(holds(normal, k_normal_pages, seed)) << where << ", after a clean round";
    ASSERT_TRUE(holds(kept, k_kept_pages, 7777)) << where << ", after a clean round";
  }
  // How many calls of each kind a clean eviction (restore: false) or restore makes.
  std::vector<uint64_t> clean_counts(bool restore) {
    std::vector<uint64_t> n;
    if (restore) {
      EXPECT_EQ(pg->evict_all(), ok) << last_error();
    }
    be->count_calls();
    store->count_calls();
    EXPECT_EQ(restore ? pg->restore_all() : pg->evict_all(), ok) << last_error();
    for (unsigned op = 0; op < static_cast<unsigned>(fault_op::count_); ++op) n.push_back(be->calls(static_cast<fault_op>(op)));
    n.push_back(store->writes());
    n.push_back(store->reads());
    if (!restore) {
      EXPECT_EQ(pg->restore_all(), ok) << last_error();
    }
    return n;
  }

  // One failure at every position: arm(n) for n in [0, count), then `step`, then check.
  template <typename Arm>
  void sweep(bool restore, const char* name, uint64_t count, Arm arm) {
    for (uint64_t n = 0; n < count; ++n) {
      const std::string where = std::string(restore ? "restore" : "eviction") + ", " + name + " call #" + std::to_string(n) + " failing";
      const uint64_t seed = 100 + ++round_;
      write(normal, k_normal_pages, seed);
      if (restore) {
        ASSERT_EQ(pg->evict_all(), ok) << where << ": " << last_error();
      }
      arm(n);
      clear_error();
      const int rc = restore ? pg->restore_all() : pg->evict_all();
      if (rc != ok) {
        ++failures_;
        EXPECT_NE(std::string(last_error()).find("nothing lost"), std::string::npos) << where << ": " << last_error();
      }
      ASSERT_TRUE(every_page_in_one_place()) << where;
      recover_and_verify(seed, where);
      if (HasFatalFailure()) return;
    }
  }

  void sweep_all(bool restore) {
    const std::vector<uint64_t> counts = clean_counts(restore);
    for (unsigned op = 0; op < static_cast<unsigned>(fault_op::count_); ++op) {
      const auto o = static_cast<fault_op>(op);
      sweep(restore, test::fault_op_name(o), counts[op], [&](uint64_t n) { be->fail_at(o, n); });
      if (HasFatalFailure()) return;
    }
    const size_t w = static_cast<size_t>(fault_op::count_);
    sweep(restore, "slot_for_write", counts[w], [&](uint64_t n) { store->fail_at(faulty_store::op::write, n); });
    sweep(restore, "slot_for_read", counts[w + 1], [&](uint64_t n) { store->fail_at(faulty_store::op::read, n); });
  }

  std::unique_ptr<test::faulty_backend> be;
  std::unique_ptr<faulty_store> store;
  std::unique_ptr<scrubbing_frames> frames;
  std::unique_ptr<pager> pg;
  stream_id stream = 0;
  void* staging = nullptr;
  device_ptr normal = 0;
  device_ptr kept = 0;
  uint64_t round_ = 0;
  uint64_t failures_ = 0;
};

TEST_P(PagerFaults, AFailureAtAnyStepOfAnEvictionLosesNoByte) {
  sweep_all(/*restore=*/false);
  EXPECT_GT(failures_, 20u) << "the sweep must have made evictions fail";
}

TEST_P(PagerFaults, AFailureAtAnyStepOfARestoreLosesNoByte) {
  sweep_all(/*restore=*/true);
  EXPECT_GT(failures_, 20u) << "the sweep must have made restores fail";
}

// A malloc maps its pages, then grants access to all of them in one call. A failure of any
// of those calls fails the malloc, which leaves nothing behind (no page resident, every
// frame given back) and the other allocations' bytes intact; the next malloc works.
TEST_P(PagerFaults, AFailureAtAnyStepOfAMallocLeavesNothingBehind) {
  constexpr uint64_t k_new = 4;
  write(normal, k_normal_pages, 41);
  const uint64_t resident_before = pg->stats().resident_bytes;
  be->count_calls();
  device_ptr p = 0;
  ASSERT_EQ(pg->malloc(k_new * k_page, &p), ok) << last_error();
  const uint64_t maps = be->calls(fault_op::map);
  EXPECT_EQ(maps, k_new);
  EXPECT_EQ(be->calls(fault_op::set_access), 1u) << "one grant for the allocation's run of pages";
  ASSERT_EQ(pg->free(p), ok) << last_error();
  for (const fault_op o : {fault_op::map, fault_op::set_access}) {
    for (uint64_t n = 0; n < (o == fault_op::map ? maps : 1); ++n) {
      const std::string where = std::string(test::fault_op_name(o)) + " call #" + std::to_string(n) + " failing";
      device_info before;
      ASSERT_EQ(be->get_device_info(0, &before), ok) << last_error();
      be->fail_at(o, n);
      clear_error();
      device_ptr q = 0;
      EXPECT_EQ(pg->malloc(k_new * k_page, &q), err_cuda) << where;
      EXPECT_NE(std::string(last_error()).find("injected fault"), std::string::npos) << where << ": " << last_error();
      be->disarm();
      ASSERT_TRUE(every_page_in_one_place()) << where;
      EXPECT_EQ(pg->stats().resident_bytes, resident_before) << where << ": pages of the failed malloc stay resident";
      EXPECT_EQ(pg->stats().allocations, 2u) << where;
      device_info after;
      ASSERT_EQ(be->get_device_info(0, &after), ok) << last_error();
      if (GetParam() == backend_kind::host) {  // (the driver's own use of device memory moves on cuda)
        EXPECT_EQ(after.free_bytes, before.free_bytes) << where << ": every frame the malloc took is given back";
      }
      ASSERT_TRUE(holds(normal, k_normal_pages, 41)) << where;
      ASSERT_EQ(pg->malloc(k_new * k_page, &q), ok) << where << ": " << last_error();
      write(q, k_new, 42);
      ASSERT_TRUE(holds(q, k_new, 42)) << where;
      ASSERT_EQ(pg->free(q), ok) << where << ": " << last_error();
    }
  }
}

// The case seen in the field: the store runs out of space part-way through an eviction
// while copies of earlier pages are still in flight behind it.
TEST_P(PagerFaults, AStoreThatFillsUpMidEvictionKeepsThePagesInFlightWhole) {
  for (uint64_t n : {1u, 3u, 5u}) {
    const uint64_t seed = 900 + n;
    write(normal, k_normal_pages, seed);
    const uint64_t evicted_before = pg->stats().pages_evicted;
    store->fail_at(faulty_store::op::write, n);
    EXPECT_EQ(pg->evict_all(), err_no_space);
    ASSERT_TRUE(every_page_in_one_place());
    EXPECT_EQ(pg->stats().pages_evicted - evicted_before, n) << "the pages whose copies completed (all those with a slot) left their frames";
    recover_and_verify(seed, "slot " + std::to_string(n) + " refused");
    if (HasFatalFailure()) return;
  }
}

// Two failures on one page: its frame cannot be left (unmap fails after its scrub ran),
// and copying its saved bytes back fails too. The page stays mapped over a frame that
// does not hold its bytes; its saved copy is their only home. Whichever comes next, a
// restore or another eviction, brings every byte back: the restore copies the saved copy
// in again, the eviction leaves the frame without copying it over the saved copy.
TEST_P(PagerFaults, APageThatCanNeitherLeaveItsFrameNorGetItsBytesBackLosesNoByte) {
  const std::vector<uint64_t> evicting = clean_counts(/*restore=*/false);
  const std::vector<uint64_t> restoring = clean_counts(/*restore=*/true);
  struct double_fault {
    bool restore;
    fault_op first;  // failing at call #n
    bool first_every;
    fault_op second;  // its first call after that
    uint64_t calls;
  };
  const double_fault faults[] = {
      // Eviction: the unmap after a page's copy out and scrub, then the copy back.
      {false, fault_op::unmap, false, fault_op::copy_h2d, evicting[static_cast<size_t>(fault_op::unmap)]},
      {false, fault_op::unmap, false, fault_op::stream_synchronize, evicting[static_cast<size_t>(fault_op::unmap)]},
      // Restore: a copy in, then the unmap that would put the page back, then (every copy
      // in failing) the copy in that would complete it where it is.
      {true, fault_op::copy_h2d, true, fault_op::unmap, restoring[static_cast<size_t>(fault_op::copy_h2d)]},
  };
  uint64_t doubled = 0;
  for (const double_fault& f : faults) {
    for (uint64_t n = 0; n < f.calls; ++n) {
      for (const bool evict_next : {false, true}) {
        const std::string where = std::string(f.restore ? "restore" : "eviction") + ", " + test::fault_op_name(f.first) + " call #" +
                                  std::to_string(n) + " then " + test::fault_op_name(f.second) + " failing, then " +
                                  (evict_next ? "an eviction" : "a restore");
        const uint64_t seed = 300 + ++round_;
        write(normal, k_normal_pages, seed);
        if (f.restore) {
          ASSERT_EQ(pg->evict_all(), ok) << where << ": " << last_error();
        }
        if (f.first_every) {
          be->fail_from(f.first, n);
        } else {
          be->fail_at(f.first, n);
        }
        be->then_fail(f.second);
        clear_error();
        EXPECT_NE(f.restore ? pg->restore_all() : pg->evict_all(), ok) << where;
        doubled += be->second_fired();
        be->disarm();
        ASSERT_TRUE(every_page_in_one_place()) << where;
        if (evict_next) {
          ASSERT_EQ(pg->evict_all(), ok) << where << ": " << last_error();
        }
        recover_and_verify(seed, where);
        if (HasFatalFailure()) return;
      }
    }
  }
  EXPECT_GT(doubled, 10u) << "the second fault must have fired";
}

// A malloc on a page whose frame does not hold its bytes copies them in first, so the new
// allocation's bytes are not overwritten by a later repair; when that copy fails, the
// malloc fails, and nothing is lost.
TEST_P(PagerFaults, AMallocOnAPageWhoseFrameLostItsBytesRepairsItFirst) {
  device_ptr first_half = 0;
  ASSERT_EQ(pg->malloc(k_page / 2, &first_half), ok) << last_error();
  const uint64_t evict_unmaps = clean_counts(/*restore=*/false)[static_cast<size_t>(fault_op::unmap)];
  uint64_t shared = 0;
  for (uint64_t n = 0; n < evict_unmaps; ++n) {
    const std::string where = "eviction, unmap call #" + std::to_string(n) + " then copy_h2d failing";
    const uint64_t seed = 600 + ++round_;
    write(normal, k_normal_pages, seed);
    test::fill_random(staging, k_page / 2, seed * 1000 + 99);
    ASSERT_EQ(be->copy_h2d(first_half, staging, k_page / 2, stream), ok) << last_error();
    ASSERT_EQ(be->stream_synchronize(stream), ok) << last_error();
    be->fail_at(fault_op::unmap, n);
    be->then_fail(fault_op::copy_h2d);
    EXPECT_NE(pg->evict_all(), ok) << where;
    be->disarm();
    // Copying in fails: so does a malloc on that page, which changes nothing.
    be->fail_from(fault_op::copy_h2d, 0);
    device_ptr second_half = 0;
    const int refused = pg->malloc(k_page / 2, &second_half);
    be->disarm();
    const bool repair_refused = refused != ok && std::string(last_error()).find("shares a page with older memory") != std::string::npos;
    if (repair_refused) {
      EXPECT_NE(std::string(last_error()).find("nothing lost"), std::string::npos) << where << ": " << last_error();
      EXPECT_EQ(pg->stats().allocations, 3u) << where;
    } else if (refused == ok) {
      ASSERT_EQ(pg->free(second_half), ok) << last_error();
    }
    ASSERT_TRUE(every_page_in_one_place()) << where;
    shared += repair_refused;
    ASSERT_EQ(pg->malloc(k_page / 2, &second_half), ok) << where << ": " << last_error();
    ASSERT_EQ((second_half - pg->arena_base()) / k_page, (first_half - pg->arena_base()) / k_page)
        << where << ": the test needs both halves on one page";
    // The new allocation is written where it is: at once when its page is mapped (a page
    // whose frame lost its bytes is), after the restore otherwise.
    if (pg->state_of(second_half) != page_state::resident) {
      ASSERT_EQ(pg->restore_all(), ok) << where << ": " << last_error();
    }
    test::fill_random(staging, k_page / 2, seed * 1000 + 98);
    ASSERT_EQ(be->copy_h2d(second_half, staging, k_page / 2, stream), ok) << last_error();
    ASSERT_EQ(be->stream_synchronize(stream), ok) << last_error();
    ASSERT_EQ(pg->restore_all(), ok) << where << ": " << last_error();
    ASSERT_TRUE(holds(normal, k_normal_pages, seed)) << where;
    for (const auto& [ptr, salt] : {std::pair{first_half, 99}, std::pair{second_half, 98}}) {
      std::memset(staging, 0x5A, k_page / 2);
      ASSERT_EQ(be->copy_d2h(staging, ptr, k_page / 2, stream), ok) << last_error();
      ASSERT_EQ(be->stream_synchronize(stream), ok) << last_error();
      EXPECT_EQ(test::first_mismatch(staging, k_page / 2, seed * 1000 + salt), k_page / 2)
          << where << ": the " << (ptr == first_half ? "older" : "new") << " allocation's bytes";
    }
    ASSERT_EQ(pg->free(second_half), ok) << last_error();
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(shared, 1u) << "exactly one of the sweep's faults leaves the shared page without its bytes";
}

// A free whose page cannot leave its frame (the scrub or the unmap fails) holds the frame
// back, still mapped, instead of losing track of it; the next malloc gives it back first
// and can use the address again. No frame is leaked, no other byte changes.
TEST_P(PagerFaults, AFreeWhosePageCannotLeaveItsFrameHoldsTheFrameBackUntilItCan) {
  for (const fault_op o : {fault_op::unmap, fault_op::memset_d8, fault_op::stream_synchronize}) {
    const std::string where = std::string(test::fault_op_name(o)) + " failing in free";
    device_info before;
    ASSERT_EQ(be->get_device_info(0, &before), ok) << last_error();
    write(normal, k_normal_pages, 71);
    device_ptr extra = 0;
    ASSERT_EQ(pg->malloc(2 * k_page, &extra), ok) << last_error();
    be->fail_at(o, 0);
    EXPECT_EQ(pg->free(extra), ok) << where << ": " << last_error();
    EXPECT_TRUE(be->fired()) << where;
    be->disarm();
    EXPECT_EQ(pg->frames_held_back(), 1u) << where;
    ASSERT_TRUE(every_page_in_one_place()) << where;
    device_ptr again = 0;
    ASSERT_EQ(pg->malloc(2 * k_page, &again), ok) << where << ": " << last_error();
    EXPECT_EQ(pg->frames_held_back(), 0u) << where << ": the malloc gave the held-back frame back first";
    write(again, 2, 72);
    ASSERT_TRUE(holds(again, 2, 72)) << where;
    ASSERT_TRUE(holds(normal, k_normal_pages, 71)) << where;
    ASSERT_EQ(pg->free(again), ok) << last_error();
    device_info after;
    ASSERT_EQ(be->get_device_info(0, &after), ok) << last_error();
    if (GetParam() == backend_kind::host) {
      EXPECT_EQ(after.free_bytes, before.free_bytes) << where << ": every frame is given back";
    }
  }
}

// Sleep and wake of the normal memory (memory classes): a failure at any step of either
// leaves the memory awake and whole, or asleep with every byte saved, and says which; once
// the fault is gone, a wake brings every byte back.
TEST_P(PagerFaults, AFailureAtAnyStepOfASleepOrAWakeLosesNoByte) {
  const std::vector<page_range> pages = {pg->pages_of(normal, k_normal_pages * k_page)};
  for (const bool waking : {false, true}) {
    // The calls a clean run makes.
    if (waking) {
      ASSERT_EQ(pg->sleep(pages, false), ok) << last_error();
    }
    be->count_calls();
    store->count_calls();
    ASSERT_EQ(waking ? pg->wake(pages) : pg->sleep(pages, false), ok) << last_error();
    std::vector<uint64_t> counts;
    for (unsigned op = 0; op < static_cast<unsigned>(fault_op::count_); ++op) counts.push_back(be->calls(static_cast<fault_op>(op)));
    counts.push_back(store->writes());
    counts.push_back(store->reads());
    if (!waking) {
      ASSERT_EQ(pg->wake(pages), ok) << last_error();
    }
    uint64_t failed = 0;
    for (size_t op = 0; op < counts.size(); ++op) {
      for (uint64_t n = 0; n < counts[op]; ++n) {
        const std::string name = op < static_cast<size_t>(fault_op::count_) ? test::fault_op_name(static_cast<fault_op>(op))
                                 : op == counts.size() - 2                   ? "slot_for_write"
                                                                             : "slot_for_read";
        const std::string where = std::string(waking ? "wake" : "sleep") + ", " + name + " call #" + std::to_string(n) + " failing";
        const uint64_t seed = 300 + ++round_;
        write(normal, k_normal_pages, seed);
        if (waking) {
          ASSERT_EQ(pg->sleep(pages, false), ok) << where << ": " << last_error();
        }
        if (op < static_cast<size_t>(fault_op::count_)) {
          be->fail_at(static_cast<fault_op>(op), n);
        } else {
          store->fail_at(op == counts.size() - 2 ? faulty_store::op::write : faulty_store::op::read, n);
        }
        clear_error();
        const int rc = waking ? pg->wake(pages) : pg->sleep(pages, false);
        be->disarm();
        store->disarm();
        if (rc != ok) {
          ++failed;
          const std::string why = last_error();
          EXPECT_TRUE(why.find("asleep") != std::string::npos || why.find("awake") != std::string::npos) << where << ": " << why;
        }
        ASSERT_EQ(pg->check_invariants(), ok) << where << ": " << last_error();
        // Asleep pages are saved (host), awake ones resident: never anywhere else.
        for (uint64_t i = 0; i < k_normal_pages; ++i) {
          const page_state st = pg->state_of(normal + i * k_page);
          ASSERT_TRUE(st == page_state::resident || st == page_state::host) << where << ": page " << i << " is " << page_state_name(st);
        }
        ASSERT_EQ(pg->wake(pages), ok) << where << ": " << last_error();
        ASSERT_TRUE(holds(normal, k_normal_pages, seed)) << where;
        ASSERT_TRUE(holds(kept, k_kept_pages, 7777)) << where;
      }
    }
    EXPECT_GT(failed, 3u) << (waking ? "wake" : "sleep") << ": the sweep must have made calls fail";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, PagerFaults, ::testing::Values(backend_kind::host, backend_kind::cuda), test::param_name);

}  // namespace
}  // namespace vramswap::detail
