// pool_paths: where a device's pool server keeps its files (docs/pool_server.md).
//
// Return codes: 0, or a negative vramswap::detail::status with the detail in last_error(); never
// throws.
#pragma once

#include <string>

namespace vramswap::detail {

// Where a device's pool server keeps its files: in the runtime dir (lock/runtime_dir.hpp),
// beside the device's lock and pool segments. <p> below is VRAMSWAP_SHM_PREFIX (usually
// empty): one server per device, prefix and runtime dir.
struct pool_paths {
  std::string dir;          // the runtime dir
  std::string socket;       // <dir>/<p><key>.sock         the server's listening socket
  std::string server_lock;  // <dir>/<p><key>.server.lock  flock held by the one server of the device
  std::string start_lock;   // <dir>/<p><key>.start.lock   flock held by a client while it starts one
  std::string log;          // <dir>/<p><key>.log          a server started on demand logs here

  // The paths for `device_key`. With `create_dir`, creates or checks the runtime dir
  // (runtime_dir). Returns 0, err_invalid_argument (bad key or VRAMSWAP_GROUP),
  // err_not_owner, err_system.
  static int make(const std::string& device_key, bool create_dir, pool_paths* out) noexcept;
};

}  // namespace vramswap::detail
