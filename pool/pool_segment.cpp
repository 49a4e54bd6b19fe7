#include "pool/pool_segment.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstring>
#include <new>

#include "core/log.hpp"
#include "core/status.hpp"
#include "lock/futex.hpp"
#include "lock/liveness_lease.hpp"
#include "lock/ownership.hpp"
#include "lock/process_identity.hpp"
#include "lock/runtime_dir.hpp"
#include "lock/shared_segment.hpp"

namespace vramswap::detail {
using namespace pool_layout;

namespace {

// How long a second server waits for the holder of a segment to say who it is (a server
// replacing a dead one's segment, or one between its flock and its identity) before it
// reports what it knows.
constexpr uint64_t k_claim_wait_ns = 3'000'000'000;

// The segment named `name` ("/<p>vramswap-<owner>-pool-<key>") in this process's view of
// the runtime dir.
std::string path_of(const std::string& name) {
  std::string dir;
  return runtime_dir(/*create=*/false, &dir) == ok ? dir + name : name;
}

std::string bounded(const char* text, size_t max) { return std::string(text, ::strnlen(text, max)); }

// The identity published in the segment open on `fd`; false when it is not (yet) there.
bool read_identity(int fd, pool_segment::server_identity* who) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(pool_header)) return false;
  void* p = ::mmap(nullptr, sizeof(pool_header), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return false;
  const pool_header* h = header_of(p);
  const bool published = h->claimed.load(std::memory_order_acquire) == 1;
  if (published) {
    who->pid = h->server_pid;
    who->start_time = h->server_start_time;
    who->pid_ns = h->server_pid_ns;
    who->runtime_dir = bounded(h->server_runtime_dir, sizeof h->server_runtime_dir);
    who->socket = bounded(h->server_socket, sizeof h->server_socket);
  }
  ::munmap(p, sizeof(pool_header));
  return published;
}

// "pool server pid 12 (runtime dir /run/vramswap, socket /run/vramswap/GPU-1.sock)".
std::string describe(const pool_segment::server_identity& who) {
  std::string text = "pool server pid " + std::to_string(who.pid) + " (runtime dir " +
                     (who.runtime_dir.empty() ? std::string("unknown") : who.runtime_dir);
  if (!who.socket.empty()) text += ", socket " + who.socket;
  return text + ")";
}

void copy_path(char* to, const std::string& from) {
  const size_t n = std::min(from.size(), k_server_path_bytes - 1);
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}

// Write `who` into a header the caller holds the flock of, claimed last.
void publish_identity(pool_header* h, const pool_segment::server_identity& who) {
  h->claimed.store(0, std::memory_order_release);
  h->server_pid = who.pid;
  h->server_start_time = who.start_time;
  h->server_pid_ns = current_pid_namespace();
  h->server_flags.store(who.flags, std::memory_order_relaxed);
  copy_path(h->server_runtime_dir, who.runtime_dir);
  copy_path(h->server_socket, who.socket);
  h->claimed.store(1, std::memory_order_release);
}

// What a stale segment (nobody holds its flock) holds, from its header and its leases.
struct stale_pool {
  bool initialized = false;  // its magic is there
  uint64_t format = 0;
  uint64_t segment_size = 0;  // as its header says
  uint32_t frame_count = 0;
  uint32_t host_slots = 0;
  uint32_t members_in_use = 0;  // member slots whose lease a process holds
  bool ours() const { return initialized && format == format_word(); }
  bool whole(size_t file_size) const {
    return segment_size == file_size && segment_size_for(frame_count, host_slots) == file_size;
  }
};

// The member leases are at the same bytes in every layout from version 7 on, and the format
// word names the layout's member count: count them whatever the layout (an older one has
// none, so it reads as unused).
stale_pool inspect_stale(int fd, size_t file_size) {
  stale_pool old;
  if (file_size < sizeof(pool_header)) return old;
  void* p = ::mmap(nullptr, sizeof(pool_header), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return old;
  const pool_header* h = header_of(p);
  old.initialized = h->magic.load(std::memory_order_acquire) == k_magic;
  old.format = h->format;
  old.segment_size = h->segment_size;
  old.frame_count = h->frame_count;
  old.host_slots = h->host_slot_count;
  ::munmap(p, sizeof(pool_header));
  if (!old.initialized) return old;
  const uint32_t members = old.format >> 48 == k_layout_version ? k_member_count
                                                                 : std::max<uint32_t>(k_member_count, (old.format >> 16) & 0xFFFF);
  for (uint32_t m = 0; m < members; ++m) old.members_in_use += lease_held_elsewhere(fd, m) ? 1 : 0;
  return old;
}

// Does a live server hold the claim of the segment open on `fd`, whose header said `who`
// (`known`: it did)? By the process where this namespace can see it (no lock taken, so a
// server's claim or remove is never disturbed); else by the flock itself, tried shared and
// let go at once.
bool claim_alive(int fd, bool known, const pool_segment::server_identity& who) {
  if (known && visible_here(who.pid_ns)) return check_liveness({who.pid, who.start_time}) == liveness::alive;
  if (::flock(fd, LOCK_SH | LOCK_NB) == 0) {
    ::flock(fd, LOCK_UN);
    return false;
  }
  return errno == EWOULDBLOCK;
}

uint64_t new_pool_id() {
  uint64_t id = 0;
  if (::getrandom(&id, sizeof id, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof id) || id == 0) {
    id = monotonic_ns() ^ (uint64_t{static_cast<uint32_t>(::getpid())} << 32) ^ 0x9E3779B97F4A7C15ull;
  }
  return id;
}

// claim's steps, one per state its segment file is found in.

// Another process holds the segment's flock (flock failed with `flock_errno`; `fd` is
// closed here): ok when it is worth looking again shortly, else why the claim fails.
int segment_held(int fd, int flock_errno, const std::string& path, const std::string& device_key, uint64_t deadline) {
  const int e = flock_errno;
  pool_segment::server_identity other;
  const bool known = e == EWOULDBLOCK && read_identity(fd, &other);
  struct stat st {};
  const bool linked = ::fstat(fd, &st) == 0 && st.st_nlink > 0;
  ::close(fd);
  if (e == EINTR) return ok;
  if (e != EWOULDBLOCK) return fail_errno(e, "pool: flock %s", path.c_str());
  // A server of another PID namespace cannot be looked up here: its flock, held, is
  // all there is to go by, and the deadline tells a live one from one being replaced.
  const bool visible = known && visible_here(other.pid_ns);
  const bool alive = visible && check_liveness({other.pid, other.start_time}) == liveness::alive;
  const bool late = monotonic_ns() >= deadline;
  if ((alive && linked) || late) {
    std::string whom = known ? describe(other) : "a pool server that has not yet said who it is (still starting?)";
    if (visible && !alive) whom += ", which this PID namespace does not show as running";
    if (known && !visible) whom += " in another PID namespace";
    return fail(err_busy,
                "pool: device %s already has a pool in this runtime dir: %s holds its pool segment %s. A runtime dir "
                "has one pool per device: use that server (its clients set VRAMSWAP_RUNTIME_DIR=%s), or stop it first%s",
                device_key.c_str(), whom.c_str(), path.c_str(),
                known && !other.runtime_dir.empty() ? other.runtime_dir.c_str() : "<its runtime dir>",
                known ? (" (kill -TERM " + std::to_string(other.pid) + ")").c_str() : "");
  }
  // A server replacing a dead one's segment, or one between its flock and its identity:
  // look again shortly (it either publishes itself or unlinks this one).
  ::usleep(10'000);
  return ok;
}

// A stale segment still used by members, which this server cannot adopt: why (`fd` is the
// caller's to close).
int refuse_in_use(const std::string& device_key, const std::string& path, bool known, const pool_segment::server_identity& dead,
                  const stale_pool& old, off_t file_size) {
  const std::string whose = known ? describe(dead) : std::string("a pool server no longer running");
  if (!old.ours()) {
    return fail(err_version_mismatch,
                "pool: device %s's pool segment %s, left by %s, is still used by %u process(es), and it has pool "
                "layout version %" PRIu64 " where this vramswapd has version %" PRIu64 ": a server cannot adopt a pool "
                "of another layout. Let those processes finish (or stop them), or run the vramswapd of their vramswap "
                "version until they have; then start this one",
                device_key.c_str(), path.c_str(), whose.c_str(), old.members_in_use, old.format >> 48, k_layout_version);
  }
  return fail(err_version_mismatch,
              "pool: device %s's pool segment %s, left by %s, is still used by %u process(es), but it is %lld bytes "
              "where its header says %" PRIu64 ": it was truncated or overwritten, and cannot be adopted. Stop those "
              "processes, then start the server again",
              device_key.c_str(), path.c_str(), whose.c_str(), old.members_in_use, static_cast<long long>(file_size),
              old.segment_size);
}

// A stopped or dead server's segment (nobody holds its flock), of `file_size` bytes. Its
// members live on and use it: *base is its mapping, with `who` published in it, to adopt
// (`fd` stays open). Nobody uses it: it is unlinked, `fd` closed, *base null (look again).
// Otherwise (`fd` closed) why it can be neither.
int adopt_or_replace(int fd, off_t file_size, const std::string& path, const std::string& device_key,
                     const pool_segment::server_identity& who, void** base) {
  *base = nullptr;
  pool_segment::server_identity dead;
  const bool known = read_identity(fd, &dead);
  const stale_pool old = inspect_stale(fd, static_cast<size_t>(file_size));
  if (old.members_in_use > 0 && old.ours() && old.whole(static_cast<size_t>(file_size))) {
    // Its members live on and use it: serve them, with every table as it is.
    const size_t size = static_cast<size_t>(file_size);
    void* mapped = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return fail_errno(e, "pool: mapping the running pool segment %s to adopt it", path.c_str());
    }
    pool_header* h = header_of(mapped);
    publish_identity(h, who);
    const uint32_t adoptions = h->adoptions.fetch_add(1, std::memory_order_acq_rel) + 1;
    log(log_level::info, "pool: adopting the running pool %s of %s (%u frames, %u member(s) still attached; adoption %u)",
        path.c_str(), known ? (describe(dead) + ", no longer running").c_str() : "a pool server no longer running",
        old.frame_count, old.members_in_use, adoptions);
    *base = mapped;
    return ok;
  }
  if (old.members_in_use > 0) {
    // Never replace a pool under processes that use it: they would go on in frames that
    // a new pool hands out again.
    ::close(fd);
    return refuse_in_use(device_key, path, known, dead, old, file_size);
  }
  // Nobody uses it any more; its frames went with their last holder. Its readers
  // (vramswap status) keep their mapping: never reuse it, replace it.
  log(log_level::info, "pool: replacing the stale pool segment %s of %s", path.c_str(),
      known ? (describe(dead) + ", no longer running").c_str() : "a pool server that died while starting");
  const int urc = ::unlink(path.c_str());
  const int e = errno;
  ::close(fd);
  if (urc != 0 && e != ENOENT) return fail_errno(e, "pool: removing the stale pool segment %s", path.c_str());
  return ok;
}

// An empty segment, ours: one page, mapped at *base, saying who we are before anything
// else. On failure it is unlinked and `fd` closed.
int start_segment(int fd, const std::string& path, const pool_segment::server_identity& who, void** base, size_t* size) {
  *size = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* mapped = MAP_FAILED;
  int e = ::ftruncate(fd, static_cast<off_t>(*size)) == 0 ? 0 : errno;
  // Its pages now: a full tmpfs answers a touch of a shared mapping with SIGBUS.
  if (e == 0 && (e = ::posix_fallocate(fd, 0, static_cast<off_t>(*size))) == EOPNOTSUPP) e = 0;
  if (e == 0) mapped = ::mmap(nullptr, *size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) {
    if (e == 0) e = errno;
    ::unlink(path.c_str());
    ::close(fd);
    return fail_errno(e, "pool: sizing and mapping %s (is the runtime dir's file system full?)", path.c_str());
  }
  publish_identity(header_of(mapped), who);
  *base = mapped;
  return ok;
}

}  // namespace

int pool_segment::name_for(const std::string& device_key, std::string* out) noexcept {
  // The lock's naming rules (prefix, owner, allowed characters) with a "pool-" marker.
  return shared_segment::name_for("pool-" + device_key, out);
}

int pool_segment::remove(const std::string& device_key) noexcept {
  try {
    std::string name;
    VS_TRY(name_for(device_key, &name));
    const std::string path = path_of(name);
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? ok : fail_errno(errno, "pool: open %s to remove it", path.c_str());
    // Only a segment whose flock nobody holds is removed, by the one who holds it now: the
    // rule every remover and every server follows (pool/pool_layout.hpp).
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      server_identity who;
      const bool known = read_identity(fd, &who);
      ::close(fd);
      return fail(err_busy, "pool: %s is held by %s; a live pool is never removed: stop that server first%s", path.c_str(),
                  known ? describe(who).c_str() : "a pool server that is starting",
                  known ? (" (kill -TERM " + std::to_string(who.pid) + ")").c_str() : "");
    }
    struct stat st {};
    int rc = ok;
    if (::fstat(fd, &st) == 0 && st.st_nlink > 0 && ::unlink(path.c_str()) != 0 && errno != ENOENT) {
      rc = fail_errno(errno, "pool: removing %s", path.c_str());
    }
    ::close(fd);
    return rc;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "pool: out of host memory");
  }
}

int pool_segment::wrap(void* base, size_t size, const std::string& name, const std::string& path,
                        std::unique_ptr<pool_segment>* out) noexcept {
  try {
    std::unique_ptr<pool_segment> seg(new pool_segment());
    seg->base_ = base;
    seg->size_ = size;
    seg->name_ = name;
    seg->path_ = path;
    *out = std::move(seg);
    return ok;
  } catch (const std::bad_alloc&) {
    ::munmap(base, size);
    return fail(err_out_of_memory, "pool: out of host memory");
  }
}

int pool_segment::claim(const std::string& device_key, const server_identity& who, std::unique_ptr<pool_segment>* out) noexcept {
  try {
    std::string name;
    VS_TRY(name_for(device_key, &name));
    std::string dir;
    VS_TRY(runtime_dir(/*create=*/true, &dir));
    const std::string path = dir + name;
    const uint64_t deadline = monotonic_ns() + k_claim_wait_ns;
    for (;;) {
      int fd = -1;
      VS_TRY(open_owned(path, O_RDWR | O_CREAT, "pool: the pool segment", "or use another VRAMSWAP_SHM_PREFIX", &fd));
      if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        VS_TRY(segment_held(fd, errno, path, device_key, deadline));
        continue;
      }
      struct stat st {};
      if (::fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        return fail_errno(e, "pool: fstat %s", path.c_str());
      }
      if (st.st_nlink == 0) {  // its holder replaced it before we got its flock: the name is another one's now
        ::close(fd);
        continue;
      }
      if (st.st_size != 0) {
        void* base = nullptr;
        VS_TRY(adopt_or_replace(fd, st.st_size, path, device_key, who, &base));
        if (base == nullptr) continue;  // replaced
        const int rc = wrap(base, static_cast<size_t>(st.st_size), name, path, out);
        if (rc != ok) {
          ::close(fd);
          return rc;
        }
        (*out)->claim_fd_ = fd;
        (*out)->adopted_ = true;
        return ok;
      }
      void* base = nullptr;
      size_t size = 0;
      VS_TRY(start_segment(fd, path, who, &base, &size));
      const int rc = wrap(base, size, name, path, out);
      if (rc != ok) {
        ::unlink(path.c_str());
        ::close(fd);
        return rc;
      }
      (*out)->claim_fd_ = fd;
      return ok;
    }
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "pool: out of host memory");
  }
}


int pool_segment::initialize(uint32_t frame_count, uint64_t frame_size, uint32_t host_slots) noexcept {
  if (claim_fd_ < 0 || header()->magic.load(std::memory_order_relaxed) != 0) {
    return fail(err_internal, "pool: initialize of %s, which this process has not claimed or has initialized already", name_.c_str());
  }
  const size_t size = segment_size_for(frame_count, host_slots);
  if (::ftruncate(claim_fd_, static_cast<off_t>(size)) != 0) {
    return fail_errno(errno, "pool: sizing %s to %zu bytes (is the runtime dir's file system full?)", path_.c_str(), size);
  }
  // Its pages now: a full tmpfs answers a touch of a shared mapping with SIGBUS.
  if (const int e = ::posix_fallocate(claim_fd_, 0, static_cast<off_t>(size)); e != 0 && e != EOPNOTSUPP) {
    return fail_errno(e, "pool: cannot make room for %s (%zu bytes): the runtime dir's file system is full; free space there or set "
                      "VRAMSWAP_RUNTIME_DIR to a directory with room", path_.c_str(), size);
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, claim_fd_, 0);
  if (base == MAP_FAILED) return fail_errno(errno, "pool: mmap %s", path_.c_str());
  ::munmap(base_, size_);
  base_ = base;
  size_ = size;
  // ftruncate gave zeros past the identity: every frame free with owner 0... set the owners explicitly.
  pool_header* h = header_of(base);
  h->format = format_word();
  h->segment_size = size;
  h->frame_size = frame_size;
  h->frame_count = frame_count;
  h->host_slot_count = host_slots;
  h->host_slot_size = host_slots > 0 ? frame_size : 0;
  h->pool_id = new_pool_id();
  h->adoptions.store(0, std::memory_order_relaxed);
  frame_entry* frames = frames_of(base);
  for (uint32_t i = 0; i < frame_count; ++i) {
    frames[i].word.store(frame_word{frame_free, k_no_member, k_no_member, 0}.encode(), std::memory_order_relaxed);
  }
  slot_entry* slots = slots_of(base);
  for (uint32_t i = 0; i < host_slots; ++i) {
    slots[i].word.store(slot_word{slot_free, k_no_member, 0}.encode(), std::memory_order_relaxed);
  }
  h->magic.store(k_magic, std::memory_order_release);  // published last
  return ok;
}

void pool_segment::reset_tables() noexcept {
  pool_header* h = header();
  for (uint32_t i = 0; i < frame_count(); ++i) {
    const frame_word old = frame_word::decode(read(i));
    frame(i).last_use.store(0, std::memory_order_relaxed);
    frame(i).word.store(frame_word{frame_free, k_no_member, k_no_member, old.generation + 1}.encode(), std::memory_order_release);
  }
  for (uint32_t s = 0; s < host_slot_count(); ++s) {
    const slot_word old = slot_word::decode(read_slot(s));
    slot(s).word.store(slot_word{slot_free, k_no_member, old.generation + 1}.encode(), std::memory_order_release);
  }
  for (uint32_t m = 0; m < k_member_count; ++m) remove_member(m);
  h->pool_id = new_pool_id();
  h->adoptions.store(0, std::memory_order_relaxed);
  notify_freed();
  notify_slots_freed();
}

int pool_segment::create(const std::string& device_key, uint32_t frame_count, uint64_t frame_size, uint32_t host_slots,
                         pid_t server_pid, uint64_t server_start_time, std::unique_ptr<pool_segment>* out) noexcept {
  server_identity who;
  who.pid = server_pid;
  who.start_time = server_start_time;
  std::unique_ptr<pool_segment> seg;
  VS_TRY(claim(device_key, who, &seg));
  VS_TRY(seg->initialize(frame_count, frame_size, host_slots));
  *out = std::move(seg);
  return ok;
}

namespace {
// What a client can see of `device_key`'s segment without opening it as a member: whether it
// is initialized, and whether the server that claimed it lives (*who: that server, as far as
// it has said). False when there is no segment or it cannot be read.
bool look_at_claim(const std::string& device_key, bool* initialized, bool* alive, pool_segment::server_identity* who) noexcept {
  try {
    std::string name;
    if (pool_segment::name_for(device_key, &name) != ok) {
      clear_error();
      return false;
    }
    const std::string path = path_of(name);
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st {};
    bool result = false;
    if (::fstat(fd, &st) == 0 && st.st_uid == ::geteuid() && static_cast<size_t>(st.st_size) >= sizeof(pool_header)) {
      void* p = ::mmap(nullptr, sizeof(pool_header), PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        *initialized = header_of(p)->magic.load(std::memory_order_acquire) != 0;
        ::munmap(p, sizeof(pool_header));
        pool_segment::server_identity seen;
        const bool known = read_identity(fd, &seen);
        *alive = claim_alive(fd, known, seen);
        if (who != nullptr) *who = seen;
        result = true;
      }
    }
    ::close(fd);
    return result;
  } catch (const std::bad_alloc&) {
    return false;
  }
}
}  // namespace

pool_segment::claim_state pool_segment::claim_of(const std::string& device_key, server_identity* who) noexcept {
  bool initialized = false, alive = false;
  server_identity seen;
  if (!look_at_claim(device_key, &initialized, &alive, &seen) || !alive) return claim_state::none;
  if (who != nullptr) *who = seen;
  return initialized ? claim_state::built : claim_state::starting;
}

bool pool_segment::starting(const std::string& device_key, server_identity* who) noexcept {
  return claim_of(device_key, who) == claim_state::starting;
}

int pool_segment::open(const std::string& name, std::unique_ptr<pool_segment>* out, bool read_only) noexcept {
  int fd = -1;
  const std::string path = path_of(name);
  VS_TRY(open_owned(path, read_only ? O_RDONLY : O_RDWR, "pool: the pool segment", "", &fd));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(pool_header)) {
    ::close(fd);
    return fail(err_version_mismatch, "pool: %s is too small to be a pool segment", path.c_str());
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* base = ::mmap(nullptr, size, read_only ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    return fail_errno(e, "pool: mmap %s", path.c_str());
  }
  const pool_header* h = header_of(base);
  int rc = ok;
  const uint64_t magic = h->magic.load(std::memory_order_acquire);
  if (magic == 0) {
    // Claimed and not initialized yet (pool/pool_layout.hpp): a server that builds its pool,
    // or one that died while it did. Neither is a version mismatch.
    server_identity who;
    const bool known = read_identity(fd, &who);
    const std::string whom = known ? describe(who) : std::string("a pool server that has not said who it is yet");
    if (claim_alive(fd, known, who)) {
      rc = fail(err_unavailable,
                "pool: %s is claimed by %s, which is still starting (building its pool: device frames, the pinned host "
                "pool) and does not serve yet; try again once it listens on its socket%s",
                path.c_str(), whom.c_str(), known ? "" : " (or find it: fuser -v <the segment>)");
    } else {
      rc = fail(err_unavailable,
                "pool: %s was claimed by %s, which is no longer running: it died while building its pool, before it "
                "served. Nothing uses it; the next vramswapd of the device replaces it when it starts (a client with "
                "autostart starts one), or remove it (rm %s)",
                path.c_str(), whom.c_str(), path.c_str());
    }
  } else if (magic != k_magic) {
    rc = fail(err_version_mismatch, "pool: %s is not an initialized pool segment (magic %#" PRIx64 ")", path.c_str(), magic);
  } else if (h->format != format_word()) {
    rc = fail(err_version_mismatch,
              "pool: %s has layout format %#" PRIx64 " (version %" PRIu64 "), this build expects %#" PRIx64
              "; run client and pool server from the same vramswap version",
              path.c_str(), h->format, h->format >> 48, format_word());
  } else if (h->segment_size != size || segment_size_for(h->frame_count, h->host_slot_count) != size) {
    rc = fail(err_version_mismatch,
              "pool: %s is %zu bytes, its header says %" PRIu64 ": it was truncated or overwritten, and the processes "
              "still using it die of SIGBUS when they touch what is missing; stop its pool server (pid %d) and its clients, "
              "and let a new server make it again",
              path.c_str(), size, h->segment_size, static_cast<int>(h->server_pid));
  }
  // A member's lease lives on a description of its own, never mapped (lock/liveness_lease.hpp).
  int lease_fd = -1;
  if (rc == ok && !read_only) {
    rc = open_lease_description(fd, ("pool: the pool segment " + path).c_str(), &lease_fd);
    if (rc == ok && (rc = register_lease_fd(lease_fd)) != ok) {
      ::close(lease_fd);
      lease_fd = -1;
    }
  }
  ::close(fd);  // the mapping keeps the file
  if (rc != ok) ::munmap(base, size);
  if (rc == ok) rc = wrap(base, size, name, path, out);  // unmaps on its own failure
  if (rc != ok) {
    if (lease_fd >= 0) {
      unregister_lease_fd(lease_fd);
      ::close(lease_fd);
    }
    return rc;
  }
  (*out)->lease_fd_ = lease_fd;
  return ok;
}

pool_segment::~pool_segment() {
  if (base_ != nullptr) ::munmap(base_, size_);
  if (lease_fd_ >= 0) {
    // The lease goes with the description; the slot was given up before (or the server
    // repairs it, as a dead member's).
    unregister_lease_fd(lease_fd_);
    ::close(lease_fd_);
  }
  if (claim_fd_ >= 0) {
    // The server's own segment: its name goes while the flock is still held, so nobody
    // can have replaced it in between (pool/pool_layout.hpp). A pool left for the next
    // server keeps its name: only the flock goes.
    if (!keep_) ::unlink(path_.c_str());
    ::close(claim_fd_);
  }
}

int pool_segment::lease_member(uint32_t m) noexcept {
  if (lease_fd_ < 0) return fail(err_internal, "pool: lease of member %u on %s, which this process did not open for writing", m, path_.c_str());
  if (leased_ >= 0) return fail(err_internal, "pool: this process leases member %d of %s already", leased_, path_.c_str());
  VS_TRY(take_lease(lease_fd_, m, ("pool: member slot of " + path_).c_str()));
  leased_ = static_cast<int>(m);
  return ok;
}

bool pool_segment::member_leased(uint32_t m) const noexcept {
  // The server holds no lease: any lease this description sees is a member's.
  const int fd = claim_fd_ >= 0 ? claim_fd_ : lease_fd_;
  if (fd < 0) return true;  // cannot tell: taken as alive
  if (static_cast<int>(m) == leased_) return true;
  return lease_held_elsewhere(fd, m);
}

bool pool_segment::move(uint32_t f, uint64_t seen, frame_state state, uint32_t owner, uint32_t requester) noexcept {
  const frame_word old = frame_word::decode(seen);
  const uint64_t next = frame_word{state, owner, requester, old.generation + 1}.encode();
  return frame(f).word.compare_exchange_strong(seen, next, std::memory_order_acq_rel);
}

void pool_segment::notify_freed() noexcept {
  header()->frames_freed.fetch_add(1, std::memory_order_acq_rel);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&header()->frames_freed), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool pool_segment::take_free(frame_state state, uint32_t owner, uint32_t* scan_hint, uint32_t* out) noexcept {
  const uint32_t n = frame_count();
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t f = (*scan_hint + k) % n;
    uint64_t raw = read(f);
    if (frame_word::decode(raw).state != frame_free) continue;
    if (move(f, raw, state, owner, k_no_member)) {
      *scan_hint = (f + 1) % n;
      *out = f;
      return true;
    }
  }
  return false;
}

int pool_segment::give_back(uint32_t f, uint32_t owner) noexcept {
  for (;;) {
    uint64_t raw = read(f);
    const frame_word w = frame_word::decode(raw);
    if (w.owner != owner || w.state == frame_free) {
      return fail(err_internal, "pool: giving back frame %u that this process (member %u) does not own (state %d, owner %u)", f, owner,
                  static_cast<int>(w.state), w.owner);
    }
    if (move(f, raw, frame_free, k_no_member, k_no_member)) break;  // lost a race with a requester: retry
  }
  notify_freed();
  return ok;
}

bool pool_segment::move_slot(uint32_t s, uint64_t seen, slot_state state, uint32_t owner) noexcept {
  const slot_word old = slot_word::decode(seen);
  const uint64_t next = slot_word{state, owner, old.generation + 1}.encode();
  return slot(s).word.compare_exchange_strong(seen, next, std::memory_order_acq_rel);
}

void pool_segment::notify_slots_freed() noexcept {
  header()->slots_freed.fetch_add(1, std::memory_order_acq_rel);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&header()->slots_freed), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

uint32_t pool_segment::count_slots(slot_state state, uint32_t owner) const noexcept {
  uint32_t n = 0;
  for (uint32_t s = 0; s < host_slot_count(); ++s) {
    const slot_word w = slot_word::decode(read_slot(s));
    n += w.state == state && (owner == k_no_member || w.owner == owner);
  }
  return n;
}

uint32_t pool_segment::claim_dirty_slots_of(uint32_t owner) noexcept {
  uint32_t claimed = 0;
  for (uint32_t s = 0; s < host_slot_count(); ++s) {
    const uint64_t seen = read_slot(s);
    const slot_word w = slot_word::decode(seen);
    // A CAS that fails lost to a member that took the slot to write over it: no longer ours.
    if (w.state == slot_dirty && w.owner == owner && move_slot(s, seen, slot_used, owner)) ++claimed;
  }
  return claimed;
}

uint32_t pool_segment::free_slots_of(uint32_t owner) noexcept {
  uint32_t freed = 0;
  for (uint32_t s = 0; s < host_slot_count(); ++s) {
    // Only the state can change under us (the owner is dead, nobody else takes a used
    // slot), so retry until it is free. A dirty slot is left alone: it was not zeroed
    // (claim_dirty_slots_of comes first), and another member may take it.
    for (uint64_t seen = read_slot(s);; seen = read_slot(s)) {
      const slot_word w = slot_word::decode(seen);
      if (w.state != slot_used || w.owner != owner) break;
      if (move_slot(s, seen, slot_free, k_no_member)) {
        ++freed;
        break;
      }
    }
  }
  if (freed > 0) notify_slots_freed();
  return freed;
}

void pool_segment::notify_member(uint32_t m) noexcept {
  member(m).requests.fetch_add(1, std::memory_order_acq_rel);
  futex_wake_one(&member(m).requests);
}

uint32_t pool_segment::count(frame_state state, uint32_t owner) const noexcept {
  uint32_t n = 0;
  for (uint32_t f = 0; f < frame_count(); ++f) {
    const frame_word w = frame_word::decode(read(f));
    n += w.state == state && (owner == k_no_member || w.owner == owner);
  }
  return n;
}

void pool_segment::trace(uint32_t m, trace_kind kind, uint64_t ns, uint64_t duration_ns, uint64_t bytes,
                         uint64_t extra) noexcept {
  trace_ring& ring = trace_ring_of(m);
  const uint64_t index = ring.head.fetch_add(1, std::memory_order_acq_rel);
  trace_record& r = ring.records[index % k_trace_records];
  r.seq.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // readers see seq 0 before any new field
  r.ns.store(ns, std::memory_order_relaxed);
  r.duration_ns.store(duration_ns, std::memory_order_relaxed);
  r.bytes.store(bytes, std::memory_order_relaxed);
  r.extra.store(extra, std::memory_order_relaxed);
  r.kind.store(kind, std::memory_order_relaxed);
  r.pid.store(member(m).pid, std::memory_order_relaxed);
  r.seq.store(index + 1, std::memory_order_release);  // published last
}

uint64_t pool_segment::read_trace(uint32_t m, uint64_t* cursor, std::vector<trace_event>* out) const {
  const trace_ring& ring = trace_ring_of(m);
  const uint64_t head = ring.head.load(std::memory_order_acquire);
  uint64_t lost = 0;
  if (head > *cursor + k_trace_records) {
    lost += head - k_trace_records - *cursor;
    *cursor = head - k_trace_records;
  }
  for (; *cursor < head; ++*cursor) {
    const trace_record& r = ring.records[*cursor % k_trace_records];
    const uint64_t want = *cursor + 1;
    if (r.seq.load(std::memory_order_acquire) != want) {
      // Not yet published (a writer between claim and publish) or torn by its death. A
      // record claimed but still being written is worth waiting for: stop here and come
      // back at the next poll, unless the ring has moved on (then it is lost).
      if (head - *cursor < 16) break;
      ++lost;
      continue;
    }
    trace_event e{*cursor, static_cast<trace_kind>(r.kind.load(std::memory_order_relaxed)), r.pid.load(std::memory_order_relaxed),
                  r.ns.load(std::memory_order_relaxed), r.duration_ns.load(std::memory_order_relaxed),
                  r.bytes.load(std::memory_order_relaxed), r.extra.load(std::memory_order_relaxed)};
    std::atomic_thread_fence(std::memory_order_acquire);
    if (r.seq.load(std::memory_order_relaxed) != want) {
      ++lost;
      continue;
    }
    out->push_back(e);
  }
  return lost;
}

int pool_segment::add_member(pid_t pid, uint64_t start_time, uint64_t pid_ns, uint32_t* index) noexcept {
  for (uint32_t m = 0; m < k_member_count; ++m) {
    member_slot& s = member(m);
    if (s.state.load(std::memory_order_acquire) != member_free) continue;
    // A client whose handshake with a server that died is ending may still lease this slot
    // for a moment: not this one, then.
    if (claim_fd_ >= 0 && lease_held_elsewhere(claim_fd_, m)) continue;
    s.pid = pid;
    s.start_time = start_time;
    s.pid_ns = pid_ns;
    s.requests.store(0);
    s.holding.store(0);
    s.bytes_out.store(0);
    s.bytes_in.store(0);
    s.evictions_served.store(0);
    s.swaps_in.store(0);
    s.phase.store(phase_idle);
    s.holding_since_ns.store(0);
    s.host_bytes.store(0);
    s.disk_bytes.store(0);
    s.host_pinned_bytes.store(0);
    s.outside_pool_bytes.store(0);
    s.acquires.store(0);
    s.lock_wait_ns.store(0);
    s.restore_ns.store(0);
    s.evict_ns.store(0);
    s.identity.store(0);  // until the member says who it is
    // Nothing of the slot's previous member: its failure to evict (a lock holder waiting on
    // the new member would quote it as the new member's), its turns' rhythm (a predicted next
    // acquire), its asking ahead. The status first: a reader takes the detail only after it.
    s.evict_status.store(0, std::memory_order_release);
    s.evict_failed_ns.store(0);
    s.evict_error[0] = '\0';
    s.released_ns.store(0);
    s.asked_ns.store(0);
    s.idle_gap_ns.store(0);
    s.idle_gaps.store(0);
    s.frames_asked_ahead.store(0);
    s.frames_asked_at_acquire.store(0);
    // The ring is never reset (a reader may still be reading the previous member's
    // records); the new member's events start at its current head.
    s.trace_start.store(trace_ring_of(m).head.load(std::memory_order_acquire));
    s.state.store(member_live, std::memory_order_release);
    *index = m;
    return ok;
  }
  return fail(err_busy, "pool: all %u member slots are in use; no more processes can attach to this device's pool",
              k_member_count);
}

void pool_segment::remove_member(uint32_t index) noexcept { member(index).state.store(member_free, std::memory_order_release); }

}  // namespace vramswap::detail
