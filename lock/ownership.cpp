#include "lock/ownership.hpp"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

#include "core/status.hpp"
#include "lock/shared_segment.hpp"

namespace vramswap::detail {

int current_sharing(sharing* out) noexcept {
  sharing s;
  VS_TRY(configured_group(&s.gid, &s.group));
  *out = s;
  return ok;
}

std::string owner_tag(const sharing& s) {
  return s.group ? "g" + std::to_string(s.gid) : "u" + std::to_string(::geteuid());
}

std::string describe_uid(uid_t uid) {
  std::string text = "uid " + std::to_string(uid);
  char buf[4096];
  passwd entry{};
  passwd* found = nullptr;
  if (::getpwuid_r(uid, &entry, buf, sizeof buf, &found) == 0 && found != nullptr) text += std::string(" (") + found->pw_name + ")";
  return text;
}

std::string group_name(gid_t gid) {
  char buf[4096];
  group entry{};
  group* found = nullptr;
  return ::getgrgid_r(gid, &entry, buf, sizeof buf, &found) == 0 && found != nullptr ? found->gr_name : "";
}

std::string describe_gid(gid_t gid) {
  const std::string name = group_name(gid);
  return "gid " + std::to_string(gid) + (name.empty() ? "" : " (" + name + ")");
}

bool socket_peer_in_group(int fd, gid_t gid) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.gid == gid) return true;
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 4; ++attempt) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      return std::find(groups.begin(), groups.end(), gid) != groups.end();
    }
    if (errno != ERANGE) return false;
    groups.resize(bytes / sizeof(gid_t) + 1);
  }
  return false;
}

namespace {
// Is `gid` this process's group (effective or supplementary)?
bool a_group_of_mine(gid_t gid) {
  if (gid == ::getegid()) return true;
  std::vector<gid_t> groups(static_cast<size_t>(std::max(0, ::getgroups(0, nullptr))));
  const int n = ::getgroups(static_cast<int>(groups.size()), groups.data());
  return n > 0 && std::find(groups.begin(), groups.begin() + n, gid) != groups.begin() + n;
}
}  // namespace

int check_owned(const struct stat& st, mode_t kind, const std::string& path, const char* what, const sharing& s,
                const char* remedy) noexcept {
  try {
    // Shared with a group of ours (a node's pool: 2770 / 0660, that group), and this process
    // runs without VRAMSWAP_GROUP: it is not another user's to remove, it is ours to join.
    if (!s.group && (st.st_mode & 0070) != 0 && st.st_gid != 0 && a_group_of_mine(st.st_gid)) {
      const std::string name = group_name(st.st_gid);
      return fail(err_not_owner,
                  "%s %s is shared with group %s (%s, mode %04o), of which this process is a member, and this process runs "
                  "without VRAMSWAP_GROUP: set VRAMSWAP_GROUP=%s to share it",
                  what, path.c_str(), describe_gid(st.st_gid).c_str(), describe_uid(st.st_uid).c_str(),
                  static_cast<unsigned>(st.st_mode & 07777), (name.empty() ? std::to_string(st.st_gid) : name).c_str());
    }
    const bool dir = kind == S_IFDIR;
    const mode_t mode = st.st_mode & 07777;
    // A group's directory may be set-group-ID: files made in it then get the group.
    const mode_t allowed = (s.group ? 0660 : 0600) | (dir ? (s.group ? 02110 : 0100) : 0);
    const char* rm = dir ? "rm -r" : "rm";
    const bool mine = st.st_uid == ::geteuid();
    const bool groups = s.group && st.st_gid == s.gid;
    char mode_text[8];
    std::snprintf(mode_text, sizeof mode_text, "%04o", static_cast<unsigned>(mode));
    const std::string owner = describe_uid(st.st_uid) + ", group " + describe_gid(st.st_gid) + ", mode " + mode_text;
    const std::string you = s.group ? "you (" + describe_uid(::geteuid()) + ") or group " + describe_gid(s.gid) + " (VRAMSWAP_GROUP)"
                                    : "you (" + describe_uid(::geteuid()) + ")";
    if (!mine && !groups) {
      return fail(err_not_owner,
                  "%s %s belongs to %s, not to %s: another user made it, and using it would let them block or spy on "
                  "this process; it is left alone. Have its owner or root remove it (%s %s)%s%s",
                  what, path.c_str(), owner.c_str(), you.c_str(), rm, path.c_str(), *remedy != '\0' ? ", " : "", remedy);
    }
    if ((st.st_mode & S_IFMT) != kind) {
      return fail(err_not_owner, "%s %s is not a %s (%s); remove it (rm %s)%s%s", what, path.c_str(),
                  dir ? "directory" : "regular file", owner.c_str(), path.c_str(), *remedy != '\0' ? ", " : "", remedy);
    }
    // Group bits are only for VRAMSWAP_GROUP: a file of ours whose group is another one is
    // open to that group's users.
    if ((mode & ~allowed) != 0 || ((mode & 0070) != 0 && !groups)) {
      char want[8];
      std::snprintf(want, sizeof want, "%04o", static_cast<unsigned>(allowed));
      return fail(err_not_owner,
                  "%s %s is open to other users (%s; at most %s%s): %s; it is left "
                  "alone. Remove it (%s %s) and start again%s%s",
                  what, path.c_str(), owner.c_str(), want, s.group ? (", group bits for " + describe_gid(s.gid)).c_str() : "",
                  (mode & 0022) != 0 || ((mode & 0020) != 0 && !groups) ? "anyone could have written into it"
                  : dir                                                   ? "others could read or enter it (tighten it: chmod)"
                                                                          : "others could read it (tighten it: chmod)",
                  rm, path.c_str(),
                  *remedy != '\0' ? ", " : "", remedy);
    }
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "ownership: out of host memory");
  }
}

namespace {

// Creates `path` with its group and mode already set, or finds that it exists (*fd_out -1).
// The file is made under a temporary name beside it, given its group and mode there, and
// only then linked to `path` (link(2) never replaces): a user of the group who opens `path`
// at the same moment never meets it owned by its creator with mode 0600, which it could not
// open.
int create_complete(const std::string& path, int flags, const sharing& s, const char* what, int* fd_out) noexcept {
  *fd_out = -1;
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  const std::string leaf = slash == std::string::npos ? path : path.substr(slash + 1);
  static std::atomic<uint32_t> serial{0};
  for (int attempt = 0;; ++attempt) {
    char suffix[64];
    std::snprintf(suffix, sizeof suffix, ".%d.%u.new", static_cast<int>(::getpid()), serial.fetch_add(1, std::memory_order_relaxed));
    const std::string temp = dir + "/." + leaf + suffix;
    const int fd = ::open(temp.c_str(), flags | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
      if (errno == EEXIST && attempt < 100) continue;  // a name another process left: the next one
      return fail_errno(errno, "%s %s: cannot create it (as %s)", what, path.c_str(), temp.c_str());
    }
    // Ours from birth: group and mode past the umask, before the name exists.
    int e = 0;
    const char* step = nullptr;
    if (s.group && ::fchown(fd, static_cast<uid_t>(-1), s.gid) != 0) {
      e = errno;
      step = "give it to the group";
    } else if (::fchmod(fd, s.group ? 0660 : 0600) != 0) {
      e = errno;
      step = "fchmod";
    } else if (::link(temp.c_str(), path.c_str()) != 0) {
      e = errno;
      step = "link";
    }
    ::unlink(temp.c_str());
    if (step == nullptr) {
      *fd_out = fd;
      return ok;
    }
    ::close(fd);
    if (e == EEXIST) return ok;  // someone else's came first: open that one
    if (std::strcmp(step, "give it to the group") == 0) {
      return fail_errno(e, "%s %s: cannot give it to group %s (VRAMSWAP_GROUP); are you a member of it?", what, path.c_str(),
                        describe_gid(s.gid).c_str());
    }
    return fail_errno(e, "%s %s: %s", what, path.c_str(), step);
  }
}

}  // namespace

int open_owned(const std::string& path, int flags, const char* what, const char* remedy, int* fd_out, bool* created) noexcept {
  sharing s;
  VS_TRY(current_sharing(&s));
  const bool create = (flags & O_CREAT) != 0;
  const int base = (flags & ~(O_CREAT | O_EXCL)) | O_NOFOLLOW | O_CLOEXEC;
  for (int attempt = 0;; ++attempt) {
    if (create) {
      int fd = -1;
      VS_TRY(create_complete(path, base, s, what, &fd));
      if (fd >= 0) {
        if (created != nullptr) *created = true;
        *fd_out = fd;
        return ok;
      }
    }
    const int fd = ::open(path.c_str(), base);
    if (fd < 0) {
      const int e = errno;
      if (e == ENOENT && create && attempt < 100) continue;  // removed between the two opens
      struct stat st {};
      if ((e == EACCES || e == ELOOP || e == EPERM) && ::lstat(path.c_str(), &st) == 0) {
        // Only for the message: the decision was the kernel's.
        const int rc = check_owned(st, S_IFREG, path, what, s, remedy);
        if (rc != ok) return rc;
      }
      return fail_errno(e, "%s %s: cannot open it", what, path.c_str());
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      return fail_errno(e, "%s %s: fstat", what, path.c_str());
    }
    const int rc = check_owned(st, S_IFREG, path, what, s, remedy);
    if (rc != ok) {
      ::close(fd);
      return rc;
    }
    if (created != nullptr) *created = false;
    *fd_out = fd;
    return ok;
  }
}

}  // namespace vramswap::detail
