// Shared helpers for tests that run against every backend.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "core/backend.hpp"
#include "core/status.hpp"

namespace vramswap::detail::test {

// One backend per kind for the whole test process (a CUDA context is costly to make);
// nullptr with the reason when the kind cannot run here.
inline backend* shared_backend(backend_kind kind, std::string* why) {
  static std::map<backend_kind, std::unique_ptr<backend>> made;
  static std::map<backend_kind, std::string> reasons;
  if (made.count(kind) == 0 && reasons.count(kind) == 0) {
    std::unique_ptr<backend> be;
    if (make_backend(kind, &be) == ok) {
      made[kind] = std::move(be);
    } else {
      reasons[kind] = last_error();
    }
  }
  if (made.count(kind) != 0) return made[kind].get();
  *why = reasons[kind];
  return nullptr;
}

inline std::string param_name(const ::testing::TestParamInfo<backend_kind>& info) { return backend_kind_name(info.param); }

// The backend the multi-process suites run their children on: host, or what
// VRAMSWAP_TEST_BACKEND names (scripts/device-run.sh sets cuda on the GPU machine).
inline std::string backend_under_test() {
  const char* name = std::getenv("VRAMSWAP_TEST_BACKEND");
  return name != nullptr ? name : "host";
}

// Device 0's key under `backend_name` ("host-0", or the GPU's UUID): what its pool and lock
// are named by.
inline ::testing::AssertionResult device0_key(const std::string& backend_name, std::string* key) {
  std::unique_ptr<backend> made;
  if (make_backend(backend_name == "cuda" ? backend_kind::cuda : backend_kind::host, &made) != ok) {
    return ::testing::AssertionFailure() << "making the " << backend_name << " backend: " << last_error();
  }
  device_info info;
  if (made->get_device_info(0, &info) != ok) return ::testing::AssertionFailure() << "device 0's info: " << last_error();
  *key = info.uuid;
  return ::testing::AssertionSuccess();
}

}  // namespace vramswap::detail::test

// `expr` fails with `code`, and last_error() mentions `needle`.
#define EXPECT_FAILS(expr, code, needle)                                                  \
  do {                                                                                    \
    ::vramswap::detail::clear_error();                                                            \
    EXPECT_EQ((expr), (code)) << #expr;                                                   \
    EXPECT_NE(std::string(::vramswap::detail::last_error()).find(needle), std::string::npos)      \
        << ::vramswap::detail::last_error();                                                      \
  } while (0)
