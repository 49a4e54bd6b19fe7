#include "core/options.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/status.hpp"

namespace vramswap {
namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t GiB = 1ull << 30;

TEST(ParseSize, AcceptsBinaryUnits) {
  uint64_t v = 0;
  ASSERT_EQ(parse_size("4096", &v, "x"), ok);
  EXPECT_EQ(v, 4096u);
  ASSERT_EQ(parse_size("32M", &v, "x"), ok);
  EXPECT_EQ(v, 32 * MiB);
  ASSERT_EQ(parse_size("32MiB", &v, "x"), ok);
  EXPECT_EQ(v, 32 * MiB);
  ASSERT_EQ(parse_size("1.5g", &v, "x"), ok);
  EXPECT_EQ(v, 3 * GiB / 2);
  ASSERT_EQ(parse_size("2KB", &v, "x"), ok);
  EXPECT_EQ(v, 2048u);
}

TEST(ParseSize, PercentNeedsABase) {
  uint64_t v = 0;
  ASSERT_EQ(parse_size("50%", &v, "x", 10 * GiB), ok);
  EXPECT_EQ(v, 5 * GiB);
  EXPECT_EQ(parse_size("50%", &v, "VRAMSWAP_FRAME_SIZE"), err_invalid_argument);
  EXPECT_NE(std::string(last_error()).find("VRAMSWAP_FRAME_SIZE"), std::string::npos) << last_error();
}

TEST(ParseSize, RejectsGarbageAndNamesIt) {
  uint64_t v = 77;
  for (const char* bad : {"", "abc", "-1", "12Q", "1.5", "3 MiBs", "nan", "inf"}) {
    EXPECT_EQ(parse_size(bad, &v, "VRAMSWAP_TEST"), err_invalid_argument) << bad;
    EXPECT_NE(std::string(last_error()).find("VRAMSWAP_TEST"), std::string::npos) << last_error();
    EXPECT_EQ(v, 77u) << "a failed parse must not write its output";
  }
}

TEST(Options, OverrideBeatsEnvironmentBeatsDefault) {
  ::unsetenv("VRAMSWAP_FRAME_SIZE");
  option_set(option_id::frame_size, nullptr);
  EXPECT_TRUE(option_is_default(option_id::frame_size));
  EXPECT_EQ(option_text(option_id::frame_size), "32MiB");
  ::setenv("VRAMSWAP_FRAME_SIZE", "64M", 1);
  EXPECT_EQ(option_text(option_id::frame_size), "64M");
  option_set(option_id::frame_size, "2M");
  uint64_t v = 0;
  ASSERT_EQ(option_size(option_id::frame_size, &v), ok);
  EXPECT_EQ(v, 2 * MiB);
  option_set(option_id::frame_size, nullptr);
  ::unsetenv("VRAMSWAP_FRAME_SIZE");
}

TEST(Options, UintRangeIsChecked) {
  option_set(option_id::host_devices, "0");
  uint64_t v = 0;
  EXPECT_EQ(option_uint(option_id::host_devices, &v, 1, 64), err_invalid_argument);
  EXPECT_NE(std::string(last_error()).find("VRAMSWAP_HOST_DEVICES"), std::string::npos);
  option_set(option_id::host_devices, "3x");
  EXPECT_EQ(option_uint(option_id::host_devices, &v, 1, 64), err_invalid_argument);
  option_set(option_id::host_devices, "3");
  ASSERT_EQ(option_uint(option_id::host_devices, &v, 1, 64), ok);
  EXPECT_EQ(v, 3u);
  option_set(option_id::host_devices, nullptr);
}

}  // namespace
}  // namespace vramswap
