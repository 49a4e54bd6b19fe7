// Who is this thread, and is a given process still alive?
//
// A process is identified by (pid, start time): the start time from /proc/<pid>/stat
// (field 22, clock ticks since boot) differs between a dead process and a later one that
// reuses its PID, so a reused PID never passes for the old owner. A zombie (killed but not
// yet reaped by its parent) counts as dead: it can never release anything.
//
// A pid means something only in its PID namespace: the identity carries that namespace too
// (the inode of /proc/self/ns/pid), and pids of another namespace (another container) are
// never looked up in this one's /proc. Whether the owner of a shared slot is alive is asked
// of its liveness lease instead (lock/liveness_lease.hpp), which works across namespaces;
// the pid stays for messages, and for the pool server's check of a client it can see.
// A PID reused within the same clock tick (10 ms) as the old process's start would fool the
// start-time check; wrapping the whole PID space that fast does not happen in practice.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace vramswap::detail {

struct process_identity {
  pid_t pid;
  uint64_t start_time;
  uint64_t pid_ns = 0;  // inode of its /proc/<pid>/ns/pid (0: unknown)
};

// The inode of this process's PID namespace (/proc/self/ns/pid), cached; 0 when unreadable.
uint64_t current_pid_namespace() noexcept;

// The inode of the PID namespace of process `pid` (a pid of this namespace), from
// /proc/<pid>/ns/pid; 0 when it cannot be read.
uint64_t pid_namespace_of(pid_t pid) noexcept;

// A pidfd of process `pid` of this PID namespace (pidfd_open, Linux 5.3; close-on-exec), or
// -1 with errno set where the kernel or a seccomp policy has none, or the process is gone.
int open_pidfd(pid_t pid) noexcept;

// The process a pidfd refers to, as its /proc/self/fdinfo says: its pid in this process's
// PID namespace, 0 when it is not in it, -1 when it has exited; -2 when `fd` is no pidfd.
pid_t pidfd_process(int fd) noexcept;

// Is a pid recorded with namespace `pid_ns` one this process can look up in its /proc?
inline bool visible_here(uint64_t pid_ns) noexcept { return pid_ns != 0 && pid_ns == current_pid_namespace(); }

// describe_process for a pid of namespace `pid_ns`: as describe_process when it is this
// process's namespace, else "pid 1234 in another PID namespace (pid:[4026532123])".
void describe_process_in(pid_t pid, uint64_t pid_ns, char* buf, size_t size) noexcept;

// This process's identity, cached; refreshed in a forked child (pthread_atfork).
// Returns 0, or err_unavailable when /proc/self/stat cannot be read.
int current_process(process_identity* out) noexcept;

// This thread's kernel thread id, cached per thread; correct in a forked child.
pid_t current_tid() noexcept;

// Incremented in every forked child; lets per-thread caches notice a fork.
uint64_t fork_generation() noexcept;

enum class liveness { alive, dead };

// Is the process `who` still running (not exited, not a zombie, not replaced by a PID
// reuse)? Reads /proc/<pid>/stat; a few microseconds. Never fails: anything unreadable
// means the process is gone.
liveness check_liveness(const process_identity& who) noexcept;

// The scheduler state of a thread or process (field 3 of /proc/<id>/stat: 'R', 'S', 'T', ...),
// or 0 when it is gone or unreadable.
char process_state(pid_t id) noexcept;

// Stopped by a signal (SIGSTOP, SIGTSTP: Ctrl-Z) or by a debugger (state T or t): it runs no
// instruction until someone sends SIGCONT or the debugger lets it go.
inline bool is_stopped_state(char state) noexcept { return state == 'T' || state == 't'; }

// The process a thread id belongs to (Tgid in /proc/<tid>/status); 0 when it is gone.
pid_t process_of_thread(pid_t tid) noexcept;

// For error messages: "pid 1234 (python3)", then ", stopped (SIGSTOP, Ctrl-Z or a debugger)"
// when it is stopped, or " (gone)" when it no longer exists. Always NUL-terminates `buf`.
void describe_process(pid_t pid, char* buf, size_t size) noexcept;

// CLOCK_MONOTONIC in nanoseconds.
uint64_t monotonic_ns() noexcept;

}  // namespace vramswap::detail
