// pool_connection: a client's connection to its device's pool server (vramswapd).
//
// What it does (protocol: pool/pool_protocol.hpp; server: server/pool_server.hpp; the whole
// story: docs/pool_server.md):
//   1. Finds the server's socket, <runtime dir>/<prefix><device key>.sock, the prefix being
//      VRAMSWAP_SHM_PREFIX (usually empty) and the key the device's UUID
//      (device_info::uuid: "GPU-..." on cuda, "host-N" on the host backend).
//   2. When nobody listens there and `autostart` is set, starts vramswapd itself
//      (pool/server_start.hpp), race-free:
//      under an flock on <runtime dir>/<prefix><key>.start.lock it tries once more (another
//      client may have just started one), else spawns the server detached (its own session; the
//      server forks once more so that it is nobody's child), waits until the server says it
//      is ready on a pipe and connects. k_start_timeout_s bounds all of it, the wait for the
//      start lock included: a server not ready by then is killed, and the clients that
//      waited on the lock give up by then too, naming the server, its pid and its log.
//   3. hello -> welcome; then receives every frame's descriptor in batches and imports each
//      with backend::import_frame. It keeps each descriptor (pool/kept_descriptors.hpp): a
//      next server can only get the frames from a member, and only as the descriptors the
//      member was given.
//   4. When the server has a shared host pool (VRAMSWAP_HOST_POOL): receives its memfd,
//      maps it, faults it in and registers it with the backend once (pinned), and closes
//      the descriptor. Saved pages then go to its slots (swap/pool_host_store.hpp).
//   5. Maps the pool segment, leases its member slot there (pool/pool_layout.hpp) and says
//      so (attach); it is a member once the server answers (attached).
//   6. Keeps the socket open, silent, for its lifetime: its hang-up is how the server learns
//      that this process is gone, and the server's hang-up is how this process learns that
//      its server stopped (server_alive()). The pool outlives its server: rejoin() goes on
//      as the same member through the next server (the one that adopted the pool), handing
//      it the frames' descriptors when it has none yet; meanwhile frames, host slots and
//      the lock keep working through the segments. A rejoin refused for good (the pool was
//      replaced, or this membership repaired) makes pool_alive() false: the pool is gone.
//
// Threads: rejoin() on one thread at a time (pool_member's keeper); server_alive(),
// pool_alive(), socket_fd() and server_pid() from any thread. The socket keeps its
// descriptor number across a rejoin (the new connection is dup2'ed onto it).
//
// Lifetime rule: destroy the connection only after every pool frame is unmapped in this
// process and every frame this member owned was given back (pool_layout "give"). The
// destructor releases the imported frames and closes the socket; the server then treats
// any frame still owned by this member as abandoned: it scrubs and frees it.
//
// Return codes: 0, or a negative vramswap::detail::status with the detail in last_error(); never
// throws.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/pinned_chunk.hpp"
#include "pool/kept_descriptors.hpp"
#include "pool/pool_paths.hpp"
#include "pool/server_start.hpp"

namespace vramswap::detail {

class pool_segment;
namespace pool_protocol {
struct welcome;
}

class pool_connection {
 public:
  // How long a client that finds no server waits for one: for the start lock, for the
  // server it starts to report ready.
  static constexpr int k_start_timeout_s = k_server_start_timeout_s;
  // How long a connecting process waits for the node's service (pool_header::server_flags: a
  // server under a service manager, or --service) to come back before it gives up; it never
  // starts one itself for such a pool.
  static constexpr uint64_t k_managed_restart_wait_ns = 10'000'000'000;

  // Connect to `device`'s pool server (starting one when `autostart` and none runs),
  // import every frame of the pool into `be` and map the pool segment. A server that ends
  // during the handshake (a restart) is followed to the next one, twice at most; while the
  // pool's last server was the node's service, this process waits k_managed_restart_wait_ns
  // for it and then fails (err_unavailable, saying how to start it), never starting one.
  // Returns 0; err_unavailable (no server and !autostart; or vramswapd not found: the
  // detail lists the places tried; or the server could not start or died before it was
  // ready: the detail names its log); err_timeout (no server was ready within
  // k_start_timeout_s: the one this process started was killed, or another client's start
  // held the start lock that long; the detail names the server, its pid and its log); the welcome's status when the server refused (err_not_owner: wrong user;
  // err_version_mismatch: another protocol version; err_busy: no member slot free), with
  // the server's message; err_version_mismatch (the pool segment); err_system.
  static int connect(backend& be, int device, bool autostart, std::unique_ptr<pool_connection>* out) noexcept;

  ~pool_connection();
  pool_connection(const pool_connection&) = delete;
  pool_connection& operator=(const pool_connection&) = delete;

  // After the server's hang-up: connect to the device's server (starting one when
  // `autostart` and none listens) and go on as this same member of the same pool. Returns 0;
  // err_unavailable or err_timeout while no server is there yet (try again); the refusal's
  // code when the server will not take this membership back (the pool it belonged to is
  // gone, or the membership was repaired): then pool_alive() is false from now on, and the
  // detail says why. err_system and the handshake's errors otherwise (try again).
  int rejoin(bool autostart) noexcept;
  // False once this process's pool is gone for good (a refused rejoin); a stopped server
  // alone does not make it false.
  bool pool_alive() const noexcept { return !lost_.load(std::memory_order_acquire); }
  uint64_t pool_id() const noexcept { return pool_id_; }

  const std::string& device_key() const noexcept { return key_; }
  int device() const noexcept { return device_; }
  uint32_t member() const noexcept { return member_; }
  pool_segment& segment() const noexcept { return *segment_; }
  uint32_t frame_count() const noexcept { return static_cast<uint32_t>(frames_.size()); }
  uint64_t frame_size() const noexcept { return frame_size_; }
  // This process's frame_id of pool frame `index` (0 .. frame_count-1).
  frame_id frame(uint32_t index) const noexcept { return frames_[index]; }
  const std::vector<frame_id>& frames() const noexcept { return frames_; }
  // The shared host pool, mapped and pinned in this process (nullptr / 0: the server has
  // none). Slot i is host_pool() + i * frame_size(); who holds it: segment().read_slot(i).
  char* host_pool() const noexcept { return host_pool_.base(); }
  uint32_t host_slot_count() const noexcept { return host_slot_count_; }
  // The connection's socket, for poll(): it becomes readable/hung-up when the server dies.
  int socket_fd() const noexcept { return fd_; }
  pid_t server_pid() const noexcept { return server_pid_.load(std::memory_order_acquire); }
  // False once the server has closed the connection (it died or shut down) until a rejoin;
  // never blocks.
  bool server_alive() const noexcept;

 private:
  explicit pool_connection(backend& be) : be_(be) {}
  int handshake() noexcept;
  // The handshake's steps, in order: send the hello and check the welcome (`server`: the
  // server's pid as this process sees it, for messages); import the frames; open the pool
  // segment the welcome names and check that it is this server's; take the member lease
  // and attach.
  int exchange_hello(pool_protocol::welcome* w, pid_t* server) noexcept;
  int receive_frames(const pool_protocol::welcome& w, pid_t server) noexcept;
  int open_segment(const pool_protocol::welcome& w) noexcept;
  int attach_as_member(pid_t server) noexcept;
  int attach_host_pool(uint32_t slot_count, uint64_t bytes) noexcept;
  // The rejoin's exchange on a new connection `fd` (pool/pool_protocol.hpp, "Rejoining").
  int rejoin_on(int fd) noexcept;
  int send_frames(int fd) noexcept;

  backend& be_;
  int device_ = -1;
  std::string key_;
  int fd_ = -1;
  uint32_t member_ = 0;
  std::atomic<pid_t> server_pid_{0};
  uint64_t pool_id_ = 0;
  std::atomic<bool> lost_{false};
  int host_pool_fd_ = -1;  // the host pool's memfd, kept to hand to a next server
  uint64_t frame_size_ = 0;
  std::vector<frame_id> frames_;
  kept_descriptors kept_;  // frames_[i]'s descriptor at kept_.fds()[i], for a next server
  bool told_not_kept_ = false;
  std::unique_ptr<pool_segment> segment_;
  pinned_chunk host_pool_;  // the shared host pool, mapped and pinned; empty when none
  uint32_t host_slot_count_ = 0;
};

}  // namespace vramswap::detail
