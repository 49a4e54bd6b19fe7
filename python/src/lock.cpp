// The device lock for Python. The package wraps these in vramswap.gpu_lock (a context
// manager and decorator, python/vramswap/_lock.py). Waiting releases the GIL.
//
// Waits are interruptible as threading.Lock's are: while waiting, the lock asks Python
// (PyErr_CheckSignals, with the GIL taken briefly) whether a signal handler raised, when a
// signal woke the wait and at least every 50 ms; if one did, the wait leaves the queue and
// the exception (KeyboardInterrupt for Ctrl-C) propagates. That holds for the first acquire's
// wait for the pool server too (opening the device's session: lock/wait_bounds.hpp), which
// the acquire's timeout also bounds. gpu_lock.__enter__ and __exit__
// are this file's C++ functions, not Python code: Python runs signal handlers between its
// own bytecodes, so a handler that raised between the grant and the with-block, or at the
// start of a Python __exit__ (before its release), would leave the lock held with nothing
// to release it. With both in C++ a KeyboardInterrupt either cancels the wait (nothing
// held), arrives inside the block (__exit__ releases), or after __exit__ has released.
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include "runtime/runtime.hpp"
#include "bindings.hpp"
#include "vramswap/vramswap.hpp"

namespace py = pybind11;

namespace vramswap::detail::python {
namespace {

uint64_t monotonic_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

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
  // Nanoseconds in an int64_t: about 292 years. Past that the conversion is undefined.
  constexpr double k_max_s = 9.0e9;
  if (*timeout > k_max_s) {
    char text[160];
    std::snprintf(text, sizeof text, "%s: timeout %g s is longer than the longest a wait can be told (%g s); use None to wait "
                  "as long as it takes", fn, *timeout, k_max_s);
    throw vramswap::invalid_argument(VRAMSWAP_ERR_INVALID_ARGUMENT, text);
  }
  return static_cast<int64_t>(*timeout * 1e9);
}

// The wait check (runtime.hpp) of a Python caller's acquire.
struct python_signals {
  static constexpr uint64_t k_check_ns = 50'000'000;  // a signal may have woken another thread
  uint64_t last_check_ns = 0;
  bool raised = false;     // a handler raised: the exception is set on this thread
  bool not_asked = false;  // a wait ended on a signal without asking Python (below)

  // In the lock's queue: ask Python, with the GIL taken briefly.
  static bool should_stop(void* context, bool signal_ran) noexcept {
    auto* self = static_cast<python_signals*>(context);
    const uint64_t now = monotonic_ns();
    if (!signal_ran && now - self->last_check_ns < k_check_ns) return false;
    self->last_check_ns = now;
    const PyGILState_STATE gil = PyGILState_Ensure();
    if (PyErr_CheckSignals() != 0) self->raised = true;
    PyGILState_Release(gil);
    return self->raised;
  }
  // Opening the device's session, under the runtime's mutex: the GIL is not taken there (a
  // thread holding it may be waiting for that mutex: a PyTorch allocation on another
  // thread). A signal that ran on this thread ends the wait instead; the caller then asks
  // Python with the GIL it holds again, and opens the session again when no handler raised.
  // Ctrl-C reaches the main thread, the only one Python raises it in.
  static bool should_stop_without_blocking(void* context, bool signal_ran) noexcept {
    if (signal_ran) static_cast<python_signals*>(context)->not_asked = true;
    return signal_ran;
  }
  rt::wait_check check() { return {&should_stop, this, &should_stop_without_blocking}; }
  // After a call made with check() installed returned `rc`, with the GIL held again: true to
  // make the call again (a signal ended a wait, and no handler raised); raises the handler's
  // exception.
  bool call_again(int rc) {
    if (raised) throw py::error_already_set();
    if (rc != VRAMSWAP_ERR_INTERRUPTED || !not_asked) return false;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    not_asked = false;
    rt::log_line(rt::log_severity::debug, "lock: a signal ended the wait for the pool server, and no handler raised; opening the session again");
    return true;
  }
};

// Take the lock, interruptibly (above). True when held; false when a timed or tried acquire
// did not get it; raises the signal handler's exception (holding nothing), or the error.
// More than one device: a gang (all or none, docs/lock.md "Gangs").
bool acquire_interruptibly(const std::vector<int>& devices, priority p, int64_t ns) {
  python_signals signals;
  int rc = 0;
  const uint64_t deadline = ns > 0 ? monotonic_ns() + static_cast<uint64_t>(ns) : 0;
  do {
    // Called again (a signal ended the session's opening): what is left of the timeout.
    const int64_t left = deadline == 0 ? ns : std::max<int64_t>(1, static_cast<int64_t>(deadline - std::min(deadline, monotonic_ns())));
    py::gil_scoped_release nogil;
    const rt::scoped_wait_check interruptible(signals.check());
    if (devices.size() == 1) {
      rc = rt::lock(devices[0], static_cast<uint32_t>(p), left, nullptr);
      // Granted just as a handler raised: the exception wins, and the lock goes back.
      if (rc == VRAMSWAP_OK && signals.raised) rt::unlock(devices[0]);
    } else {
      rc = rt::lock_gang(devices.data(), devices.size(), static_cast<uint32_t>(p), left, nullptr);
      if (rc == VRAMSWAP_OK && signals.raised) rt::unlock_gang(devices.data(), devices.size());
    }
  } while (signals.call_again(rc));
  if (rc == VRAMSWAP_OK) return true;
  if (ns >= 0 && (rc == VRAMSWAP_ERR_BUSY || rc == VRAMSWAP_ERR_TIMEOUT)) return false;
  throw_error(rc, vramswap_last_error());
}

bool acquire_interruptibly(int device, priority p, int64_t ns) { return acquire_interruptibly(std::vector<int>{device}, p, ns); }

std::string device_text(const std::vector<int>& devices) {
  if (devices.size() == 1) return "device " + std::to_string(devices[0]);
  std::string s = "devices ";
  for (size_t i = 0; i < devices.size(); ++i) s += (i == 0 ? "" : ",") + std::to_string(devices[i]);
  return s;
}

// gpu_lock.__enter__ (python/vramswap/_lock.py has the class).
py::object gpu_lock_enter(py::object self) {
  const std::vector<int> devices = self.attr("devices").cast<std::vector<int>>();
  const priority p = parse_priority("gpu_lock", self.attr("priority").cast<std::string>());
  const py::object timeout = self.attr("timeout");
  const int64_t ns = timeout_ns("gpu_lock", timeout.is_none() ? std::nullopt : std::optional<double>(timeout.cast<double>()));
  if (!acquire_interruptibly(devices, p, ns)) {
    const std::string detail = vramswap_last_error();
    char head[160];
    std::snprintf(head, sizeof head, "gpu_lock(%s): not acquired within %g s: ", device_text(devices).c_str(),
                  static_cast<double>(ns) / 1e9);
    PyErr_SetString(PyExc_TimeoutError, (head + detail).c_str());
    throw py::error_already_set();
  }
  return self;
}

// release() and release_devices(): the unlock without the GIL (the last one waits for the
// process's device work), its error raised.
void release_one(int device) {
  int rc = 0;
  {
    py::gil_scoped_release nogil;
    rc = rt::unlock(device);
  }
  if (rc != VRAMSWAP_OK) throw_error(rc, vramswap_last_error());
}

void release_gang(const std::vector<int>& devices) {
  int rc = 0;
  {
    py::gil_scoped_release nogil;
    rc = rt::unlock_gang(devices.data(), devices.size());
  }
  if (rc != VRAMSWAP_OK) throw_error(rc, vramswap_last_error());
}

// gpu_lock.__exit__: the release, whatever left the block (an exception is not swallowed).
py::object gpu_lock_exit(py::object self, py::object, py::object, py::object) {
  const std::vector<int> devices = self.attr("devices").cast<std::vector<int>>();
  if (devices.size() == 1) {
    release_one(devices[0]);
  } else {
    release_gang(devices);
  }
  return py::bool_(false);
}

// The lock's functions: taking a device's lock or a gang's, and a gang's release.
void def_acquire(py::module_& m) {
  m.def(
      "acquire",
      [](int device, const std::string& prio, std::optional<double> timeout) {
        return acquire_interruptibly(device, parse_priority("acquire", prio), timeout_ns("acquire", timeout));
      },
      py::arg("device") = 0, py::arg("priority") = "normal", py::arg("timeout") = py::none(),
      R"doc(Take the device's cross-process lock; when it returns True, this process's memory on
the device is resident and the device is its alone until release().

timeout: None waits as long as it takes; 0 only tries; > 0 waits at most that many seconds.
Returns False when the lock was not had in time (like threading.Lock.acquire). The GIL is
released while waiting, and the wait is interruptible like threading.Lock's: when a signal
handler raises (Ctrl-C: KeyboardInterrupt), the wait leaves the queue and the exception
propagates, with nothing held. A thread that holds the lock may take it again (counted: each
acquire needs its release). Several devices: all at once with acquire_devices(), or one by
one in increasing device order; a
waiting acquire of a device below one this thread holds raises ValueError.
Raises ValueError (bad device, priority or timeout; device order), vramswap.Error.)doc");
  m.def(
      "acquire_devices",
      [](const std::vector<int>& devices, const std::string& prio, std::optional<double> timeout) {
        if (devices.empty()) {
          throw vramswap::invalid_argument(VRAMSWAP_ERR_INVALID_ARGUMENT, "acquire_devices: no devices; list at least one");
        }
        return acquire_interruptibly(devices, parse_priority("acquire_devices", prio), timeout_ns("acquire_devices", timeout));
      },
      py::arg("devices"), py::arg("priority") = "normal", py::arg("timeout") = py::none(),
      R"doc(A gang: take the locks of several devices at once, all or none (docs/lock.md, "Gangs").
It waits in FIFO order on every device and is granted them together when it is next on each
(meanwhile a free member device idles rather than serve those queued behind it); then this
process's memory on every one of them is resident. timeout and the return value as for
acquire(); interruptible the same way. Each device is then held as by acquire(): release them
with release_devices() (or release() each). Device order: a gang takes all its devices at its
lowest one. Raises ValueError (an empty list, a device twice, no such device, holding a device
above the gang's lowest or only some of its devices), vramswap.Error.)doc");
  m.def(
      "release_devices", &release_gang,
      py::arg("devices"),
      R"doc(release() of each of the devices, highest first. When this thread does not hold one of them,
vramswap.Error and nothing is released.)doc");
}

// The C++ side of python/vramswap/_lock.py: join_gang, gpu_lock's timeout rule, and its
// __enter__ and __exit__.
void def_lock_py_support(py::module_& m) {
  m.def(
      "_join_gang",
      [](std::optional<std::string> job, int rank, int world_size, int device) {
        int rc = 0;
        python_signals signals;
        do {
          // It may open the device's session first: dial (or start) the pool server and
          // wait for its welcome, which other threads must not wait for with us, and which
          // Ctrl-C ends (the session is not opened).
          py::gil_scoped_release nogil;
          const rt::scoped_wait_check interruptible(signals.check());
          rc = rt::join_gang(job ? job->c_str() : nullptr, rank, world_size, device);
        } while (signals.call_again(rc));
        if (rc != VRAMSWAP_OK) throw_error(rc, vramswap_last_error());
      },
      py::arg("job"), py::arg("rank"), py::arg("world_size"), py::arg("device"),
      "vramswap.join_gang's C++ side (python/vramswap/_lock.py); job None leaves the gang.");
  m.def(
      "_check_timeout", [](const std::string& fn, double seconds) { timeout_ns(fn.c_str(), seconds); }, py::arg("fn"),
      py::arg("seconds"),
      "The rule of a lock's timeout in seconds (finite, >= 0, within 64-bit nanoseconds): ValueError naming fn when broken.");
  m.def(
      "_install_gpu_lock_methods",
      [](py::object cls) {
        cls.attr("__enter__") = py::cpp_function(&gpu_lock_enter, py::name("__enter__"), py::is_method(cls),
                                                 "Wait for the lock (interruptibly); TimeoutError when not had in time.");
        cls.attr("__exit__") = py::cpp_function(&gpu_lock_exit, py::name("__exit__"), py::is_method(cls),
                                                "Release the lock (every device of a gang); an exception leaving the block "
                                                "goes on.");
      },
      "Makes cls.__enter__ and __exit__ the C++ ones, so a signal handler cannot raise between the grant and the "
      "with-block, nor between the block's end and the release.");
}

// The holder's functions: releasing a device's lock, how often it is held, whether an
// operator asked for it.
void def_holder(py::module_& m) {
  m.def(
      "release", &release_one, py::arg("device") = 0,
      R"doc(Undo one acquire() of this thread; the last one waits for this process's device work and
hands the lock on. Raises vramswap.Error when this thread does not hold the lock.)doc");
  m.def(
      "held", [](int device) { return rt::held_by_this_thread(device); }, py::arg("device") = 0,
      "How many times this thread holds the device's lock (0: not held).");
  m.def(
      "release_requested", [](int device) { return rt::release_requested(device); }, py::arg("device") = 0,
      R"doc(True when an operator asked this process to release the device's lock during its current
hold (`vramswap release-request`); False when it does not hold the lock or nobody asked.
Cheap enough to poll between steps. Nothing is taken from the holder: releasing (leaving the
gpu_lock block) is up to the program. VRAMSWAP_RELEASE_SIGNAL=SIGINT turns the request into
a KeyboardInterrupt instead.)doc");
}

}  // namespace

// The definitions in the order they have always been made (the module's attributes keep
// theirs): hence release_devices with the acquires, release with the holder's functions.
void init_lock(py::module_& m) {
  def_acquire(m);
  def_lock_py_support(m);
  def_holder(m);
}

}  // namespace vramswap::detail::python
