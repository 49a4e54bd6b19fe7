#include "pool/pool_member.hpp"

#include <unistd.h>

#include <utility>

#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/futex.hpp"
#include "pool/process_label.hpp"

namespace vramswap::detail {

int pool_member::join(backend& be, int device, std::unique_ptr<pool_member>* out) noexcept {
  std::unique_ptr<pool_connection> conn;
  VS_TRY(pool_connection::connect(be, device, /*autostart=*/true, &conn));
  try {
    out->reset(new pool_member(std::move(conn)));
    (*out)->observe().identify(static_cast<uint32_t>(::geteuid()), option_text(option_id::job_name), command_line_of(::getpid()));
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "device %d: joining the pool: out of host memory", device);
  }
  return ok;
}

pool_member::pool_member(std::unique_ptr<pool_connection> conn)
    : conn_(std::move(conn)), observe_(conn_->segment(), conn_->member()) {}

pool_member::~pool_member() { stop_service(); }

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

uint32_t pool_member::requests_seen() const noexcept { return slot().requests.load(std::memory_order_acquire); }

void pool_member::wait_for_request(uint32_t seen, uint64_t timeout_ns) noexcept {
  if (stop_.load()) return;
  futex_wait(&slot().requests, seen, timeout_ns);
}

}  // namespace vramswap::detail
