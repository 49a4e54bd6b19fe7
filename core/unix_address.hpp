// unix_address: the sockaddr_un of a Unix socket's name, for bind, connect and sendto.
//
// A name is a path, or, where the caller allows it, "@name" for the abstract namespace (as
// ss and systemd's NOTIFY_SOCKET write it). A path must fit sun_path with its NUL (107 bytes); an abstract
// name has no NUL, so its length is part of the address.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <string>

namespace vramswap::detail {

// Fills *addr and *len for `name` (a leading '@' is abstract only with `allow_abstract`).
// err_invalid_argument when it is empty or does not fit:
// the detail says "socket path <name> is longer than 107 bytes" (callers add whose socket it
// is and what to do).
int unix_address(const std::string& name, bool allow_abstract, sockaddr_un* addr, socklen_t* len) noexcept;

}  // namespace vramswap::detail
