// libvramswap_preload.so's crash report.
//
// VRAMSWAP_PRELOAD_BACKTRACE=1: on a crash (SIGSEGV, SIGBUS, SIGILL), print the native
// stack to stderr before dying, for reports of a program that fails only under the shim.
//
// The handler may run inside malloc (heap corruption: the arena's lock held), so it must
// not allocate: the first backtrace() loads libgcc_s (dlopen, which allocates), so it is
// called once at install, never first in the handler. It runs on a stack of its own, so
// that a stack overflow is reported too, and once (SA_RESETHAND): a crash inside it ends
// the process with the default action.
//
// The option is read as the shim is loaded (rt::crash_backtrace_wanted, runtime/runtime.hpp;
// libvramswap.so, which the shim needs, is initialized by then), before the program runs, so
// that a crash at any time after is reported.
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <initializer_list>

#include "runtime/runtime.hpp"

namespace {
alignas(16) char g_alt_stack[64 * 1024];

void crash_backtrace(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  const char head[] = "vramswap preload: crashed; native stack:\n";
  (void)!write(2, head, sizeof head - 1);
  backtrace_symbols_fd(frames, n, 2);
  raise(sig);  // the default action now (SA_RESETHAND)
}
__attribute__((constructor)) void install_crash_backtrace() {
  if (!vramswap::detail::rt::crash_backtrace_wanted()) return;
  void* warm[1];
  (void)backtrace(warm, 1);  // loads libgcc_s now, while allocating is safe
  stack_t alt{};
  alt.ss_sp = g_alt_stack;
  alt.ss_size = sizeof g_alt_stack;
  const bool on_alt_stack = sigaltstack(&alt, nullptr) == 0;
  struct sigaction sa {};
  sa.sa_handler = crash_backtrace;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_NODEFER | (on_alt_stack ? SA_ONSTACK : 0);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL}) sigaction(sig, &sa, nullptr);
}
}  // namespace
