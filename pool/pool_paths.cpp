#include "pool/pool_paths.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <new>
#include <string>
#include <utility>

#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/ownership.hpp"
#include "lock/shared_segment.hpp"

namespace vramswap::detail {

int pool_paths::make(const std::string& device_key, bool create_dir, pool_paths* out) noexcept {
  try {
    std::string unused;
    VS_TRY(shared_segment::name_for(device_key, &unused));  // the key's character rules
    gid_t gid = 0;
    bool group = false;
    VS_TRY(configured_group(&gid, &group));
    pool_paths p;
    p.dir = option_text(option_id::runtime_dir);
    if (p.dir.empty()) {
      p.dir = group ? "/tmp/vramswap-g" + std::to_string(gid) : "/tmp/vramswap-" + std::to_string(::getuid());
    }
    while (p.dir.size() > 1 && p.dir.back() == '/') p.dir.pop_back();
    // The prefix names the files as it names the segments: pools under two prefixes are two
    // pools, each with its own server, even in one runtime dir.
    const std::string base = p.dir + "/" + option_text(option_id::shm_prefix) + device_key;
    p.socket = base + ".sock";
    p.server_lock = base + ".server.lock";
    p.start_lock = base + ".start.lock";
    p.log = base + ".log";
    if (create_dir) {
      const mode_t mode = group ? 0770 : 0700;
      if (::mkdir(p.dir.c_str(), mode) == 0) {
        // Set group and mode explicitly: mkdir's mode went through the umask.
        if (group && ::chown(p.dir.c_str(), static_cast<uid_t>(-1), gid) != 0) {
          return fail_errno(errno, "pool: cannot give the runtime dir %s to group %u (VRAMSWAP_GROUP)", p.dir.c_str(),
                            static_cast<unsigned>(gid));
        }
        if (::chmod(p.dir.c_str(), mode) != 0) return fail_errno(errno, "pool: chmod %s", p.dir.c_str());
      } else if (errno != EEXIST) {
        return fail_errno(errno, "pool: cannot create the runtime dir %s (VRAMSWAP_RUNTIME_DIR)", p.dir.c_str());
      }
      // Checked on the opened directory, never by a path looked at first (a symlink is refused).
      const int dir_fd = ::open(p.dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (dir_fd < 0) {
        const int e = errno;
        struct stat st {};
        if ((e == ENOTDIR || e == ELOOP) && ::lstat(p.dir.c_str(), &st) == 0) {
          return fail(err_not_owner, "pool: the runtime dir %s is not a directory (a symlink or file is refused); remove it or set "
                      "VRAMSWAP_RUNTIME_DIR to a directory of your own", p.dir.c_str());
        }
        return fail_errno(e, "pool: cannot open the runtime dir %s", p.dir.c_str());
      }
      struct stat st {};
      const int src = ::fstat(dir_fd, &st);
      const int e = errno;
      ::close(dir_fd);
      if (src != 0) return fail_errno(e, "pool: fstat the runtime dir %s", p.dir.c_str());
      sharing who;
      who.group = group;
      who.gid = gid;
      VS_TRY(check_owned(st, S_IFDIR, p.dir, "pool: the runtime dir", who, "or set VRAMSWAP_RUNTIME_DIR to a directory of your own"));
    }
    *out = std::move(p);
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "pool: out of host memory");
  }
}

}  // namespace vramswap::detail
