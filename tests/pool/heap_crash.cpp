// A program that crashes inside malloc, holding the arena's lock: a freed chunk's back link
// is overwritten (a use after free), and the next malloc follows it. A second thread makes
// malloc take its locks. For preload_backtrace_test.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

int main() {
  std::thread other([] {});  // the process is multi-threaded from now on: malloc locks its arenas
  other.join();
  void* keep = std::malloc(4000);  // keeps the next chunk away from the top
  auto* chunk = static_cast<uintptr_t*>(std::malloc(4000));
  void* fence = std::malloc(4000);
  std::free(chunk);  // past the tcache's sizes: into the unsorted bin
  chunk[1] = 0x10;   // its bk: an address that is not mapped
  void* p = std::malloc(8000);
  std::free(keep);
  std::free(fence);
  std::free(p);
  return 0;  // not reached
}
