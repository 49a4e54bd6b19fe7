// How the test worker programs (session_worker, oversub_worker) leave on a failed call:
// the call's name and vramswap's detail on stderr, then the exit status the harness checks.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "core/status.hpp"

namespace vramswap::detail::test {

// _Exit: no static destructors while a session's threads still run (the backend would go
// first, under them). The exit status is the point.
[[noreturn]] inline void worker_die(const char* program, int code, const char* what) {
  std::fprintf(stderr, "%s[%d]: %s: %s\n", program, static_cast<int>(getpid()), what, last_error());
  std::fflush(nullptr);
  std::_Exit(code);
}

// Exit status 2 when `rc` is a failure.
inline void worker_check(const char* program, int rc, const char* what) {
  if (rc != ok) worker_die(program, 2, what);
}

}  // namespace vramswap::detail::test
