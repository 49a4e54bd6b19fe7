// single_runtime: at most one copy of the runtime opens sessions in a process.
//
// libvramswap.so, the Python module (vramswap._vramswap) and the preload shim
// (libvramswap_preload.so) each link every layer's objects, so each carries a runtime of its
// own (process-wide state, one session per device). Two copies in one process would be two
// pool members that take turns with each other, each swapping out the other's memory for its
// own lock. So the first copy to open a session claims the process, and every other copy's
// claim fails: the session is not opened.
//
// The claim is an abstract Unix socket bound to a name made of the process's pid namespace,
// pid and start time (abstract names are per network namespace, which containers may share
// while their pids repeat): the kernel makes the name unique, it needs no symbol shared
// between the copies (libvramswap.so exports only the public API), no file to clean up, and
// it goes with the process (exit, crash, exec: the socket is close-on-exec; a forked child
// closes its copy, pthread_atfork). A second socket, bound beside it, carries an address
// inside the claiming copy in its name (/proc/net/unix lists it); the refused copy, in the
// same address space, turns it into that copy's file, so the refusal names both copies
// however long their paths (a socket name holds 107 bytes).
// Where the claim cannot be made at all (no socket: seccomp, the descriptor limit), it is
// skipped with a warning: the guard never stops a process that uses one copy.
#pragma once

namespace vramswap::detail {

// Claims this process for this copy of the runtime; again from the same copy, ok at once.
// err_unavailable when another copy of the runtime in this process claimed it (the message
// names both copies and what to do). `fn` and `device` start the message. Thread-safe.
int claim_process_for_this_runtime(const char* fn, int device) noexcept;

}  // namespace vramswap::detail
