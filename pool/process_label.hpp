// process_label: how `vramswap status` names a process to a person: its user, a command line
// short enough for a table column, and the container, pod or batch job it runs in.
//
// Every PyTorch job's /proc/<pid>/comm is "python", so the command line is the name: argv
// from /proc/<pid>/cmdline with the program's directory dropped ("/opt/venv/bin/python3" is
// "python3") and, after an interpreter, the script's directory too ("python train.py --lr
// 3e-4"). A job that sets VRAMSWAP_JOB_NAME is shown by that name instead (the member
// records it in its slot: pool/pool_layout.hpp). Where a process runs is read from the path
// of its cgroup, which container runtimes, the kubelet and slurmd name after what they run:
//
//   .../docker-<id>.scope, /docker/<id>               docker <id:12>
//   .../libpod-<id>.scope                             podman <id:12>
//   kubepods.../pod<uid>... (any runtime inside)      pod <uid:8>
//   .../cri-containerd-<id>.scope, .../crio-<id>.scope  containerd <id:12>, cri-o <id:12>
//   .../slurm.../job_<n>/...                          slurm <n>
//   /lxc.payload.<name>/..., /lxc/<name>/...          lxc <name>
//
// Everything here reads /proc of this PID namespace; callers check visible_here() first.
// Nothing throws; unreadable means empty.
#pragma once

#include <sys/types.h>

#include <string>

namespace vramswap::detail {

// The command line of process `pid` (/proc/<pid>/cmdline), shortened; "" when unreadable or
// empty (a kernel thread, a zombie).
std::string command_line_of(pid_t pid) noexcept;

// argv as /proc/<pid>/cmdline holds it (arguments separated by NUL bytes), shortened: the
// program's base name, the script's base name after an interpreter (python, bash, ...),
// the rest as it is, joined by spaces; an argument with a space in it is quoted. A command
// line rewritten into one string (setproctitle) is kept as it is.
std::string shorten_command_line(const std::string& raw) noexcept;

// The container, pod or batch job process `pid` runs in (table above), from /proc/<pid>/cgroup;
// "" when none is recognized or the file is unreadable.
std::string container_of(pid_t pid) noexcept;
// The same from the text of a /proc/<pid>/cgroup file (one "id:controllers:path" per line).
std::string container_from_cgroup(const std::string& text) noexcept;

// The effective uid of process `pid` (/proc/<pid>/status); false when unreadable.
bool effective_uid_of(pid_t pid, uid_t* out) noexcept;

// The name of user `uid` ("alice"), or the number when it has no passwd entry here.
std::string user_name(uid_t uid) noexcept;

// `text` cut to at most `max` bytes without splitting a UTF-8 character.
std::string cut_utf8(const std::string& text, size_t max) noexcept;

}  // namespace vramswap::detail
