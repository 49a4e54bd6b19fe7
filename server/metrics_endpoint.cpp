#include "server/metrics_endpoint.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "core/log.hpp"
#include "core/status.hpp"
#include "lock/process_identity.hpp"

namespace vramswap::detail {
namespace {

void close_fd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

struct connection {
  int fd = -1;
  uint64_t deadline_ns = 0;
  bool answering = false;
  std::string request;
  std::string answer;
  size_t sent = 0;
};

bool request_complete(const std::string& r) {
  return r.find("\r\n\r\n") != std::string::npos || r.find("\n\n") != std::string::npos ||
         r.size() >= metrics_endpoint::k_max_request;
}

std::string answer_for(const std::string& request, const metrics_endpoint::render_fn& render) {
  std::string status = "404 Not Found", body = "only GET /metrics is served here\n";
  if (request.rfind("GET /metrics ", 0) == 0 || request.rfind("GET /metrics?", 0) == 0 || request.rfind("GET / ", 0) == 0) {
    try {
      status = render(&body) ? "200 OK" : "500 Internal Server Error";
    } catch (const std::exception& e) {
      status = "500 Internal Server Error";
      body = std::string("rendering the metrics: ") + e.what() + "\n";
    }
  }
  return "HTTP/1.0 " + status + "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

// Send what is left of c's answer without blocking; false when the connection is done
// (all sent, or the peer went away).
bool send_some(connection* c) {
  while (c->sent < c->answer.size()) {
    const ssize_t n = ::send(c->fd, c->answer.data() + c->sent, c->answer.size() - c->sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c->sent += static_cast<size_t>(n);
      continue;
    }
    return n < 0 && (errno == EAGAIN || errno == EINTR);
  }
  return false;
}

}  // namespace

int metrics_endpoint::start(const std::string& port_text, const char* what, render_fn render,
                            std::unique_ptr<metrics_endpoint>* out) noexcept {
  try {
    char* end = nullptr;
    errno = 0;
    const unsigned long port = std::strtoul(port_text.c_str(), &end, 10);
    if (port_text.empty() || end == port_text.c_str() || *end != '\0' || errno != 0 || port > 65535) {
      return fail(err_invalid_argument, "vramswapd: metrics port \"%s\" (%s) is not a port number 0..65535", port_text.c_str(), what);
    }
    std::unique_ptr<metrics_endpoint> m(new metrics_endpoint());
    m->render_ = std::move(render);
    m->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (m->listen_fd_ < 0) return fail_errno(errno, "vramswapd: metrics socket");
    const int one = 1;
    ::setsockopt(m->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(m->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      return fail_errno(errno, "vramswapd: metrics endpoint: bind 127.0.0.1:%lu (%s)", port, what);
    }
    if (::listen(m->listen_fd_, 64) != 0) return fail_errno(errno, "vramswapd: metrics endpoint: listen");
    socklen_t len = sizeof addr;
    if (::getsockname(m->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return fail_errno(errno, "vramswapd: metrics endpoint: getsockname");
    }
    m->port_ = ntohs(addr.sin_port);
    if (::pipe2(m->stop_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) return fail_errno(errno, "vramswapd: metrics endpoint: pipe2");
    try {
      m->thread_ = std::thread([p = m.get()] { p->run(); });
    } catch (const std::system_error& e) {
      return fail(err_system, "vramswapd: metrics endpoint: cannot start its thread: %s", e.what());
    }
    *out = std::move(m);
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "vramswapd: out of host memory");
  }
}

metrics_endpoint::~metrics_endpoint() {
  if (thread_.joinable()) {
    const char byte = 1;
    [[maybe_unused]] const ssize_t n = ::write(stop_pipe_[1], &byte, 1);
    thread_.join();
  }
  close_fd(&listen_fd_);
  close_fd(&stop_pipe_[0]);
  close_fd(&stop_pipe_[1]);
}

void metrics_endpoint::run() noexcept {
  std::vector<connection> conns;
  std::vector<pollfd> fds;
  try {
    conns.reserve(k_max_connections);
    fds.reserve(k_max_connections + 2);
  } catch (const std::bad_alloc&) {
    log(log_level::error, "vramswapd: metrics endpoint: out of host memory; it stops");
    return;
  }
  for (;;) {
    const uint64_t now = monotonic_ns();
    uint64_t next = UINT64_MAX;
    for (const connection& c : conns) next = std::min(next, c.deadline_ns);
    const int timeout_ms = next == UINT64_MAX ? -1 : next <= now ? 0 : static_cast<int>((next - now) / 1'000'000) + 1;
    fds.clear();
    fds.push_back({stop_pipe_[0], POLLIN, 0});
    fds.push_back({conns.size() < k_max_connections ? listen_fd_ : -1, POLLIN, 0});
    for (const connection& c : conns) fds.push_back({c.fd, static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
    const int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) {
      log(log_level::error, "vramswapd: metrics endpoint: poll: %s; it stops", std::strerror(errno));
      break;
    }
    if (n > 0 && fds[0].revents != 0) break;
    const uint64_t t = monotonic_ns();
    // Existing connections first (their pollfds are in order from index 2), then new ones.
    for (size_t i = 0; i < conns.size(); ++i) {
      connection& c = conns[i];
      const short revents = n > 0 ? fds[i + 2].revents : 0;
      bool open = true;
      if (revents != 0 && !c.answering) {
        char buf[1024];
        const ssize_t got = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (got > 0) c.request.append(buf, static_cast<size_t>(got));
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) open = got == 0 && !c.request.empty();
        if (open && (got == 0 || request_complete(c.request))) {
          try {
            c.answer = answer_for(c.request, render_);
          } catch (const std::bad_alloc&) {
            open = false;
          }
          c.answering = true;
          c.deadline_ns = t + uint64_t{k_answer_ms} * 1'000'000;
          if (open) open = send_some(&c);
        }
      } else if (revents != 0) {
        open = send_some(&c);
      }
      if (open && t >= c.deadline_ns) open = false;  // silent, or reading too slowly
      if (!open) close_fd(&c.fd);
    }
    for (size_t i = 0; i < conns.size();) {
      if (conns[i].fd < 0) {
        conns[i] = std::move(conns.back());
        conns.pop_back();
      } else {
        ++i;
      }
    }
    while (n > 0 && fds[1].revents != 0 && conns.size() < k_max_connections) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
          log(log_level::warn, "vramswapd: metrics endpoint: accept: %s", std::strerror(errno));
        }
        break;
      }
      connection c;
      c.fd = fd;
      c.deadline_ns = t + uint64_t{k_request_ms} * 1'000'000;
      conns.push_back(std::move(c));
    }
  }
  for (connection& c : conns) close_fd(&c.fd);
}

}  // namespace vramswap::detail
