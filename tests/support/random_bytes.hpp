// Deterministic random test data: never zeros (zeros hide unwritten memory).
//
// splitmix64, not std::mt19937_64: the suites fill and check hundreds of MiB in Debug
// builds under AddressSanitizer, where the Mersenne Twister's calls took most of a test's
// time (store_chain_test: about 60%), which a loaded machine multiplies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace vramswap::detail::test {

struct splitmix64 {
  uint64_t state;
  uint64_t operator()() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

inline void fill_random(void* dst, size_t size, uint64_t seed) {
  splitmix64 rng{seed * 0x9E3779B97F4A7C15ull + 1};
  auto* p = static_cast<unsigned char*>(dst);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t v = rng() | 1;  // never an all-zero word
    std::memcpy(p + i, &v, 8);
  }
  for (uint64_t v = rng() | 1; i < size; ++i, v >>= 8) p[i] = static_cast<unsigned char>(v | 1);
}

// Index of the first byte that differs from fill_random(seed), or `size` when all match.
inline size_t first_mismatch(const void* data, size_t size, uint64_t seed) {
  splitmix64 rng{seed * 0x9E3779B97F4A7C15ull + 1};
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t v = rng() | 1;
    if (std::memcmp(p + i, &v, 8) != 0) {
      for (size_t j = 0; j < 8; ++j) {
        if (p[i + j] != reinterpret_cast<const unsigned char*>(&v)[j]) return i + j;
      }
    }
  }
  for (uint64_t v = rng() | 1; i < size; ++i, v >>= 8) {
    if (p[i] != static_cast<unsigned char>(v | 1)) return i;
  }
  return size;
}

}  // namespace vramswap::detail::test
