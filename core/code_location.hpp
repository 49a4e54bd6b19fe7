// Which loaded file holds a piece of code: a shared object (libvramswap.so, the Python
// module, the preload shim) or the program itself, when the library's objects are linked
// into it. Clients look for vramswapd next to it, and the single-runtime check names it.
#pragma once

#include <string>

namespace vramswap::detail {

// The path of the object holding `code`: a shared object's from its link map; for the
// program (whose link map name is empty, and whose dladdr name is argv[0], perhaps
// relative), /proc/self/exe. Empty when neither can be read. Never throws.
std::string object_holding(const void* code) noexcept;

}  // namespace vramswap::detail
