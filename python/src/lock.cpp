// The device lock for Python. The package wraps these in vramswap.gpu_lock (a context
// manager and decorator, python/vramswap/_lock.py). Waiting releases the GIL.
#include <pybind11/stl.h>

#include <cmath>
#include <optional>
#include <string>

#include "cpp_api/src/runtime.hpp"
#include "python/src/bindings.hpp"
#include "vramswap/vramswap.hpp"

namespace py = pybind11;

namespace vramswap::python {
namespace {

priority parse_priority(const char* fn, const std::string& text) {
  if (text == "normal") return priority::normal;
  if (text == "high") return priority::high;
  throw vramswap::invalid_argument(VRAMSWAP_ERR_INVALID_ARGUMENT,
                                   std::string(fn) + ": priority must be 'normal' or 'high', not '" + text + "'");
}

int64_t timeout_ns(const char* fn, std::optional<double> timeout) {
  if (!timeout) return -1;
  if (!std::isfinite(*timeout) || *timeout < 0) {
    throw vramswap::invalid_argument(VRAMSWAP_ERR_INVALID_ARGUMENT, std::string(fn) + ": timeout must be None (wait) or a "
                                     "finite number of seconds >= 0, not " + std::to_string(*timeout));
  }
  return static_cast<int64_t>(*timeout * 1e9);
}

}  // namespace

void init_lock(py::module_& m) {
  m.def(
      "acquire",
      [](int device, const std::string& prio, std::optional<double> timeout) {
        const priority p = parse_priority("acquire", prio);
        const int64_t ns = timeout_ns("acquire", timeout);
        int rc = 0;
        {
          py::gil_scoped_release nogil;
          rc = rt::lock(device, static_cast<uint32_t>(p), ns, nullptr);
        }
        if (rc == VRAMSWAP_OK) return true;
        if (ns >= 0 && (rc == VRAMSWAP_ERR_BUSY || rc == VRAMSWAP_ERR_TIMEOUT)) return false;
        throw_error(rc, vramswap_last_error());
      },
      py::arg("device") = 0, py::arg("priority") = "normal", py::arg("timeout") = py::none(),
      R"doc(Take the device's cross-process lock; when it returns True, this process's memory on
the device is resident and the device is its alone until release().

timeout: None waits as long as it takes; 0 only tries; > 0 waits at most that many seconds.
Returns False when the lock was not had in time (like threading.Lock.acquire). The GIL is
released while waiting. A thread that holds the lock may take it again (counted: each
acquire needs its release). Several devices: take them in increasing device order; a
waiting acquire of a device below one this thread holds raises ValueError.
Raises ValueError (bad device, priority or timeout; device order), vramswap.Error.)doc");
  m.def(
      "release",
      [](int device) {
        int rc = 0;
        {
          py::gil_scoped_release nogil;
          rc = rt::unlock(device);
        }
        if (rc != VRAMSWAP_OK) throw_error(rc, vramswap_last_error());
      },
      py::arg("device") = 0,
      R"doc(Undo one acquire() of this thread; the last one waits for this process's device work and
hands the lock on. Raises vramswap.Error when this thread does not hold the lock.)doc");
  m.def(
      "held", [](int device) { return rt::held_by_this_thread(device); }, py::arg("device") = 0,
      "How many times this thread holds the device's lock (0: not held).");
}

}  // namespace vramswap::python
