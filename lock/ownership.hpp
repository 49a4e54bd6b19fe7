// Whose objects vramswap uses: the owner rule for every segment, socket, lock file and
// directory that it finds in a place other users share (/dev/shm, /tmp).
//
// An object is used only when it is ours: owned by this process's effective uid, or, in
// group mode (VRAMSWAP_GROUP), by that group; and with no permission bits beyond 0600 (0660
// in group mode, the group bits only for VRAMSWAP_GROUP; directories 0700 / 2770). Anything
// else is refused with err_not_owner, by name and owner, and left alone: an object another
// user made first may be a trap (a forged lock holder, a mutex "held" by a thread of theirs,
// a frame table shared with their processes). The check runs on the open descriptor
// (fstat), never on a path looked at before opening it, and opens never follow a symlink.
//
// Names carry the owner too (owner_tag: "u<uid>", or "g<gid>" in group mode), so that two
// users never even meet at one name; the check is what makes a squatter harmless.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <string>

namespace vramswap::detail {

// Who may share this process's objects: VRAMSWAP_GROUP read once per call.
struct sharing {
  bool group = false;  // VRAMSWAP_GROUP is set
  gid_t gid = 0;       // its gid when set
};
// err_invalid_argument for a VRAMSWAP_GROUP that is neither a group name nor a number.
int current_sharing(sharing* out) noexcept;

// "u<euid>", or "g<gid>" in group mode: the owner part of vramswap's names.
std::string owner_tag(const sharing& s);

// "uid 65534 (nobody)" / "gid 27 (sudo)": an owner as a user reads it.
std::string describe_uid(uid_t uid);
std::string describe_gid(gid_t gid);
// The name of group `gid` ("" when it has none): what VRAMSWAP_GROUP takes, with the number.
std::string group_name(gid_t gid);

// Is `gid` the primary or a supplementary group of the peer of Unix socket `fd`, as the
// kernel recorded them when it connected (SO_PEERCRED, SO_PEERGROUPS)? Needs no /proc, so it
// answers for a peer of any PID namespace.
bool socket_peer_in_group(int fd, gid_t gid);

// Is `st` (fstat of an object open at `path`) ours under the rule above, and of `kind`
// (S_IFREG or S_IFDIR; directories are allowed the x bits)? `what` names the object for the
// message ("the lock segment"), `remedy` says what else the user may do ("use another
// VRAMSWAP_SHM_PREFIX"). Returns 0 or err_not_owner, with a message that names the path, its
// owner, group and mode.
int check_owned(const struct stat& st, mode_t kind, const std::string& path, const char* what, const sharing& s,
                const char* remedy) noexcept;

// Open the regular file at `path` (flags: O_RDWR or O_RDONLY, plus O_CREAT to create it
// when absent) without following a symlink, close-on-exec. A file this call created gets
// the mode (0600, or 0660 and VRAMSWAP_GROUP's group) set explicitly, past the umask; one
// that existed must pass check_owned. *created (may be null) says which. Returns 0,
// err_not_owner, err_invalid_argument (VRAMSWAP_GROUP), err_system (ENOENT without O_CREAT
// among them: the detail names the path).
int open_owned(const std::string& path, int flags, const char* what, const char* remedy, int* fd_out,
               bool* created = nullptr) noexcept;

}  // namespace vramswap::detail
