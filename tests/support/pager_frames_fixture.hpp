// What the tests of the pager's frame-level moves (evict_frames, remap_pages) share: a pager
// over a fault layer (support/faulty_backend.hpp) on a real backend, a frame source that
// scrubs like a shared pool and keeps every frame given back for inspection, random bytes
// per page, and ways to see where every page is and whether a frame given back is zeroed.
//
// The test's own reads and writes go through the real backend, so that they neither count
// as calls of the operation under test nor meet an injected fault.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/frame_source.hpp"
#include "core/pager.hpp"
#include "core/status.hpp"
#include "support/backends.hpp"
#include "support/faulty_backend.hpp"
#include "support/random_bytes.hpp"
#include "swap/host_tier.hpp"

namespace vramswap::detail::test {

constexpr uint64_t k_fixture_page = 2ull << 20;

// Frames made on demand and zeroed before they are given back, as a shared pool's are. A
// frame given back is kept (not released) until the end, so that a test can look at what
// it holds, and so that no frame id is reused while a test still compares them.
class keeping_frames final : public frame_source {
 public:
  explicit keeping_frames(backend& be) : be_(be) {}
  ~keeping_frames() override {
    for (frame_id f : made_) be_.release_frame(f);
  }
  keeping_frames(const keeping_frames&) = delete;
  keeping_frames& operator=(const keeping_frames&) = delete;

  int take(int device, size_t size, frame_id* out) override { return make(device, size, frame_location::device, out); }
  int give_back(frame_id frame) override {
    given_back_.push_back(frame);
    return ok;
  }
  bool scrub_before_give_back(frame_id) const override { return true; }

  // A frame of the test's own (remap_pages' new frames), released at the end like the others.
  int make(int device, size_t size, frame_location where, frame_id* out) {
    VS_TRY(where == frame_location::host ? be_.create_host_frame(device, size, out) : be_.create_frame(device, size, out));
    made_.push_back(*out);
    return ok;
  }
  const std::vector<frame_id>& given_back() const { return given_back_; }

 private:
  backend& be_;
  std::vector<frame_id> made_;
  std::vector<frame_id> given_back_;
};

class PagerFramesTest : public ::testing::TestWithParam<backend_kind> {
 protected:
  static constexpr uint64_t k_pages = 10;

  void SetUp() override {
    std::string why;
    real = shared_backend(GetParam(), &why);
    if (real == nullptr) GTEST_SKIP() << "backend " << backend_kind_name(GetParam()) << " unavailable here: " << why;
    be = std::make_unique<faulty_backend>(*real);
    frames = std::make_unique<keeping_frames>(*be);
    store = std::make_unique<host_tier>(*be, k_fixture_page, 4);
    pager_config cfg;
    cfg.frame_size = k_fixture_page;
    cfg.arena_size = 64ull << 20;
    cfg.copies_in_flight = 4;  // fewer than the pages moved: several windows, slots reused
    ASSERT_EQ(pager::create(*be, 0, *store, *frames, cfg, &pg), ok) << last_error();
    ASSERT_EQ(real->stream_create(0, &stream), ok) << last_error();
    ASSERT_EQ(real->host_alloc(k_fixture_page, &staging), ok) << last_error();
    ASSERT_EQ(real->reserve(0, k_fixture_page, 0, &probe), ok) << last_error();
    ASSERT_EQ(pg->malloc(k_pages * k_fixture_page, &base), ok) << last_error();
  }
  void TearDown() override {
    if (be == nullptr) return;
    pg.reset();
    store.reset();
    frames.reset();
    if (probe != 0) real->unreserve(probe, k_fixture_page);
    if (staging != nullptr) real->host_free(staging);
    if (stream != 0) real->stream_destroy(stream);
  }

  device_ptr page_address(uint64_t i) const { return base + i * k_fixture_page; }
  static uint64_t page_seed(uint64_t seed, uint64_t i) { return seed * 1000 + i; }

  // Every page of the allocation gets new random bytes.
  void write_all(uint64_t seed) {
    for (uint64_t i = 0; i < k_pages; ++i) {
      fill_random(staging, k_fixture_page, page_seed(seed, i));
      ASSERT_EQ(real->copy_h2d(page_address(i), staging, k_fixture_page, stream), ok) << last_error();
      ASSERT_EQ(real->stream_synchronize(stream), ok) << last_error();
    }
  }
  // Every byte of every page is the one write_all(seed) wrote (the pages must be resident).
  ::testing::AssertionResult all_hold(uint64_t seed) {
    for (uint64_t i = 0; i < k_pages; ++i) {
      std::memset(staging, 0x5A, k_fixture_page);
      if (real->copy_d2h(staging, page_address(i), k_fixture_page, stream) != ok || real->stream_synchronize(stream) != ok) {
        return ::testing::AssertionFailure() << "reading page " << i << ": " << last_error();
      }
      const size_t at = first_mismatch(staging, k_fixture_page, page_seed(seed, i));
      if (at != k_fixture_page) {
        return ::testing::AssertionFailure() << "page " << i << " differs at byte " << at
                                             << (static_cast<unsigned char*>(staging)[at] == 0 ? " (zero: scrubbed)" : "");
      }
    }
    return ::testing::AssertionSuccess();
  }
  // The frame backing each page of the allocation, in page order (all resident).
  std::vector<frame_id> page_frames() const { return pg->resident_frames(); }
  std::vector<page_state> page_states() const {
    std::vector<page_state> s;
    for (uint64_t i = 0; i < k_pages; ++i) s.push_back(pg->state_of(page_address(i)));
    return s;
  }
  // Every byte of `frame` is zero (it was scrubbed before it was given back).
  ::testing::AssertionResult zeroed(frame_id frame) {
    std::memset(staging, 0x5A, k_fixture_page);
    int rc = real->map(probe, k_fixture_page, frame, 0);
    if (rc == ok) {
      rc = real->set_access(probe, k_fixture_page, access_flags::read_write);
      if (rc == ok) rc = real->copy_d2h(staging, probe, k_fixture_page, stream);
      if (rc == ok) rc = real->stream_synchronize(stream);
      real->unmap(probe, k_fixture_page);
    }
    if (rc != ok) return ::testing::AssertionFailure() << "reading frame " << frame << ": " << last_error();
    const auto* bytes = static_cast<const unsigned char*>(staging);
    const auto* nonzero = std::find_if(bytes, bytes + k_fixture_page, [](unsigned char b) { return b != 0; });
    if (nonzero != bytes + k_fixture_page) {
      return ::testing::AssertionFailure() << "frame " << frame << " was given back unscrubbed: byte " << (nonzero - bytes) << " is "
                                           << int(*nonzero);
    }
    return ::testing::AssertionSuccess();
  }
  // Frames given back since index `from` of the source's record.
  std::vector<frame_id> given_back_since(size_t from) const {
    const auto& all = frames->given_back();
    return {all.begin() + static_cast<long>(std::min(from, all.size())), all.end()};
  }

  backend* real = nullptr;
  std::unique_ptr<faulty_backend> be;
  std::unique_ptr<keeping_frames> frames;
  std::unique_ptr<host_tier> store;
  std::unique_ptr<pager> pg;
  stream_id stream = 0;
  void* staging = nullptr;
  device_ptr probe = 0;  // where a frame given back is mapped to look at it
  device_ptr base = 0;   // the allocation of k_pages pages
};

}  // namespace vramswap::detail::test
