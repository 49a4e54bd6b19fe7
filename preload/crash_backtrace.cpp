// libvramswap_preload.so's crash report.
//
// VRAMSWAP_PRELOAD_BACKTRACE=1: on a crash (SIGSEGV, SIGBUS, SIGILL), print the native
// stack to stderr before dying, for reports of a program that fails only under the shim.
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace {
void crash_backtrace(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  const char head[] = "vramswap preload: crashed; native stack:\n";
  (void)!write(2, head, sizeof head - 1);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}
__attribute__((constructor)) void install_crash_backtrace() {
  const char* on = std::getenv("VRAMSWAP_PRELOAD_BACKTRACE");
  if (on == nullptr || std::strcmp(on, "1") != 0) return;
  for (int sig : {SIGSEGV, SIGBUS, SIGILL}) signal(sig, crash_backtrace);
}
}  // namespace
