// service_notify: tells a service manager (systemd, Type=notify) when vramswapd is ready and
// when it is stopping.
//
// The sd_notify protocol: when the manager set NOTIFY_SOCKET (a path, or "@name" for the
// abstract namespace), one datagram of "KEY=value" lines to that socket per state change.
// It is small and stable enough to speak directly, so vramswapd needs no libsystemd: the
// same binary runs where systemd is absent (containers, Slurm nodes) and simply says
// nothing when NOTIFY_SOCKET is unset.
//
//   ready     "READY=1", "MAINPID=<pid>", "STATUS=serving device N (<key>)": sent once the
//             pool is built and the socket accepts, so that units ordered After= it (and
//             `systemctl start`) wait for a pool that clients can use.
//   stopping  "STOPPING=1": sent when the server stops serving (SIGTERM, SIGINT, idle exit),
//             before it closes its connections and releases the pool.
//
// Errors are logged, never fatal: a manager that cannot be told is no reason not to serve.
#pragma once

#include <string>

namespace vramswap::detail {

// Sends `state` (newline-separated KEY=value lines) to the manager's socket `where`: the
// process's NOTIFY_SOCKET, as vramswapd read it at start (foreign_environment, core/options.hpp).
// Returns true when it was sent, false when `where` is empty or the send failed (logged at warn).
bool notify_service_manager(const std::string& where, const std::string& state) noexcept;

}  // namespace vramswap::detail
