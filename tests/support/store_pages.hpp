// Pages written into and read back out of a page store as the pager does (a slot, then its
// bytes), with random bytes that show a loss, a stale copy or a misplaced page.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

#include "core/page_store.hpp"
#include "core/status.hpp"
#include "support/random_bytes.hpp"

namespace vramswap::detail::test {

// Writes page `key` (`size` bytes of fill_random(seed)) into `s`; the store's status.
inline int put_page(page_store& s, uint64_t key, size_t size, uint64_t seed) {
  void* slot = nullptr;
  const int rc = s.slot_for_write(key, size, &slot);
  if (rc == ok) fill_random(slot, size, seed);
  return rc;
}

// Page `key` comes back from `s` as fill_random(seed) wrote it.
inline ::testing::AssertionResult page_reads_back(page_store& s, uint64_t key, size_t size, uint64_t seed) {
  void* slot = nullptr;
  if (s.slot_for_read(key, &slot) != ok) return ::testing::AssertionFailure() << "page " << key << ": " << last_error();
  const size_t at = first_mismatch(slot, size, seed);
  s.read_done(key);
  if (at != size) return ::testing::AssertionFailure() << "page " << key << " differs at byte " << at;
  return ::testing::AssertionSuccess();
}

}  // namespace vramswap::detail::test
