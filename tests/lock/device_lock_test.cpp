// Description: device_lock API in one process (plus forked children where ownership across
// fork is the point): acquire/release, re-entry, try and timed acquire, bad input, and
// segments that are corrupt, truncated, of another version or half-initialized.
#include "lock/device_lock.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <thread>

#include "core/options.hpp"
#include "lock/segment_layout.hpp"
#include "lock/shared_segment.hpp"
#include "lock_test_support.hpp"

namespace vramswap::detail::lock_test {
namespace {

using namespace std::chrono_literals;

class DeviceLock : public lock_fixture {};

TEST_F(DeviceLock, AcquireReleaseAndHeld) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok) << last_error();
  EXPECT_FALSE(lock.held());
  acquire_info info;
  ASSERT_EQ(lock.acquire(lock_priority::normal, -1, &info), ok) << last_error();
  EXPECT_TRUE(lock.held());
  EXPECT_FALSE(info.previous_holder_died);
  EXPECT_FALSE(info.reentered);
  std::vector<lock_queue_entry> q;
  ASSERT_EQ(lock.snapshot(&q), ok);
  ASSERT_EQ(q.size(), 1u);
  EXPECT_TRUE(q[0].holding);
  EXPECT_EQ(q[0].pid, ::getpid());
  ASSERT_EQ(lock.release(), ok) << last_error();
  EXPECT_FALSE(lock.held());
  ASSERT_EQ(lock.snapshot(&q), ok);
  EXPECT_TRUE(q.empty());
}

TEST_F(DeviceLock, SegmentIsPrivateToTheUser) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok) << last_error();
  struct stat st {};
  ASSERT_EQ(::stat(segment_path().c_str(), &st), 0) << segment_path();
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(DeviceLock, GroupOptionGivesGroupAccess) {
  option_set(option_id::group, std::to_string(::getegid()).c_str());
  device_lock lock;
  const int rc = device_lock::open(key_, &lock);
  const std::string path = segment_path();  // the group's name ("vramswap-g<gid>-...")
  struct stat st {};
  const int src = ::stat(path.c_str(), &st);
  device_lock::remove(key_);
  option_set(option_id::group, nullptr);
  ASSERT_EQ(rc, ok) << last_error();
  EXPECT_NE(path.find("vramswap-g" + std::to_string(::getegid()) + "-"), std::string::npos) << path;
  ASSERT_EQ(src, 0) << path;
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, ::getegid());
}

TEST_F(DeviceLock, UnknownGroupIsRejectedByName) {
  option_set(option_id::group, "no-such-group-vramswap");
  device_lock lock;
  EXPECT_EQ(device_lock::open(key_, &lock), err_invalid_argument);
  EXPECT_NE(std::string(last_error()).find("VRAMSWAP_GROUP"), std::string::npos) << last_error();
  option_set(option_id::group, nullptr);
}

TEST_F(DeviceLock, ReentryIsCounted) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  ASSERT_EQ(lock.acquire(), ok);
  acquire_info info;
  ASSERT_EQ(lock.acquire(lock_priority::high, 0, &info), ok);
  EXPECT_TRUE(info.reentered);
  ASSERT_EQ(lock.release(), ok);
  EXPECT_TRUE(lock.held()) << "the first release of two acquires must keep the lock";
  // Another thread still cannot get it.
  int other = 1;
  std::thread([&] { other = lock.try_acquire(); }).join();
  EXPECT_EQ(other, err_busy);
  ASSERT_EQ(lock.release(), ok);
  EXPECT_FALSE(lock.held());
  std::thread([&] {
    other = lock.try_acquire();
    if (other == ok) lock.release();
  }).join();
  EXPECT_EQ(other, ok);
}

TEST_F(DeviceLock, ReleaseWithoutAcquireAndDoubleReleaseAreErrors) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  EXPECT_EQ(lock.release(), err_not_owner);
  EXPECT_NE(std::string(last_error()).find("does not hold"), std::string::npos) << last_error();
  ASSERT_EQ(lock.acquire(), ok);
  ASSERT_EQ(lock.release(), ok);
  EXPECT_EQ(lock.release(), err_not_owner);
  // Nothing was broken: the lock still works.
  ASSERT_EQ(lock.try_acquire(), ok);
  ASSERT_EQ(lock.release(), ok);
}

TEST_F(DeviceLock, ReleaseByAnotherThreadIsAnError) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  ASSERT_EQ(lock.acquire(), ok);
  int rc = 0;
  std::thread([&] { rc = lock.release(); }).join();
  EXPECT_EQ(rc, err_not_owner);
  EXPECT_TRUE(lock.held());
  ASSERT_EQ(lock.release(), ok);
}

TEST_F(DeviceLock, ThreadsSharingOneObjectAreMutuallyExclusive) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  constexpr int k_threads = 4, k_increments = 3000;
  volatile uint64_t counter = 0;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < k_threads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < k_increments; ++i) {
        if (lock.acquire() != ok) failures.fetch_add(1);
        counter = counter + 1;
        if (lock.release() != ok) failures.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0) << last_error();
  EXPECT_EQ(counter, uint64_t{k_threads} * k_increments);
}

TEST_F(DeviceLock, TryAndTimedAcquireWhileHeld) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  ASSERT_EQ(lock.acquire(), ok);
  int try_rc = 0, timed_rc = 0;
  uint64_t waited = 0;
  std::thread([&] {
    try_rc = lock.try_acquire();
    const uint64_t t0 = monotonic_ns();
    timed_rc = lock.acquire(lock_priority::normal, 50'000'000);
    waited = monotonic_ns() - t0;
  }).join();
  EXPECT_EQ(try_rc, err_busy);
  EXPECT_EQ(timed_rc, err_timeout);
  EXPECT_GE(waited, 50'000'000u);
  EXPECT_LT(waited, 1'000'000'000u);
  std::vector<lock_queue_entry> q;
  ASSERT_EQ(lock.snapshot(&q), ok);
  EXPECT_EQ(q.size(), 1u) << "a timed-out waiter must leave the queue";
  ASSERT_EQ(lock.release(), ok);
}

TEST_F(DeviceLock, TimedAcquireSucceedsWhenReleasedInTime) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  ASSERT_EQ(lock.acquire(), ok);
  int rc = 1;
  std::thread waiter([&] {
    rc = lock.acquire(lock_priority::normal, 5'000'000'000);
    if (rc == ok) lock.release();
  });
  ASSERT_TRUE(wait_for_queue(lock, [](const auto& q) { return queue_has_waiters(q, 1); }));
  ASSERT_EQ(lock.release(), ok);
  waiter.join();
  EXPECT_EQ(rc, ok) << last_error();
}

// The heads-up before a release wakes the next waiter but grants nothing: the holder keeps
// the lock until it releases, and a non-holder's heads-up does nothing.
TEST_F(DeviceLock, AnnounceReleaseGrantsNothing) {
  device_lock holder, other;
  ASSERT_EQ(device_lock::open(key_, &holder), ok);
  ASSERT_EQ(device_lock::open(key_, &other), ok);
  other.announce_release();  // not held by anyone: nothing to do
  ASSERT_EQ(holder.acquire(), ok);
  std::atomic<bool> granted{false};
  int rc = 1;
  std::thread waiter([&] {
    rc = other.acquire();
    granted.store(true);
    if (rc == ok) other.release();
  });
  ASSERT_TRUE(wait_for_queue(holder, [](const auto& q) { return queue_has_waiters(q, 1); }));
  for (int i = 0; i < 3; ++i) {
    holder.announce_release();
    other.announce_release();  // this thread does not hold `other`'s lock: a no-op
    std::this_thread::sleep_for(5ms);  // past the waiter's spin
  }
  EXPECT_FALSE(granted.load()) << "a heads-up must not hand the lock on";
  EXPECT_TRUE(holder.held());
  std::vector<lock_queue_entry> q;
  ASSERT_EQ(holder.snapshot(&q), ok);
  ASSERT_EQ(q.size(), 2u);
  EXPECT_TRUE(q[0].holding);
  EXPECT_FALSE(q[1].holding);
  ASSERT_EQ(holder.release(), ok);
  waiter.join();
  EXPECT_EQ(rc, ok) << last_error();
  EXPECT_TRUE(granted.load());
}

// The hold-time hints that let the next waiter predict a regular holder's release: after
// regular holds, the mean is near the hold time and the jitter under it (the bound is loose:
// a loaded CI machine oversleeps). The decision itself is device_lock::holds().predictable.
TEST_F(DeviceLock, RegularHoldsAreMeasured) {
  device_lock a, b;
  ASSERT_EQ(device_lock::open(key_, &a), ok);
  ASSERT_EQ(device_lock::open(key_, &b), ok);
  EXPECT_EQ(a.holds().mean_ns, 0u) << "no release yet";
  EXPECT_FALSE(a.holds().predictable);
  auto turns = [](device_lock* l, int* failures) {
    for (int i = 0; i < 12; ++i) {
      if (l->acquire() != ok) ++*failures;
      std::this_thread::sleep_for(20ms);
      if (l->release() != ok) ++*failures;
    }
  };
  int fa = 0, fb = 0;
  std::thread ta(turns, &a, &fa), tb(turns, &b, &fb);
  ta.join();
  tb.join();
  EXPECT_EQ(fa + fb, 0) << last_error();
  const device_lock::hold_stats h = b.holds();
  EXPECT_GE(h.mean_ns, 19'000'000u);
  EXPECT_LT(h.mean_ns, 1'000'000'000u);
  EXPECT_LT(h.jitter_ns, h.mean_ns) << "24 holds of 20 ms (mean " << h.mean_ns << " ns)";
  EXPECT_EQ(h.predictable, h.jitter_ns * 2 <= h.mean_ns);
}

TEST_F(DeviceLock, BadArgumentsAreRejected) {
  device_lock closed;
  EXPECT_EQ(closed.acquire(), err_invalid_argument);
  EXPECT_EQ(closed.release(), err_not_owner);
  EXPECT_FALSE(closed.held());
  device_lock lock;
  EXPECT_EQ(device_lock::open("", &lock), err_invalid_argument);
  EXPECT_EQ(device_lock::open("../etc/passwd", &lock), err_invalid_argument);
  EXPECT_NE(std::string(last_error()).find("'/'"), std::string::npos) << last_error();
  EXPECT_EQ(device_lock::open(key_, nullptr), err_invalid_argument);
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  EXPECT_EQ(lock.acquire(static_cast<lock_priority>(7)), err_invalid_argument);
  EXPECT_EQ(lock.acquire(lock_priority::normal, -5), err_invalid_argument);
  EXPECT_FALSE(lock.held());
}

TEST_F(DeviceLock, ForkedChildDoesNotInheritTheLock) {
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok);
  ASSERT_EQ(lock.acquire(), ok);
  const pid_t child = spawn([&] {
    if (lock.held()) return 1;
    if (lock.release() != err_not_owner) return 2;
    if (std::string(last_error()).find("forked child") == std::string::npos) return 3;
    if (lock.try_acquire() != err_busy) return 4;  // the parent still holds it
    return 0;
  });
  EXPECT_EQ(reap(child), 0);
  EXPECT_TRUE(lock.held());
  ASSERT_EQ(lock.release(), ok);
}

// Write into the header of an existing segment, as a different build or a stray writer would.
void poke_header(const std::string& path, size_t offset, uint64_t value) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, &value, sizeof value, static_cast<off_t>(offset)), static_cast<ssize_t>(sizeof value));
  ::close(fd);
}

TEST_F(DeviceLock, CorruptMagicIsRefused) {
  device_lock user;  // keeps the segment (its last user to close removes it)
  ASSERT_EQ(device_lock::open(key_, &user), ok);
  poke_header(segment_path(), offsetof(lock_layout::segment_header, magic), 0x1234567812345678ull);
  device_lock lock;
  EXPECT_EQ(device_lock::open(key_, &lock), err_version_mismatch);
  EXPECT_NE(std::string(last_error()).find("not a vramswap segment"), std::string::npos) << last_error();
  EXPECT_EQ(lock.acquire(), err_invalid_argument) << "a refused open leaves the lock closed";
}

TEST_F(DeviceLock, OldVersionIsRefusedWithBothVersions) {
  device_lock user;  // keeps the segment (its last user to close removes it)
  ASSERT_EQ(device_lock::open(key_, &user), ok);
  const uint64_t old_format = (lock_layout::format_word() & ((1ull << 48) - 1)) | (0ull << 48);
  poke_header(segment_path(), offsetof(lock_layout::segment_header, format), old_format);
  device_lock lock;
  EXPECT_EQ(device_lock::open(key_, &lock), err_version_mismatch);
  EXPECT_NE(std::string(last_error()).find("version 0"), std::string::npos) << last_error();
  const std::string ours = "version " + std::to_string(lock_layout::k_layout_version);
  EXPECT_NE(std::string(last_error()).find(ours), std::string::npos) << last_error();
  EXPECT_NE(std::string(last_error()).find("a process uses it now"), std::string::npos) << last_error();
}

// The segment of an older build whose every user died (SIGKILL at a pod's end, then an
// upgrade): nobody uses it, so the new build makes it anew instead of refusing every job on
// the device. The same for one that is corrupt or cut short.
TEST_F(DeviceLock, ASegmentOfAnotherBuildThatNobodyUsesIsMadeAnew) {
  const uint64_t old_format = (lock_layout::format_word() & ((1ull << 48) - 1)) | (0ull << 48);
  const struct {
    const char* what;
    size_t offset;  // of a header word poked (SIZE_MAX: the file is cut to 16 bytes instead)
    uint64_t value;
  } leftovers[] = {
      {"an older layout version", offsetof(lock_layout::segment_header, format), old_format},
      {"a corrupt magic number", offsetof(lock_layout::segment_header, magic), 0x1234567812345678ull},
      {"a file cut short", SIZE_MAX, 0},
  };
  for (const auto& left : leftovers) {
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t user = spawn([&] {  // the old build's last user, killed while it has it open
      device_lock lock;
      if (device_lock::open(key_, &lock) != ok) return 1;
      if (::write(ready[1], "r", 1) != 1) return 2;
      for (;;) ::pause();
    });
    char c = 0;
    ASSERT_EQ(::read(ready[0], &c, 1), 1) << left.what;
    ::close(ready[0]);
    ::close(ready[1]);
    if (left.offset == SIZE_MAX) {
      ASSERT_EQ(::truncate(segment_path().c_str(), 16), 0);
    } else {
      poke_header(segment_path(), left.offset, left.value);
    }
    ::kill(user, SIGKILL);
    reap(user);
    device_lock lock;
    ASSERT_EQ(device_lock::open(key_, &lock), ok) << left.what << ": " << last_error();
    ASSERT_EQ(lock.acquire(), ok) << left.what << ": " << last_error();
    ASSERT_EQ(lock.release(), ok) << left.what << ": " << last_error();
  }
}

TEST_F(DeviceLock, TruncatedSegmentIsRefused) {
  device_lock user;  // keeps the segment (its last user to close removes it)
  ASSERT_EQ(device_lock::open(key_, &user), ok);
  ASSERT_EQ(::truncate(segment_path().c_str(), 16), 0);
  device_lock lock;
  EXPECT_EQ(device_lock::open(key_, &lock), err_version_mismatch);
  EXPECT_NE(std::string(last_error()).find("too small"), std::string::npos) << last_error();
}

// The runtime dir's file system is full (a container's 64 MB /dev/shm that a data loader's
// workers filled): the open fails, naming the segment and saying what to do, instead of
// the process dying of SIGBUS on the segment's first page (a tmpfs gives pages as they are
// touched). A tmpfs of 64 KiB, filled, in a mount namespace of the child's own.
TEST_F(DeviceLock, AFullRuntimeDirFailsTheOpenClearlyInsteadOfKillingTheProcess) {
  if (::geteuid() != 0) GTEST_SKIP() << "skipped: mounting a small tmpfs needs root";
  const pid_t child = spawn([&] {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 10;
    const std::string dir = "/tmp/vramswap-full-" + std::to_string(::getpid());
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return 11;
    if (::mount("full", dir.c_str(), "tmpfs", 0, "size=64k,mode=0700") != 0) return 12;
    const int fill = ::open((dir + "/filler").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    if (fill < 0) return 13;
    static char block[4096];
    while (::write(fill, block, sizeof block) > 0) {
    }
    ::close(fill);
    option_set(option_id::runtime_dir, (dir + "/rt").c_str());
    device_lock lock;
    const int rc = device_lock::open(key_, &lock);
    if (rc == ok) return 14;
    const std::string why = last_error();
    std::fprintf(stderr, "%s\n", why.c_str());
    return why.find("file system is full") != std::string::npos && why.find("VRAMSWAP_RUNTIME_DIR") != std::string::npos ? 0 : 15;
  });
  EXPECT_EQ(reap(child), 0) << "0: refused, saying why; 135 or 128 + 7: killed by SIGBUS";
  ::rmdir(("/tmp/vramswap-full-" + std::to_string(child)).c_str());  // the mount point (the mount went with the child)
}

// Truncated below its size with the header intact (a stray `truncate`): refused by name on
// open, never mapped past its end (which would be SIGBUS).
TEST_F(DeviceLock, SegmentTruncatedBelowItsSizeIsRefused) {
  device_lock user;
  ASSERT_EQ(device_lock::open(key_, &user), ok);
  const size_t half = lock_layout::k_segment_size / 2;
  ASSERT_EQ(::truncate(segment_path().c_str(), static_cast<off_t>(half)), 0);
  device_lock lock;
  EXPECT_EQ(device_lock::open(key_, &lock), err_version_mismatch);
  EXPECT_NE(std::string(last_error()).find("is " + std::to_string(half) + " bytes but its header says " +
                                           std::to_string(lock_layout::k_segment_size)),
            std::string::npos)
      << last_error();
  EXPECT_NE(std::string(last_error()).find(segment_path()), std::string::npos) << last_error();
}

TEST_F(DeviceLock, HalfInitializedSegmentIsRebuilt) {
  // A creator killed before publishing the magic leaves magic 0: the next opener rebuilds.
  device_lock user;  // keeps the segment (its last user to close removes it)
  ASSERT_EQ(device_lock::open(key_, &user), ok);
  poke_header(segment_path(), offsetof(lock_layout::segment_header, magic), 0);
  device_lock lock;
  ASSERT_EQ(device_lock::open(key_, &lock), ok) << last_error();
  ASSERT_EQ(lock.acquire(), ok);
  ASSERT_EQ(lock.release(), ok);
}

// Removal: the last user to close a segment removes it; a user that remains, in this process
// or another, keeps it; a process that forked since it opened it leaves it to others.
TEST_F(DeviceLock, LastUserRemovesTheSegment) {
  auto exists = [&] { return ::access(segment_path().c_str(), F_OK) == 0; };
  {
    device_lock a;
    device_lock b;
    ASSERT_EQ(device_lock::open(key_, &a), ok) << last_error();
    ASSERT_EQ(device_lock::open(key_, &b), ok) << last_error();
    ASSERT_EQ(a.acquire(), ok);
    a = device_lock();  // destroyed while held: released, then closed; b still uses it
    EXPECT_TRUE(exists());
    ASSERT_EQ(b.try_acquire(), ok) << "a closed lock was not released";
    ASSERT_EQ(b.release(), ok);
  }
  EXPECT_FALSE(exists()) << "the last user left the segment behind";

  // Another process that uses it keeps it; when it closes last, it removes it. (Forked before
  // this process opens its own, so that it shares no descriptor with it.)
  auto* step = shared_object<std::atomic<int>>();
  const pid_t child = spawn([&] {
    device_lock theirs;
    if (device_lock::open(key_, &theirs) != ok) return 1;
    step->store(1);
    while (step->load() != 2) std::this_thread::sleep_for(1ms);
    return 0;  // closes `theirs`: the last user now
  });
  for (int i = 0; i < 10'000 && step->load() != 1; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(step->load(), 1) << "the child did not open the lock";
  {
    device_lock mine;
    ASSERT_EQ(device_lock::open(key_, &mine), ok);
  }
  EXPECT_TRUE(exists()) << "removed while another process used it";
  step->store(2);
  EXPECT_EQ(reap(child), 0);
  EXPECT_FALSE(exists());

  // A process that forked after opening keeps it (the child shares its descriptor).
  {
    device_lock forked;
    ASSERT_EQ(device_lock::open(key_, &forked), ok);
    EXPECT_EQ(reap(spawn([] { return 0; })), 0);
  }
  EXPECT_TRUE(exists()) << "removed by a process whose forked child may still use it";
  free_shared_object(step);
}

// Mutual exclusion holds while users come and go and the segment is removed and made again
// under them: four processes open, take the lock, increment a shared counter non-atomically
// (read, yield, write), release and close, over and over.
TEST_F(DeviceLock, RemovalNeverMakesTwoLocks) {
  constexpr int k_procs = 4;
  constexpr int k_rounds = 400;
  auto* counter = shared_object<std::atomic<long>>();
  std::vector<pid_t> kids;
  for (int p = 0; p < k_procs; ++p) {
    kids.push_back(spawn([&, p] {
      for (int i = 0; i < k_rounds; ++i) {
        {
          device_lock l;
          if (device_lock::open(key_, &l) != ok || l.acquire() != ok) return 1;
          const long seen = counter->load(std::memory_order_relaxed);
          std::this_thread::yield();
          counter->store(seen + 1, std::memory_order_relaxed);
          if (l.release() != ok) return 2;
        }
        // Closed: now and then all are, and the segment goes (and is made again).
        if ((i + p) % 2 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      return 0;
    }));
  }
  for (pid_t k : kids) EXPECT_EQ(reap(k), 0);
  EXPECT_EQ(counter->load(), long{k_procs} * k_rounds) << "two processes held the lock at once";
  free_shared_object(counter);
}

}  // namespace
}  // namespace vramswap::detail::lock_test
