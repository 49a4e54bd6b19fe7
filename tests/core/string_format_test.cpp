// string_format: the whole text, however long, for the reports that print names processes chose.
#include "core/string_format.hpp"

#include <gtest/gtest.h>

#include <string>

namespace vramswap::detail {
namespace {

TEST(StringFormat, ShortTextIsFormattedAsPrintfWould) {
  EXPECT_EQ(string_format("%s pid %d: %.1f%%", "job", 42, 12.34), "job pid 42: 12.3%");
  EXPECT_EQ(string_format("%s", ""), "");
}

TEST(StringFormat, TextLongerThanAnyFixedBufferComesBackWhole) {
  std::string name(5000, 'x');
  name.back() = 'y';  // the end shows a cut
  const std::string line = string_format("job=\"%s\" frames=%u", name.c_str(), 7u);
  EXPECT_EQ(line, "job=\"" + name + "\" frames=7");
}

TEST(StringFormat, TextOfExactlyTheInlineBufferSizeIsWhole) {
  for (size_t n : {254u, 255u, 256u, 257u}) {
    const std::string s(n, 'a');
    EXPECT_EQ(string_format("%s", s.c_str()), s) << n;
  }
}

}  // namespace
}  // namespace vramswap::detail
