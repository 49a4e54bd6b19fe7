#include "core/fd_transfer.hpp"

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/status.hpp"

namespace vramswap::detail {

int send_fds(int socket, const int* fds, size_t count, const void* payload, size_t len) noexcept {
  if (len == 0) return fail(err_invalid_argument, "send_fds: a message needs at least one byte of payload");
  if (count > k_max_fds_per_message) {
    return fail(err_invalid_argument, "send_fds: %zu descriptors in one message; at most %zu", count, k_max_fds_per_message);
  }
  iovec iov{const_cast<void*>(payload), len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * k_max_fds_per_message)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (count > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * count);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * count);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * count);
  }
  ssize_t n;
  do {
    n = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return fail_errno(errno, "send_fds: sendmsg on socket %d (%zu descriptors)", socket, count);
  if (static_cast<size_t>(n) != len) return fail(err_system, "send_fds: short send on socket %d (%zd of %zu bytes)", socket, n, len);
  return ok;
}

int recv_fds(int socket, int* fds, size_t cap, size_t* count, void* payload, size_t payload_cap, size_t* len) noexcept {
  *count = 0;
  iovec iov{payload, payload_cap};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * k_max_fds_per_message)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return fail_errno(errno, "recv_fds: recvmsg on socket %d", socket);
  size_t got = 0;
  bool too_many = false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (got < cap) {
        fds[got++] = fd;
      } else {
        ::close(fd);
        too_many = true;
      }
    }
  }
  if (n == 0 && got == 0) return fail(err_system, "recv_fds: the peer on socket %d hung up", socket);
  // A message that failed gives its caller no descriptor to own: those that came are closed
  // here, so that no caller's error path (a peer's malformed message) leaks one.
  auto close_received = [&] {
    for (size_t i = 0; i < got; ++i) ::close(fds[i]);
  };
  if (msg.msg_flags & MSG_CTRUNC) {
    close_received();
    rlimit lim{};
    ::getrlimit(RLIMIT_NOFILE, &lim);
    return fail(err_system, "recv_fds: descriptors sent on socket %d did not all arrive: this process (pid %d) is probably at its "
                "file descriptor limit (RLIMIT_NOFILE %llu); the message's descriptors were closed", socket,
                static_cast<int>(::getpid()), static_cast<unsigned long long>(lim.rlim_cur));
  }
  if (too_many) {
    close_received();
    return fail(err_system, "recv_fds: more than %zu descriptor(s) arrived on socket %d; all were closed", cap, socket);
  }
  *count = got;
  *len = static_cast<size_t>(n);
  return ok;
}

int send_fd(int socket, int fd, const void* payload, size_t len) noexcept {
  return fd >= 0 ? send_fds(socket, &fd, 1, payload, len) : send_fds(socket, nullptr, 0, payload, len);
}

int recv_fd(int socket, int* fd, void* payload, size_t cap, size_t* len) noexcept {
  *fd = -1;
  size_t count = 0;
  const int rc = recv_fds(socket, fd, 1, &count, payload, cap, len);
  if (count == 0) *fd = -1;  // none came, or recv_fds closed it: no number to close twice
  return rc;
}

}  // namespace vramswap::detail
