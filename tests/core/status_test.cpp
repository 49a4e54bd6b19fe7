// The per-thread error detail: a failure records it, add_context prefixes it on failure
// only, and success never touches it (a hot path that wraps every call in add_context must
// not grow the text: see StreamAllocator.ManySuccessfulPairsLeaveTheErrorDetailAlone).
#include "core/status.hpp"

#include <gtest/gtest.h>

#include <string>
#include <thread>

namespace vramswap::detail {
namespace {

TEST(Status, AddContextPrefixesAFailure) {
  clear_error();
  const int rc = add_context(fail(err_io, "writing page 3"), "evict(device %d): ", 0);
  EXPECT_EQ(rc, err_io);
  EXPECT_STREQ(last_error(), "evict(device 0): writing page 3");
}

TEST(Status, SuccessLeavesTheDetailOfTheLastFailureUntouched) {
  fail(err_timeout, "the last failure");
  for (int i = 0; i < 100000; ++i) ASSERT_EQ(add_context(ok, "malloc_async(%d bytes): ", i), ok);
  EXPECT_STREQ(last_error(), "the last failure");
  clear_error();
  EXPECT_EQ(add_context(ok, "free_async: "), ok);
  EXPECT_STREQ(last_error(), "");
}

TEST(Status, EachThreadHasItsOwnDetail) {
  fail(err_busy, "main thread's");
  std::thread([] {
    EXPECT_STREQ(last_error(), "");
    fail(err_io, "worker's");
  }).join();
  EXPECT_STREQ(last_error(), "main thread's");
}

}  // namespace
}  // namespace vramswap::detail
