#include "core/unix_address.hpp"

#include <cstddef>
#include <cstring>

#include "core/status.hpp"

namespace vramswap::detail {

int unix_address(const std::string& name, bool allow_abstract, sockaddr_un* addr, socklen_t* len) noexcept {
  *addr = sockaddr_un{};
  addr->sun_family = AF_UNIX;
  const bool abstract = allow_abstract && !name.empty() && name[0] == '@';
  if (name.empty() || name.size() + (abstract ? 0 : 1) > sizeof addr->sun_path) {
    return fail(err_invalid_argument, "socket path %s is longer than %zu bytes", name.empty() ? "(empty)" : name.c_str(),
                sizeof addr->sun_path - 1);
  }
  std::memcpy(addr->sun_path, name.data(), name.size());
  if (abstract) addr->sun_path[0] = '\0';
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() + (abstract ? 0 : 1));
  return ok;
}

}  // namespace vramswap::detail
