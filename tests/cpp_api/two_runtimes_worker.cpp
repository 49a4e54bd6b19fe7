// A process with two copies of vramswap's runtime: its own (linked in, as the Python module
// and the preload shim carry theirs) and libvramswap.so's, loaded with dlopen. The first copy
// to open a session must keep the process; the other must refuse (runtime/single_runtime.hpp).
//
// usage: two_runtimes_worker <path of libvramswap.so> own-first|library-first
//   allocate 1 MiB on device 0 through the first copy's C API, then through the second's;
//   print "first=<code>", "second=<code>" and "second_error=<its vramswap_last_error()>" on
//   lines of their own, free what was allocated, exit 0.
// Exit: 0 done (the codes say what happened), 4 libvramswap.so or a symbol of it not found,
// 64 bad usage.
#include <dlfcn.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>

#include "vramswap/vramswap.h"

namespace {

// One copy's C API.
struct c_api {
  int (*malloc)(void**, size_t, int) = nullptr;
  int (*free)(void*, int) = nullptr;
  const char* (*last_error)() = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[2], "own-first") != 0 && std::strcmp(argv[2], "library-first") != 0)) {
    std::fprintf(stderr, "usage: %s <path of libvramswap.so> own-first|library-first\n", argv[0]);
    return 64;
  }
  void* library = ::dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    std::fprintf(stderr, "two_runtimes_worker: dlopen %s: %s\n", argv[1], ::dlerror());
    return 4;
  }
  c_api own{&vramswap_malloc, &vramswap_free, &vramswap_last_error};
  c_api loaded;
  loaded.malloc = reinterpret_cast<int (*)(void**, size_t, int)>(::dlsym(library, "vramswap_malloc"));
  loaded.free = reinterpret_cast<int (*)(void*, int)>(::dlsym(library, "vramswap_free"));
  loaded.last_error = reinterpret_cast<const char* (*)()>(::dlsym(library, "vramswap_last_error"));
  if (loaded.malloc == nullptr || loaded.free == nullptr || loaded.last_error == nullptr) {
    std::fprintf(stderr, "two_runtimes_worker: %s lacks the C API (vramswap_malloc, vramswap_free, vramswap_last_error)\n", argv[1]);
    return 4;
  }
  if (loaded.malloc == own.malloc) {
    std::fprintf(stderr, "two_runtimes_worker: dlsym found this program's own vramswap_malloc, not %s's\n", argv[1]);
    return 4;
  }
  const bool own_first = std::strcmp(argv[2], "own-first") == 0;
  const c_api& first = own_first ? own : loaded;
  const c_api& second = own_first ? loaded : own;
  void* a = nullptr;
  void* b = nullptr;
  const int first_rc = first.malloc(&a, 1 << 20, 0);
  std::printf("first=%d\n", first_rc);
  if (first_rc != VRAMSWAP_OK) std::printf("first_error=%s\n", first.last_error());
  const int second_rc = second.malloc(&b, 1 << 20, 0);
  std::printf("second=%d\n", second_rc);
  std::printf("second_error=%s\n", second_rc == VRAMSWAP_OK ? "" : second.last_error());
  if (b != nullptr) second.free(b, 0);
  if (a != nullptr) first.free(a, 0);
  std::fflush(stdout);
  return 0;
}
