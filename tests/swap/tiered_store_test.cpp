// Description: the disk tier and the tiered store. Byte-exact round trips with random data
// device -> host -> disk -> host -> device (through the pager, on every backend) and at the
// store's own level; the host budget; reuse of swap-file space; EIO, short transfers and
// no progress through the io_faults seam; io_uring_submit failing with EAGAIN or EBUSY (retried,
// nothing lost) or a hard error (the transfers not started fail, no hang, the page stays where
// it was, the other transfers unaffected), also through the seam; ENOSPC on a real small ext4 filesystem (loop
// mounted by the test, skipped where mounting is not permitted); a missing, unwritable,
// no-O_TMPFILE and no-O_DIRECT swap directory. Reserving ahead: a spill's disk space is
// reserved in one fallocate before its first write (store, pager), the file grows
// geometrically, written extents are reused before fresh ones (lowest offset first), and
// ENOSPC on a reservation changes nothing.
#include "swap/tiered_store.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/options.hpp"
#include "core/pager.hpp"
#include "core/status.hpp"
#include "support/backends.hpp"
#include "support/faulty_backend.hpp"
#include "support/random_bytes.hpp"
#include "support/scratch_fs.hpp"
#include "support/store_pages.hpp"

namespace vramswap::detail {
namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr size_t k_page = 2 * MiB;

// The fault seam as the tests script it.
struct scripted_faults final : io_faults {
  bool no_direct = false;
  std::function<int(bool write, uint64_t nth, unsigned len, int res)> on;
  std::function<int(uint64_t nth, unsigned ready)> submit;
  int on_open(int flags) override { return no_direct && (flags & O_DIRECT) != 0 ? -EINVAL : 0; }
  int on_complete(bool write, uint64_t nth, uint64_t, unsigned len, int res) override { return on ? on(write, nth, len, res) : res; }
  int on_submit(uint64_t nth, unsigned ready) override { return submit ? submit(nth, ready) : 0; }
};

// Runs `op` on a thread and gives it `limit`: a regression that hangs fails (it ends the
// process, whose stuck thread still uses the test's objects) rather than hanging the suite.
void within(std::chrono::seconds limit, const char* what, const std::function<void()>& op) {
  std::promise<void> finished;
  std::future<void> f = finished.get_future();
  std::thread t([&] {
    op();
    finished.set_value();
  });
  if (f.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "FAILED: %s: still running after %lld s (hung)\n", what, static_cast<long long>(limit.count()));
    std::fflush(stderr);
    std::_Exit(1);
  }
  t.join();
}

bool contains(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }

// A store of 2 MiB pages: `budget` pages of host memory, 4 slots in the write window,
// 2 pages of spill-ahead and read-ahead (3 staging slots), growing by `grow` bytes.
int make_store(backend& be, size_t budget, const std::string& dir, io_faults* faults, std::unique_ptr<tiered_store>* out,
               uint64_t grow = 8 * MiB, bool make_ahead = false) {
  tiered_config cfg;
  cfg.slot_size = k_page;
  cfg.host_limit = budget * k_page;
  cfg.swap_dir = dir;
  cfg.queue_depth = 8;
  cfg.block_size = 512 * 1024;
  cfg.grow_step = grow;
  cfg.chunk_slots = 4;
  cfg.write_window = 4;
  cfg.spill_ahead = 2;
  cfg.read_ahead = 2;
  cfg.make_ahead = make_ahead;
  cfg.faults = faults;
  return tiered_store::create(be, cfg, out);
}

// Write page `key` (fill_random(seed)) into the store as the pager would: slot, then bytes.
int put(tiered_store& s, uint64_t key, uint64_t seed) { return test::put_page(s, key, k_page, seed); }
::testing::AssertionResult read_back(tiered_store& s, uint64_t key, uint64_t seed) {
  return test::page_reads_back(s, key, k_page, seed);
}

using test::mount_small_ext4;
using test::scratch_image;
using test::scratch_mount;

class TieredStore : public ::testing::TestWithParam<backend_kind> {
 protected:
  void SetUp() override {
    std::string why;
    be = test::shared_backend(GetParam(), &why);
    if (be == nullptr) GTEST_SKIP() << "backend " << backend_kind_name(GetParam()) << " unavailable here: " << why;
  }
  backend* be = nullptr;
  const std::string dir = "/var/tmp";
};

TEST_P(TieredStore, PagesPastTheBudgetGoToDiskAndComeBackExact) {
  std::unique_ptr<tiered_store> s;
  ASSERT_EQ(make_store(*be, 10, dir, nullptr, &s), ok) << last_error();
  constexpr uint64_t n = 40;
  for (uint64_t k = 0; k < n; ++k) ASSERT_EQ(put(*s, k, 100 + k), ok) << last_error();
  ASSERT_EQ(s->flush(), ok) << last_error();
  tiered_stats st = s->stats();
  EXPECT_LE(st.pinned_bytes, 10 * k_page) << "the host tier stays within its budget";
  EXPECT_LE(st.host_bytes, (10 - 3) * k_page) << "saved pages leave the staging slots free";
  EXPECT_GE(st.disk_bytes, (n - 7) * k_page);
  EXPECT_EQ(s->bytes_held(), n * k_page);
  EXPECT_TRUE((s->tier_of(0) == 1)) << "the least recently used page went first";
  EXPECT_FALSE((s->tier_of(n - 1) == 1)) << "the newest page is still in host memory";
  // Forward (read-ahead order), then backwards, then forward again: always exact.
  for (uint64_t k = 0; k < n; ++k) ASSERT_TRUE(read_back(*s, k, 100 + k));
  for (uint64_t k = n; k-- > 0;) ASSERT_TRUE(read_back(*s, k, 100 + k));
  for (uint64_t k = 0; k < n; ++k) ASSERT_TRUE(read_back(*s, k, 100 + k));
  st = s->stats();
  EXPECT_LE(st.pinned_bytes, 10 * k_page) << "reading back with read_done stays within the budget";
  EXPECT_EQ(st.budget_overruns, 0u);
  const uint64_t file = st.file_bytes;
  // Space is reused: new contents for every page, the file does not grow.
  for (uint64_t k = 0; k < n; ++k) ASSERT_EQ(s->release(k), ok);
  EXPECT_EQ(s->bytes_held(), 0u);
  for (uint64_t k = 0; k < n; ++k) ASSERT_EQ(put(*s, k, 900 + k), ok) << last_error();
  ASSERT_EQ(s->flush(), ok) << last_error();
  EXPECT_EQ(s->stats().file_bytes, file) << "released extents are reused before the file grows";
  for (uint64_t k = 0; k < n; ++k) ASSERT_TRUE(read_back(*s, k, 900 + k));
}

TEST_P(TieredStore, RewritingAPageOnDiskMakesItsDiskCopyStale) {
  std::unique_ptr<tiered_store> s;
  ASSERT_EQ(make_store(*be, 8, dir, nullptr, &s), ok) << last_error();
  for (uint64_t k = 0; k < 12; ++k) ASSERT_EQ(put(*s, k, k + 1), ok);
  ASSERT_EQ(s->spill_all(), ok) << last_error();
  ASSERT_TRUE((s->tier_of(0) == 1));
  ASSERT_EQ(put(*s, 0, 777), ok);  // new bytes for page 0: its old disk copy must not come back
  for (uint64_t k = 20; k < 32; ++k) ASSERT_EQ(put(*s, k, k + 1), ok);  // push page 0 out again
  ASSERT_EQ(s->flush(), ok) << last_error();
  EXPECT_TRUE(read_back(*s, 0, 777));
  for (uint64_t k = 1; k < 12; ++k) EXPECT_TRUE(read_back(*s, k, k + 1));
}

TEST_P(TieredStore, WithoutReadDoneTheCallersSlotsStayValidUntilRelease) {
  std::unique_ptr<tiered_store> s;
  ASSERT_EQ(make_store(*be, 8, dir, nullptr, &s), ok) << last_error();
  constexpr uint64_t n = 20;
  for (uint64_t k = 0; k < n; ++k) ASSERT_EQ(put(*s, k, 50 + k), ok);
  ASSERT_EQ(s->flush(), ok);
  // As the pager restores: every slot stays the caller's until it releases them all.
  std::vector<void*> slots(n);
  for (uint64_t k = 0; k < n; ++k) ASSERT_EQ(s->slot_for_read(k, &slots[k]), ok) << last_error();
  for (uint64_t k = 0; k < n; ++k) EXPECT_EQ(test::first_mismatch(slots[k], k_page, 50 + k), k_page) << "page " << k;
  EXPECT_GT(s->stats().budget_overruns, 0u) << "it had to go past the budget, and says so";
  for (uint64_t k = 0; k < n; ++k) ASSERT_EQ(s->release(k), ok);
}

// Host memory that cannot be pinned (strict overcommit, a memory cgroup, a driver that
// refuses the registration) after the first two chunks: the host tier cannot grow, so it
// acts as full, and the oldest pages go to disk to make room, every byte coming back. (The
// write window's newest 4 pages stay in host memory: two chunks leave 4 slots for others.)
TEST_P(TieredStore, AHostTierThatCannotGrowSendsPagesToDisk) {
  test::faulty_backend pinning(*be);
  pinning.fail_from(test::fault_op::host_register, 2);
  std::unique_ptr<tiered_store> s;
  ASSERT_EQ(make_store(pinning, 12, dir, nullptr, &s), ok) << last_error();
  constexpr uint64_t n = 24;
  for (uint64_t k = 0; k < n; ++k) ASSERT_EQ(put(*s, k, 400 + k), ok) << "page " << k << ": " << last_error();
  ASSERT_EQ(s->flush(), ok) << last_error();
  EXPECT_TRUE(pinning.fired()) << "the host tier never tried to grow past its first chunk";
  const tiered_stats st = s->stats();
  EXPECT_LE(st.pinned_bytes, 8 * k_page) << "two chunks of 4 slots: nothing else could be pinned";
  EXPECT_GE(st.disk_bytes, (n - 8) * k_page);
  for (uint64_t k = 0; k < n; ++k) ASSERT_TRUE(read_back(*s, k, 400 + k)) << "page " << k;
  for (uint64_t k = n; k-- > 0;) ASSERT_TRUE(read_back(*s, k, 400 + k)) << "page " << k;
  pinning.disarm();
}

// A write that fails once is tried again: the page stays in host memory meanwhile, and once
// its rewrite is on disk the failure is over, not reported to a later save that needs room
// (where its "stays in host memory" would no longer be true).
TEST_P(TieredStore, AnEioOnOneSpillIsRetriedAndFailsNoSave) {
  scripted_faults faults;
  faults.on = [](bool write, uint64_t nth, unsigned, int res) { return write && nth == 5 ? -EIO : res; };
  std::unique_ptr<tiered_store> s;
  ASSERT_EQ(make_store(*be, 8, dir, &faults, &s), ok) << last_error();
  for (uint64_t k = 0; k < 30; ++k) ASSERT_EQ(put(*s, k, 300 + k), ok) << "page " << k << ": " << last_error();
  ASSERT_EQ(s->flush(), ok) << last_error();
  for (uint64_t k = 0; k < 30; ++k) EXPECT_TRUE(read_back(*s, k, 300 + k));
}

// Writes that keep failing leave no room: the save that needs it fails with the write's
// error, saying the page stays in host memory; once the disk works again, so do saves.
TEST_P(TieredStore, EioOnEverySpillKeepsThePageInHostMemory) {
  scripted_faults faults;
  bool failing = true;
  faults.on = [&](bool write, uint64_t nth, unsigned, int res) { return write && nth >= 5 && failing ? -EIO : res; };
  std::unique_ptr<tiered_store> s;
  ASSERT_EQ(make_store(*be, 8, dir, &faults, &s), ok) << last_error();
  int failed_at = -1;
  for (uint64_t k = 0; k < 30; ++k) {
    const int rc = put(*s, k, 300 + k);
    if (rc != ok) {
      EXPECT_EQ(rc, err_io);
      EXPECT_NE(std::string(last_error()).find("Input/output error"), std::string::npos) << last_error();
      EXPECT_NE(std::string(last_error()).find("stays in host memory"), std::string::npos) << last_error();
      EXPECT_FALSE(s->holds(k)) << "the failed call created nothing";
      failed_at = static_cast<int>(k);
      break;
    }
  }
  ASSERT_GE(failed_at, 0) << "the failing writes never reached a caller";
  // Every page saved before the failure is intact, wherever it is; later spills work again.
  for (uint64_t k = 0; k < static_cast<uint64_t>(failed_at); ++k) EXPECT_TRUE(read_back(*s, k, 300 + k));
  failing = false;
  for (uint64_t k = failed_at; k < 30; ++k) ASSERT_EQ(put(*s, k, 300 + k), ok) << last_error();
  ASSERT_EQ(s->flush(), ok) << last_error();
  for (uint64_t k = 0; k < 30; ++k) EXPECT_TRUE(read_back(*s, k, 300 + k));
}

TEST_P(TieredStore, EioOnAReadLeavesThePageOnDisk) {
  scripted_faults faults;
  bool fail_reads = true;
  faults.on = [&](bool write, uint64_t, unsigned, int res) { return !write && fail_reads ? -EIO : res; };
  std::unique_ptr<tiered_store> s;
  ASSERT_EQ(make_store(*be, 8, dir, &faults, &s), ok) << last_error();
  for (uint64_t k = 0; k < 12; ++k) ASSERT_EQ(put(*s, k, 40 + k), ok);
  ASSERT_EQ(s->spill_all(), ok) << last_error();
  ASSERT_TRUE((s->tier_of(0) == 1));
  void* slot = nullptr;
  EXPECT_FAILS(s->slot_for_read(0, &slot), err_io, "stays on disk");
  EXPECT_TRUE((s->tier_of(0) == 1));
  EXPECT_TRUE(s->holds(0));
  fail_reads = false;
  for (uint64_t k = 0; k < 12; ++k) EXPECT_TRUE(read_back(*s, k, 40 + k));
}

TEST_P(TieredStore, ShortWritesAndReadsAreResubmitted) {
  scripted_faults faults;
  // Every third completion moved only half of its bytes (a 4 KiB multiple) as far as we know.
  faults.on = [](bool, uint64_t nth, unsigned len, int res) {
    return nth % 3 == 1 && res == static_cast<int>(len) && len >= 8192 ? static_cast<int>(len / 2 / 4096 * 4096) : res;
  };
  std::unique_ptr<tiered_store> s;
  ASSERT_EQ(make_store(*be, 8, dir, &faults, &s), ok) << last_error();
  for (uint64_t k = 0; k < 16; ++k) ASSERT_EQ(put(*s, k, 60 + k), ok) << last_error();
  ASSERT_EQ(s->spill_all(), ok) << last_error();
  for (uint64_t k = 0; k < 16; ++k) EXPECT_TRUE(read_back(*s, k, 60 + k));
}

TEST_P(TieredStore, ATransferThatMakesNoProgressFailsAsShort) {
  scripted_faults faults;
  bool stall = false;
  faults.on = [&](bool write, uint64_t, unsigned, int res) { return stall && !write ? 0 : res; };
  std::unique_ptr<tiered_store> s;
  ASSERT_EQ(make_store(*be, 8, dir, &faults, &s), ok) << last_error();
  for (uint64_t k = 0; k < 12; ++k) ASSERT_EQ(put(*s, k, 70 + k), ok);
  ASSERT_EQ(s->spill_all(), ok) << last_error();
  stall = true;
  void* slot = nullptr;
  EXPECT_FAILS(s->slot_for_read(0, &slot), err_io, "short read");
  stall = false;
  EXPECT_TRUE(read_back(*s, 0, 70));
}

// A device whose completions answer EAGAIN for good: the read fails, saying so, instead of
// being resubmitted for ever (the restore waiting on it would hang); once the device answers
// again the page's bytes come back.
TEST_P(TieredStore, ACompletionThatAnswersEagainForGoodFailsTheTransfer) {
  scripted_faults faults;
  bool eagain = false;
  faults.on = [&](bool write, uint64_t, unsigned, int res) { return eagain && !write ? -EAGAIN : res; };
  std::unique_ptr<tiered_store> s;
  ASSERT_EQ(make_store(*be, 8, dir, &faults, &s), ok) << last_error();
  for (uint64_t k = 0; k < 12; ++k) ASSERT_EQ(put(*s, k, 90 + k), ok);
  ASSERT_EQ(s->spill_all(), ok) << last_error();
  eagain = true;
  within(std::chrono::seconds(60), "a read whose completions answer EAGAIN for good", [&] {
    void* slot = nullptr;
    EXPECT_FAILS(s->slot_for_read(0, &slot), err_io, "times in a row");
  });
  eagain = false;
  EXPECT_TRUE(read_back(*s, 0, 90));
}

TEST_P(TieredStore, EagainAndEbusyOnSubmitAreRetriedAndLoseNothing) {
  scripted_faults faults;
  unsigned injected = 0;
  // Two of every three submissions fail, alternately EAGAIN and EBUSY, the kernel taking none.
  faults.submit = [&](uint64_t nth, unsigned) {
    if (nth % 3 == 2) return 0;
    ++injected;
    return nth % 2 == 0 ? -EAGAIN : -EBUSY;
  };
  std::unique_ptr<tiered_store> s;
  ASSERT_EQ(make_store(*be, 8, dir, &faults, &s), ok) << last_error();
  within(std::chrono::seconds(60), "spilling and reading back with EAGAIN/EBUSY on submit", [&] {
    for (uint64_t k = 0; k < 24; ++k) ASSERT_EQ(put(*s, k, 500 + k), ok) << last_error();
    ASSERT_EQ(s->spill_all(), ok) << last_error();
    for (uint64_t k = 0; k < 24; ++k) EXPECT_TRUE(read_back(*s, k, 500 + k));
  });
  EXPECT_GT(s->stats().bytes_read, 0u) << "the pages came back from the disk";
  EXPECT_GT(injected, 10u) << "the faults were met";
}

TEST_P(TieredStore, AHardSubmitErrorFailsTheTransfersAndLosesNothing) {
  scripted_faults faults;
  bool broken = false;
  faults.submit = [&](uint64_t, unsigned) { return broken ? -EINVAL : 0; };
  std::unique_ptr<tiered_store> s;
  ASSERT_EQ(make_store(*be, 8, dir, &faults, &s), ok) << last_error();
  within(std::chrono::seconds(60), "spills and reads whose submission fails", [&] {
    // Saved before the failure, some on disk: untouched by it.
    for (uint64_t k = 0; k < 12; ++k) ASSERT_EQ(put(*s, k, 600 + k), ok) << last_error();
    ASSERT_EQ(s->spill_all(), ok) << last_error();
    ASSERT_TRUE((s->tier_of(0) == 1));
    // A read whose submission fails: an error, not a hang, and the page stays on disk.
    broken = true;
    void* slot = nullptr;
    EXPECT_FAILS(s->slot_for_read(0, &slot), err_io, "io_uring_submit failed: Invalid argument");
    EXPECT_TRUE(contains(last_error(), "stays on disk")) << last_error();
    EXPECT_TRUE((s->tier_of(0) == 1));
    // Saves that must spill: the spill fails, its pages stay in host memory.
    int failed_at = -1;
    for (uint64_t k = 12; k < 40; ++k) {
      const int rc = put(*s, k, 600 + k);
      if (rc != ok) {
        EXPECT_EQ(rc, err_io);
        EXPECT_TRUE(contains(last_error(), "io_uring_submit failed: Invalid argument")) << last_error();
        EXPECT_TRUE(contains(last_error(), "stays in host memory")) << last_error();
        EXPECT_TRUE(contains(last_error(), dir.c_str())) << last_error();
        EXPECT_FALSE(s->holds(k)) << "the failed call created nothing";
        failed_at = static_cast<int>(k);
        break;
      }
    }
    ASSERT_GE(failed_at, 0) << "the failed submission never reached a caller";
    broken = false;
    // Spills retried before the caller saw the error may have failed too: flush reports them.
    const int flushed = s->flush();
    if (flushed != ok) {
      EXPECT_EQ(flushed, err_io);
      EXPECT_TRUE(contains(last_error(), "io_uring_submit failed")) << last_error();
    }
    for (uint64_t k = failed_at; k < 40; ++k) ASSERT_EQ(put(*s, k, 600 + k), ok) << last_error();
    ASSERT_EQ(s->flush(), ok) << last_error();
    for (uint64_t k = 0; k < 40; ++k) EXPECT_TRUE(read_back(*s, k, 600 + k));
  });
}

// --- the swap directory ---------------------------------------------------------------------

TEST_P(TieredStore, AMissingDirectoryIsRefusedClearly) {
  std::unique_ptr<tiered_store> s;
  EXPECT_FAILS(make_store(*be, 8, "/nonexistent/vramswap-swap", nullptr, &s), err_unavailable, "VRAMSWAP_SWAP_DIR");
  EXPECT_NE(std::string(last_error()).find("No such file"), std::string::npos) << last_error();
}

TEST_P(TieredStore, AFilesystemWithoutOTmpfileIsRefusedClearly) {
  std::unique_ptr<tiered_store> s;
  EXPECT_FAILS(make_store(*be, 8, "/proc", nullptr, &s), err_unavailable, "O_TMPFILE");
}

TEST_P(TieredStore, AFilesystemWithoutODirectIsRefusedClearly) {
  scripted_faults faults;
  faults.no_direct = true;  // open() answers EINVAL to O_DIRECT, as such filesystems do
  std::unique_ptr<tiered_store> s;
  EXPECT_FAILS(make_store(*be, 8, dir, &faults, &s), err_unavailable, "does not support O_DIRECT");
}

uint64_t free_bytes(const std::string& dir) {
  struct statfs s {};
  return ::statfs(dir.c_str(), &s) == 0 ? static_cast<uint64_t>(s.f_bavail) * static_cast<uint64_t>(s.f_bsize) : 0;
}

TEST_P(TieredStore, AnUnwritableDirectoryIsRefusedClearly) {
  if (::geteuid() != 0) {
    char tmpl[] = "/var/tmp/vramswap-ro-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    ::chmod(tmpl, 0500);
    std::unique_ptr<tiered_store> s;
    EXPECT_FAILS(make_store(*be, 8, tmpl, nullptr, &s), err_unavailable, "not writable");
    ::rmdir(tmpl);
    return;
  }
  // Root writes anywhere that is mounted writable: use a read-only mount instead.
  scratch_mount m;
  std::string why;
  if (!m.mount("-t tmpfs -o size=1m,ro tmpfs", &why)) GTEST_SKIP() << why;
  std::unique_ptr<tiered_store> s;
  EXPECT_FAILS(make_store(*be, 8, m.dir(), nullptr, &s), err_unavailable, "not writable");
}

TEST_P(TieredStore, EnospcOnASmallRealFilesystemLosesNothingAndSpaceIsReused) {
  scratch_image img;
  scratch_mount m;
  std::string why;
  if (!mount_small_ext4(m, img, &why)) GTEST_SKIP() << why;

  std::unique_ptr<tiered_store> s;
  ASSERT_EQ(make_store(*be, 8, m.dir(), nullptr, &s, 2 * k_page), ok) << last_error();
  // About 20 MiB of space: 10 pages of 2 MiB fit on disk, 5 more in host memory.
  int rc = ok;
  uint64_t saved = 0;
  for (; saved < 64; ++saved) {
    if ((rc = put(*s, saved, 500 + saved)) != ok) break;
  }
  ASSERT_EQ(rc, err_no_space) << last_error();
  EXPECT_NE(std::string(last_error()).find("full"), std::string::npos) << last_error();
  EXPECT_GT(saved, 8u);
  EXPECT_LT(saved, 30u);
  EXPECT_FALSE(s->holds(saved)) << "the page that found no room was not taken";
  for (uint64_t k = 0; k < saved; ++k) ASSERT_TRUE(read_back(*s, k, 500 + k));
  // Releasing pages frees their extents; the same number of new pages fits again.
  const uint64_t file = s->stats().file_bytes;
  for (uint64_t k = 0; k < saved; ++k) ASSERT_EQ(s->release(k), ok);
  for (uint64_t k = 0; k < saved; ++k) ASSERT_EQ(put(*s, 100 + k, 600 + k), ok) << k << ": " << last_error();
  ASSERT_EQ(s->flush(), ok) << last_error();
  EXPECT_EQ(s->stats().file_bytes, file);
  for (uint64_t k = 0; k < saved; ++k) EXPECT_TRUE(read_back(*s, 100 + k, 600 + k));
  s.reset();  // closes the swap file before the unmount
}

TEST_P(TieredStore, EnospcOnTheReservationItselfChangesNothing) {
  scratch_image img;
  scratch_mount m;
  std::string why;
  if (!mount_small_ext4(m, img, &why)) GTEST_SKIP() << why;

  std::unique_ptr<tiered_store> s;
  ASSERT_EQ(make_store(*be, 8, m.dir(), nullptr, &s, 2 * k_page), ok) << last_error();
  // 4 pages fit in host memory (5 saved pages do: 8 less 3 staging slots): nothing on disk.
  for (uint64_t k = 0; k < 4; ++k) ASSERT_EQ(put(*s, k, 700 + k), ok) << last_error();
  const uint64_t before = free_bytes(m.dir());
  // 64 more pages: 128 MiB do not fit in about 20 MiB.
  EXPECT_FAILS(s->expect_saves(64), err_no_space, "full");
  EXPECT_EQ(s->stats().file_bytes, 0u) << "a failed reservation leaves the file as it was";
  EXPECT_EQ(s->stats().bytes_written, 0u);
  EXPECT_GE(free_bytes(m.dir()) + MiB, before) << "what the failed fallocate did allocate was given back";
  EXPECT_GE(s->io_stats().grows, 1u);
  EXPECT_LE(s->io_stats().grows, 2u) << "the geometric size, then exactly what was missing, no more";
  for (uint64_t k = 0; k < 4; ++k) ASSERT_TRUE(read_back(*s, k, 700 + k));
  // The saves go on and meet the error themselves, at the page that finds no room.
  int rc = ok;
  uint64_t saved = 4;
  for (; saved < 64; ++saved) {
    if ((rc = put(*s, saved, 700 + saved)) != ok) break;
  }
  ASSERT_EQ(rc, err_no_space) << last_error();
  EXPECT_GT(saved, 8u) << "pages went to disk until it was full";
  EXPECT_FALSE(s->holds(saved));
  for (uint64_t k = 0; k < saved; ++k) ASSERT_TRUE(read_back(*s, k, 700 + k));
  s.reset();
}

TEST_P(TieredStore, ASpillIsReservedInOneFallocateBeforeItsFirstWrite) {
  std::unique_ptr<tiered_store> s;
  ASSERT_EQ(make_store(*be, 8, dir, nullptr, &s), ok) << last_error();  // grows by 8 MiB (4 pages) at least
  constexpr uint64_t n = 40;
  // 40 pages, 5 of which stay in host memory (8 less 3 staging slots): 35 go to disk (and
  // the store may write a page or two ahead of need).
  ASSERT_EQ(s->expect_saves(n), ok) << last_error();
  swap_file::io_stats io = s->io_stats();
  EXPECT_EQ(io.grows, 1u) << "one fallocate for the whole spill";
  EXPECT_GE(io.grow_bytes, (n - 5) * k_page);
  EXPECT_EQ(s->stats().bytes_written, 0u) << "reserved before the first write";
  for (uint64_t k = 0; k < n; ++k) ASSERT_EQ(put(*s, k, 800 + k), ok) << last_error();
  ASSERT_EQ(s->flush(), ok) << last_error();
  io = s->io_stats();
  EXPECT_EQ(io.grows, 1u) << "the file did not grow while the spill wrote";
  EXPECT_EQ(io.grows_in_flight, 0u);
  EXPECT_GE(s->stats().bytes_written, (n - 5) * k_page);
  EXPECT_EQ(io.overwrites, 0u);
  for (uint64_t k = 0; k < n; ++k) ASSERT_TRUE(read_back(*s, k, 800 + k));
  // Nothing more to reserve when the pages come back as new contents: their extents are reused.
  for (uint64_t k = 0; k < n; ++k) ASSERT_EQ(s->release(k), ok);
  ASSERT_EQ(s->expect_saves(n), ok) << last_error();
  for (uint64_t k = 0; k < n; ++k) ASSERT_EQ(put(*s, k, 900 + k), ok) << last_error();
  ASSERT_EQ(s->flush(), ok) << last_error();
  io = s->io_stats();
  EXPECT_EQ(io.grows, 1u) << "freed extents are reused before the file grows";
  EXPECT_GE(io.overwrites, n - 5) << "into extents written before";
  for (uint64_t k = 0; k < n; ++k) ASSERT_TRUE(read_back(*s, k, 900 + k));
}

TEST_P(TieredStore, SpillAllReservesWhatItWritesInOneFallocate) {
  std::unique_ptr<tiered_store> s;
  ASSERT_EQ(make_store(*be, 16, dir, nullptr, &s, 2 * MiB), ok) << last_error();  // 1-page steps
  for (uint64_t k = 0; k < 12; ++k) ASSERT_EQ(put(*s, k, 1000 + k), ok) << last_error();
  EXPECT_EQ(s->io_stats().grows, 0u) << "12 pages fit in host memory";
  ASSERT_EQ(s->spill_all(), ok) << last_error();
  const swap_file::io_stats io = s->io_stats();
  EXPECT_EQ(io.grows, 1u);
  EXPECT_EQ(io.grows_in_flight, 0u);
  EXPECT_EQ(io.grow_bytes, 12 * k_page - 4 * k_page) << "the 8 pages outside the write window, exactly";
  for (uint64_t k = 0; k < 12; ++k) ASSERT_TRUE(read_back(*s, k, 1000 + k));
}

INSTANTIATE_TEST_SUITE_P(Backends, TieredStore, ::testing::Values(backend_kind::host, backend_kind::cuda), test::param_name);

// --- through the pager: device -> host -> disk -> host -> device --------------------------------

class PagerOverDisk : public ::testing::TestWithParam<backend_kind> {
 protected:
  void SetUp() override {
    std::string why;
    be = test::shared_backend(GetParam(), &why);
    if (be == nullptr) GTEST_SKIP() << "backend " << backend_kind_name(GetParam()) << " unavailable here: " << why;
    ASSERT_EQ(be->stream_create(0, &stream), ok);
    ASSERT_EQ(be->host_alloc(k_page, &staging), ok);
  }
  void TearDown() override {
    if (be == nullptr) return;
    pg.reset();
    store.reset();
    be->host_free(staging);
    be->stream_destroy(stream);
  }
  void make(size_t budget_pages, io_faults* faults, bool make_ahead = false) {
    ASSERT_EQ(make_store(*be, budget_pages, "/var/tmp", faults, &store, 8 * MiB, make_ahead), ok) << last_error();
    frames = std::make_unique<local_frame_source>(*be);
    pager_config cfg;
    cfg.frame_size = k_page;
    cfg.arena_size = 256 * MiB;
    cfg.copies_in_flight = 4;  // == the store's write window
    ASSERT_EQ(pager::create(*be, 0, *store, *frames, cfg, &pg), ok) << last_error();
  }
  void write(device_ptr p, uint64_t size, uint64_t seed) {
    for (uint64_t off = 0; off < size; off += k_page) {
      test::fill_random(staging, k_page, seed * 1000 + off / k_page);
      ASSERT_EQ(be->copy_h2d(p + off, staging, k_page, stream), ok) << last_error();
      ASSERT_EQ(be->stream_synchronize(stream), ok);
    }
  }
  ::testing::AssertionResult holds(device_ptr p, uint64_t size, uint64_t seed) {
    for (uint64_t off = 0; off < size; off += k_page) {
      std::memset(staging, 0, k_page);
      if (be->copy_d2h(staging, p + off, k_page, stream) != ok || be->stream_synchronize(stream) != ok) {
        return ::testing::AssertionFailure() << last_error();
      }
      const size_t at = test::first_mismatch(staging, k_page, seed * 1000 + off / k_page);
      if (at != k_page) return ::testing::AssertionFailure() << "byte " << off + at << " differs";
    }
    return ::testing::AssertionSuccess();
  }

  backend* be = nullptr;
  stream_id stream = 0;
  void* staging = nullptr;
  std::unique_ptr<tiered_store> store;
  std::unique_ptr<local_frame_source> frames;
  std::unique_ptr<pager> pg;
};

TEST_P(PagerOverDisk, RandomBytesSurviveDeviceHostDiskHostDevice) {
  make(10, nullptr);  // 20 MiB of host budget for 48 MiB of memory
  device_ptr a = 0;
  constexpr uint64_t size = 48 * MiB;
  ASSERT_EQ(pg->malloc(size, &a), ok) << last_error();
  for (int cycle = 0; cycle < 3; ++cycle) {
    write(a, size, 10 + cycle);
    ASSERT_EQ(pg->evict_all(), ok) << last_error();
    ASSERT_EQ(pg->check_invariants(), ok) << last_error();
    ASSERT_EQ(store->flush(), ok);
    EXPECT_EQ(pg->stats().host_bytes, size) << "every page is saved, in one tier or the other";
    EXPECT_GE(store->bytes_in_tier(1), size - 10 * k_page) << "pages past the budget are on disk";
    EXPECT_EQ(pg->state_of(a), page_state::host);
    EXPECT_EQ(store->tier_of((a - pg->arena_base()) / k_page), 1u) << "the oldest saved page went to disk first";
    // Saved pages stay within the budget.
    EXPECT_LE(store->stats().host_bytes, 10 * k_page);
    ASSERT_EQ(pg->restore_all(), ok) << last_error();
    ASSERT_EQ(pg->check_invariants(), ok) << last_error();
    // (Restoring may still take slots past this tiny budget: the pager reports each copy in
    // as it completes (read_done), but keeps up to copies_in_flight copies queued, which is
    // more than the 10 pages of budget here.)
    EXPECT_EQ(store->bytes_held(), 0u);
    ASSERT_TRUE(holds(a, size, 10 + cycle)) << "cycle " << cycle;
  }
}

// Writes that fail from the 8th on (a write that fails once is retried and fails nothing:
// TieredStore.AnEioOnOneSpillIsRetriedAndFailsNoSave).
TEST_P(PagerOverDisk, EioDuringEvictionLeavesEveryPageIntact) {
  scripted_faults faults;
  bool armed = true;
  faults.on = [&](bool write, uint64_t nth, unsigned, int res) { return armed && write && nth >= 7 ? -EIO : res; };
  make(10, &faults);
  device_ptr a = 0;
  constexpr uint64_t size = 48 * MiB;
  ASSERT_EQ(pg->malloc(size, &a), ok) << last_error();
  write(a, size, 5);
  EXPECT_FAILS(pg->evict_all(), err_io, "nothing lost");
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();  // a failed eviction leaves a consistent, non-resident pager
  EXPECT_GT(pg->stats().resident_bytes, 0u);
  EXPECT_EQ(pg->stats().resident_bytes + pg->stats().host_bytes, size) << "every page is resident or saved";
  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  ASSERT_TRUE(holds(a, size, 5));
  armed = false;
  ASSERT_EQ(pg->evict_all(), ok) << last_error();
  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  ASSERT_TRUE(holds(a, size, 5));
}

TEST_P(PagerOverDisk, EioDuringRestoreLeavesEveryPageIntact) {
  scripted_faults faults;
  bool armed = false;
  faults.on = [&](bool write, uint64_t, unsigned, int res) { return armed && !write ? -EIO : res; };
  make(10, &faults);
  device_ptr a = 0;
  constexpr uint64_t size = 48 * MiB;
  ASSERT_EQ(pg->malloc(size, &a), ok) << last_error();
  write(a, size, 6);
  ASSERT_EQ(pg->evict_all(), ok) << last_error();
  armed = true;
  EXPECT_FAILS(pg->restore_all(), err_io, "nothing lost");
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
  armed = false;
  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  ASSERT_TRUE(holds(a, size, 6));
}

TEST_P(PagerOverDisk, AnEvictionReservesItsDiskSpaceBeforeItsFirstWrite) {
  make(10, nullptr);  // 20 MiB of host budget (7 saved pages) for 48 MiB (24 pages)
  device_ptr a = 0;
  constexpr uint64_t size = 48 * MiB;
  ASSERT_EQ(pg->malloc(size, &a), ok) << last_error();
  for (int cycle = 0; cycle < 3; ++cycle) {
    write(a, size, 20 + cycle);
    ASSERT_EQ(pg->evict_all(), ok) << last_error();
    ASSERT_EQ(store->flush(), ok) << last_error();
    const swap_file::io_stats io = store->io_stats();
    EXPECT_EQ(io.grows, 1u) << "cycle " << cycle << ": one fallocate, in the first eviction, none after";
    EXPECT_EQ(io.grows_in_flight, 0u) << "never while writes were in flight";
    EXPECT_GE(io.grow_bytes, size - 7 * k_page);
    if (cycle > 0) {
      EXPECT_GT(io.overwrites, 0u) << "later evictions reuse the extents written before";
    }
    ASSERT_EQ(pg->restore_all(), ok) << last_error();
    ASSERT_TRUE(holds(a, size, 20 + cycle)) << "cycle " << cycle;
  }
}

// Waits up to 20 s for the store's pinned bytes to reach `bytes`; what they reached.
uint64_t wait_pinned(const tiered_store& s, uint64_t bytes) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (s.stats().pinned_bytes < bytes && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return s.stats().pinned_bytes;
}

TEST_P(PagerOverDisk, HostSlotsArePinnedAheadAsMemoryGrowsAndTheFirstEvictionFindsThem) {
  make(40, nullptr, /*make_ahead=*/true);
  EXPECT_EQ(store->stats().pinned_bytes, 0u) << "nothing is pinned before there is memory to save";
  device_ptr a = 0;
  constexpr uint64_t size = 48 * MiB;  // 24 pages: 6 chunks of 4
  ASSERT_EQ(pg->malloc(size, &a), ok) << last_error();
  write(a, size, 31);
  ASSERT_EQ(wait_pinned(*store, size), size) << "the thread pins the host slots for the pages allocated, and no more";
  ASSERT_EQ(pg->evict_all(), ok) << last_error();
  EXPECT_EQ(store->stats().pinned_bytes, size) << "the eviction took the slots made ahead and made none";
  EXPECT_EQ(store->bytes_in_tier(1), 0u) << "within the budget, nothing went to disk";
  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  ASSERT_TRUE(holds(a, size, 31));
  ASSERT_EQ(pg->check_invariants(), ok) << last_error();
}

TEST_P(PagerOverDisk, PinningAheadStaysWithinTheBudget) {
  make(10, nullptr, /*make_ahead=*/true);
  device_ptr a = 0;
  constexpr uint64_t size = 64 * MiB;  // 32 pages, the budget 10
  ASSERT_EQ(pg->malloc(size, &a), ok) << last_error();
  write(a, size, 32);
  const uint64_t pinned = wait_pinned(*store, 8 * k_page);  // two whole chunks fit the budget
  EXPECT_EQ(pinned, 8 * k_page);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(store->stats().pinned_bytes, 8 * k_page) << "whole chunks only, and never past the budget";
  ASSERT_EQ(pg->evict_all(), ok) << last_error();
  ASSERT_EQ(store->flush(), ok) << last_error();
  EXPECT_LE(store->stats().pinned_bytes, 10 * k_page) << "the eviction made the rest up to the budget, no more";
  ASSERT_EQ(pg->restore_all(), ok) << last_error();
  ASSERT_TRUE(holds(a, size, 32));
}

TEST_P(PagerOverDisk, EvictionsWhilePinningAheadIsUnderWayLoseNothing) {
  // Each round allocates more and evicts at once, while the thread is still making chunks:
  // the eviction adopts what is made, waits for a chunk in the making, makes the rest.
  make(80, nullptr, /*make_ahead=*/true);
  std::vector<device_ptr> blocks;
  std::vector<uint64_t> sizes;
  for (int round = 0; round < 6; ++round) {
    device_ptr p = 0;
    const uint64_t size = (4 + 3 * round) * k_page;
    ASSERT_EQ(pg->malloc(size, &p), ok) << last_error();
    write(p, size, 40 + round);
    blocks.push_back(p);
    sizes.push_back(size);
    ASSERT_EQ(pg->evict_all(), ok) << "round " << round << ": " << last_error();
    ASSERT_EQ(pg->restore_all(), ok) << "round " << round << ": " << last_error();
    ASSERT_EQ(pg->check_invariants(), ok) << last_error();
    for (size_t i = 0; i < blocks.size(); ++i) ASSERT_TRUE(holds(blocks[i], sizes[i], 40 + i)) << "round " << round << ", block " << i;
  }
  EXPECT_LE(store->stats().pinned_bytes, 80 * k_page) << "the thread and the evictions together stay within the budget";
  EXPECT_EQ(store->stats().budget_overruns, 0u);
}

TEST_P(PagerOverDisk, WithoutPinningAheadNothingIsPinnedBeforeTheFirstEviction) {
  make(40, nullptr, /*make_ahead=*/false);
  device_ptr a = 0;
  ASSERT_EQ(pg->malloc(48 * MiB, &a), ok) << last_error();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(store->stats().pinned_bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, PagerOverDisk, ::testing::Values(backend_kind::host, backend_kind::cuda), test::param_name);

// --- the swap file's space -------------------------------------------------------------------

class SwapFile : public ::testing::Test {
 protected:
  void SetUp() override {
    swap_file_config cfg;
    cfg.dir = "/var/tmp";
    cfg.extent_size = k_page;
    cfg.queue_depth = 8;
    cfg.block_size = 512 * 1024;
    cfg.grow_step = 2 * k_page;
    cfg.label = "test";
    ASSERT_EQ(swap_file::open(cfg, &f), ok) << last_error();
    buf = ::mmap(nullptr, k_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(buf, MAP_FAILED);
    std::memset(buf, 0x5A, k_page);
  }
  void TearDown() override {
    f.reset();
    if (buf != nullptr && buf != MAP_FAILED) ::munmap(buf, k_page);
  }
  uint64_t alloc() {
    uint64_t e = ~0ull;
    EXPECT_EQ(f->alloc_extent(&e), ok) << last_error();
    return e;
  }
  void write(uint64_t extent) {
    f->submit(true, extent, buf, extent);
    std::vector<swap_file::completion> done;
    while (done.empty()) ASSERT_EQ(f->reap(true, &done), ok) << last_error();
    ASSERT_EQ(done[0].status, ok) << done[0].detail;
  }
  std::unique_ptr<swap_file> f;
  void* buf = nullptr;
};

TEST_F(SwapFile, ReservesInOneFallocateAndGrowsGeometrically) {
  ASSERT_EQ(f->reserve(3), ok) << last_error();
  EXPECT_EQ(f->stats().grows, 1u);
  EXPECT_EQ(f->file_bytes(), 4 * k_page) << "what is missing, rounded up to whole grow steps (2 pages)";
  EXPECT_EQ(f->extents_free(), 4u);
  ASSERT_EQ(f->reserve(4), ok);
  EXPECT_EQ(f->stats().grows, 1u) << "enough is free: no fallocate";
  for (int i = 0; i < 4; ++i) alloc();
  ASSERT_EQ(f->reserve(5), ok) << last_error();
  EXPECT_EQ(f->stats().grows, 2u);
  EXPECT_EQ(f->file_bytes(), 10 * k_page) << "4 + 5 missing, rounded to 6";
  for (int i = 0; i < 6; ++i) alloc();
  EXPECT_EQ(f->stats().grows, 2u);
  // Without a reservation, the file grows by half its size (5 pages, rounded to 6), not by one step.
  alloc();
  EXPECT_EQ(f->stats().grows, 3u);
  EXPECT_EQ(f->file_bytes(), 16 * k_page);
  EXPECT_EQ(f->stats().largest_grow, 6 * k_page);
  EXPECT_EQ(f->stats().grow_bytes, 16 * k_page);
  EXPECT_EQ(f->stats().grows_in_flight, 0u);
}

TEST_F(SwapFile, WrittenExtentsAreReusedFirstLowestOffsetFirst) {
  ASSERT_EQ(f->reserve(8), ok) << last_error();
  for (uint64_t i = 0; i < 6; ++i) EXPECT_EQ(alloc(), i) << "reserved extents, lowest offset first";
  write(4);
  write(5);
  EXPECT_EQ(f->stats().fresh_writes, 2u);
  f->free_extent(0);  // never written
  f->free_extent(5);  // written
  f->free_extent(4);  // written
  EXPECT_EQ(alloc(), 4u) << "an extent written before comes first, even above a fresh one";
  EXPECT_EQ(alloc(), 5u);
  EXPECT_EQ(alloc(), 0u) << "then the fresh ones, lowest offset first";
  EXPECT_EQ(alloc(), 6u);
  write(4);
  write(0);
  EXPECT_EQ(f->stats().overwrites, 1u);
  EXPECT_EQ(f->stats().fresh_writes, 3u);
  EXPECT_EQ(f->stats().grows, 1u);
}

// --- submission failures, at the swap file's own level -----------------------------------------

// Pages of 4 blocks, 6 blocks in the ring: a page's blocks can be split between the kernel,
// the ring and the queue. Buffers of random bytes, one per page.
class SwapFileSubmission : public ::testing::Test {
 protected:
  static constexpr unsigned k_pages = 8;
  void SetUp() override {
    faults.submit = [this](uint64_t, unsigned) { return submit_fault(); };
    swap_file_config cfg;
    cfg.dir = "/var/tmp";
    cfg.extent_size = k_page;
    cfg.queue_depth = 6;
    cfg.block_size = 512 * 1024;
    cfg.grow_step = k_pages * k_page;
    cfg.submit_patience_ms = 300;
    cfg.faults = &faults;
    cfg.label = "test";
    ASSERT_EQ(swap_file::open(cfg, &f), ok) << last_error();
    ASSERT_EQ(f->reserve(k_pages), ok) << last_error();
    for (unsigned i = 0; i < k_pages; ++i) ASSERT_EQ(f->alloc_extent(&extent[i]), ok) << last_error();
    mem = ::mmap(nullptr, k_pages * k_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(mem, MAP_FAILED);
  }
  void TearDown() override {
    f.reset();
    if (mem != nullptr && mem != MAP_FAILED) ::munmap(mem, k_pages * k_page);
  }
  // What the seam answers for the next submission: 0, or -errno (once, or every time).
  int submit_fault() {
    if (fail_always != 0) return ++injected, -fail_always;
    if (fail_times == 0) return 0;
    --fail_times, ++injected;
    return -fail_with;
  }
  char* page(unsigned i) { return static_cast<char*>(mem) + static_cast<size_t>(i) * k_page; }
  void start(bool write, unsigned i) { f->submit(write, extent[i], page(i), i); }
  // Reaps until nothing is in flight (within a bound, so a hang fails); status per page.
  std::map<uint64_t, swap_file::completion> finish() {
    std::map<uint64_t, swap_file::completion> by_tag;
    within(std::chrono::seconds(30), "reaping the swap file's requests", [&] {
      std::vector<swap_file::completion> done;
      while (f->requests_in_flight() > 0) ASSERT_EQ(f->reap(true, &done), ok) << last_error();
      for (auto& c : done) by_tag[c.tag] = std::move(c);
    });
    return by_tag;
  }
  // Writes fill_random(seed + i) to every page, with no fault.
  void write_all(uint64_t seed) {
    for (unsigned i = 0; i < k_pages; ++i) test::fill_random(page(i), k_page, seed + i);
    for (unsigned i = 0; i < k_pages; ++i) start(true, i);
    for (const auto& [tag, c] : finish()) ASSERT_EQ(c.status, ok) << c.detail;
  }
  // Reads every page back (no fault) and checks it holds fill_random(seed[i]).
  void expect_on_disk(const std::vector<uint64_t>& seed) {
    std::memset(mem, 0, k_pages * k_page);
    for (unsigned i = 0; i < k_pages; ++i) start(false, i);
    const auto done = finish();
    ASSERT_EQ(done.size(), k_pages);
    for (const auto& [tag, c] : done) ASSERT_EQ(c.status, ok) << c.detail;
    for (unsigned i = 0; i < k_pages; ++i) EXPECT_EQ(test::first_mismatch(page(i), k_page, seed[i]), k_page) << "page " << i;
  }
  // Every page written and read back exactly while `fail_with` makes submissions fail.
  void round_trip_through_transient_failures(int err) {
    fail_with = err;
    fail_times = 5;
    write_all(700);
    EXPECT_EQ(fail_times, 0) << "the writes met the faults";
    std::vector<uint64_t> seeds;
    for (unsigned i = 0; i < k_pages; ++i) seeds.push_back(700 + i);
    fail_times = 5;
    expect_on_disk(seeds);
    EXPECT_EQ(fail_times, 0) << "the reads met the faults";
    EXPECT_EQ(injected, 10u);
  }

  scripted_faults faults;
  int fail_with = 0;       // errno for the next fail_times submissions
  int fail_times = 0;
  int fail_always = 0;     // errno for every submission, while set
  unsigned injected = 0;
  std::unique_ptr<swap_file> f;
  uint64_t extent[k_pages] = {};
  void* mem = nullptr;
};

TEST_F(SwapFileSubmission, EagainIsRetriedAndEveryByteComesBack) { round_trip_through_transient_failures(EAGAIN); }

TEST_F(SwapFileSubmission, EbusyIsRetriedAndEveryByteComesBack) { round_trip_through_transient_failures(EBUSY); }

TEST_F(SwapFileSubmission, AHardErrorFailsWhatWasNotSubmittedAndNothingElse) {
  write_all(800);
  // Page 0 goes to the kernel whole; then the submission of page 1 (2 blocks in the ring,
  // 2 queued) fails: page 1 fails, page 0 is unaffected, and pages 2 and 3, submitted after,
  // go through.
  for (unsigned i = 0; i < 4; ++i) test::fill_random(page(i), k_page, 900 + i);
  start(true, 0);
  fail_with = EINVAL;
  fail_times = 1;
  start(true, 1);
  start(true, 2);
  start(true, 3);
  auto done = finish();
  ASSERT_EQ(done.size(), 4u);
  EXPECT_EQ(done[0].status, ok) << done[0].detail;
  EXPECT_EQ(done[1].status, err_io);
  EXPECT_TRUE(contains(done[1].detail, "io_uring_submit failed: Invalid argument")) << done[1].detail;
  EXPECT_TRUE(contains(done[1].detail, "swap file in /var/tmp for test: write")) << done[1].detail;
  EXPECT_TRUE(contains(done[1].detail, "not submitted")) << done[1].detail;
  EXPECT_EQ(done[2].status, ok) << done[2].detail;
  EXPECT_EQ(done[3].status, ok) << done[3].detail;
  EXPECT_EQ(injected, 1u);
  // A read that cannot be submitted: an error, and its buffer untouched, even once the
  // submissions after it go through.
  std::memset(page(4), 0x5A, k_page);
  fail_times = 1;
  start(false, 4);
  start(false, 5);
  done = finish();
  EXPECT_EQ(done[4].status, err_io);
  EXPECT_TRUE(contains(done[4].detail, "read")) << done[4].detail;
  EXPECT_EQ(done[5].status, ok) << done[5].detail;
  EXPECT_EQ(test::first_mismatch(page(5), k_page, 805), k_page);
  for (size_t b = 0; b < k_page; ++b) ASSERT_EQ(static_cast<unsigned char>(page(4)[b]), 0x5Au) << "byte " << b << " of the failed read";
  // On disk: page 1 still holds what it held before its failed write, the others what they
  // were given.
  expect_on_disk({900, 801, 902, 903, 804, 805, 806, 807});
}

TEST_F(SwapFileSubmission, EagainPastThePatienceFailsTheTransfersInsteadOfHanging) {
  write_all(1000);
  fail_always = EAGAIN;
  for (unsigned i = 0; i < 3; ++i) test::fill_random(page(i), k_page, 1100 + i);
  for (unsigned i = 0; i < 3; ++i) start(true, i);
  const auto t0 = std::chrono::steady_clock::now();
  const auto done = finish();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(done.size(), 3u);
  for (const auto& [tag, c] : done) {
    EXPECT_EQ(c.status, err_io) << "page " << tag;
    EXPECT_TRUE(contains(c.detail, "io_uring_submit failed: Resource temporarily unavailable")) << c.detail;
    EXPECT_TRUE(contains(c.detail, "VRAMSWAP_SWAP_QUEUE_DEPTH")) << c.detail;
  }
  EXPECT_GE(took, 0.25) << "retried for the patience (300 ms) first";
  EXPECT_GT(injected, 3u) << "with retries";
  // The submission works again: new transfers go through, the failed writes never happened.
  fail_always = 0;
  expect_on_disk({1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007});
}

TEST(SwapOptions, HostLimitTakesASizeOrAPercentOfRam) {
  uint64_t v = 0;
  option_set(option_id::host_limit, "25%");
  ASSERT_EQ(option_size(option_id::host_limit, &v, 1000), ok);
  EXPECT_EQ(v, 250u);
  option_set(option_id::host_limit, "4GiB");
  ASSERT_EQ(option_size(option_id::host_limit, &v, 1000), ok);
  EXPECT_EQ(v, 4ull << 30);
  option_set(option_id::host_limit, nullptr);
  EXPECT_EQ(option_text(option_id::swap_dir), "/var/tmp");
  EXPECT_EQ(option_text(option_id::swap_queue_depth), "32");
}

}  // namespace
}  // namespace vramswap::detail
