#include "server/socket_holders.hpp"

#include <dirent.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/fd_guard.hpp"
#include "lock/process_identity.hpp"

namespace vramswap::detail {

bool peer_socket_inode(int fd, uint64_t* inode, std::string* why) noexcept {
  try {
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      *why = std::string("fstat: ") + std::strerror(errno);
      return false;
    }
    fd_guard nl(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
    if (nl.fd < 0) {
      *why = std::string("socket(AF_NETLINK, NETLINK_SOCK_DIAG): ") + std::strerror(errno);
      return false;
    }
    timeval tv{1, 0};  // the kernel answers at once; never hang the server's loop on it
    ::setsockopt(nl.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct {
      nlmsghdr header;
      unix_diag_req request;
    } ask{};
    ask.header.nlmsg_len = sizeof ask;
    ask.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    ask.header.nlmsg_flags = NLM_F_REQUEST;
    ask.request.sdiag_family = AF_UNIX;
    ask.request.udiag_states = ~0u;
    ask.request.udiag_ino = static_cast<uint32_t>(st.st_ino);
    ask.request.udiag_show = UDIAG_SHOW_PEER;
    ask.request.udiag_cookie[0] = INET_DIAG_NOCOOKIE;
    ask.request.udiag_cookie[1] = INET_DIAG_NOCOOKIE;
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    if (::sendto(nl.fd, &ask, sizeof ask, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) != static_cast<ssize_t>(sizeof ask)) {
      *why = std::string("sending the socket diagnostics request: ") + std::strerror(errno);
      return false;
    }
    alignas(nlmsghdr) char answer[8192];
    const ssize_t n = ::recv(nl.fd, answer, sizeof answer, 0);
    if (n < 0) {
      *why = std::string("receiving the socket diagnostics answer: ") + std::strerror(errno);
      return false;
    }
    int left = static_cast<int>(n);
    for (const nlmsghdr* h = reinterpret_cast<const nlmsghdr*>(answer); NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_type == NLMSG_ERROR) {
        const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
        *why = std::string("the kernel's Unix socket diagnostics (unix_diag) answered: ") + std::strerror(-e->error);
        return false;
      }
      if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY) continue;
      const auto* msg = static_cast<const unix_diag_msg*>(NLMSG_DATA(h));
      int attr_left = static_cast<int>(h->nlmsg_len) - static_cast<int>(NLMSG_LENGTH(sizeof *msg));
      const auto* a = reinterpret_cast<const nlattr*>(reinterpret_cast<const char*>(msg) + NLMSG_ALIGN(sizeof *msg));
      while (attr_left >= static_cast<int>(sizeof *a) && a->nla_len >= sizeof *a && a->nla_len <= attr_left) {
        if ((a->nla_type & NLA_TYPE_MASK) == UNIX_DIAG_PEER && a->nla_len >= NLA_HDRLEN + sizeof(uint32_t)) {
          uint32_t peer = 0;
          std::memcpy(&peer, reinterpret_cast<const char*>(a) + NLA_HDRLEN, sizeof peer);
          *inode = peer;
          return true;
        }
        const int step = static_cast<int>(NLA_ALIGN(a->nla_len));
        attr_left -= step;
        a = reinterpret_cast<const nlattr*>(reinterpret_cast<const char*>(a) + step);
      }
      *why = "the socket has no peer";
      return false;
    }
    *why = "no answer from the kernel's Unix socket diagnostics";
    return false;
  } catch (const std::bad_alloc&) {
    return false;
  }
}

std::vector<pid_t> processes_holding_socket(uint64_t inode) noexcept {
  std::vector<pid_t> found;
  try {
    char want[48];
    std::snprintf(want, sizeof want, "socket:[%llu]", static_cast<unsigned long long>(inode));
    DIR* proc = ::opendir("/proc");
    if (proc == nullptr) return found;
    while (const dirent* e = ::readdir(proc)) {
      char* end = nullptr;
      const long pid = std::strtol(e->d_name, &end, 10);
      if (pid <= 0 || *end != '\0') continue;
      const std::string dir = std::string("/proc/") + e->d_name + "/fd";
      DIR* fds = ::opendir(dir.c_str());
      if (fds == nullptr) continue;  // gone, or another user's
      while (const dirent* f = ::readdir(fds)) {
        if (f->d_name[0] == '.') continue;
        char target[64];
        const ssize_t len = ::readlinkat(::dirfd(fds), f->d_name, target, sizeof target - 1);
        if (len <= 0) continue;
        target[len] = '\0';
        if (std::strcmp(target, want) == 0) {
          found.push_back(static_cast<pid_t>(pid));
          break;
        }
      }
      ::closedir(fds);
    }
    ::closedir(proc);
    std::sort(found.begin(), found.end());
  } catch (const std::bad_alloc&) {
  }
  return found;
}

std::string describe_processes(const std::vector<pid_t>& pids) noexcept {
  try {
    std::string text;
    for (const pid_t p : pids) {
      char one[128];
      describe_process(p, one, sizeof one);
      if (!text.empty()) text += ", ";
      text += one;
    }
    return text;
  } catch (const std::bad_alloc&) {
    return "";
  }
}

}  // namespace vramswap::detail
