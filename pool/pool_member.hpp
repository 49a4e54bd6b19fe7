// pool_member: this process's membership in its device's pool.
//
// It holds what makes the process a member: the connection to the pool server
// (pool/pool_connection.hpp: the imported frames, the pool segment, the socket whose hang-up
// tells the server that we left), the member observer (pool/member_observer.hpp: phase,
// statistics and trace events for `vramswap status`), and the one service thread that waits
// on this member's request futex. Every write this process makes to its own member slot
// goes through here (holding, through set_holding; the rest through observe()), and nothing
// else waits on the slot's request futex.
//
// Other members ask this one for frames by marking them requested in the frame table and
// bumping the slot's `requests` futex word (pool_segment::notify_member). The service
// thread reads the word, calls the session's `serve` with the value it read, and sleeps on
// the word until it changes or k_service_poll_ns passes; `serve` looks at the frame table
// (member_frames::requested_of_me) and moves the pages. A request that comes while `serve`
// runs changes the word, so the next wait returns at once and no request is missed. A
// `serve` that wants to linger for requests that follow closely waits with
// wait_for_request(), on the same word.
//
// The keeper: a second thread, from join() on, that waits for the server's hang-up and then
// rejoins the pool through the next server (pool_connection::rejoin): at once, and again
// with a growing pause (up to k_rejoin_pause_max_ms) until a server takes it back. The first
// tries only dial: the node's service (pool_header::server_flags: a server under a service
// manager, or --service) is only ever waited for, never replaced by a server of a member;
// any other is started by whichever member gets the start lock first (pool/server_start.hpp), the others joining it. Nothing else
// waits for it: the frame table, the host slots and the lock work without a server, so the
// process goes on meanwhile (only repairs of members that die wait for the next server).
// A rejoin refused for good ends the keeper, and pool_alive() says so to the frame sources.
//
// Lifetime: stop_service() (or the destructor) joins the thread before the session's pager
// and frame sources go; the destructor then stops the keeper and closes the connection (the
// server sees us leave and frees what we still own).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "core/backend.hpp"
#include "pool/member_frames.hpp"
#include "pool/member_observer.hpp"
#include "pool/pool_connection.hpp"
#include "pool/pool_layout.hpp"
#include "pool/pool_segment.hpp"

namespace vramswap::detail {

class pool_member {
 public:
  // The service thread wakes at least this often even without a request, so that a serve
  // with work of its own (promotion, retries after a failure) gets to it.
  static constexpr uint64_t k_service_poll_ns = 50'000'000;
  // How long members give a server run by a service manager to come back before one of them
  // starts a server itself.
  static constexpr int k_rejoin_pause_max_ms = 250;

  // Join `device`'s pool: connect to its server (starting vramswapd when none runs), take
  // a member slot, and start the keeper. The errors are pool_connection::connect's, and
  // err_system when the keeper cannot start.
  static int join(backend& be, int device, std::unique_ptr<pool_member>* out) noexcept;
  ~pool_member();  // stops the service thread and the keeper, then leaves the pool
  pool_member(const pool_member&) = delete;
  pool_member& operator=(const pool_member&) = delete;

  pool_connection& connection() noexcept { return *conn_; }
  const pool_connection& connection() const noexcept { return *conn_; }
  pool_segment& segment() const noexcept { return conn_->segment(); }
  uint32_t index() const noexcept { return conn_->member(); }
  // A fresh view of the frame table for a frame source of this member.
  member_frames frames_view() const { return member_frames(conn_->segment(), conn_->member(), conn_->frames()); }
  member_observer& observe() noexcept { return observe_; }

  // Whether this process holds the device lock, as the pool server and observers see it.
  void set_holding(bool holding) noexcept;

  // Start the service thread: it calls `serve(requests_seen)` at each request and at least
  // every k_service_poll_ns, until stop_service(). `device` names the thread's log lines.
  void start_service(int device, std::function<void(uint32_t requests_seen)> serve);
  // Stop the service thread and wait for its current serve to return. Idempotent.
  void stop_service() noexcept;
  // Have the service thread serve now rather than at its next poll, with no request counted
  // (a turn of its own: this process started waiting for the lock). A hint: one that comes
  // while the thread is inside a serve is lost, and the poll serves within k_service_poll_ns.
  void wake_service() noexcept;
  bool stopping() const noexcept { return stop_.load(); }
  // The slot's request count now: read it before looking at the frame table, then wait on
  // it, so that a request made in between ends the wait at once.
  uint32_t requests_seen() const noexcept;
  // Wait until a request after `seen` comes, stop_service() is called, or `timeout_ns`
  // passes (from a serve, to linger for requests that follow closely).
  void wait_for_request(uint32_t seen, uint64_t timeout_ns) noexcept;

 private:
  explicit pool_member(std::unique_ptr<pool_connection> conn);
  pool_layout::member_slot& slot() const noexcept { return conn_->segment().member(conn_->member()); }
  void keep() noexcept;
  // After the server's hang-up: rejoin until a server takes us back (true), the pool is gone
  // or the keeper is told to stop (false).
  bool rejoin() noexcept;
  // Wait `ms` or until the keeper is told to stop (then true).
  bool pause_keeper(int ms) noexcept;

  std::unique_ptr<pool_connection> conn_;
  member_observer observe_;
  std::atomic<bool> stop_{false};
  std::thread service_;
  int keeper_wake_ = -1;  // eventfd: the keeper stops when it is readable
  std::thread keeper_;
};

}  // namespace vramswap::detail
