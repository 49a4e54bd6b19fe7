#include "core/code_location.hpp"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <climits>
#include <new>

namespace vramswap::detail {

std::string object_holding(const void* code) noexcept {
  try {
    Dl_info info{};
    link_map* map = nullptr;
    if (::dladdr1(code, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) != 0 && map != nullptr &&
        map->l_name != nullptr && map->l_name[0] != '\0') {
      return map->l_name;
    }
    char exe[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
    return n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string();
  } catch (const std::bad_alloc&) {
    return std::string();
  }
}

}  // namespace vramswap::detail
