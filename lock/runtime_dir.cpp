#include "lock/runtime_dir.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <new>
#include <string>

#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/ownership.hpp"
#include "lock/process_identity.hpp"

namespace vramswap::detail {
namespace {

// Group and mode explicitly: mkdir's mode went through the umask.
int fix_group_and_mode(const std::string& dir, mode_t mode, const sharing& who) {
  if (who.group && ::chown(dir.c_str(), static_cast<uid_t>(-1), who.gid) != 0) {
    return fail_errno(errno, "vramswap: cannot give the runtime dir %s to group %s (VRAMSWAP_GROUP); are you a member of it?",
                      dir.c_str(), describe_gid(who.gid).c_str());
  }
  if (::chmod(dir.c_str(), mode) != 0) return fail_errno(errno, "vramswap: chmod the runtime dir %s", dir.c_str());
  return ok;
}

// Make `dir` with `mode` and (in group mode) the group, whole before anyone sees it: it is
// built under a temporary name beside it and renamed into place without replacing anything.
// Made in place, between the mkdir and the chown and chmod it stood with the umask's mode
// and the creator's primary group, and a member opening it then was refused (and for good
// when the creator died there). One that exists already (another process won) is fine.
int create_runtime_dir(const std::string& dir, mode_t mode, const sharing& who) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) == 0) return ok;  // checked by the caller, on the opened directory
  const std::string temp = dir + ".new-" + std::to_string(::getpid()) + "-" + std::to_string(monotonic_ns());
  if (::mkdir(temp.c_str(), mode & 0777) != 0) {
    if (errno == EEXIST) return ok;
    // A parent where we may not make names beside it: make it in place.
    if (::mkdir(dir.c_str(), mode & 0777) == 0) return fix_group_and_mode(dir, mode, who);
    if (errno == EEXIST) return ok;
    return fail_errno(errno, "vramswap: cannot create the runtime dir %s (VRAMSWAP_RUNTIME_DIR)", dir.c_str());
  }
  int rc = fix_group_and_mode(temp, mode, who);
  if (rc == ok && ::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, dir.c_str(), RENAME_NOREPLACE) != 0) {
    if (errno == EEXIST) {
      ::rmdir(temp.c_str());  // another process's is in place
      return ok;
    }
    if (errno == EINVAL || errno == ENOSYS) {
      // A file system without RENAME_NOREPLACE: a plain rename, which fails over a
      // directory that is not empty and replaces an empty one (nobody's files are in it yet).
      if (::rename(temp.c_str(), dir.c_str()) == 0) return ok;
      if (errno == ENOTEMPTY || errno == EEXIST) {
        ::rmdir(temp.c_str());
        return ok;
      }
    }
    rc = fail_errno(errno, "vramswap: cannot put the runtime dir %s in place (VRAMSWAP_RUNTIME_DIR)", dir.c_str());
  }
  if (rc != ok) ::rmdir(temp.c_str());
  return rc;
}

}  // namespace

int runtime_dir(bool create, std::string* out) noexcept {
  try {
    sharing who;
    VS_TRY(current_sharing(&who));
    std::string dir = option_text(option_id::runtime_dir);
    if (dir.empty()) dir = who.group ? "/dev/shm/vramswap-g" + std::to_string(who.gid) : "/dev/shm/vramswap-" + std::to_string(::geteuid());
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    if (!create) {
      *out = std::move(dir);
      return ok;
    }
    const mode_t mode = who.group ? 02770 : 0700;
    VS_TRY(create_runtime_dir(dir, mode, who));
    // Checked on the opened directory, never by a path looked at first (a symlink is refused).
    const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st {};
    if (dir_fd < 0) {
      const int e = errno;
      if ((e == ENOTDIR || e == ELOOP) && ::lstat(dir.c_str(), &st) == 0) {
        return fail(err_not_owner,
                    "vramswap: the runtime dir %s is not a directory (a symlink or file is refused); remove it or set "
                    "VRAMSWAP_RUNTIME_DIR to a directory of your own",
                    dir.c_str());
      }
      if (e == EACCES && ::stat(dir.c_str(), &st) == 0) {
        const std::string name = group_name(st.st_gid);  // as VRAMSWAP_GROUP takes it: the name, else the number
        return fail(err_not_owner,
                    "vramswap: the runtime dir %s belongs to %s, group %s, mode %04o, and %s may not enter it: only its "
                    "owner and that group's members share this pool. Run as a member of %s (and set "
                    "VRAMSWAP_GROUP=%s), or use a runtime dir of your own",
                    dir.c_str(), describe_uid(st.st_uid).c_str(), describe_gid(st.st_gid).c_str(),
                    static_cast<unsigned>(st.st_mode & 07777), describe_uid(::geteuid()).c_str(),
                    describe_gid(st.st_gid).c_str(),
                    (name.empty() ? std::to_string(st.st_gid) : name).c_str());
      }
      return fail_errno(e, "vramswap: cannot open the runtime dir %s", dir.c_str());
    }
    const int src = ::fstat(dir_fd, &st);
    const int e = errno;
    ::close(dir_fd);
    if (src != 0) return fail_errno(e, "vramswap: fstat the runtime dir %s", dir.c_str());
    VS_TRY(check_owned(st, S_IFDIR, dir, "vramswap: the runtime dir", who, "or set VRAMSWAP_RUNTIME_DIR to a directory of your own"));
    *out = std::move(dir);
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "vramswap: out of host memory");
  }
}

}  // namespace vramswap::detail
