// runtime_dir: the one directory that holds everything the processes of a device share.
//
// The lock segment, the pool segment, the pool server's socket, its lock files and its log
// all live in it, so that a single shared directory (a hostPath volume, a bind mount) is all
// that containers need to share a device: no shared /dev/shm, IPC or PID namespace. Two
// runtime dirs are two separate pools, each with its own lock (docs/security.md: one pool is
// one trust domain).
//
// VRAMSWAP_RUNTIME_DIR, else /dev/shm/vramswap-<uid> (or /dev/shm/vramswap-g<gid> with
// VRAMSWAP_GROUP, so that the group's users meet in one place). /dev/shm, not /tmp: it is a
// tmpfs wherever Linux runs, processes that share it are those that shared the lock
// segments when they were shared-memory objects, and neither a private /tmp (systemd's
// PrivateTmp, pam_namespace) nor a /tmp cleaner splits one device's processes into two
// pools with two locks. Containers set VRAMSWAP_RUNTIME_DIR to their shared volume. Mode 0700; with
// VRAMSWAP_GROUP, 2770 and owned by that group (set-group-ID, so that files made in it get
// the group even where a member's umask or primary group would not).
#pragma once

#include <string>

namespace vramswap::detail {

// The runtime dir's path (trailing slashes removed). With `create`, creates it when missing
// (mode as above) and checks an existing one: a directory, not a symlink, owned by this user
// (or, with VRAMSWAP_GROUP, by that group, mode 0770 or 2770); anything else is
// err_not_owner, naming the directory and its owner; a directory this process may not enter
// (a user outside the group) is err_not_owner too, saying who may. Returns 0,
// err_invalid_argument (VRAMSWAP_GROUP), err_not_owner, err_system.
int runtime_dir(bool create, std::string* out) noexcept;

}  // namespace vramswap::detail
