#include "runtime/single_runtime.hpp"

#include <dlfcn.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <string>

#include "core/code_location.hpp"
#include "core/log.hpp"
#include "core/status.hpp"
#include "lock/process_identity.hpp"

namespace vramswap::detail {
namespace {

std::mutex g_claim_mutex;
pid_t g_claimed_for = 0;  // the pid this copy claimed (0: none; another after a fork)
int g_claim_fd = -1;      // the claim, open for the life of the process
int g_owner_fd = -1;      // the socket whose name carries an address inside this copy

// A forked child must not keep its parent's claim: it could outlive the parent, and a new
// process given the parent's pid would then find the name taken. (The child cannot use
// vramswap anyway: runtime.hpp, fork.) exec closes them by itself (SOCK_CLOEXEC).
void drop_claim_in_child() {
  if (g_claim_fd >= 0) ::close(g_claim_fd);
  if (g_owner_fd >= 0) ::close(g_owner_fd);
  g_claim_fd = g_owner_fd = -1;
}

// An address inside this copy of the runtime; another copy in the same process turns it into
// the file it was loaded from.
const void* this_copys_code() { return reinterpret_cast<const void*>(&claim_process_for_this_runtime); }

// The file the copy holding `code` was loaded from: a shared object, or the program.
std::string copy_holding(const void* code) {
  const std::string path = object_holding(code);
  return path.empty() ? "the program" : path;
}

// "pid:[<namespace inode>]-<pid>-<start time>": the process, whatever its PID namespace
// (lock/process_identity.hpp reads all three once per process).
std::string process_tag(pid_t pid) {
  process_identity me{};
  if (current_process(&me) != ok || me.pid != pid) return "pid:[?]-" + std::to_string(pid);
  return "pid:[" + std::to_string(me.pid_ns) + "]-" + std::to_string(me.pid) + "-" + std::to_string(me.start_time);
}

std::string claim_name(pid_t pid) { return "vramswap-runtime-" + process_tag(pid); }
std::string owner_prefix(pid_t pid) { return claim_name(pid) + "-by:"; }

// Binds a new socket to the abstract name `name` (truncated to fit); the descriptor, or -1
// with errno.
int bind_abstract(const std::string& name) {
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t len = std::min(name.size(), sizeof addr.sun_path - 1);
  std::memcpy(addr.sun_path + 1, name.data(), len);  // sun_path[0] == '\0': the abstract namespace
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + len)) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

// The claiming copy's path. Its second socket's name (shown in /proc/net/unix with a leading
// '@') carries an address inside it rather than its path: a path can be longer than a socket
// name, and the address, in this same address space, leads back to the file.
std::string claiming_copy(pid_t pid) {
  const std::string prefix = "@" + owner_prefix(pid);
  std::ifstream in("/proc/net/unix");
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find(prefix);
    if (at == std::string::npos) continue;
    const std::string address = line.substr(at + prefix.size());
    const void* code = reinterpret_cast<const void*>(std::strtoull(address.c_str(), nullptr, 16));
    Dl_info info{};
    if (code == nullptr || ::dladdr(code, &info) == 0) return "a copy that is no longer loaded (code at " + address + ")";
    return copy_holding(code);
  }
  return "another copy (its name could not be read from /proc/net/unix)";
}

}  // namespace

int claim_process_for_this_runtime(const char* fn, int device) noexcept {
  try {
    std::lock_guard<std::mutex> guard(g_claim_mutex);
    const pid_t pid = ::getpid();
    if (g_claimed_for == pid) return ok;
    const std::string mine = copy_holding(this_copys_code());
    g_claim_fd = bind_abstract(claim_name(pid));
    if (g_claim_fd < 0) {
      if (errno != EADDRINUSE) {
        log(log_level::warn, "%s(device %d): cannot check that this process runs one copy of vramswap's runtime (%s): %s",
            fn, device, mine.c_str(), std::strerror(errno));
        g_claimed_for = pid;
        return ok;
      }
      return fail(err_unavailable,
                  "%s(device %d): this process already runs vramswap's runtime from %s, and this copy (%s) would be a second "
                  "one: libvramswap.so, the Python module and the preload shim (libvramswap_preload.so) each carry their own "
                  "runtime, and two in one process are two sessions that take turns with each other. Use one of them: run a "
                  "program that links libvramswap or imports vramswap without LD_PRELOAD=libvramswap_preload.so",
                  fn, device, claiming_copy(pid).c_str(), mine.c_str());
    }
    static std::once_flag at_fork;
    std::call_once(at_fork, [] { ::pthread_atfork(nullptr, nullptr, drop_claim_in_child); });
    char address[2 + 2 * sizeof(void*) + 1];
    std::snprintf(address, sizeof address, "%" PRIxPTR, reinterpret_cast<uintptr_t>(this_copys_code()));
    g_owner_fd = bind_abstract(owner_prefix(pid) + address);
    if (g_owner_fd < 0) {
      log(log_level::debug, "runtime: cannot publish where this copy (%s) lies for the single-runtime check: %s", mine.c_str(),
          std::strerror(errno));
    }
    g_claimed_for = pid;
    return ok;
  } catch (const std::exception&) {
    return fail(err_out_of_memory, "%s(device %d): out of host memory", fn, device);
  }
}

}  // namespace vramswap::detail
