#include "server/pool_server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <thread>

#include "core/fd_transfer.hpp"
#include "core/log.hpp"
#include "core/options.hpp"
#include "core/pinned_chunk.hpp"
#include "core/status.hpp"
#include "lock/device_lock.hpp"
#include "lock/ownership.hpp"
#include "pool/pool_connection.hpp"
#include "pool/pool_protocol.hpp"
#include "pool/pool_report.hpp"
#include "pool/pool_segment.hpp"
#include "lock/process_identity.hpp"
#include "lock/shared_segment.hpp"
#include "server/metrics_endpoint.hpp"

namespace vramswap::detail {
namespace {

using namespace pool_layout;

constexpr size_t k_scrub_batch = 16;      // frames mapped at once while scrubbing
constexpr int k_client_io_timeout_s = 5;  // a client that stops reading during its handshake is dropped
constexpr uint64_t k_gib = uint64_t{1} << 30;

bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::string human(uint64_t bytes) {
  char buf[64];
  if (bytes >= k_gib) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / static_cast<double>(k_gib));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  }
  return buf;
}

void close_fd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

// MemAvailable from /proc/meminfo (bytes); 0 when it cannot be read.
uint64_t available_ram() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

// What may be at the socket path before we bind: nothing, or the socket of a dead server of
// ours (we hold the server flock, so no live one of ours listens), which is removed. Anything
// else is refused and left alone: a file, a link or a directory is not ours to delete, and a
// socket somebody listens on is not stale.
int remove_stale_socket(const std::string& path, const sockaddr_un& addr) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return ok;
    return fail_errno(errno, "vramswapd: lstat %s", path.c_str());
  }
  if (!S_ISSOCK(st.st_mode)) {
    const char* kind = S_ISREG(st.st_mode) ? "a regular file" : S_ISLNK(st.st_mode) ? "a symbolic link" : S_ISDIR(st.st_mode) ? "a directory" : "not a socket";
    return fail(err_busy,
                "vramswapd: %s is %s (owner uid %u, %lld bytes), not a pool server's socket; it is left alone: move it "
                "away or remove it, then start the server again",
                path.c_str(), kind, static_cast<unsigned>(st.st_uid), static_cast<long long>(st.st_size));
  }
  if (st.st_uid != ::geteuid()) {
    return fail(err_not_owner,
                "vramswapd: the socket %s belongs to uid %u, not to this server's uid %u; it is left alone: remove it (as its "
                "owner or root), or set VRAMSWAP_RUNTIME_DIR to a directory of your own",
                path.c_str(), static_cast<unsigned>(st.st_uid), static_cast<unsigned>(::geteuid()));
  }
  const int probe = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (probe < 0) return fail_errno(errno, "vramswapd: socket(AF_UNIX, SOCK_SEQPACKET)");
  int rc;
  do {
    rc = ::connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  } while (rc != 0 && errno == EINTR);
  const int e = errno;
  ::close(probe);
  if (rc == 0 || (e != ECONNREFUSED && e != ENOENT)) {
    return fail(err_busy,
                "vramswapd: something listens on %s although this server holds the device's server lock (%s); it is left "
                "alone: find that process (ss -xlp | grep %s) and stop it",
                path.c_str(), rc == 0 ? "it accepted a connection" : std::strerror(e), path.c_str());
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return fail_errno(errno, "vramswapd: removing the stale socket %s", path.c_str());
  log(log_level::info, "vramswapd: removed the stale socket %s of a dead server", path.c_str());
  return ok;
}

}  // namespace

int pool_server::start(const pool_server_options& options, std::unique_ptr<pool_server>* out) noexcept {
  try {
    std::unique_ptr<pool_server> s(new pool_server());
    s->device_ = options.device;
    log_set_device(options.device);
    s->idle_exit_s_ = options.idle_exit_s;
    s->be_ = options.be;
    if (s->be_ == nullptr) VS_TRY(default_backend(&s->be_));
    backend& be = *s->be_;
    device_info info;
    VS_TRY(be.get_device_info(options.device, &info));
    s->key_ = info.uuid;
    pool_paths paths;
    VS_TRY(pool_paths::make(info.uuid, true, &paths));
    s->log_path_ = paths.log;

    // --- one server per device -------------------------------------------------------------
    VS_TRY(open_owned(paths.server_lock, O_RDWR | O_CREAT, "vramswapd: the one-server lock", "or use another VRAMSWAP_RUNTIME_DIR",
                      &s->server_lock_fd_));
    if (::flock(s->server_lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      if (e != EWOULDBLOCK) return fail_errno(e, "vramswapd: flock %s", paths.server_lock.c_str());
      char pid_text[32] = {};
      const ssize_t n = ::pread(s->server_lock_fd_, pid_text, sizeof pid_text - 1, 0);
      if (n > 0) pid_text[n] = '\0';
      while (n > 0 && std::strlen(pid_text) > 0 && pid_text[std::strlen(pid_text) - 1] == '\n') pid_text[std::strlen(pid_text) - 1] = '\0';
      return fail(err_busy,
                  "vramswapd: another pool server (pid %s) already serves device %d (%s); its socket is %s. Only one "
                  "server per device: stop that one first (kill -TERM %s)",
                  n > 0 ? pid_text : "unknown", options.device, info.uuid.c_str(), paths.socket.c_str(),
                  n > 0 ? pid_text : "<pid>");
    }
    char pid_text[32];
    const int pid_len = std::snprintf(pid_text, sizeof pid_text, "%d\n", static_cast<int>(::getpid()));
    if (::ftruncate(s->server_lock_fd_, 0) != 0 || ::pwrite(s->server_lock_fd_, pid_text, static_cast<size_t>(pid_len), 0) != pid_len) {
      log(log_level::warn, "vramswapd: cannot write the pid into %s: %s", paths.server_lock.c_str(), std::strerror(errno));
    }
    // The lock above is per runtime dir; the pool segment's name is the same for every
    // server of the device whatever its runtime dir, so its flock makes the one server.
    process_identity me{};
    VS_TRY(current_process(&me));
    {
      pool_segment::server_identity who;
      who.pid = me.pid;
      who.start_time = me.start_time;
      who.runtime_dir = paths.dir;
      who.socket = paths.socket;
      VS_TRY(add_context(pool_segment::claim(info.uuid, who, &s->segment_), "vramswapd: device %d: ", options.device));
    }

    if (options.log_to_file) {
      int log_fd = -1;
      VS_TRY(open_owned(paths.log, O_WRONLY | O_CREAT | O_APPEND, "vramswapd: the log", "or use another VRAMSWAP_RUNTIME_DIR", &log_fd));
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
      ::close(log_fd);
    }

    // --- frame size and pool size ------------------------------------------------------------
    // The pager's rule (core/pager.cpp, resolve_pager_config): a power-of-two multiple of the
    // granularity, so that pager and server agree on every valid value.
    uint64_t frame_size = 0;
    VS_TRY(option_size(option_id::frame_size, &frame_size));
    if (frame_size == 0 || frame_size % info.granularity != 0 || !is_pow2(frame_size / info.granularity)) {
      return fail(err_invalid_argument,
                  "VRAMSWAP_FRAME_SIZE: %" PRIu64 " bytes is not a power-of-two multiple of device %d's allocation granularity (%" PRIu64
                  " bytes); use e.g. 2MiB, 32MiB (the default), 64MiB or 256MiB",
                  frame_size, options.device, info.granularity);
    }
    s->frame_size_ = frame_size;
    uint64_t pool_bytes = 0;
    const std::string size_text = options.pool_size.empty() ? option_text(option_id::pool_size) : options.pool_size;
    const uint64_t reserve = be.kind() == backend_kind::cuda ? std::max(k_gib, info.total_bytes / 100 * 3) : frame_size;
    if (!size_text.empty()) {
      VS_TRY(parse_size(size_text.c_str(), &pool_bytes, options.pool_size.empty() ? "VRAMSWAP_POOL_SIZE" : "--pool-size",
                        info.total_bytes));
    } else {
      pool_bytes = info.free_bytes > reserve ? info.free_bytes - reserve : 0;
    }
    pool_bytes = pool_bytes / frame_size * frame_size;
    if (pool_bytes == 0) {
      return fail(err_out_of_memory,
                  "vramswapd: device %d (%s) leaves no room for a pool of %" PRIu64 "-byte frames: %s free of %s%s",
                  options.device, info.uuid.c_str(), frame_size, human(info.free_bytes).c_str(), human(info.total_bytes).c_str(),
                  size_text.empty() ? (", less a reserve of " + human(reserve)).c_str() : "");
    }
    if (pool_bytes > info.free_bytes) {
      return fail(err_out_of_memory, "vramswapd: a pool of %s does not fit in device %d's free memory (%s of %s)",
                  human(pool_bytes).c_str(), options.device, human(info.free_bytes).c_str(), human(info.total_bytes).c_str());
    }
    if (pool_bytes / frame_size >= k_no_member) {
      return fail(err_invalid_argument, "vramswapd: %" PRIu64 " frames of %" PRIu64 " bytes; at most %u: use larger frames",
                  pool_bytes / frame_size, frame_size, k_no_member - 1);
    }

    // --- the shared host pool (optional) ----------------------------------------------------
    uint64_t host_pool_bytes = 0;
    {
      const std::string text = options.host_pool.empty() ? option_text(option_id::host_pool) : options.host_pool;
      VS_TRY(parse_size(text.c_str(), &host_pool_bytes, options.host_pool.empty() ? "VRAMSWAP_HOST_POOL" : "--host-pool",
                        physical_ram()));
    }
    const uint64_t host_slots = host_pool_bytes / frame_size;
    if (host_pool_bytes > 0 && host_slots < k_min_host_slots) {
      // Below this even one eviction cannot keep the pager's copies in flight (each needs a
      // slot), and there is no slack for a handoff (docs/swap.md, "Shared host pool").
      return fail(err_invalid_argument,
                  "VRAMSWAP_HOST_POOL: %s holds %" PRIu64 " slot(s) of %s; a shared host pool needs at least %u (the pager's "
                  "%u copies in flight and one more), and should hold what all processes of device %d save at once (their memory "
                  "less the device pool) plus slack; set it to 0 to keep per-process host tiers",
                  human(host_pool_bytes).c_str(), host_slots, human(frame_size).c_str(), k_min_host_slots, k_min_host_slots - 1,
                  options.device);
    }
    if (host_slots > UINT32_MAX) {
      return fail(err_invalid_argument, "VRAMSWAP_HOST_POOL: %" PRIu64 " slots of %s; at most %u: use larger frames", host_slots,
                  human(frame_size).c_str(), UINT32_MAX);
    }

    // --- the pool --------------------------------------------------------------------------
    const uint64_t t0 = monotonic_ns();
    VS_TRY(s->build_pool(pool_bytes));
    if (host_slots > 0) VS_TRY(s->build_host_pool(host_slots * frame_size));
    VS_TRY(s->segment_->initialize(s->frame_count(), frame_size, s->host_slots_));
    s->lock_.reset(new device_lock());
    VS_TRY(device_lock::open(info.uuid, s->lock_.get()));
    if (::pipe2(s->stop_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) return fail_errno(errno, "vramswapd: pipe2");
    s->socket_path_ = paths.socket;
    VS_TRY(s->open_socket());
    {
      std::string port = options.metrics_port.empty() ? option_text(option_id::metrics_port) : options.metrics_port;
      if (!port.empty()) VS_TRY(s->open_metrics(port, options.metrics_port.empty() ? "VRAMSWAP_METRICS_PORT" : "--metrics-port"));
    }
    const std::string host_text =
        s->host_slots_ > 0 ? "; shared host pool " + human(uint64_t{s->host_slots_} * frame_size) + " (" + std::to_string(s->host_slots_) + " slots)"
                           : "";
    log(log_level::info,
        "vramswapd: serving device %d (%s, %s): %u frames of %s = %s (%s free of %s before)%s, built in %.2f s; socket %s%s",
        options.device, info.name.c_str(), info.uuid.c_str(), s->frame_count(), human(frame_size).c_str(),
        human(pool_bytes).c_str(), human(info.free_bytes).c_str(), human(info.total_bytes).c_str(), host_text.c_str(),
        static_cast<double>(monotonic_ns() - t0) / 1e9, paths.socket.c_str(),
        s->idle_exit_s_ > 0 ? (", idle exit after " + std::to_string(s->idle_exit_s_) + " s").c_str() : "");
    *out = std::move(s);
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "vramswapd: out of host memory");
  }
}

int pool_server::build_pool(uint64_t pool_bytes) noexcept {
  const size_t count = static_cast<size_t>(pool_bytes / frame_size_);
  // Every frame's descriptor stays open (the host backend keeps one more per frame).
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < 2 * count + 256) {
    return fail(err_system,
                "vramswapd: %zu frames need about %zu descriptors, the limit is %llu (ulimit -n; raise the hard limit or use "
                "larger frames, VRAMSWAP_FRAME_SIZE)",
                count, 2 * count + 256, static_cast<unsigned long long>(lim.rlim_cur));
  }
  frames_.reserve(count);
  exported_.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    frame_id f = 0;
    const int rc = be_->create_frame(device_, frame_size_, &f);
    if (rc != ok) return add_context(rc, "vramswapd: creating frame %zu of %zu: ", i, count);
    frames_.push_back(f);
  }
  scratch_frames_ = std::min(count, k_scrub_batch);
  VS_TRY(be_->reserve(device_, scratch_frames_ * frame_size_, 0, &scratch_));
  VS_TRY(be_->stream_create(device_, &stream_));
  std::vector<uint32_t> all(count);
  for (size_t i = 0; i < count; ++i) all[i] = static_cast<uint32_t>(i);
  VS_TRY(scrub(all.data(), all.size()));
  for (size_t i = 0; i < count; ++i) {
    int fd = -1;
    const int rc = be_->export_frame(frames_[i], &fd);
    if (rc != ok) return add_context(rc, "vramswapd: exporting frame %zu of %zu: ", i, count);
    exported_.push_back(fd);
  }
  return ok;
}

// The shared host pool: one memfd, faulted in here so that its memory is committed before
// any client counts on it (a host without the room fails now, by name, not with SIGBUS or
// the OOM killer in the middle of an eviction). Several threads fault it in: the kernel
// zeroes every page, ~60 GiB is seconds of memory bandwidth and a client waits for our
// "ready" at most pool_connection::k_start_timeout_s. The server keeps the descriptor and
// no mapping: it never reads or writes slot contents.
int pool_server::build_host_pool(uint64_t bytes) noexcept {
  const uint64_t avail = available_ram();
  if (avail != 0 && bytes > avail) {
    return fail(err_out_of_memory,
                "vramswapd: a shared host pool of %s (VRAMSWAP_HOST_POOL) does not fit this host's available memory (%s of %s "
                "RAM); set a smaller VRAMSWAP_HOST_POOL, or 0 for per-process host tiers",
                human(bytes).c_str(), human(avail).c_str(), human(physical_ram()).c_str());
  }
  host_pool_fd_ = ::memfd_create("vramswap-host-pool", MFD_CLOEXEC);
  if (host_pool_fd_ < 0) return fail_errno(errno, "vramswapd: memfd_create for the shared host pool");
  if (::ftruncate(host_pool_fd_, static_cast<off_t>(bytes)) != 0) {
    return fail_errno(errno, "vramswapd: sizing the shared host pool's memfd to %s", human(bytes).c_str());
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, host_pool_fd_, 0);
  if (p == MAP_FAILED) return fail_errno(errno, "vramswapd: mapping the shared host pool (%s)", human(bytes).c_str());
  ::madvise(p, bytes, MADV_HUGEPAGE);  // best effort: shmem huge pages where the kernel allows (shmem_enabled=advise)
  const unsigned threads = std::max(1u, std::min({8u, std::thread::hardware_concurrency(), static_cast<unsigned>(bytes / frame_size_)}));
  const uint64_t per = (bytes / threads + frame_size_ - 1) / frame_size_ * frame_size_;
  std::vector<int> errors(threads, 0);
  std::vector<std::thread> pool;
  try {
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const uint64_t from = std::min<uint64_t>(bytes, t * per), to = std::min<uint64_t>(bytes, from + per);
        if (from == to) return;
        char* base = static_cast<char*>(p) + from;
        // The memfd is new: no one's bytes are in it yet, so an older kernel may touch its pages.
        errors[t] = fault_in_writable(base, to - from, populate_fallback::touch);
      });
    }
  } catch (const std::exception&) {
    errors[0] = EAGAIN;  // could not start a thread: fail below, after joining those that did
  }
  for (std::thread& t : pool) t.join();
  ::munmap(p, bytes);
  for (int e : errors) {
    if (e != 0) {
      return fail(err_out_of_memory, "vramswapd: cannot fault in the shared host pool of %s (VRAMSWAP_HOST_POOL): %s; %s available",
                  human(bytes).c_str(), std::strerror(e), human(available_ram()).c_str());
    }
  }
  host_slots_ = static_cast<uint32_t>(bytes / frame_size_);
  return ok;
}

// Zero the given pool frames: map up to k_scrub_batch at the scratch reservation, memset,
// wait, unmap. A frame is only ever handed to another owner after this.
int pool_server::scrub(const uint32_t* indices, size_t count) noexcept {
  for (size_t done = 0; done < count;) {
    const size_t k = std::min(scratch_frames_, count - done);
    size_t mapped = 0;
    int rc = ok;
    for (; mapped < k && rc == ok; ++mapped) {
      rc = be_->map(scratch_ + mapped * frame_size_, frame_size_, frames_[indices[done + mapped]], 0);
      if (rc != ok) break;
    }
    if (rc == ok) rc = be_->set_access(scratch_, k * frame_size_, access_flags::read_write);
    for (size_t j = 0; j < k && rc == ok; ++j) rc = be_->memset_d8(scratch_ + j * frame_size_, 0, frame_size_, stream_);
    if (rc == ok) rc = be_->stream_synchronize(stream_);
    if (mapped > 0) {
      const int urc = be_->unmap(scratch_, mapped * frame_size_);
      if (rc == ok) rc = urc;
    }
    if (rc != ok) return add_context(rc, "vramswapd: scrubbing frames: ");
    done += k;
  }
  return ok;
}

int pool_server::open_socket() noexcept {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path_.size() >= sizeof addr.sun_path) {
    return fail(err_invalid_argument, "vramswapd: socket path %s is longer than %zu bytes; use a shorter VRAMSWAP_RUNTIME_DIR",
                socket_path_.c_str(), sizeof addr.sun_path - 1);
  }
  std::memcpy(addr.sun_path, socket_path_.c_str(), socket_path_.size() + 1);
  listen_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) return fail_errno(errno, "vramswapd: socket(AF_UNIX, SOCK_SEQPACKET)");
  VS_TRY(remove_stale_socket(socket_path_, addr));
  gid_t gid = 0;
  bool group = false;
  VS_TRY(configured_group(&gid, &group));
  // Bind under a tight umask so that the socket is never, even briefly, open to others.
  const mode_t old_mask = ::umask(group ? 0007 : 0077);
  const int brc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  const int bind_errno = errno;
  ::umask(old_mask);
  if (brc != 0) return fail_errno(bind_errno, "vramswapd: bind %s", socket_path_.c_str());
  socket_bound_ = true;
  if (group && ::chown(socket_path_.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return fail_errno(errno, "vramswapd: cannot give %s to group %u (VRAMSWAP_GROUP)", socket_path_.c_str(), static_cast<unsigned>(gid));
  }
  if (::chmod(socket_path_.c_str(), group ? 0660 : 0600) != 0) return fail_errno(errno, "vramswapd: chmod %s", socket_path_.c_str());
  if (::listen(listen_fd_, 128) != 0) return fail_errno(errno, "vramswapd: listen on %s", socket_path_.c_str());
  return ok;
}

void pool_server::request_stop() noexcept {
  if (stop_pipe_[1] >= 0) {
    const char byte = 1;
    [[maybe_unused]] const ssize_t n = ::write(stop_pipe_[1], &byte, 1);
  }
}

int pool_server::run() noexcept {
  uint64_t idle_since = monotonic_ns();
  std::vector<pollfd> fds;
  for (;;) {
    bool pending = false;
    fds.clear();
    fds.push_back({stop_pipe_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    const size_t first_client = 2;
    for (const client& c : clients_) {
      if (c.hung_up_ns == 0) {
        fds.push_back({c.fd, POLLIN | POLLRDHUP, 0});
      } else {
        pending = true;
      }
    }
    int timeout_ms = -1;
    if (lock_repair_pending_) timeout_ms = k_lock_repair_retry_ms;
    if (pending) {
      timeout_ms = 10;
    } else if (idle_exit_s_ > 0 && clients_.empty()) {
      const uint64_t limit = idle_since + static_cast<uint64_t>(idle_exit_s_) * 1'000'000'000;
      const uint64_t now = monotonic_ns();
      timeout_ms = now >= limit ? 0 : static_cast<int>((limit - now) / 1'000'000) + 1;
    }
    const int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) return fail_errno(errno, "vramswapd: poll");
    const uint64_t now = monotonic_ns();
    if (n > 0) {
      if (fds[0].revents != 0) {
        log(log_level::info, "vramswapd: stopping on request (%zu clients attached)", clients_.size());
        return ok;
      }
      // Hang-ups first: their fds are positions first_client.. in the order of the clients.
      size_t at = first_client;
      for (client& c : clients_) {
        if (c.hung_up_ns != 0) continue;
        const short revents = fds[at++].revents;
        if (revents == 0) continue;
        char byte;
        const ssize_t got = ::recv(c.fd, &byte, 1, MSG_DONTWAIT);
        if (got > 0) {
          log(log_level::warn, "vramswapd: member %u (pid %d) sent unexpected data after its handshake; ignored", c.member,
              static_cast<int>(c.pid));
          continue;
        }
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        c.hung_up_ns = now;
        close_fd(&c.fd);
      }
      if (fds[1].revents != 0) accept_one();
    }
    if (lock_repair_pending_) repair_lock();
    // Repair members whose process is gone (or that left long enough ago).
    for (size_t i = 0; i < clients_.size();) {
      const client& c = clients_[i];
      if (c.hung_up_ns != 0 &&
          (check_liveness({c.pid, c.start_time}) == liveness::dead || now - c.hung_up_ns >= uint64_t{k_repair_grace_ms} * 1'000'000)) {
        repair(c);
        clients_.erase(clients_.begin() + static_cast<ptrdiff_t>(i));
        if (clients_.empty()) idle_since = monotonic_ns();
      } else {
        ++i;
      }
    }
    if (idle_exit_s_ > 0 && clients_.empty() && monotonic_ns() - idle_since >= static_cast<uint64_t>(idle_exit_s_) * 1'000'000'000) {
      log(log_level::info, "vramswapd: no client for %" PRId64 " s: exiting", idle_exit_s_);
      return ok;
    }
  }
}

int pool_server::open_metrics(const std::string& port_text, const char* what) noexcept {
  // The endpoint's thread reads the pool segment (made for concurrent readers) and the lock's
  // queue through a device_lock of its own, never the one that repairs use.
  metrics_lock_.reset(new (std::nothrow) device_lock());
  if (!metrics_lock_) return fail(err_out_of_memory, "vramswapd: out of host memory");
  VS_TRY(device_lock::open(key_, metrics_lock_.get()));
  const std::string key = key_;
  pool_segment* segment = segment_.get();
  device_lock* lock = metrics_lock_.get();
  auto render = [key, segment, lock](std::string* body) {
    device_report r;
    if (collect_report(key, *segment, lock, &r) != ok) {
      *body = std::string(last_error()) + "\n";
      return false;
    }
    *body = render_prometheus({r});
    return true;
  };
  VS_TRY(metrics_endpoint::start(port_text, what, render, &metrics_));
  metrics_port_ = metrics_->port();
  segment_->header()->metrics_port.store(metrics_port_, std::memory_order_release);
  log(log_level::info, "vramswapd: metrics at http://127.0.0.1:%u/metrics", metrics_port_);
  return ok;
}

void pool_server::accept_one() noexcept {
  const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) log(log_level::warn, "vramswapd: accept: %s", std::strerror(errno));
    return;
  }
  serve_new(fd);
}

void pool_server::refuse(int fd, int status, const char* fmt, ...) noexcept {
  pool_protocol::welcome w{};
  w.magic = pool_protocol::k_magic;
  w.version = pool_protocol::k_version;
  w.status = status;
  w.server_pid = ::getpid();
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(w.message, sizeof w.message, fmt, ap);
  va_end(ap);
  log(log_level::warn, "vramswapd: refused a client (%s): %s", status_name(status), w.message);
  send_fds(fd, nullptr, 0, &w, sizeof w);
  // Drop whatever else the peer sent, so that the close does not reset the connection
  // (which would discard the welcome before the peer reads it).
  char sink[256];
  while (::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
  }
  ::close(fd);
}

bool pool_server::peer_allowed(pid_t pid, uid_t uid, gid_t peer_gid, std::string* why) noexcept {
  if (uid == ::geteuid() || uid == 0) return true;
  gid_t gid = 0;
  bool group = false;
  if (configured_group(&gid, &group) == ok && group && (peer_gid == gid || process_in_group(pid, gid))) return true;
  char text[200];
  std::snprintf(text, sizeof text, "uid %u may not use this pool: it belongs to uid %u%s", static_cast<unsigned>(uid),
                static_cast<unsigned>(::geteuid()), group ? " and the peer is not in VRAMSWAP_GROUP" : " (VRAMSWAP_GROUP is not set)");
  *why = text;
  return false;
}

void pool_server::serve_new(int fd) noexcept {
  using pool_protocol::hello;
  using pool_protocol::welcome;
  using pool_protocol::frame_batch;
  using pool_protocol::k_version;
  constexpr uint32_t k_magic = pool_protocol::k_magic;
  timeval tv{k_client_io_timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  ucred cred{};
  socklen_t cred_len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) {
    refuse(fd, err_system, "SO_PEERCRED failed: %s", std::strerror(errno));
    return;
  }
  // The hello first, even from a peer about to be refused: closing a Unix socket with
  // unread data resets the connection, and the peer would lose the welcome that says why.
  hello h{};
  size_t len = 0;
  size_t nfds = 0;
  if (recv_fds(fd, nullptr, 0, &nfds, &h, sizeof h, &len) != ok) {
    refuse(fd, err_invalid_argument, "no valid hello from pid %d: %s", static_cast<int>(cred.pid), last_error());
    return;
  }
  std::string why;
  if (!peer_allowed(cred.pid, cred.uid, cred.gid, &why)) {
    refuse(fd, err_not_owner, "%s", why.c_str());
    return;
  }
  if (len != sizeof h || h.magic != k_magic || h.version != k_version) {
    refuse(fd, err_version_mismatch,
           "pid %d sent a %zu-byte hello with magic %#x, protocol version %u; this server (pid %d) speaks protocol version %u "
           "(%zu-byte hello, magic %#x): run client and server from the same vramswap version",
           static_cast<int>(cred.pid), len, len >= 4 ? h.magic : 0u, len >= 8 ? h.version : 0u, static_cast<int>(::getpid()),
           k_version, sizeof h, k_magic);
    return;
  }
  if (h.pid != cred.pid) {
    refuse(fd, err_invalid_argument,
           "the hello names pid %d but the socket's peer is pid %d: client and server must share a PID namespace", h.pid,
           static_cast<int>(cred.pid));
    return;
  }
  if (check_liveness({h.pid, h.start_time}) != liveness::alive) {
    refuse(fd, err_invalid_argument, "pid %d's start time %" PRIu64 " does not match /proc/%d/stat", h.pid, h.start_time, h.pid);
    return;
  }
  uint32_t member = 0;
  if (segment_->add_member(h.pid, h.start_time, &member) != ok) {
    refuse(fd, err_busy, "%s", last_error());
    return;
  }
  welcome w{};
  w.magic = k_magic;
  w.version = k_version;
  w.status = ok;
  w.member = member;
  w.frame_count = frame_count();
  w.server_pid = ::getpid();
  w.frame_size = frame_size_;
  std::snprintf(w.segment_name, sizeof w.segment_name, "%s", segment_->name().c_str());
  w.host_slot_count = host_slots_;
  w.host_pool_bytes = uint64_t{host_slots_} * frame_size_;
  int rc = send_fds(fd, nullptr, 0, &w, sizeof w);
  for (uint32_t first = 0; rc == ok && first < frame_count(); first += static_cast<uint32_t>(k_max_fds_per_message)) {
    frame_batch b{first, static_cast<uint32_t>(std::min<size_t>(k_max_fds_per_message, frame_count() - first))};
    rc = send_fds(fd, &exported_[first], b.count, &b, sizeof b);
  }
  if (rc == ok && host_slots_ > 0) {
    pool_protocol::host_pool hp{w.host_pool_bytes, host_slots_, 0};
    rc = send_fds(fd, &host_pool_fd_, 1, &hp, sizeof hp);
  }
  if (rc != ok) {
    log(log_level::warn, "vramswapd: pid %d left during its handshake: %s", h.pid, last_error());
    segment_->remove_member(member);
    ::close(fd);
    return;
  }
  clients_.push_back(client{fd, member, h.pid, h.start_time, 0});
  log(log_level::info, "vramswapd: member %u: pid %d attached (%zu clients)", member, h.pid, clients_.size());
}

void pool_server::repair(const client& c) noexcept {
  std::vector<uint32_t> owned;
  for (uint32_t f = 0; f < frame_count(); ++f) {
    const frame_word w = frame_word::decode(segment_->read(f));
    if (w.state != frame_free && w.owner == c.member) owned.push_back(f);
  }
  uint32_t freed = 0;
  if (!owned.empty()) {
    if (scrub(owned.data(), owned.size()) != ok) {
      // Never hand out a frame that still holds the dead member's data: keep them owned.
      log(log_level::error, "vramswapd: cannot scrub the %zu frames of dead member %u (pid %d); they stay out of the pool: %s",
          owned.size(), c.member, static_cast<int>(c.pid), last_error());
      owned.clear();
    }
    for (uint32_t f : owned) {
      // Only the state can change under us (a lock holder may request an idle frame of the
      // dead member); the owner cannot, so retry until it is ours to free.
      for (uint64_t seen = segment_->read(f);; seen = segment_->read(f)) {
        const frame_word w = frame_word::decode(seen);
        if (w.state == frame_free || w.owner != c.member) break;
        if (segment_->move(f, seen, frame_free, k_no_member, k_no_member)) {
          ++freed;
          break;
        }
      }
    }
  }
  frames_repaired_ += freed;
  // Its host slots: freed, not zeroed (a slot is only read by an owner that wrote all of it
  // first; see pool_layout.hpp). Before remove_member, so a new member in this slot index
  // never finds slots it did not take.
  const uint32_t slots = host_slots_ > 0 ? segment_->free_slots_of(c.member) : 0;
  slots_repaired_ += slots;
  segment_->member(c.member).holding.store(0, std::memory_order_relaxed);
  segment_->remove_member(c.member);
  segment_->notify_freed();
  const bool lock_repaired = repair_lock();
  const bool dead = check_liveness({c.pid, c.start_time}) == liveness::dead;
  log(log_level::info, "vramswapd: member %u: pid %d %s; %u frames scrubbed and freed, %u host slots freed (%zu clients left)%s",
      c.member, static_cast<int>(c.pid), dead ? "is gone" : "closed its connection", freed, slots, clients_.size() - 1,
      lock_repaired ? "" : "; the device lock's repair did not run (see the warning above)");
}

bool pool_server::repair_lock() noexcept {
  const int lrc = lock_->repair_now(k_lock_repair_wait_ns);
  if (lrc == err_timeout) {
    // Its internal mutex is held by a client that does not run (stopped): the waiters'
    // own liveness scans do the same repair once it is free; retry meanwhile, and say so once.
    if (!lock_repair_pending_) log(log_level::warn, "vramswapd: %s; the lock's repair is retried every %d ms", last_error(), k_lock_repair_retry_ms);
    lock_repair_pending_ = true;
    return false;
  }
  if (lrc != ok) log(log_level::warn, "vramswapd: device lock repair failed: %s", last_error());
  if (lock_repair_pending_ && lrc == ok) log(log_level::info, "vramswapd: the device lock's repair ran");
  lock_repair_pending_ = false;
  return lrc == ok;
}

pool_server::~pool_server() { teardown(); }

void pool_server::teardown() noexcept {
  for (client& c : clients_) close_fd(&c.fd);
  clients_.clear();
  close_fd(&listen_fd_);
  metrics_.reset();  // joins its thread: before the segment and the lock it reads go
  metrics_lock_.reset();
  close_fd(&host_pool_fd_);  // its memory goes when the last client unmaps it
  if (socket_bound_) ::unlink(socket_path_.c_str());
  segment_.reset();  // a claimed segment's name goes with it (pool_segment::~pool_segment)
  lock_.reset();
  for (int& fd : exported_) close_fd(&fd);
  exported_.clear();
  for (frame_id f : frames_) {
    if (be_->release_frame(f) != ok) log(log_level::warn, "vramswapd: releasing a frame: %s", last_error());
  }
  frames_.clear();
  if (scratch_ != 0) be_->unreserve(scratch_, scratch_frames_ * frame_size_);
  if (stream_ != 0) be_->stream_destroy(stream_);
  close_fd(&stop_pipe_[0]);
  close_fd(&stop_pipe_[1]);
  close_fd(&server_lock_fd_);  // last: the next server may start now
}

}  // namespace vramswap::detail
