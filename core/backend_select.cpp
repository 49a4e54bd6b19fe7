// Which backend a process uses: VRAMSWAP_BACKEND=host|cuda|auto, decided once.
#include <pthread.h>

#include <atomic>
#include <mutex>
#include <string>

#include "core/backend_impls.hpp"
#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"

namespace vramswap::detail {

namespace {

// Say once per process tree that there is no usable GPU; later processes of the tree (and
// this one, should it choose again) log it at info. The tree hears of it through the
// environment (foreign_environment::no_gpu_noted_by, core/options.hpp).
void say_no_gpu(const std::string& why) {
  const std::string noted = process_foreign_environment().no_gpu_noted_by;
  if (!noted.empty()) {
    log(log_level::info, "backend host: no usable GPU (%s); said once per process tree, by pid %s", why.c_str(), noted.c_str());
    return;
  }
  log(log_level::warn,
      "no usable GPU (%s): using the host backend, which emulates a GPU in host memory (VRAMSWAP_BACKEND=host chooses "
      "it without this warning). Said once for this process and the processes it starts",
      why.c_str());
  mark_no_gpu_noted();
}

}  // namespace

int make_backend(backend_kind kind, std::unique_ptr<backend>* out) {
  switch (kind) {
    case backend_kind::host: return make_host_backend(out);
    case backend_kind::cuda: return make_cuda_backend(out);
  }
  return fail(err_invalid_argument, "make_backend: unknown backend kind %d", static_cast<int>(kind));
}

namespace {

// Set in a child made by fork(): the process's backend is its parent's copy, whose threads
// (the host backend's stream workers) and driver objects (the CUDA backend's streams and
// mappings) are not the child's. Destroying it at the child's exit would join threads that
// do not exist here (a hang) or release the parent's objects: the child leaves it alone.
std::atomic<bool> g_backend_forked{false};
void mark_backend_forked() noexcept { g_backend_forked.store(true, std::memory_order_relaxed); }

struct chosen {
  std::unique_ptr<backend> instance;
  int status = ok;
  std::string detail;
  chosen() = default;
  chosen(chosen&&) = default;
  ~chosen() {
    if (g_backend_forked.load(std::memory_order_relaxed)) (void)instance.release();
  }
};

}  // namespace

int select_backend(const std::string& text, std::unique_ptr<backend>* out) {
  if (text == "host" || text == "cuda") {
    const int rc = make_backend(text == "host" ? backend_kind::host : backend_kind::cuda, out);
    if (rc != ok) return add_context(rc, "VRAMSWAP_BACKEND=%s: ", text.c_str());
    log(log_level::info, "backend %s (VRAMSWAP_BACKEND=%s)", (*out)->name(), text.c_str());
    return ok;
  }
  if (text == "auto") {
    const int rc = make_backend(backend_kind::cuda, out);
    if (rc == ok) {
      log(log_level::info, "backend cuda (a GPU is usable; VRAMSWAP_BACKEND=host selects the emulation)");
      return ok;
    }
    if (rc != err_unavailable) return rc;
    const std::string why = last_error();
    VS_TRY(make_backend(backend_kind::host, out));
    say_no_gpu(why);
    return ok;
  }
  return fail(err_invalid_argument, "VRAMSWAP_BACKEND=\"%s\" is not one of host, cuda, auto", text.c_str());
}

namespace {

chosen choose() {
  ::pthread_atfork(nullptr, nullptr, mark_backend_forked);
  chosen c;
  c.status = select_backend(option_text(option_id::backend), &c.instance);
  if (c.status != ok) c.detail = last_error();
  return c;
}

}  // namespace

int default_backend(backend** out) {
  static chosen c = choose();  // thread-safe, once per process
  if (c.status != ok) return fail(c.status, "%s", c.detail.c_str());
  *out = c.instance.get();
  return ok;
}

}  // namespace vramswap::detail
