// Description: where a TCP port is listened on, from /proc/net/tcp and tcp6
// (pool/listen_address.hpp), with real listening sockets on loopback addresses; and the
// kernel's format for an address no test can bind.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "pool/listen_address.hpp"

namespace vramswap::detail {
namespace {

// A socket listening on `address` (IPv4 or IPv6 literal), any free port; -1 when this
// machine cannot bind it (no IPv6, say). *port: the port it got.
int listen_on(const char* address, uint16_t* port) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  int family = AF_INET;
  if (inet_pton(AF_INET, address, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr) == 1) {
    reinterpret_cast<sockaddr_in*>(&ss)->sin_family = AF_INET;
    len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, address, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr) == 1) {
    family = AF_INET6;
    reinterpret_cast<sockaddr_in6*>(&ss)->sin6_family = AF_INET6;
    len = sizeof(sockaddr_in6);
  } else {
    return -1;
  }
  const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int one = 1;
  if (family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd, 1) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    ::close(fd);
    return -1;
  }
  *port = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return fd;
}

TEST(ListenAddress, NamesTheAddressARealListenerBound) {
  uint16_t port = 0;
  const int fd = listen_on("127.0.0.2", &port);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  EXPECT_EQ(listening_host(port), "127.0.0.2");
  ::close(fd);
  EXPECT_EQ(listening_host(port), "") << "nobody listens there any more";
}

TEST(ListenAddress, AWildcardBindIsReachedOnLoopback) {
  uint16_t port = 0;
  const int fd = listen_on("0.0.0.0", &port);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  EXPECT_EQ(listening_host(port), "127.0.0.1");
  ::close(fd);
}

TEST(ListenAddress, IPv6ListenersAreBracketed) {
  uint16_t port = 0;
  const int fd = listen_on("::1", &port);
  if (fd < 0) GTEST_SKIP() << "skipped: this machine cannot bind ::1 (no IPv6 loopback): " << std::strerror(errno);
  EXPECT_EQ(listening_host(port), "[::1]");
  ::close(fd);
  const int any = listen_on("::", &port);
  ASSERT_GE(any, 0) << std::strerror(errno);
  EXPECT_EQ(listening_host(port), "[::1]") << "a wildcard bind is reached on loopback";
  ::close(any);
}

// Lines as the kernel writes them (the address words in memory order, read natively: on a
// little-endian machine 127.0.0.2 is 0200007F), for an address no test can bind, and a
// connection on the same port that is not a listener.
TEST(ListenAddress, ReadsTheKernelsFormat) {
  const uint32_t v4 = htonl(0x0A000005);  // 10.0.0.5
  in6_addr v6{};
  ASSERT_EQ(inet_pton(AF_INET6, "fd00::5", &v6), 1);
  uint32_t words[4];
  std::memcpy(words, v6.s6_addr, sizeof words);
  char tcp[512];
  std::snprintf(tcp, sizeof tcp,
                "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
                "   0: %08X:2382 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 1 1\n"
                "   1: %08X:2382 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1\n",
                0x0100007Fu, v4);
  EXPECT_EQ(listening_host_in(tcp, false, 0x2382), "10.0.0.5");
  EXPECT_EQ(listening_host_in(tcp, false, 0x2383), "");
  char tcp6[512];
  std::snprintf(tcp6, sizeof tcp6,
                "  sl  local_address                         remote_address                        st\n"
                "   0: %08X%08X%08X%08X:1F90 00000000000000000000000000000000:0000 0A 0:0 0:0 0 0 0 3 1\n",
                words[0], words[1], words[2], words[3]);
  EXPECT_EQ(listening_host_in(tcp6, true, 0x1F90), "[fd00::5]");
  EXPECT_EQ(listening_host_in("garbage\nnot a table\n", false, 80), "");
}

}  // namespace
}  // namespace vramswap::detail
