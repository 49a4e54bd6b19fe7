// What a client that starts a device's pool server records in the start lock file, for the
// clients that wait on that lock (pool/server_start.cpp): who starts what, with which pid,
// and how it went. Those clients read it while the starter rewrites it, so a record must
// never be seen empty or half written: it is written over the old one and then cut to its
// length (the file is never empty once written), and it carries a checksum, so that a read
// that raced with a write is recognized and read again.
//
// Format, one line: "<client pid> <server pid> <state> <status> <server path> #<fnv-1a hex>",
// the server pid 0 until it is known, the state "starting", "ready", "failed" (then
// <status> is the start's error) or "left" (the client stopped waiting, Ctrl-C or its timeout,
// and left the server starting: the next client to take the lock within the start bound waits
// for that server, and records "ready" once it serves).
// Never throws.
#pragma once

#include <sys/types.h>

#include <string>

namespace vramswap::detail {

struct start_record {
  int client = 0;       // the pid of the client that holds (or held) the start lock
  int server_pid = 0;   // the server it started; 0 until known
  std::string state;    // "starting", "ready", "failed" or "left"
  int status = 0;       // 0, or the start's error (a negative vramswap::detail::status)
  std::string server;   // the server binary's path
};

// Replaces the record in `lock_fd` (this process as the client). false (errno set) when the
// file could not be written: the record is advice for error messages, so callers go on.
bool write_start_record(int lock_fd, pid_t server_pid, const char* state, int status, const std::string& server) noexcept;

// Reads the record in `lock_fd`, reading again (for at most `retry_ms`) while what it finds
// is a write in progress. false when there is no whole record: nobody wrote one yet, or a
// writer that is not vramswap's.
bool read_start_record(int lock_fd, start_record* record, int retry_ms = 100) noexcept;

}  // namespace vramswap::detail
