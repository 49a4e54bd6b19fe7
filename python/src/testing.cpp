// vramswap._testing: what the Python tests need and users should not: copy bytes between
// Python and device memory (through the backend's pinned copies), close this process's
// sessions so that each test gets its own pool server, have the options see a changed
// environment.
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "runtime/runtime.hpp"
#include "bindings.hpp"
#include "vramswap/vramswap.hpp"

namespace py = pybind11;

namespace vramswap::detail::python {

void init_testing(py::module_& m) {
  py::module_ t = m.def_submodule("_testing", "Helpers for vramswap's own tests; not a public API.");
  t.def(
      "write",
      [](uintptr_t ptr, const py::bytes& data, int device) {
        const std::string bytes = data;
        int rc = 0;
        {
          py::gil_scoped_release nogil;
          rc = rt::copy_to_device(device, ptr, bytes.data(), bytes.size());
        }
        if (rc != VRAMSWAP_OK) throw_error(rc, vramswap_last_error());
      },
      py::arg("ptr"), py::arg("data"), py::arg("device") = 0,
      "Copy `data` to device memory at `ptr`; this thread must hold the device's lock.");
  t.def(
      "read",
      [](uintptr_t ptr, size_t size, int device) {
        std::string out(size, '\0');
        int rc = 0;
        {
          py::gil_scoped_release nogil;
          rc = rt::copy_from_device(device, out.data(), ptr, size);
        }
        if (rc != VRAMSWAP_OK) throw_error(rc, vramswap_last_error());
        return py::bytes(out);
      },
      py::arg("ptr"), py::arg("size"), py::arg("device") = 0,
      "Copy `size` bytes of device memory at `ptr` into a bytes object; this thread must hold the lock.");
  t.def(
      "lock_queue",
      [](const std::string& key) {
        std::vector<rt::queue_entry> q;
        int rc = 0;
        {
          py::gil_scoped_release nogil;
          rc = rt::lock_queue(key.c_str(), &q);
        }
        if (rc != VRAMSWAP_OK) throw_error(rc, vramswap_last_error());
        std::vector<std::tuple<int, bool>> out;
        for (const rt::queue_entry& e : q) out.emplace_back(static_cast<int>(e.pid), e.holding);
        return out;
      },
      py::arg("key"), "The lock queue of device `key` (\"host-0\"): (pid, holding) pairs, the holder first.");
  t.def(
      "reset",
      [] {
        py::gil_scoped_release nogil;
        rt::reset();
      },
      "Close this process's sessions (locks it holds are released); the next call opens new ones.");
  t.def(
      "stop_pool_server",
      [](int device) {
        int rc = 0;
        {
          py::gil_scoped_release nogil;
          rc = rt::stop_pool_server(device);
        }
        if (rc != VRAMSWAP_OK) throw_error(rc, vramswap_last_error());
      },
      py::arg("device") = 0, "Stop the device's pool server and remove its segment names (after reset()).");
  t.def(
      "pool_server_pid",
      [](int device) {
        pid_t pid = 0;
        int rc = 0;
        {
          py::gil_scoped_release nogil;
          rc = rt::pool_server_pid(device, &pid);
        }
        if (rc != VRAMSWAP_OK) throw_error(rc, vramswap_last_error());
        return static_cast<int>(pid);
      },
      py::arg("device") = 0, "The pid of the device's pool server, from its pool segment (0 when none is there).");
  t.def(
      "reread_options", [] { rt::reread_options_for_testing(); },
      "Read the VRAMSWAP_* environment again (it is read once per process otherwise): after a test changes os.environ.");
}

}  // namespace vramswap::detail::python
