// A program that crashes inside malloc, holding the arena's lock: a freed chunk's back link
// is overwritten (a use after free), and the next malloc follows it. A second thread makes
// malloc take its locks. For preload_backtrace_test.
//
// malloc and free are called through volatile pointers: an optimizing build would otherwise
// drop allocations whose memory nothing reads, and with them the write after the free
// (undefined behaviour, as far as the compiler knows), and the program would exit cleanly.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <thread>

namespace {
void* (*volatile allocate)(std::size_t) = std::malloc;
void (*volatile release)(void*) = std::free;
}  // namespace

int main() {
  std::thread other([] {});  // the process is multi-threaded from now on: malloc locks its arenas
  other.join();
  void* keep = allocate(4000);  // keeps the next chunk away from the top
  auto* chunk = static_cast<uintptr_t*>(allocate(4000));
  void* fence = allocate(4000);
  release(chunk);  // past the tcache's sizes: into the unsorted bin
  static_cast<volatile uintptr_t*>(chunk)[1] = 0x10;  // its bk: an address that is not mapped
  void* p = allocate(8000);
  release(keep);
  release(fence);
  release(p);
  return 0;  // not reached
}
