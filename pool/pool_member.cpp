#include "pool/pool_member.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/futex.hpp"
#include "lock/process_identity.hpp"
#include "pool/process_label.hpp"

namespace vramswap::detail {

int pool_member::join(backend& be, int device, std::unique_ptr<pool_member>* out) noexcept {
  std::unique_ptr<pool_connection> conn;
  VS_TRY(pool_connection::connect(be, device, /*autostart=*/true, &conn));
  std::unique_ptr<pool_member> m;
  try {
    m.reset(new pool_member(std::move(conn)));
    m->observe().reset_prediction();
    m->observe().identify(static_cast<uint32_t>(::geteuid()), option_text(option_id::job_name), command_line_of(::getpid()));
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "device %d: joining the pool: out of host memory", device);
  }
  m->keeper_wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (m->keeper_wake_ < 0) return fail_errno(errno, "device %d: joining the pool: eventfd for its keeper", device);
  try {
    m->keeper_ = std::thread([p = m.get(), device] {
      log_set_device(device);
      p->keep();
    });
  } catch (const std::system_error& e) {
    return fail(err_system, "device %d: joining the pool: cannot start its keeper thread: %s", device, e.what());
  }
  *out = std::move(m);
  return ok;
}

pool_member::pool_member(std::unique_ptr<pool_connection> conn)
    : conn_(std::move(conn)), observe_(conn_->segment(), conn_->member()) {}

pool_member::~pool_member() {
  stop_service();
  if (keeper_wake_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(keeper_wake_, &one, sizeof one);
  }
  if (keeper_.joinable()) keeper_.join();
  if (keeper_wake_ >= 0) ::close(keeper_wake_);
}

void pool_member::keep() noexcept {
  for (;;) {
    pollfd p[2] = {{keeper_wake_, POLLIN, 0}, {conn_->socket_fd(), POLLIN | POLLRDHUP, 0}};
    const int n = ::poll(p, 2, -1);
    if (n < 0 && errno != EINTR) {
      log(log_level::error, "pool: the membership's keeper stops: poll: %s; a restart of the pool server would end this job's pool",
          std::strerror(errno));
      return;
    }
    if (n > 0 && p[0].revents != 0) return;
    // The server never writes after the handshake: readable means it hung up.
    if (n <= 0 || p[1].revents == 0 || conn_->server_alive()) continue;
    if (!rejoin()) return;
  }
}

bool pool_member::rejoin() noexcept {
  const pid_t old = conn_->server_pid();
  const uint64_t since = monotonic_ns();
  // The header still names the server that ended, until the next one claims the pool.
  const bool managed = (segment().header()->server_flags.load(std::memory_order_relaxed) & pool_layout::k_server_managed) != 0;
  log(log_level::info, "pool: the pool server (pid %d) of %s ended; this process goes on, and rejoins the pool through the next server%s",
      static_cast<int>(old), conn_->device_key().c_str(),
      managed ? " (it is the node's service: this process waits for it to come back, and starts no server of its own)" : "");
  int pause_ms = 10;
  bool told = false;
  for (;;) {
    // Never for the node's service: a server of ours would die with this job, and while it
    // lived the service could not start.
    const bool autostart = !managed;
    const int rc = conn_->rejoin(autostart);
    if (rc == ok) {
      log(log_level::info, "pool: rejoined the pool of %s through the pool server pid %d, %.2f s after pid %d ended",
          conn_->device_key().c_str(), static_cast<int>(conn_->server_pid()), static_cast<double>(monotonic_ns() - since) / 1e9,
          static_cast<int>(old));
      return true;
    }
    if (!conn_->pool_alive()) {
      log(log_level::error, "%s (this process goes on with the memory it holds; its next need of a frame fails)", last_error());
      return false;
    }
    // No server yet is expected for a moment; anything else is worth a word, once.
    if (!told && (rc != err_unavailable || autostart)) {
      log(log_level::warn, "pool: rejoining the pool of %s: %s; trying again", conn_->device_key().c_str(), last_error());
      told = true;
    }
    clear_error();
    if (pause_keeper(pause_ms)) return false;
    pause_ms = std::min(pause_ms * 2, k_rejoin_pause_max_ms);
  }
}

bool pool_member::pause_keeper(int ms) noexcept {
  pollfd p{keeper_wake_, POLLIN, 0};
  return ::poll(&p, 1, ms) > 0;
}

void pool_member::set_holding(bool holding) noexcept { slot().holding.store(holding ? 1 : 0); }

void pool_member::start_service(int device, std::function<void(uint32_t)> serve) {
  service_ = std::thread([this, device, serve = std::move(serve)] {
    log_set_device(device);
    while (!stop_.load()) {
      const uint32_t seen = requests_seen();
      serve(seen);
      if (stop_.load()) break;
      futex_wait(&slot().requests, seen, k_service_poll_ns);
    }
  });
}

void pool_member::stop_service() noexcept {
  stop_.store(true);
  futex_wake_one(&slot().requests);
  if (service_.joinable()) service_.join();
}

void pool_member::wake_service() noexcept { futex_wake_one(&slot().requests); }

uint32_t pool_member::requests_seen() const noexcept { return slot().requests.load(std::memory_order_acquire); }

void pool_member::wait_for_request(uint32_t seen, uint64_t timeout_ns) noexcept {
  if (stop_.load()) return;
  futex_wait(&slot().requests, seen, timeout_ns);
}

}  // namespace vramswap::detail
