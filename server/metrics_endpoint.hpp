// metrics_endpoint: the pool server's Prometheus endpoint, served from a thread of its own.
//
// A TCP listener on 127.0.0.1 only (the metrics are not for the network), served by one
// thread with a poll() loop of its own, so that no scraper, however silent or slow, ever
// holds up the server's event loop (handshakes, hang-ups, repairs). Every socket is
// non-blocking and each connection is a small state machine with a deadline:
//
//   reading    the request, up to its blank line (at most k_max_request bytes), within
//              k_request_ms of the accept; a connection that says nothing is closed then.
//   answering  the answer (HTTP/1.0, "Connection: close"), within k_answer_ms; a reader
//              too slow for that is closed with its answer cut short.
//
// At most k_max_connections at once; more wait in the listen backlog until one ends (at the
// latest, a deadline later). The body comes from a render function, called on the endpoint's
// thread: it must be safe to call there (pool_server's reads the pool segment, which is made
// for concurrent readers, and a device_lock of its own).
//
// Threads: start() and the destructor on the owner's thread; render on the endpoint's.
// Errors: 0 or a negative vramswap::detail::status with last_error(); never throws.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace vramswap::detail {

class metrics_endpoint {
 public:
  static constexpr int k_request_ms = 1000;
  static constexpr int k_answer_ms = 5000;
  static constexpr size_t k_max_connections = 32;
  static constexpr size_t k_max_request = 4096;

  // Fills *body; true for 200 OK, false for 500 with *body as the error text.
  using render_fn = std::function<bool(std::string* body)>;

  // Listen on 127.0.0.1:`port_text` (0: any free port) and start serving GET /metrics.
  // err_invalid_argument for a bad port (the message names `what`, the setting it came
  // from); err_system when the socket, bind or thread fails (bind names the port).
  static int start(const std::string& port_text, const char* what, render_fn render,
                   std::unique_ptr<metrics_endpoint>* out) noexcept;

  // Stops the thread (at once: it waits for nothing) and closes every connection.
  ~metrics_endpoint();
  metrics_endpoint(const metrics_endpoint&) = delete;
  metrics_endpoint& operator=(const metrics_endpoint&) = delete;

  uint16_t port() const noexcept { return port_; }

 private:
  metrics_endpoint() = default;
  void run() noexcept;

  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  uint16_t port_ = 0;
  render_fn render_;
  std::thread thread_;
};

}  // namespace vramswap::detail
