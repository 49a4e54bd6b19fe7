#include "runtime/fault_report.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "core/pager.hpp"

namespace vramswap::detail {
namespace {

constexpr int k_slots = 16;

// Written by fault_watch/unwatch, read by the handler: lock-free atomics only. A slot is in
// use while `memory` is set; the other fields are stored before it (release) and read after
// it (acquire).
struct watched {
  std::atomic<bool> claimed{false};  // by fault_watch, before it fills the slot
  std::atomic<const pager*> memory{nullptr};
  std::atomic<int> device{-1};
};
watched g_slots[k_slots];
std::mutex g_install_mutex;
bool g_installed = false;
struct sigaction g_previous {};
std::atomic<bool> g_reported{false};

// An async-signal-safe line builder (no allocation, no stdio).
struct line {
  char buf[1536];
  size_t n = 0;
  void text(const char* s) {
    while (*s != '\0' && n < sizeof buf) buf[n++] = *s++;
  }
  void dec(uint64_t v) {
    char t[24];
    int k = 0;
    do {
      t[k++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0);
    while (k > 0 && n < sizeof buf) buf[n++] = t[--k];
  }
  void hex(uint64_t v) {
    text("0x");
    char t[16];
    int k = 0;
    do {
      t[k++] = "0123456789abcdef"[v & 0xF];
      v >>= 4;
    } while (v != 0);
    while (k > 0 && n < sizeof buf) buf[n++] = t[--k];
  }
  void emit() {
    size_t done = 0;
    while (done < n) {
      const ssize_t w = ::write(STDERR_FILENO, buf + done, n - done);
      if (w <= 0) break;
      done += static_cast<size_t>(w);
    }
  }
};

void report(int device, const pager& memory, uintptr_t addr) {
  const uint64_t base = memory.arena_base();
  const uint64_t frame = memory.frame_size();
  const bool resident = memory.resident_now();
  line l;
  l.text("vramswap: segmentation fault at ");
  l.hex(addr);
  l.text(" in process ");
  l.dec(static_cast<uint64_t>(::getpid()));
  l.text(": the address is device ");
  l.dec(static_cast<uint64_t>(device));
  l.text("'s memory (vramswap's arena ");
  l.hex(base);
  l.text("-");
  l.hex(base + memory.arena_size());
  l.text(", page ");
  l.dec((addr - base) / frame);
  l.text(" of ");
  l.dec(frame >> 20);
  l.text(" MiB; host backend). ");
  if (resident) {
    l.text("This process held the device lock, so every live allocation was in a frame: the address is in no live "
           "allocation (freed, or past an allocation's end).\n");
  } else {
    l.text("This process did not hold the device lock, and that page was not in a frame: saved for another process "
           "(or dropped, if advised discardable), or never backed. Touch vramswap memory only while holding the lock "
           "(vramswap::gpu_lock, vramswap_lock, vramswap.gpu_lock()); memory allocated and written outside it stays "
           "usable there only until another process needs its frames. Its saved bytes are intact, but nothing is "
           "paged in outside the lock: the process stops here.\n");
  }
  l.emit();
}

void on_segv(int sig, siginfo_t* info, void* context) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (watched& w : g_slots) {
    const pager* memory = w.memory.load(std::memory_order_acquire);
    if (memory == nullptr) continue;
    if (addr < memory->arena_base() || addr - memory->arena_base() >= memory->arena_size()) continue;
    if (!g_reported.exchange(true)) report(w.device.load(std::memory_order_relaxed), *memory, addr);
    break;
  }
  // Then whatever was there before us.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  // The default action: put it back and let the access fault again (a core dump shows the
  // faulting instruction, not this handler).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGSEGV, &dfl, nullptr);
}

void install() {
  std::lock_guard<std::mutex> guard(g_install_mutex);
  if (g_installed) return;
  struct sigaction sa {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(SIGSEGV, &sa, &g_previous) == 0) g_installed = true;
}

}  // namespace

void fault_watch(int device, const pager& memory) noexcept {
  install();
  for (watched& w : g_slots) {
    bool free = false;
    if (!w.claimed.compare_exchange_strong(free, true, std::memory_order_acq_rel)) continue;
    w.device.store(device, std::memory_order_relaxed);
    w.memory.store(&memory, std::memory_order_release);
    return;
  }
}

void fault_unwatch(const pager& memory) noexcept {
  for (watched& w : g_slots) {
    const pager* mine = &memory;
    if (w.memory.compare_exchange_strong(mine, nullptr, std::memory_order_acq_rel)) {
      w.claimed.store(false, std::memory_order_release);
      return;
    }
  }
}

}  // namespace vramswap::detail
