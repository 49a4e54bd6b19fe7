// unix_address: a socket path that fits, one that does not (refused by name, never cut),
// and "@name" abstract only where the caller allows it.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "core/status.hpp"
#include "core/unix_address.hpp"

namespace vramswap::detail {
namespace {

TEST(UnixAddress, APathIsCopiedWithItsNul) {
  sockaddr_un addr{};
  socklen_t len = 0;
  ASSERT_EQ(unix_address("/run/vramswap/host-0.sock", false, &addr, &len), ok) << last_error();
  EXPECT_EQ(addr.sun_family, AF_UNIX);
  EXPECT_STREQ(addr.sun_path, "/run/vramswap/host-0.sock");
  EXPECT_EQ(len, offsetof(sockaddr_un, sun_path) + std::strlen("/run/vramswap/host-0.sock") + 1);
}

TEST(UnixAddress, APathTooLongIsRefusedByName) {
  sockaddr_un addr{};
  socklen_t len = 0;
  const std::string fits = "/" + std::string(sizeof addr.sun_path - 2, 'a');  // 107 bytes and the NUL
  EXPECT_EQ(unix_address(fits, false, &addr, &len), ok) << last_error();
  const std::string too_long = fits + "b";
  EXPECT_EQ(unix_address(too_long, false, &addr, &len), err_invalid_argument);
  EXPECT_NE(std::string(last_error()).find("socket path " + too_long + " is longer than 107 bytes"), std::string::npos)
      << last_error();
  EXPECT_EQ(unix_address("", false, &addr, &len), err_invalid_argument);
}

TEST(UnixAddress, AnAtNameIsAbstractOnlyWhereAllowed) {
  sockaddr_un addr{};
  socklen_t len = 0;
  ASSERT_EQ(unix_address("@vramswap-test", true, &addr, &len), ok) << last_error();
  EXPECT_EQ(addr.sun_path[0], '\0');
  EXPECT_EQ(std::string(addr.sun_path + 1, 13), "vramswap-test");
  EXPECT_EQ(len, offsetof(sockaddr_un, sun_path) + std::strlen("@vramswap-test")) << "an abstract name has no NUL";
  ASSERT_EQ(unix_address("@vramswap-test", false, &addr, &len), ok) << last_error();
  EXPECT_STREQ(addr.sun_path, "@vramswap-test") << "without allow_abstract it is a relative path";
  const std::string longest = "@" + std::string(sizeof addr.sun_path - 1, 'x');  // fills sun_path, no NUL
  EXPECT_EQ(unix_address(longest, true, &addr, &len), ok) << last_error();
  EXPECT_EQ(unix_address(longest + "x", true, &addr, &len), err_invalid_argument);
}

}  // namespace
}  // namespace vramswap::detail
