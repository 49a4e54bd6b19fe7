#include "cpp_api/api_test_env.hpp"

#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include <stdexcept>

#include "runtime/runtime.hpp"
#include "support/test_env.hpp"

namespace vramswap::detail::test {

api_test_env::api_test_env(int devices) : devices_(devices) {
  static int counter = 0;
  prefix_ = "vsa" + std::to_string(getpid()) + "x" + std::to_string(counter++) + "-";
  char dir[] = "/tmp/vramswap-api-test-XXXXXX";
  if (::mkdtemp(dir) == nullptr) throw std::runtime_error("mkdtemp failed");
  runtime_dir_ = dir;
  // Process-wide (the backend reads them once): the same for every test of the process.
  vramswap::detail::test::set_env("VRAMSWAP_BACKEND", "host");
  vramswap::detail::test::set_env("VRAMSWAP_HOST_DEVICES", "2");
  vramswap::detail::test::set_env("VRAMSWAP_HOST_DEVICE_MEMORY", "256MiB");
  ::setenv("VRAMSWAP_LOG", "warn", 0);
  // Per test.
  vramswap::detail::test::set_env("VRAMSWAP_SHM_PREFIX", prefix_.c_str());
  vramswap::detail::test::set_env("VRAMSWAP_RUNTIME_DIR", runtime_dir_.c_str());
  vramswap::detail::test::set_env("VRAMSWAP_SERVER", VRAMSWAP_SERVER_BINARY);
  vramswap::detail::test::set_env("VRAMSWAP_FRAME_SIZE", "2MiB");
  vramswap::detail::test::set_env("VRAMSWAP_POOL_SIZE", "64MiB");
  vramswap::detail::test::set_env("VRAMSWAP_POOL_IDLE_EXIT", "5");
  vramswap::detail::test::set_env("VRAMSWAP_SWAP_DIR", "/var/tmp");
  options_reread_for_testing();  // VRAMSWAP_LOG above, set only where unset
}

void api_test_env::end() {
  if (ended_) return;
  ended_ = true;
  rt::reset();
  for (int d = 0; d < devices_; ++d) rt::stop_pool_server(d);
  if (DIR* dir = ::opendir(runtime_dir_.c_str())) {
    while (dirent* e = ::readdir(dir)) {
      if (e->d_name[0] != '.') ::unlink((runtime_dir_ + "/" + e->d_name).c_str());
    }
    ::closedir(dir);
  }
  ::rmdir(runtime_dir_.c_str());
}

}  // namespace vramswap::detail::test
