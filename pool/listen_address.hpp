// Where a TCP port is listened on, as this network namespace's /proc/net/tcp and tcp6 say:
// for `vramswap status`, which knows the pool server's metrics port from the pool header but
// not the address it bound (--metrics-address), and should print a URL that reaches it.
// Never throws; nothing found (another network namespace, no /proc) is "".
#pragma once

#include <cstdint>
#include <string>

namespace vramswap::detail {

// The local address of a socket listening on TCP `port`, as a URL's host part: "127.0.0.2",
// "[fd00::5]"; a wildcard bind (0.0.0.0, ::) as the loopback address of its family, which
// reaches it from here. "" when no socket listens on the port in this network namespace.
std::string listening_host(uint16_t port) noexcept;

// The same from the text of /proc/net/tcp (`ipv6` false) or /proc/net/tcp6 (true); for tests.
std::string listening_host_in(const std::string& proc_net_tcp, bool ipv6, uint16_t port) noexcept;

}  // namespace vramswap::detail
