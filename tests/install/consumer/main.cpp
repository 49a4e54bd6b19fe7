// A program outside the vramswap tree, built against an installed vramswap by
// tests/install/install_test.sh (once with find_package, once with pkg-config). It touches no
// device and starts no pool server: it proves that the installed headers compile on their
// own, that the library links and loads, and that an exception thrown inside the library is
// caught here by its type (the typeinfo is exported).
#include <vramswap/vramswap.h>
#include <vramswap/vramswap.hpp>

#include <cstdio>
#include <cstring>
#include <mutex>

int main() {
  vramswap::gpu_lock lock(0, std::defer_lock);  // a guard that does not own: opens nothing
  if (lock.owns_lock() || lock.device() != 0) {
    std::fprintf(stderr, "consumer: a deferred gpu_lock owns the lock or forgot its device\n");
    return 1;
  }
  try {
    vramswap::throw_error(VRAMSWAP_ERR_INVALID_ARGUMENT, "consumer: on purpose");
  } catch (const vramswap::invalid_argument& e) {
    if (e.code() != VRAMSWAP_ERR_INVALID_ARGUMENT) {
      std::fprintf(stderr, "consumer: invalid_argument with code %d\n", e.code());
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: expected vramswap::invalid_argument, caught something else: %s\n", e.what());
    return 1;
  }
  const char* name = vramswap_status_name(VRAMSWAP_ERR_TIMEOUT);
  if (name == nullptr || std::strcmp(name, "timeout") != 0) {
    std::fprintf(stderr, "consumer: vramswap_status_name(VRAMSWAP_ERR_TIMEOUT) is %s\n", name ? name : "NULL");
    return 1;
  }
  std::printf("consumer: vramswap %d.%d.%d: OK\n", VRAMSWAP_VERSION_MAJOR, VRAMSWAP_VERSION_MINOR,
              VRAMSWAP_VERSION_PATCH);
  return 0;
}
