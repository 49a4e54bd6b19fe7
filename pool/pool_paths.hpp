// pool_paths: where a device's pool server keeps its files (docs/pool_server.md).
//
// Return codes: 0, or a negative vramswap::detail::status with the detail in last_error(); never
// throws.
#pragma once

#include <string>

namespace vramswap::detail {

// Where a device's pool server keeps its files. The runtime dir is VRAMSWAP_RUNTIME_DIR,
// else /tmp/vramswap-<uid> (or /tmp/vramswap-g<gid> with VRAMSWAP_GROUP, so that the
// group's users meet in one place). Mode 0700, or 0770 and owned by VRAMSWAP_GROUP.
// <p> below is VRAMSWAP_SHM_PREFIX (usually empty): one server per device and prefix.
struct pool_paths {
  std::string dir;          // the runtime dir
  std::string socket;       // <dir>/<p><key>.sock         the server's listening socket
  std::string server_lock;  // <dir>/<p><key>.server.lock  flock held by the one server of the device
  std::string start_lock;   // <dir>/<p><key>.start.lock   flock held by a client while it starts one
  std::string log;          // <dir>/<p><key>.log          a server started on demand logs here

  // The paths for `device_key`. With `create_dir`, creates the runtime dir when missing
  // (mode as above) and checks an existing one: it must be a directory, not a symlink, owned
  // by this user (or, with VRAMSWAP_GROUP, owned by that group with mode 0770); anything
  // else is err_not_owner, naming the directory and its owner. Returns 0,
  // err_invalid_argument (bad key or VRAMSWAP_GROUP), err_not_owner, err_system.
  static int make(const std::string& device_key, bool create_dir, pool_paths* out) noexcept;
};

}  // namespace vramswap::detail
