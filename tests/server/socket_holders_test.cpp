// Description: finding the processes that hold the other end of a Unix socket connection
// (server/socket_holders.hpp), with real processes: a child forked with one end of a pair,
// its parent's copy closed, is found; once it exits, nobody is (the kernel still names the
// closed peer's inode, and no process holds it).
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/socket_holders.hpp"

namespace vramswap::detail {
namespace {

TEST(SocketHolders, FindsTheForkedChildThatHoldsThePeerAndNobodyOnceItIsGone) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
  uint64_t peer = 0;
  std::string why;
  if (!peer_socket_inode(pair[0], &peer, &why)) GTEST_SKIP() << "skipped: this kernel has no Unix socket diagnostics: " << why;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pair[0]);
    for (;;) ::pause();
  }
  ::close(pair[1]);  // the child's copy is the only one now
  EXPECT_EQ(processes_holding_socket(peer), std::vector<pid_t>{child});
  const std::string named = describe_processes({child});
  EXPECT_NE(named.find("pid " + std::to_string(child) + " ("), std::string::npos) << named;

  ::kill(child, SIGKILL);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  EXPECT_TRUE(processes_holding_socket(peer).empty());
  ::close(pair[0]);
}

TEST(SocketHolders, ANonSocketIsRefusedWithAReason) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  uint64_t peer = 0;
  std::string why;
  EXPECT_FALSE(peer_socket_inode(p[0], &peer, &why));
  EXPECT_FALSE(why.empty());
  ::close(p[0]);
  ::close(p[1]);
}

}  // namespace
}  // namespace vramswap::detail
