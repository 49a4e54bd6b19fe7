// pool_server: the per-device pool server behind vramswapd.
//
// One per device and VRAMSWAP_SHM_PREFIX (an exclusive flock on <runtime
// dir>/<prefix><key>.server.lock, held for the server's lifetime, makes sure of it). It owns
// the device's pool:
//
//   start  creates every frame of the pool (size below), scrubs each (maps it at a scratch
//          reservation and sets it to zero), exports each ONCE and keeps the descriptors
//          (the soft RLIMIT_NOFILE is raised to the hard limit first: a 140 GiB pool of
//          32 MiB frames is ~4,500 descriptors), creates the pool segment (frame table and
//          member table, pool/pool_layout.hpp), opens the device lock, and listens on
//          <runtime dir>/<prefix><key>.sock (mode 0600, 0660 with VRAMSWAP_GROUP).
//   run    a poll() loop. A new connection: SO_PEERCRED must show the server's uid, root,
//          or (with VRAMSWAP_GROUP) a member of that group (SO_PEERGROUPS); the hello must
//          carry the protocol's magic and version, and where this server can see the peer
//          (pool/pool_protocol.hpp) its true pid, namespace and start time; else an error welcome with
//          a message, and the connection is closed. Then a member slot, the welcome and
//          the frames' descriptors in batches of 250 (pool/pool_protocol.hpp). The
//          connection then stays open and silent.
//   repair a connection's hang-up means its process is gone (or has left the pool). Once
//          the process has exited (client_exited: its pidfd is readable, or, without one,
//          a process this server can see is a zombie: either comes after all its files are
//          released, so its GPU work and mappings are torn down), or k_repair_grace_ms after
//          the hang-up at the latest (a process that closed the connection and lives on, or
//          one this server can neither watch nor see), every frame the member owns, in any state,
//          is scrubbed and then moved to free by compare-and-swap; the member slot is
//          freed; waiters for free frames are woken (notify_freed); and the device lock is
//          repaired (device_lock::repair_now), so a lock the dead process held passes on.
//   host   with VRAMSWAP_HOST_POOL (or options.host_pool) set: one memfd of that size (whole
//   pool   frames), faulted in at start by a few threads (so RAM is committed before any
//          client relies on it, and a host too small fails here, by name), its slot table
//          in the pool segment, its descriptor sent to each client after the frames. The
//          server reads no slot contents; it zeroes a dead member's slots at repair, then
//          frees them (every member maps the whole host pool: docs/security.md).
//   metrics with a metrics port, also a TCP listener (127.0.0.1 unless --metrics-address
//          says otherwise: server/metrics_endpoint.hpp), served from a thread
//          of its own (server/metrics_endpoint.hpp), never from the poll() loop: GET /metrics
//          answers the device's gauges and counters in the Prometheus text format
//          (pool/pool_report.hpp), one short request per connection (HTTP/1.0, closed after
//          the answer; a client gets 1 s to send its request and 5 s to read the answer). The
//          port is published in the pool header, where `vramswap status` shows it.
//   adopt  a stale pool segment (its server stopped or died) whose members still lease their
//          slots is the running pool (pool/pool_layout.hpp): the server builds nothing, keeps
//          the segment's tables, and takes its members as orphans (server/pool_adoption.cpp).
//          The first orphan to rejoin (pool/pool_protocol.hpp) hands it a descriptor of
//          every frame and of the host pool, which it imports; a newcomer meanwhile waits
//          for its welcome. An orphan whose lease goes (it died while no server ran) is
//          repaired as any dead member, once the frames are here; if every orphan dies before
//          one hands them over, their memory is gone with them and the server builds the
//          pool anew, at the same size, in the same segment.
//   stop   request_stop() (async-signal-safe; vramswapd calls it on SIGTERM/SIGINT), or
//          idle exit: with idle_exit_s > 0, the server stops after that many seconds with
//          no client. The destructor closes every connection, unlinks the socket, closes
//          the descriptors and releases every frame, then drops the server flock. With no
//          member left it unlinks the pool segment: the device's free memory is back where
//          it was. With members still attached (an upgrade, a restart by a service manager)
//          it leaves the pool segment for the next server to adopt: the members' imports
//          keep the frames' memory, and they rejoin the next server.
//
// Pool size: VRAMSWAP_POOL_SIZE (or options.pool_size), bytes or a percentage of the
// device's total memory; by default the device's free memory less a reserve for the
// contexts and libraries of the processes that use it: max(1 GiB, 3% of total) on cuda,
// one frame on the host backend. Rounded down to whole frames. Frame size:
// VRAMSWAP_FRAME_SIZE, a power-of-two multiple of the device's granularity.
//
// Threads: start() and run() on one thread; request_stop() from anywhere, signal handlers
// included; the metrics endpoint on a thread of its own. Errors: 0 or a negative vramswap::detail::status with last_error(); never throws.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "pool/pool_paths.hpp"
#include "pool/pool_protocol.hpp"
#include "pool/pool_segment.hpp"

namespace vramswap::detail {

class device_lock;
class metrics_endpoint;
struct fd_guard;

struct pool_server_options {
  int device = 0;
  backend* be = nullptr;      // nullptr: default_backend() (VRAMSWAP_BACKEND)
  std::string pool_size;      // empty: VRAMSWAP_POOL_SIZE (empty there too: the default above)
  std::string host_pool;      // empty: VRAMSWAP_HOST_POOL; size or percent of RAM; "0": no shared host pool
  int64_t idle_exit_s = 0;    // > 0: stop after this many seconds with no client; 0: never
  bool log_to_file = false;   // send stdout/stderr to <runtime dir>/<key>.log (on-demand mode)
  // Prometheus metrics at http://ADDRESS:PORT/metrics (server/metrics_endpoint.hpp): a port number (0: any free port);
  // empty: VRAMSWAP_METRICS_PORT (empty there too: no endpoint). docs/observability.md.
  std::string metrics_port;
  // A service manager restarts this server (vramswapd under NOTIFY_SOCKET): said in the pool
  // header, so that its members give it a while to come back before starting one themselves.
  bool managed = false;
};

class pool_server {
 public:
  // A client that hung up but still lives is repaired at most this long after the hang-up.
  // A server started on demand appends to one log in the runtime dir, which many servers
  // share one after another (each exits when idle) and which is often a small tmpfs: at its
  // start, a log larger than this becomes <log>.1, replacing the one before.
  static constexpr off_t k_log_rotate_bytes = 8 << 20;
  static constexpr int k_repair_grace_ms = 2000;
  // The server never blocks on a client: the device lock's repair waits at most this long
  // for the lock's internal mutex (a client may be stopped inside it), and while it could
  // not run, run() retries it every k_lock_repair_retry_ms.
  static constexpr int64_t k_lock_repair_wait_ns = 5'000'000;
  static constexpr int k_lock_repair_retry_ms = 100;
  // How often an adopting server looks at its orphans' leases and its waiting newcomers.
  static constexpr int k_orphan_poll_ms = 20;
  // How long after a member's exit its connection may stay open before the processes that
  // hold it are named (its own files close before its pidfd says it exited: any time here is
  // only margin).
  static constexpr int k_held_connection_grace_ms = 500;

  // Build the pool and start listening. err_busy when another server serves the device (the
  // detail names its pid); err_invalid_argument for a bad size option; err_out_of_memory
  // when the pool does not fit; err_not_owner for a foreign runtime dir; err_system.
  static int start(const pool_server_options& options, std::unique_ptr<pool_server>* out) noexcept;

  ~pool_server();
  pool_server(const pool_server&) = delete;
  pool_server& operator=(const pool_server&) = delete;

  // Serve until request_stop() or the idle timeout. Returns 0, or err_system when poll fails.
  int run() noexcept;
  // Make run() return soon. Async-signal-safe.
  void request_stop() noexcept;

  const std::string& device_key() const noexcept { return key_; }
  const std::string& socket_path() const noexcept { return socket_path_; }
  const std::string& log_path() const noexcept { return log_path_; }
  uint32_t frame_count() const noexcept { return frame_count_; }
  uint64_t frame_size() const noexcept { return frame_size_; }
  size_t clients() const noexcept { return clients_.size(); }
  // Frames scrubbed and freed by repairs since start.
  uint64_t frames_repaired() const noexcept { return frames_repaired_; }
  // Host slots of the shared host pool (0: none), and those freed by repairs since start.
  uint32_t host_slot_count() const noexcept { return host_slots_; }
  uint64_t slots_repaired() const noexcept { return slots_repaired_; }
  // The metrics endpoint's port (0: none).
  uint16_t metrics_port() const noexcept { return metrics_port_; }
  // Whether a process still uses the pool (a member leases its slot): then the server's end
  // leaves the pool for the next server instead of removing it.
  bool pool_in_use() const noexcept;
  // Whether this server adopted a running pool (and still waits for its frames: !has_frames()).
  bool adopted() const noexcept { return adopted_; }
  bool has_frames() const noexcept { return !frames_.empty(); }

 private:
  struct client {
    int fd = -1;              // -1: hung up, or an orphan not yet rejoined
    uint32_t member = 0;
    pid_t pid = 0;            // as the client sees itself (for messages)
    uint64_t start_time = 0;
    pid_t peer_pid = 0;       // SO_PEERCRED's: the client in this server's PID namespace (0: not visible)
    int pidfd = -1;           // the pidfd it sent with its hello (-1: none)
    uint64_t hung_up_ns = 0;  // when its connection closed, or an orphan's lease went (0: alive as far as known)
    bool orphan = false;      // a member of the previous server that has not rejoined (no connection yet)
    // When its process exited (its pidfd said so) with its connection still open: processes
    // it forked hold the connection, and its GPU context with it (0: not seen exited).
    uint64_t exited_ns = 0;
    bool held_told = false;   // the warning that names those processes was logged
    // Pidfds of the processes last found holding its connection after it exited: its repair
    // waits for them too (client_exited), as for its own.
    std::vector<int> holder_pidfds;
  };
  // A newcomer whose hello came while this server has adopted a pool and has no frames yet.
  struct newcomer {
    int fd = -1;
    pool_protocol::hello hello{};
    pid_t peer_pid = 0;
    int pidfd = -1;
    uint64_t since_ns = 0;
  };
  // A newcomer that has its welcome, the frames and the host pool, and imports, maps and pins
  // them before it says it attached: seconds for a large host pool, so run() watches it with
  // the other connections instead of the handshake waiting for it.
  struct attaching {
    int fd = -1;
    uint32_t member = 0;
    pool_protocol::hello hello{};
    pid_t peer_pid = 0;
    int pidfd = -1;
    uint64_t since_ns = 0;
  };
  // Has client `c`'s process exited (all its files released, its GPU work torn down), and so
  // have the processes found holding its connection after it exited?
  static bool client_exited(const client& c) noexcept;
  // Closes a client's descriptors: its connection, its pidfd and its holders' pidfds.
  static void close_client(client* c) noexcept;

  // start(), run(), request_stop() and these: pool_server.cpp.
  pool_server() = default;
  int finish_start(const pool_server_options& options, const device_info& info, const pool_paths& paths) noexcept;
  void teardown() noexcept;
  // A turn of run(), in its order: the poll set, the poll's timeout, what the poll found,
  // then the repair of members that are gone.
  struct poll_set;
  void fill_poll_set(bool accept_paused, poll_set* ps) noexcept;
  // The longest the turn's poll may wait; a newcomer still in its handshake resets
  // *idle_since (the server is not idle).
  int poll_timeout_ms(bool pending, bool accept_paused, uint64_t* idle_since) noexcept;
  // Hang-ups, exits of connected members, attaches, hellos, and a new connection.
  void serve_events(const poll_set& ps, uint64_t now) noexcept;
  // Members whose process is gone (or that left k_repair_grace_ms ago): their frames
  // repaired, their entries removed; the last one's removal resets *idle_since.
  void repair_gone_members(uint64_t now, uint64_t* idle_since) noexcept;
  // The pool: pool_frames.cpp.
  int build_pool(uint64_t pool_bytes) noexcept;
  int build_host_pool(uint64_t bytes) noexcept;
  int prepare_scrub() noexcept;
  int scrub(const uint32_t* indices, size_t count) noexcept;
  // The handshake: pool_handshake.cpp.
  int open_socket() noexcept;
  // A new connection waits in greeting_ for its hello, so that a peer that connects and says
  // nothing (stopped, frozen) never blocks the loop; serve_new runs once the hello is there.
  void accept_one() noexcept;
  void serve_new(int fd) noexcept;
  // serve_new's checks of what a peer's hello claims (its PID namespace, pid, start time,
  // pidfd) against what the kernel says of it, where this server can see it. False: refused.
  bool peer_told_the_truth(int fd, const ucred& cred, const pool_protocol::hello& h, int pidfd) noexcept;
  // A newcomer to an adopted pool that has no frames yet: it waits in waiting_ (taking
  // `pidfd`), or is refused.
  void wait_for_frames(int fd, const pool_protocol::hello& h, pid_t peer_pid, fd_guard* pidfd) noexcept;
  // Connections whose hello did not come within the handshake's time: refused, closed.
  void drop_silent_connections(uint64_t now) noexcept;
  void welcome_newcomer(int fd, const pool_protocol::hello& h, pid_t peer_pid, int pidfd) noexcept;
  // attaching_[i]'s attach came, or its connection closed: a member, or its slot freed.
  void finish_attach(size_t i) noexcept;
  // Newcomers still attaching after the limit (alive but stuck): dropped, their slots freed.
  void drop_late_attaches(uint64_t now) noexcept;
  // Adoption of a running pool: pool_adoption.cpp.
  int adopt_pool() noexcept;
  void serve_rejoin(int fd, const pool_protocol::hello& h, pid_t peer_pid, int pidfd) noexcept;
  // serve_rejoin's steps. The orphan that the hello may rejoin as, or nullptr (refused).
  client* rejoining_orphan(int fd, const pool_protocol::hello& h) noexcept;
  // The welcome of a rejoin, the frames' descriptors when asked for, the attach.
  int send_rejoin_welcome(int fd, const pool_protocol::hello& h, bool send_frames) noexcept;
  // A rejoin failed (`why`): logged, at most once per k_rejoin_warn_interval_ns.
  void note_failed_rejoin(const pool_protocol::hello& h, const std::string& why) noexcept;
  int receive_frames(int fd) noexcept;
  std::string descriptor_limit_note(const std::string& why) const;
  // Each turn of run(): orphans whose lease went, newcomers waiting for the frames, and the
  // pool built anew when every orphan died before handing them over.
  void tend_adoption(uint64_t now) noexcept;
  int rebuild_pool() noexcept;
  void refuse(int fd, int status, const char* fmt, ...) noexcept __attribute__((format(printf, 4, 5)));
  bool peer_allowed(int fd, const ucred& peer, std::string* why) noexcept;
  // Zero every host slot that `member` holds; how many could not be (0: all were).
  uint32_t scrub_host_slots_of(uint32_t member) noexcept;
  // Repair: pool_repair.cpp.
  void repair(const client& c) noexcept;
  // Members that exited while their connection stays open (held by processes they forked
  // without exec): named once, k_held_connection_grace_ms after the exit; their frames stay
  // theirs until the connection closes, since those processes hold the GPU context too.
  void tell_held_connections(uint64_t now) noexcept;
  // The device lock's repair; false (and retried from run()) while its mutex is stuck.
  bool repair_lock() noexcept;
  // The metrics endpoint: pool_metrics.cpp.
  int open_metrics(const std::string& port_text, const char* what) noexcept;

  backend* be_ = nullptr;
  int device_ = 0;
  std::string key_;
  std::string socket_path_;
  std::string log_path_;
  int64_t idle_exit_s_ = 0;
  int server_lock_fd_ = -1;
  int listen_fd_ = -1;
  int host_pool_fd_ = -1;     // the shared host pool's memfd (-1: none)
  uint32_t host_slots_ = 0;
  uint64_t slots_repaired_ = 0;
  uint16_t metrics_port_ = 0;
  int stop_pipe_[2] = {-1, -1};
  uint64_t frame_size_ = 0;
  uint32_t frame_count_ = 0;
  std::vector<frame_id> frames_;  // empty while an adopted pool waits for a member's descriptors
  std::vector<int> exported_;  // frames_[i]'s descriptor, sent to every client
  device_ptr scratch_ = 0;     // a reservation for scrubbing: k_scrub_batch frames
  size_t scratch_frames_ = 0;
  stream_id stream_ = 0;
  std::unique_ptr<pool_segment> segment_;
  std::unique_ptr<device_lock> lock_;
  std::unique_ptr<device_lock> metrics_lock_;   // the metrics thread's own
  std::unique_ptr<metrics_endpoint> metrics_;   // none without a metrics port
  std::vector<client> clients_;
  std::vector<newcomer> waiting_;
  std::vector<attaching> attaching_;
  struct greeting {
    int fd = -1;
    uint64_t since_ns = 0;
  };
  std::vector<greeting> greeting_;
  // accept() out of descriptors (EMFILE, ENFILE): the connection stays in the backlog, so the
  // listener is not polled again until this time (else poll returns at once, every turn),
  // and the warning comes once per k_accept_warn_interval_ns with how many failed since.
  static constexpr uint64_t k_accept_pause_ns = 100'000'000;
  static constexpr uint64_t k_accept_warn_interval_ns = 10'000'000'000;
  uint64_t accept_paused_until_ns_ = 0;
  uint64_t accept_warned_ns_ = 0;
  uint64_t accept_failures_ = 0;
  uint64_t frames_repaired_ = 0;
  bool adopted_ = false;
  uint64_t adopted_ns_ = 0;  // when this server adopted the pool
  bool lock_repair_pending_ = false;
  // Failed rejoins, logged at most once per k_rejoin_warn_interval_ns.
  static constexpr uint64_t k_rejoin_warn_interval_ns = 30'000'000'000;
  uint64_t rejoin_warned_ns_ = 0;
  uint64_t rejoin_failures_ = 0;
  bool socket_bound_ = false;
};

}  // namespace vramswap::detail
