// TCP on loopback addresses, for the tests that talk to a pool server's metrics and health
// endpoint: a connection, and one HTTP/1.0 exchange over it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace vramswap::detail::test {

// The socket connected to address:port, or -1 with errno set.
inline int connect_loopback(uint16_t port, const char* address = "127.0.0.1") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (::inet_pton(AF_INET, address, &addr.sin_addr) != 1 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int saved = errno != 0 ? errno : EINVAL;
    ::close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

// Sends `request_line` (e.g. "GET /metrics HTTP/1.0") and returns the whole answer, headers
// and all, read until the server closes or stays silent for `silence_ms`; "" when nobody
// answered (connection refused, or cut before a byte came).
inline std::string http_exchange(uint16_t port, const std::string& request_line, const char* address = "127.0.0.1",
                                 int silence_ms = 10000) {
  const int fd = connect_loopback(port, address);
  if (fd < 0) return "";
  const std::string text = request_line + "\r\n\r\n";
  (void)!::send(fd, text.data(), text.size(), MSG_NOSIGNAL);
  std::string all;
  char buf[8192];
  for (;;) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, silence_ms) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    all.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return all;
}

struct http_reply {
  int status = 0;  // 0: no HTTP answer (connection refused or cut)
  std::string body;
};

// http_exchange(), split into the status code and the body.
inline http_reply http_request(uint16_t port, const std::string& request_line, const char* address = "127.0.0.1") {
  http_reply r;
  const std::string all = http_exchange(port, request_line, address);
  if (all.rfind("HTTP/1.0 ", 0) != 0) return r;
  r.status = std::atoi(all.c_str() + 9);
  const size_t at = all.find("\r\n\r\n");
  if (at != std::string::npos) r.body = all.substr(at + 4);
  return r;
}

}  // namespace vramswap::detail::test
