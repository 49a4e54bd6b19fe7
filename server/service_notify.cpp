#include "server/service_notify.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/log.hpp"
#include "core/status.hpp"
#include "core/unix_address.hpp"

namespace vramswap::detail {

bool notify_service_manager(const std::string& where_text, const std::string& state) noexcept {
  if (where_text.empty()) return false;
  const char* where = where_text.c_str();
  sockaddr_un addr{};
  socklen_t addr_len = 0;
  if ((where[0] != '/' && where[0] != '@') || unix_address(where_text, /*allow_abstract=*/true, &addr, &addr_len) != ok) {
    log(log_level::warn, "vramswapd: NOTIFY_SOCKET=%s is neither a socket path nor an @abstract name that fits; the service "
        "manager is not told this server's state", where);
    return false;
  }
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    log(log_level::warn, "vramswapd: telling the service manager (%s): socket: %s", where, std::strerror(errno));
    return false;
  }
  ssize_t sent;
  do {
    sent = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&addr), addr_len);
  } while (sent < 0 && errno == EINTR);
  const int e = errno;
  ::close(fd);
  if (sent != static_cast<ssize_t>(state.size())) {
    log(log_level::warn, "vramswapd: telling the service manager (NOTIFY_SOCKET=%s) \"%s\" failed: %s", where, state.c_str(),
        sent < 0 ? std::strerror(e) : "a short send");
    return false;
  }
  return true;
}

}  // namespace vramswap::detail
