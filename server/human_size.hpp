// human_size: a byte count as the pool server's messages print it ("1.50 GiB", "32.0 MiB").
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace vramswap::detail {

constexpr uint64_t k_gib = uint64_t{1} << 30;

inline std::string human_size(uint64_t bytes) {
  char buf[64];
  if (bytes >= k_gib) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / static_cast<double>(k_gib));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  }
  return buf;
}

}  // namespace vramswap::detail
