// The preload shim (libvramswap_preload.so) seen from the pool server's side.
//
// vramswapd must never run with the shim preloaded: the shim would take the server's own
// driver calls for a program's and open a session of its own, against the server that is
// starting. Clients that start vramswapd on demand leave the shim out of its LD_PRELOAD;
// vramswapd refuses to run with it.
#pragma once

#include <string>

namespace vramswap::detail {

inline constexpr const char* k_preload_shim_name = "libvramswap_preload.so";

// `ld_preload` (an LD_PRELOAD value: names separated by spaces or colons, as ld.so reads
// them) without the shim, joined by colons; empty when nothing else was preloaded.
std::string without_preload_shim(const std::string& ld_preload);
// Whether `ld_preload` names the shim (by file name, with or without a directory).
bool preloads_shim(const std::string& ld_preload);

}  // namespace vramswap::detail
