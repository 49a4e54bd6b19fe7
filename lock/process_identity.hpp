// Who is this thread, and is a given process still alive?
//
// A process is identified by (pid, start time): the start time from /proc/<pid>/stat
// (field 22, clock ticks since boot) differs between a dead process and a later one that
// reuses its PID, so a reused PID never passes for the old owner. A zombie (killed but not
// yet reaped by its parent) counts as dead: it can never release anything.
//
// Limits: every participant must see the others in its /proc, i.e. share one PID namespace
// (the same rule as LMDB's pid-based liveness). A PID reused within the same clock tick
// (10 ms) as the old process's start would fool the check; wrapping the whole PID space
// that fast does not happen in practice.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace vramswap::detail {

struct process_identity {
  pid_t pid;
  uint64_t start_time;
};

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
