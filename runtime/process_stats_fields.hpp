// process_stats_fields: the one list of this process's numbers on a device, in their order.
//
// VRAMSWAP_PROCESS_STATS(X) calls X(name, type) once per field of vramswap_stats_t (after its
// `size`) and of vramswap::stats, in the order both public structs declare them. The
// conversions between the two (cpp_api/src/api.cpp), the Python dict (python/src/memory.cpp)
// and its field list are generated from it. The public headers keep their written-out
// structs, because they are the documentation; the static_asserts below tie each of them
// to this list field by field (offset and type) and in size, so that a field added to a
// struct and not here, or here and not in a struct, fails to build.
//
// A new field goes at the end (vramswap_stats_t is versioned by size: callers built against
// an older header get the fields that fit): add it to both public structs and here, then
// fill it where runtime.cpp's sessions fill the others (runtime/session.hpp: stats).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "vramswap/vramswap.h"
#include "vramswap/vramswap.hpp"

#define VRAMSWAP_PROCESS_STATS(X) \
  X(allocated_bytes, uint64_t)    \
  X(allocations, uint64_t)        \
  X(resident_bytes, uint64_t)     \
  X(host_bytes, uint64_t)         \
  X(disk_bytes, uint64_t)         \
  X(bytes_in, uint64_t)           \
  X(bytes_out, uint64_t)          \
  X(acquires, uint64_t)           \
  X(evictions_served, uint64_t)   \
  X(lock_holder_deaths, uint64_t) \
  X(acquire_seconds, double)      \
  X(lock_wait_seconds, double)    \
  X(evict_seconds, double)        \
  X(restore_seconds, double)      \
  X(cached_bytes, uint64_t)       \
  X(graph_bytes, uint64_t)        \
  X(host_frame_bytes, uint64_t)   \
  X(pages_demoted, uint64_t)      \
  X(pages_promoted, uint64_t)     \
  X(reclaim_seconds, double)     \
  X(cache_hits, uint64_t)         \
  X(cache_misses, uint64_t)       \
  X(cache_trims, uint64_t)        \
  X(allocator_seconds, double)    \
  X(yield_waits, uint64_t)        \
  X(yield_seconds, double)        \
  X(frames_asked_ahead, uint64_t) \
  X(frames_asked_at_acquire, uint64_t) \
  X(cache_miss_bytes, uint64_t)   \
  X(placement_rounds, uint64_t)   \
  X(placement_rounds_skipped, uint64_t) \
  X(pages_placed_in, uint64_t)    \
  X(pages_placed_out, uint64_t)   \
  X(host_pinned_bytes, uint64_t)

namespace vramswap::detail::process_stats_layout {

// The layouts the list implies: the C struct leads with its `size`, the C++ one does not.
struct c_layout {
  uint64_t size;
#define VRAMSWAP_FIELD(name, type) type name;
  VRAMSWAP_PROCESS_STATS(VRAMSWAP_FIELD)
#undef VRAMSWAP_FIELD
};
struct cpp_layout {
#define VRAMSWAP_FIELD(name, type) type name;
  VRAMSWAP_PROCESS_STATS(VRAMSWAP_FIELD)
#undef VRAMSWAP_FIELD
};

static_assert(std::is_standard_layout_v<vramswap_stats_t> && std::is_standard_layout_v<vramswap::stats>);
static_assert(offsetof(vramswap_stats_t, size) == 0 && std::is_same_v<decltype(vramswap_stats_t::size), uint64_t>);
#define VRAMSWAP_FIELD(name, type)                                                                                     \
  static_assert(std::is_same_v<decltype(vramswap_stats_t::name), type> &&                                            \
                    offsetof(vramswap_stats_t, name) == offsetof(c_layout, name),                                      \
                "vramswap_stats_t::" #name " differs from runtime/process_stats_fields.hpp (type or place)");          \
  static_assert(std::is_same_v<decltype(vramswap::stats::name), type> &&                                             \
                    offsetof(vramswap::stats, name) == offsetof(cpp_layout, name),                                     \
                "vramswap::stats::" #name " differs from runtime/process_stats_fields.hpp (type or place)");
VRAMSWAP_PROCESS_STATS(VRAMSWAP_FIELD)
#undef VRAMSWAP_FIELD
static_assert(sizeof(vramswap_stats_t) == sizeof(c_layout),
              "vramswap_stats_t has a field that runtime/process_stats_fields.hpp does not list");
static_assert(sizeof(vramswap::stats) == sizeof(cpp_layout),
              "vramswap::stats has a field that runtime/process_stats_fields.hpp does not list");

}  // namespace vramswap::detail::process_stats_layout
