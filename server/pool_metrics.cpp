// pool_server's metrics endpoint: the render callback over the pool segment and a device
// lock of the endpoint's own, and the port published in the pool header.
#include "server/pool_server.hpp"

#include <atomic>
#include <new>
#include <string>

#include "core/log.hpp"
#include "core/status.hpp"
#include "lock/device_lock.hpp"
#include "pool/pool_report.hpp"
#include "pool/pool_segment.hpp"
#include "server/metrics_endpoint.hpp"

namespace vramswap::detail {

int pool_server::open_metrics(const std::string& port_text, const char* what) noexcept {
  // The endpoint's thread reads the pool segment (made for concurrent readers) and the lock's
  // queue through a device_lock of its own, never the one that repairs use.
  metrics_lock_.reset(new (std::nothrow) device_lock());
  if (!metrics_lock_) return fail(err_out_of_memory, "vramswapd: out of host memory");
  VS_TRY(device_lock::open(key_, metrics_lock_.get()));
  const std::string key = key_;
  const int index = device_;
  pool_segment* segment = segment_.get();
  device_lock* lock = metrics_lock_.get();
  auto render = [key, index, segment, lock](std::string* body) {
    device_report r;
    if (collect_report(key, *segment, lock, &r) != ok) {
      *body = std::string(last_error()) + "\n";
      return false;
    }
    r.index = index;  // a GPU's key is its UUID: the index (the gpu label) is the server's to tell
    *body = render_prometheus({r});
    return true;
  };
  VS_TRY(metrics_endpoint::start(port_text, what, render, &metrics_));
  metrics_port_ = metrics_->port();
  segment_->header()->metrics_port.store(metrics_port_, std::memory_order_release);
  log(log_level::info, "vramswapd: metrics at %s/metrics, liveness /healthz, readiness /readyz", metrics_->url().c_str());
  return ok;
}
}  // namespace vramswap::detail
