#include "core/fd_transfer.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "core/status.hpp"

namespace vramswap {

int send_fd(int socket, int fd, const void* payload, size_t len) noexcept {
  if (len == 0) return fail(err_invalid_argument, "send_fd: a message needs at least one byte of payload");
  iovec iov{const_cast<void*>(payload), len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  ssize_t n;
  do {
    n = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return fail_errno(errno, "send_fd: sendmsg on socket %d (descriptor %d)", socket, fd);
  if (static_cast<size_t>(n) != len) return fail(err_system, "send_fd: short send on socket %d (%zd of %zu bytes)", socket, n, len);
  return ok;
}

int recv_fd(int socket, int* fd, void* payload, size_t cap, size_t* len) noexcept {
  *fd = -1;
  iovec iov{payload, cap};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return fail_errno(errno, "recv_fd: recvmsg on socket %d", socket);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(fd, CMSG_DATA(c), sizeof(int));
  }
  if (n == 0) return fail(err_system, "recv_fd: the peer on socket %d hung up", socket);
  if (msg.msg_flags & MSG_CTRUNC) return fail(err_system, "recv_fd: control data truncated on socket %d", socket);
  *len = static_cast<size_t>(n);
  return ok;
}

}  // namespace vramswap
