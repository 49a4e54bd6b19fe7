// Description: the descriptors a pool member keeps for a next server (pool/kept_descriptors.hpp):
// kept above the select() range, closed in a forked child (which must not keep frames' memory
// alive), and given up whole when the descriptor limit runs out.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>

#include "pool/kept_descriptors.hpp"

namespace vramswap::detail {
namespace {

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

class KeptDescriptors : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::pipe2(pipe_, O_CLOEXEC), 0);
    // Room above the select() range, as a pool member asks for (pool_connection).
    rlimit lim{};
    ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &lim), 0);
    if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < 2048) GTEST_SKIP() << "skipped: RLIMIT_NOFILE's hard limit is " << lim.rlim_max;
    if (lim.rlim_cur < 2048) {
      lim.rlim_cur = 2048;
      ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lim), 0);
    }
  }
  void TearDown() override {
    ::close(pipe_[0]);
    ::close(pipe_[1]);
  }
  int pipe_[2] = {-1, -1};
};

TEST_F(KeptDescriptors, AreKeptAboveTheSelectRangeAndClosedWithTheirOwner) {
  int kept = -1;
  {
    kept_descriptors k;
    ASSERT_TRUE(k.keep(pipe_[0]));
    ASSERT_TRUE(k.keep(pipe_[1]));
    ASSERT_EQ(k.fds().size(), 2u);
    EXPECT_TRUE(k.complete());
    kept = k.fds()[0];
    EXPECT_GE(kept, kept_descriptors::k_base);
    EXPECT_GE(k.fds()[1], kept_descriptors::k_base);
    EXPECT_TRUE(::fcntl(kept, F_GETFD) & FD_CLOEXEC) << "an exec'd program must not inherit them";
    EXPECT_TRUE(is_open(pipe_[0])) << "the caller's descriptor stays the caller's";
  }
  EXPECT_FALSE(is_open(kept)) << "closed with their owner";
}

TEST_F(KeptDescriptors, AForkedChildDoesNotHoldThem) {
  kept_descriptors k;
  ASSERT_TRUE(k.keep(pipe_[1]));
  const int kept = k.fds()[0];
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // A DataLoader worker, say: none of the member's descriptors, nor a later keep.
    const bool closed = !is_open(kept) && errno == EBADF && k.fds().empty() && !k.complete() && !k.keep(pipe_[0]);
    ::_exit(closed ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child still held a kept descriptor (status " << status << ")";
  EXPECT_TRUE(is_open(kept)) << "the parent keeps its own";
  EXPECT_EQ(k.fds().size(), 1u);
}

TEST_F(KeptDescriptors, AreGivenUpWholeWhenTheLimitRunsOut) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    kept_descriptors k;
    int ok_keeps = 0;
    // Room for a few more descriptors, then none: keeping fails, and what was kept goes.
    rlimit lim{};
    ::getrlimit(RLIMIT_NOFILE, &lim);
    int highest = 0;
    for (int fd = 0; fd < 4096; ++fd) {
      if (is_open(fd)) highest = fd;
    }
    lim.rlim_cur = lim.rlim_max = static_cast<rlim_t>(highest + 4);
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) ::_exit(2);
    while (k.keep(pipe_[0])) ++ok_keeps;
    const int why = errno;
    const bool gave_up = ok_keeps > 0 && k.fds().empty() && !k.complete() && why == EMFILE && !k.keep(pipe_[0]);
    ::_exit(gave_up ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

}  // namespace
}  // namespace vramswap::detail
