// Small helpers shared by the benchmarks.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace vramswap::detail::bench {

// Exit with the status and detail when `rc` is an error: a benchmark that cannot measure
// what it set out to must not print a number.
inline void check(int rc, const char* what) {
  if (rc == ok) return;
  std::fprintf(stderr, "benchmark: %s: %s: %s\n", what, status_name(rc), last_error());
  std::exit(1);
}

// "1,8,32" -> {1, 8, 32}
inline std::vector<double> parse_list(const char* text) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::atof(item.c_str()));
  return out;
}

// The q-quantile of `v` (0 <= q <= 1), nearest rank; 0 for no samples.
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

inline double seconds_now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace vramswap::detail::bench
