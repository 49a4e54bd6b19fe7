// Liveness leases (lock/liveness_lease.hpp): held while the owner lives, gone the moment it
// is killed, never kept alive by a forked child, invisible to the description that holds
// them (which is why owners keep lease_set). Real processes,
// real SIGKILLs, a real file.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "core/status.hpp"
#include "lock/liveness_lease.hpp"

namespace vramswap::detail {
namespace {

class LivenessLease : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = "/tmp/vramswap-lease-test-" + std::to_string(::getpid());
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(fd_, 0) << path_;
    ASSERT_EQ(::pipe(ready_), 0);
  }
  void TearDown() override {
    ::close(fd_);
    ::close(ready_[0]);
    ::close(ready_[1]);
    ::unlink(path_.c_str());
  }
  // Is lease `i` held by anyone, as a process with its own description of the file sees it?
  bool held(uint32_t i) const {
    const int other = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
    const bool h = lease_held_elsewhere(other, i);
    ::close(other);
    return h;
  }
  void wait_ready() const {
    char c = 0;
    ASSERT_EQ(::read(ready_[0], &c, 1), 1) << "the child never said it was ready";
  }
  static void reap(pid_t pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
  }

  std::string path_;
  int fd_ = -1;
  int ready_[2] = {-1, -1};
};

TEST_F(LivenessLease, HeldWhileItsOwnerLivesAndGoneOnceItIsKilled) {
  const pid_t owner = ::fork();
  ASSERT_GE(owner, 0);
  if (owner == 0) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0 || take_lease(fd, 7, "the test") != ok) ::_exit(1);
    (void)!::write(ready_[1], "r", 1);
    for (;;) ::pause();
  }
  wait_ready();
  EXPECT_TRUE(held(7)) << "the live owner's lease";
  EXPECT_FALSE(held(8)) << "a lease nobody took";
  EXPECT_EQ(take_lease(fd_, 7, "the test"), err_busy) << "a held lease cannot be taken by another description";
  ASSERT_EQ(::kill(owner, SIGKILL), 0);
  reap(owner);
  EXPECT_FALSE(held(7)) << "the kernel drops a killed owner's lease";
  EXPECT_EQ(take_lease(fd_, 7, "the test"), ok) << "and the slot's lease can be taken again";
}

TEST_F(LivenessLease, AForkedChildDoesNotKeepItsParentsLease) {
  // The owner maps the file, as a segment's user does (a mapping holds a reference to the
  // description it was made from, and a child inherits it), leases on a description of its
  // own, forks a child that lives on, and is killed. The lease must go with the owner.
  int child_pid_pipe[2];
  ASSERT_EQ(::pipe(child_pid_pipe), 0);
  const pid_t owner = ::fork();
  ASSERT_GE(owner, 0);
  if (owner == 0) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, 4096) != 0) ::_exit(1);
    void* map = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int lease = -1;
    if (map == MAP_FAILED || open_lease_description(fd, "the test", &lease) != ok || take_lease(lease, 3, "the test") != ok ||
        register_lease_fd(lease) != ok) {
      ::_exit(1);
    }
    const pid_t child = ::fork();
    if (child == 0) {
      for (;;) ::pause();
    }
    (void)!::write(child_pid_pipe[1], &child, sizeof child);
    (void)!::write(ready_[1], "r", 1);
    for (;;) ::pause();
  }
  wait_ready();
  pid_t child = 0;
  ASSERT_EQ(::read(child_pid_pipe[0], &child, sizeof child), static_cast<ssize_t>(sizeof child));
  EXPECT_TRUE(held(3));
  ASSERT_EQ(::kill(owner, SIGKILL), 0);
  reap(owner);
  EXPECT_EQ(::kill(child, 0), 0) << "the owner's child still runs, with the owner's mapping";
  // The child's copy of the lease's descriptor is closed by its pthread_atfork handler, which
  // runs when the child is first scheduled: on a loaded machine that can be after the owner
  // was killed. The lease must go then, within moments, not when the child ends.
  bool still_held = held(3);
  for (int i = 0; i < 1000 && still_held; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    still_held = held(3);
  }
  EXPECT_FALSE(still_held) << "a forked child that outlives its parent must not keep the parent's lease";
  ::kill(child, SIGKILL);
  for (int i = 0; i < 200 && ::kill(child, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::close(child_pid_pipe[0]);
  ::close(child_pid_pipe[1]);
}

TEST_F(LivenessLease, TheHoldingDescriptionSeesItsOwnLeaseAsFree) {
  // The kernel's rule that lease_set exists for: a description's own locks never conflict
  // with it, so it cannot test its own leases.
  ASSERT_EQ(take_lease(fd_, 5, "the test"), ok);
  EXPECT_FALSE(lease_held_elsewhere(fd_, 5)) << "its own lease reads as free to the holding description";
  EXPECT_TRUE(held(5)) << "and as held to any other";
  drop_lease(fd_, 5);
  EXPECT_FALSE(held(5)) << "a dropped lease is free";
  lease_set<256> mine;
  mine.add(200);
  EXPECT_TRUE(mine.has(200));
  EXPECT_FALSE(mine.has(199));
  mine.remove(200);
  EXPECT_FALSE(mine.has(200));
}

}  // namespace
}  // namespace vramswap::detail
