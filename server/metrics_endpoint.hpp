// metrics_endpoint: the pool server's HTTP endpoint (Prometheus metrics, liveness and
// readiness), served from a thread of its own.
//
//   GET /metrics   the render function's text (Prometheus format); 500 when it fails. Also "/".
//   GET /healthz   liveness: 200 "ok" while the pool server's event loop turns: it calls
//                  beat() at every turn and turns at least every k_beat_ms even when idle;
//                  503, saying how long it has not, once no beat came for stall_ms.
//   GET /readyz    readiness: 200 "ready" once the loop has beaten (pool_server starts the
//                  endpoint after the pool and its socket exist, so the pool is built and the
//                  socket is being accepted on), while live and not stopping; 503 with the
//                  reason otherwise (not serving yet, stalled, stopping).
//   anything else  404 (methods other than GET and HEAD 405, with Allow: GET, HEAD).
//   HEAD           what GET would answer (status, headers, Content-Length), without the body.
//
// A loop stuck anywhere (a lock, a driver call, a spin) stops beating, and after stall_ms
// the endpoint says so. The beat is one relaxed atomic store: nothing to read from /proc, the
// same on every kernel.
//
// Address: 127.0.0.1 unless set_address() chose another (vramswapd --metrics-address). A
// non-loopback address is allowed because a pod's kubelet probes and Prometheus reach the
// server over the pod network; the endpoint exposes only counts and states (frames, members,
// bytes moved, lock waits), never memory contents, and it accepts no input beyond a
// request line. Bind it to the pod's own address (or 0.0.0.0 in a
// pod network namespace), not a host's public interface.
//
// Connections: a TCP listener served by one thread with a poll() loop of its own, so that
// no scraper, however silent or slow, ever holds up the server's event loop (handshakes,
// hang-ups, repairs). Every socket is non-blocking and each connection is a small state
// machine with a deadline:
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
// Threads: set_address() before any start(); start() and the destructor on the owner's
// thread; beat() on the loop's; note_stopping() anywhere, signal handlers included; render
// on the endpoint's thread.
// Errors: 0 or a negative vramswap::detail::status with last_error(); never throws.
#pragma once

#include <atomic>
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
  // The loop may go this long without a beat before /healthz fails: far above any one step
  // of the loop (a repair's scrub of a dead member's frames, a handshake's descriptor batches).
  static constexpr int k_stall_ms = 30000;
  // The longest the loop sleeps in poll() while an endpoint watches it.
  static constexpr int k_beat_ms = 1000;

  // Fills *body; true for 200 OK, false for 500 with *body as the error text.
  using render_fn = std::function<bool(std::string* body)>;

  // The address every later start() listens on: an IPv4 or IPv6 literal (no host names:
  // nothing is resolved). Process-wide because pool_server, which starts the endpoint,
  // carries only the port; vramswapd sets it from --metrics-address before the server
  // starts. err_invalid_argument naming `what` for anything else.
  static int set_address(const std::string& text, const char* what) noexcept;
  // From now on, /readyz of every endpoint of this process answers 503 "stopping".
  // Async-signal-safe: vramswapd calls it from its SIGTERM handler.
  static void note_stopping() noexcept;

  // Listen on the address above at `port_text` (0: any free port) and start serving;
  // stall_ms: how long the loop may go without beat() before /healthz fails.
  // err_invalid_argument for a bad port (the message names `what`, the setting it came
  // from); err_system when the socket, bind or thread fails (bind names the address).
  static int start(const std::string& port_text, const char* what, render_fn render,
                   std::unique_ptr<metrics_endpoint>* out, int stall_ms = k_stall_ms) noexcept;

  // Stops the thread (at once: it waits for nothing) and closes every connection.
  ~metrics_endpoint();
  metrics_endpoint(const metrics_endpoint&) = delete;
  metrics_endpoint& operator=(const metrics_endpoint&) = delete;

  uint16_t port() const noexcept { return port_; }
  // The watched loop, at every turn: "still turning". Any thread; lock-free.
  void beat() noexcept;
  // http://ADDRESS:PORT (IPv6 in brackets), for log lines.
  std::string url() const;

 private:
  metrics_endpoint() = default;
  void run() noexcept;
  // 200 or 503 and the body for /healthz and /readyz.
  bool live(uint64_t now, std::string* body);
  bool ready(uint64_t now, std::string* body);
  std::string answer_for(const std::string& request);

  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  uint16_t port_ = 0;
  render_fn render_;
  std::string address_;
  int stall_ms_ = k_stall_ms;
  uint64_t started_ns_ = 0;               // when start() ran: the stall clock's origin before any beat
  std::atomic<uint64_t> last_beat_ns_{0};  // 0 until the loop's first beat
  std::thread thread_;
};

}  // namespace vramswap::detail
