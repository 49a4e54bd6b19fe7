// Claims its process for its copy of the runtime (runtime/single_runtime.hpp), prints
// "claim=<status>", and holds the claim until its stdin closes. two_runtimes_test runs it in
// pid namespaces of their own, where every copy is pid 1.
#include <unistd.h>

#include <cstdio>

#include "core/status.hpp"
#include "runtime/single_runtime.hpp"

int main() {
  using namespace vramswap::detail;
  const int rc = claim_process_for_this_runtime("runtime_claim_worker", 0);
  std::printf("claim=%d pid=%d\n", rc, static_cast<int>(::getpid()));
  if (rc != ok) std::printf("error=%s\n", last_error());
  std::fflush(stdout);
  char c;
  while (::read(0, &c, 1) > 0) {
  }
  return rc == ok ? 0 : 1;
}
