#include "server/metrics_endpoint.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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

// Process-wide settings (metrics_endpoint::set_address, note_stopping).
sockaddr_storage g_address = [] {
  sockaddr_storage a{};
  auto* in = reinterpret_cast<sockaddr_in*>(&a);
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}();
std::string g_address_text = "127.0.0.1";
volatile sig_atomic_t g_stopping = 0;

// The path of a request line "GET /path?query HTTP/1.x" (no query), "" when it is not one.
std::string path_of(const std::string& request, std::string* method) {
  const size_t sp = request.find(' ');
  if (sp == std::string::npos) return "";
  *method = request.substr(0, sp);
  const size_t end = request.find_first_of(" ?\r\n", sp + 1);
  return request.substr(sp + 1, end == std::string::npos ? std::string::npos : end - sp - 1);
}

// The answer; a HEAD request's has the same status and headers (Content-Length included) and
// no body (RFC 9110, 9.3.2), so that a probe or a check by HEAD learns what GET would answer.
std::string http(const std::string& status, const std::string& content_type, const std::string& body, bool head = false,
                 const char* extra_headers = "") {
  return "HTTP/1.0 " + status + "\r\nContent-Type: " + content_type + "\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n" + extra_headers + "Connection: close\r\n\r\n" + (head ? std::string() : body);
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

int metrics_endpoint::set_address(const std::string& text, const char* what) noexcept {
  try {
    sockaddr_storage a{};
    auto* in4 = reinterpret_cast<sockaddr_in*>(&a);
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a);
    if (::inet_pton(AF_INET, text.c_str(), &in4->sin_addr) == 1) {
      in4->sin_family = AF_INET;
    } else if (::inet_pton(AF_INET6, text.c_str(), &in6->sin6_addr) == 1) {
      in6->sin6_family = AF_INET6;
    } else {
      return fail(err_invalid_argument,
                  "vramswapd: metrics address \"%s\" (%s) is not an IPv4 or IPv6 address; give a literal address of "
                  "this host or pod: 127.0.0.1 (the default, loopback only), 0.0.0.0 or :: (every interface, e.g. in a "
                  "pod's own network namespace), or the pod's IP (status.podIP); host names are not resolved",
                  text.c_str(), what);
    }
    g_address = a;
    g_address_text = text;
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "vramswapd: out of host memory");
  }
}

void metrics_endpoint::note_stopping() noexcept { g_stopping = 1; }

std::string metrics_endpoint::url() const {
  const bool v6 = address_.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + address_ + "]" : address_) + ":" + std::to_string(port_);
}

int metrics_endpoint::start(const std::string& port_text, const char* what, render_fn render,
                            std::unique_ptr<metrics_endpoint>* out, int stall_ms) noexcept {
  try {
    char* end = nullptr;
    errno = 0;
    const unsigned long port = std::strtoul(port_text.c_str(), &end, 10);
    if (port_text.empty() || end == port_text.c_str() || *end != '\0' || errno != 0 || port > 65535) {
      return fail(err_invalid_argument, "vramswapd: metrics port \"%s\" (%s) is not a port number 0..65535", port_text.c_str(), what);
    }
    std::unique_ptr<metrics_endpoint> m(new metrics_endpoint());
    m->render_ = std::move(render);
    m->address_ = g_address_text;
    m->stall_ms_ = stall_ms;
    m->started_ns_ = monotonic_ns();
    sockaddr_storage addr = g_address;
    const bool v6 = addr.ss_family == AF_INET6;
    m->listen_fd_ = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (m->listen_fd_ < 0) return fail_errno(errno, "vramswapd: metrics socket");
    const int one = 1;
    ::setsockopt(m->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (v6) {
      reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(static_cast<uint16_t>(port));
    } else {
      reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(static_cast<uint16_t>(port));
    }
    const socklen_t addr_len = v6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    if (::bind(m->listen_fd_, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0) {
      const int e = errno;
      return fail_errno(e, "vramswapd: metrics endpoint: bind %s%s%s:%lu (%s)%s", v6 ? "[" : "", m->address_.c_str(), v6 ? "]" : "",
                        port, what,
                        e == EADDRNOTAVAIL ? "; that address is not one of this host's (or pod's): use one it has, or 0.0.0.0"
                        : e == EADDRINUSE  ? "; another program listens there: choose another port"
                                           : "");
    }
    if (::listen(m->listen_fd_, 64) != 0) return fail_errno(errno, "vramswapd: metrics endpoint: listen");
    socklen_t len = sizeof addr;
    if (::getsockname(m->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return fail_errno(errno, "vramswapd: metrics endpoint: getsockname");
    }
    m->port_ = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
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

void metrics_endpoint::beat() noexcept { last_beat_ns_.store(monotonic_ns(), std::memory_order_relaxed); }

bool metrics_endpoint::live(uint64_t now, std::string* body) {
  const uint64_t beat = last_beat_ns_.load(std::memory_order_relaxed);
  const uint64_t since = beat != 0 ? beat : started_ns_;
  const uint64_t quiet_ms = now > since ? (now - since) / 1'000'000 : 0;
  if (quiet_ms < static_cast<uint64_t>(stall_ms_)) {
    *body = "ok\n";
    return true;
  }
  *body = "the server's event loop has not turned for " + std::to_string(quiet_ms) + " ms (the limit is " +
          std::to_string(stall_ms_) + " ms; it turns at least every " + std::to_string(k_beat_ms) +
          " ms when well). It serves no handshake, hang-up or repair meanwhile: restart vramswapd (its clients reconnect)\n";
  return false;
}

bool metrics_endpoint::ready(uint64_t now, std::string* body) {
  std::string why;
  const bool is_live = live(now, &why);
  if (g_stopping != 0) {
    *body = "stopping: the server got SIGTERM or SIGINT and is closing its connections and releasing its pool\n";
    return false;
  }
  if (!is_live) {
    *body = "not ready: " + why;
    return false;
  }
  if (last_beat_ns_.load(std::memory_order_relaxed) == 0) {
    *body = "not ready: the pool is built but the server's event loop has not begun serving its socket yet\n";
    return false;
  }
  *body = "ready\n";
  return true;
}

std::string metrics_endpoint::answer_for(const std::string& request) {
  std::string method;
  const std::string path = path_of(request, &method);
  const char* text = "text/plain; charset=utf-8";
  if (method != "GET" && method != "HEAD") {
    return http("405 Method Not Allowed", text, "only GET and HEAD are served here (/metrics, /healthz, /readyz)\n", false,
                "Allow: GET, HEAD\r\n");
  }
  const bool head = method == "HEAD";
  std::string body;
  const uint64_t now = monotonic_ns();
  if (path == "/healthz") return http(live(now, &body) ? "200 OK" : "503 Service Unavailable", text, body, head);
  if (path == "/readyz") return http(ready(now, &body) ? "200 OK" : "503 Service Unavailable", text, body, head);
  if (path == "/metrics" || path == "/") {
    std::string status;
    try {
      status = render_(&body) ? "200 OK" : "500 Internal Server Error";
    } catch (const std::exception& e) {
      status = "500 Internal Server Error";
      body = std::string("rendering the metrics: ") + e.what() + "\n";
    }
    return http(status, "text/plain; version=0.0.4; charset=utf-8", body, head);
  }
  return http("404 Not Found", text, "no " + path + " here: this endpoint serves GET (and HEAD) /metrics, /healthz and /readyz\n", head);
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
            c.answer = answer_for(c.request);
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
