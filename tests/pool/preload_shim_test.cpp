// Which LD_PRELOAD entries are the shim, and what a spawned server keeps of the rest.
#include "pool/preload_shim.hpp"

#include <gtest/gtest.h>

namespace vramswap::detail {
namespace {

TEST(PreloadShim, IsRecognizedByFileNameWithOrWithoutADirectory) {
  EXPECT_TRUE(preloads_shim("libvramswap_preload.so"));
  EXPECT_TRUE(preloads_shim("/opt/vramswap/lib/libvramswap_preload.so"));
  EXPECT_TRUE(preloads_shim("libjemalloc.so.2 /x/libvramswap_preload.so"));
  EXPECT_TRUE(preloads_shim("libjemalloc.so.2:/x/libvramswap_preload.so:"));
  EXPECT_FALSE(preloads_shim(""));
  EXPECT_FALSE(preloads_shim("libjemalloc.so.2"));
  EXPECT_FALSE(preloads_shim("/x/libvramswap_preload.so.bak /x/not-libvramswap_preload.so"));
}

TEST(PreloadShim, TheRestOfLdPreloadIsKeptInOrder) {
  EXPECT_EQ(without_preload_shim("/x/libvramswap_preload.so"), "");
  EXPECT_EQ(without_preload_shim("a.so /x/libvramswap_preload.so b.so"), "a.so:b.so");
  EXPECT_EQ(without_preload_shim("a.so::libvramswap_preload.so:  b.so"), "a.so:b.so");
  EXPECT_EQ(without_preload_shim("a.so b.so"), "a.so:b.so");
}

}  // namespace
}  // namespace vramswap::detail
