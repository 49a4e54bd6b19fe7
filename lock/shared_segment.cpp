#include "lock/shared_segment.hpp"

#include <fcntl.h>
#include <grp.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>

#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/liveness_lease.hpp"
#include "lock/ownership.hpp"
#include "lock/process_identity.hpp"
#include "lock/lease_mutex.hpp"
#include "lock/runtime_dir.hpp"
#include "lock/segment_layout.hpp"

namespace vramswap::detail {
using namespace lock_layout;

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
         c == '.';
}

int check_name_part(const std::string& text, const char* what, bool may_be_empty) {
  if (text.empty() && !may_be_empty) return fail(err_invalid_argument, "lock: %s is empty", what);
  if (text.size() > 128) return fail(err_invalid_argument, "lock: %s \"%.40s...\" is longer than 128 characters", what, text.c_str());
  for (char c : text) {
    if (!is_name_char(c)) {
      return fail(err_invalid_argument, "lock: %s \"%s\" contains '%c'; use only letters, digits, '-', '_' and '.'", what,
                  text.c_str(), c);
    }
  }
  return ok;
}


// Initialize a segment whose magic is 0, while holding its init flock.
int initialize(int fd, const std::string& name, void** base_out) {
  gid_t gid = 0;
  bool shared_with_group = false;
  VS_TRY(configured_group(&gid, &shared_with_group));
  // Group and mode only where they are not right yet: a member of the group building anew
  // a segment another member made (and left unbuilt, dying) may not change either, and
  // need not (open_owned checked both).
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fail_errno(errno, "lock: fstat %s", name.c_str());
  if (shared_with_group && st.st_gid != gid && ::fchown(fd, static_cast<uid_t>(-1), gid) != 0) {
    return fail_errno(errno, "lock: cannot give %s to group %u (VRAMSWAP_GROUP); are you a member of it?",
                      name.c_str(), static_cast<unsigned>(gid));
  }
  // Set the mode explicitly: the creating open's mode was filtered by the umask.
  const mode_t mode = shared_with_group ? 0660 : 0600;
  if ((st.st_mode & 07777) != mode && ::fchmod(fd, mode) != 0) return fail_errno(errno, "lock: fchmod %s", name.c_str());
  if (::ftruncate(fd, static_cast<off_t>(k_segment_size)) != 0) {
    return fail_errno(errno, "lock: cannot size %s to %zu bytes (is the runtime dir's file system full?)", name.c_str(), k_segment_size);
  }
  // Its pages now: a tmpfs (a container's /dev/shm is often 64 MB) gives them only as they
  // are touched, and a full one answers a touch of a shared mapping with SIGBUS.
  if (const int e = ::posix_fallocate(fd, 0, static_cast<off_t>(k_segment_size)); e != 0 && e != EOPNOTSUPP && e != EINVAL) {
    return fail_errno(e, "lock: cannot make room for %s (%zu bytes): its file system is full; free space there (a container's "
                      "/dev/shm is often only 64 MB) or set VRAMSWAP_RUNTIME_DIR to a directory with room",
                      name.c_str(), k_segment_size);
  }
  void* base = ::mmap(nullptr, k_segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return fail_errno(errno, "lock: mmap %s", name.c_str());
  // A creator may have died half-way: start from zeros, whatever it left.
  std::memset(base, 0, k_segment_size);
  lock_state* state = lock_state_of(base);
  new (state) lock_state{};  // the internal mutex unlocked (a zero word)
  state->holder_slot = k_no_slot;
  waiter_slot* slots = slots_of(base);
  for (uint32_t i = 0; i < k_slot_count; ++i) new (&slots[i]) waiter_slot{};
  segment_header* header = header_of(base);
  header->format = format_word();
  header->segment_size = k_segment_size;
  // Publish last: before this store the segment is "not initialized" to everyone.
  header->magic.store(k_magic, std::memory_order_release);
  log(log_level::debug, "lock: initialized %s (%zu bytes, format %#llx)", name.c_str(), k_segment_size,
      static_cast<unsigned long long>(format_word()));
  *base_out = base;
  return ok;
}

// Check an initialized segment's header; never reads past it unless it matches.
int validate(const void* base, size_t size, const std::string& name) {
  const segment_header* header = static_cast<const segment_header*>(base);
  const uint64_t magic = header->magic.load(std::memory_order_acquire);
  if (magic != k_magic) {
    return fail(err_version_mismatch,
                "lock: %s is not a vramswap segment (magic %#llx, expected %#llx): corrupt or made by another "
                "program; stop the processes using it and remove it (rm %s)",
                name.c_str(), static_cast<unsigned long long>(magic), static_cast<unsigned long long>(k_magic), name.c_str());
  }
  if (header->format != format_word()) {
    return fail(err_version_mismatch,
                "lock: %s has layout format %#llx (version %llu), this library needs %#llx (version %llu); "
                "every process sharing a device must use the same vramswap build: stop the others or use another "
                "VRAMSWAP_SHM_PREFIX",
                name.c_str(), static_cast<unsigned long long>(header->format),
                static_cast<unsigned long long>(format_version(header->format)),
                static_cast<unsigned long long>(format_word()), static_cast<unsigned long long>(k_layout_version));
  }
  if (header->segment_size != size || size != k_segment_size) {
    return fail(err_version_mismatch,
                "lock: %s is %zu bytes but its header says %llu and this library's segments are %zu: corrupt; "
                "stop the processes using it and remove it (rm %s)",
                name.c_str(), size, static_cast<unsigned long long>(header->segment_size), k_segment_size, name.c_str());
  }
  return ok;
}

// Does another open file description hold the "in use" read lock (below) of `fd`'s file?
// Where the kernel cannot say, yes.
bool used_elsewhere(int fd) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 1;
  return ::fcntl(fd, F_OFD_GETLK, &fl) != 0 || fl.l_type != F_UNLCK;
}

// A segment that `validate` refused (`refused`, its detail set). Left by processes of
// another build (or a corrupted one) that all died without removing it (a SIGKILL, an OOM
// kill, a pod's end) and used by nobody now: nothing in it means anything to anyone, and
// refusing it would stop every job on the device after an upgrade. Built anew then, under
// the init flock (nobody is opening it meanwhile); while any process uses it, refused, saying so.
int initialize_if_unused(int fd, const std::string& name, int refused, void** base) {
  if (used_elsewhere(fd)) {
    return fail(refused, "%s; a process uses it now (it is left alone while any does)", last_error());
  }
  log(log_level::warn, "%s; no process uses it: initializing it anew", last_error());
  clear_error();
  return initialize(fd, name, base);
}

// Users and removal. Every open segment keeps its descriptor and a read lock (an OFD byte
// lock on byte 0, separate from the init flock) for as long as it is mapped. The last user
// to close it removes the name: it takes the init flock (nobody is opening it) and turns its
// read lock into a write lock (nobody else holds one) without waiting. An opener checks,
// once it holds the init flock, that its descriptor is still the object of that name, and
// opens again if it was removed meanwhile. A process that forked since it opened a segment
// never removes it: a child may share its descriptor (and its lock) and use the mapping.
std::atomic<uint64_t> g_forks{0};

void count_fork() noexcept { g_forks.fetch_add(1, std::memory_order_relaxed); }

int ofd_lock(int fd, short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 1;
  return ::fcntl(fd, F_OFD_SETLK, &fl);
}

// Holds the init flock for the lifetime of the object.
struct init_flock {
  int fd;
  explicit init_flock(int f) : fd(f) {}
  ~init_flock() { ::flock(fd, LOCK_UN); }
};

// Under the init flock: map segment `name` (open as `fd`), initializing it when it is new,
// left half-initialized, or unusable and unused, and count this process among its users.
// *removed: its last user removed it after our open (then open it again).
int map_as_user(int fd, const std::string& name, void** base_out, size_t* size_out, bool* removed) {
  int rc = ok;
  void* base = nullptr;
  size_t size = 0;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    rc = fail_errno(errno, "lock: fstat %s", name.c_str());
  } else if (st.st_nlink == 0) {
    *removed = true;
  } else if (st.st_size == 0) {
    rc = initialize(fd, name, &base);
    size = k_segment_size;
  } else if (static_cast<size_t>(st.st_size) < sizeof(segment_header)) {
    rc = fail(err_version_mismatch,
              "lock: %s is only %lld bytes, too small for a vramswap header: corrupt; stop the processes "
              "using it and remove it",
              name.c_str(), static_cast<long long>(st.st_size));
    rc = initialize_if_unused(fd, name, rc, &base);
    if (rc == ok) size = k_segment_size;
  } else {
    size = static_cast<size_t>(st.st_size);
    base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      base = nullptr;
      rc = fail_errno(errno, "lock: mmap %s", name.c_str());
    } else if (header_of(base)->magic.load(std::memory_order_acquire) == 0 && size == k_segment_size) {
      // Its creator died before publishing it (we hold the init flock, so nobody else is
      // initializing it, and nobody uses a segment without magic): build it again.
      ::munmap(base, size);
      base = nullptr;
      log(log_level::warn, "lock: %s was left half-initialized by a dead process; initializing it again",
          name.c_str());
      rc = initialize(fd, name, &base);
    } else if ((rc = validate(base, size, name)) != ok) {
      ::munmap(base, size);
      base = nullptr;
      rc = initialize_if_unused(fd, name, rc, &base);
      if (rc == ok) size = k_segment_size;
    }
  }
  // A user from now on (under the init flock, so that no last user removes it between).
  if (rc == 0 && !*removed && ofd_lock(fd, F_RDLCK) != 0) rc = fail_errno(errno, "lock: cannot take the OFD read lock that marks %s in use; if its file system does not support OFD locks, put VRAMSWAP_RUNTIME_DIR on a local one (tmpfs, ext4, xfs)", name.c_str());
  *base_out = base;
  *size_out = size;
  return rc;
}

}  // namespace

int configured_group(gid_t* gid, bool* is_set) {
  const std::string group_text = option_text(option_id::group);
  *is_set = !group_text.empty();
  if (group_text.empty()) return ok;
  char buf[4096];
  struct group grp_entry {};
  struct group* found = nullptr;
  const int rc = getgrnam_r(group_text.c_str(), &grp_entry, buf, sizeof buf, &found);
  if (rc == 0 && found != nullptr) {
    *gid = found->gr_gid;
    return ok;
  }
  char* end = nullptr;
  const unsigned long number = std::strtoul(group_text.c_str(), &end, 10);
  if (end != group_text.c_str() && *end == '\0') {
    *gid = static_cast<gid_t>(number);
    return ok;
  }
  return fail(err_invalid_argument, "VRAMSWAP_GROUP: \"%s\" is neither a known group name nor a group id", group_text.c_str());
}

int shared_segment::name_for(const std::string& device_key, std::string* out) noexcept {
  try {
    const std::string prefix = option_text(option_id::shm_prefix);
    VS_TRY(check_name_part(prefix, "VRAMSWAP_SHM_PREFIX", true));
    VS_TRY(check_name_part(device_key, "device key", false));
    sharing who;
    VS_TRY(current_sharing(&who));
    *out = "/" + prefix + "vramswap-" + owner_tag(who) + "-" + device_key;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "lock: out of memory building a segment name");
  }
  return ok;
}

int shared_segment::open(const std::string& device_key, std::unique_ptr<shared_segment>* out) noexcept {
  static const int fork_counted = ::pthread_atfork(count_fork, nullptr, nullptr);
  (void)fork_counted;
  const uint64_t forks = g_forks.load(std::memory_order_relaxed);
  std::string name;
  VS_TRY(path_for(device_key, /*create_dir=*/true, &name));
  // Never another user's, never one open to others (lock/ownership.hpp): a squatter could
  // forge a holder or leave the internal mutex "held" by a thread of theirs.
  int fd = -1;
  VS_TRY(open_owned(name, O_RDWR | O_CREAT, "lock: the lock segment", "or use another VRAMSWAP_SHM_PREFIX", &fd));
  int rc = ok;
  void* base = nullptr;
  size_t size = 0;
  bool removed = false;  // by its last user, after our open: open again
  {
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno != EINTR) {
        rc = fail_errno(errno, "lock: flock %s", name.c_str());
        break;
      }
    }
    if (rc != 0) {
      ::close(fd);
      return rc;
    }
    init_flock held(fd);
    rc = map_as_user(fd, name, &base, &size, &removed);
  }
  if (rc != 0 || removed) {
    ::close(fd);
    if (base != nullptr) ::munmap(base, size);
    if (removed) return open(device_key, out);
    return rc;
  }
  std::unique_ptr<shared_segment> segment;
  try {
    segment.reset(new shared_segment());
    segment->name_ = std::move(name);
  } catch (const std::bad_alloc&) {
    ::close(fd);
    ::munmap(base, size);
    return fail(err_out_of_memory, "lock: out of host memory opening %s", name.c_str());
  }
  // The leases on a description of their own, never mapped (lock/liveness_lease.hpp, Forks).
  int lease_fd = -1;
  int lrc = open_lease_description(fd, segment->name_.c_str(), &lease_fd);
  if (lrc == ok) lrc = register_lease_fd(lease_fd);
  uint32_t token = 0;
  if (lrc == ok) lrc = take_mutex_token(&lock_state_of(base)->mutex, lease_fd, segment->name_.c_str(), &token);
  if (lrc != ok) {
    if (lease_fd >= 0) unregister_lease_fd(lease_fd);
    if (lease_fd >= 0) ::close(lease_fd);
    ::close(fd);
    ::munmap(base, size);
    return lrc;
  }
  segment->base_ = base;
  segment->size_ = size;
  segment->fd_ = fd;
  segment->lease_fd_ = lease_fd;
  segment->mutex_token_ = token;
  segment->forks_at_open_ = forks;
  segment->opened_in_generation_ = fork_generation();
  *out = std::move(segment);
  return ok;
}

// A forked child's generation differs from its parent's (lock/process_identity.hpp): no
// system call on the acquire path.
bool shared_segment::opened_in_this_process() const noexcept { return fork_generation() == opened_in_generation_; }

int shared_segment::path_for(const std::string& device_key, bool create_dir, std::string* out) noexcept {
  try {
    std::string name;
    VS_TRY(name_for(device_key, &name));
    std::string dir;
    VS_TRY(runtime_dir(create_dir, &dir));
    *out = dir + name;
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "lock: out of memory building a segment path");
  }
}

int shared_segment::remove(const std::string& device_key) noexcept {
  std::string path;
  VS_TRY(path_for(device_key, /*create_dir=*/false, &path));
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return fail_errno(errno, "lock: removing the lock segment %s", path.c_str());
  return ok;
}

// The last user removes the name (see "Users and removal" above). Never waits: anyone in
// the init flock is opening it, anyone with a read lock uses it; either keeps it.
void shared_segment::remove_if_unused() noexcept {
  if (g_forks.load(std::memory_order_relaxed) != forks_at_open_) return;
  const lock_state* state = lock_state_of(base_);
  if (state->holder_slot.load(std::memory_order_acquire) != k_no_slot || state->waiter_count.load(std::memory_order_acquire) != 0) {
    return;  // a holder or waiter (perhaps dead) is still recorded: the next user repairs it first
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) return;
  struct stat mine {};
  struct stat named {};
  // Only the object we have open: a name removed by hand (remove()) may have a new object now.
  if (ofd_lock(fd_, F_WRLCK) == 0 && ::fstat(fd_, &mine) == 0 && mine.st_nlink > 0 &&
      ::stat(name_.c_str(), &named) == 0 && named.st_ino == mine.st_ino && named.st_dev == mine.st_dev) {
    if (::unlink(name_.c_str()) == 0) log(log_level::debug, "lock: removed %s: its last user closed it", name_.c_str());
  }
  ::flock(fd_, LOCK_UN);
}

shared_segment::~shared_segment() {
  if (lease_fd_ >= 0) {
    // Leases are dropped by their slots' owners before; closing drops any left over.
    unregister_lease_fd(lease_fd_);
    ::close(lease_fd_);
  }
  if (fd_ >= 0) {
    if (base_ != nullptr) {
      try {
        remove_if_unused();
      } catch (...) {  // a path string that could not be built: keep the segment
      }
    }
    ::close(fd_);  // drops our read lock
  }
  if (base_ != nullptr) ::munmap(base_, size_);
}

}  // namespace vramswap::detail
