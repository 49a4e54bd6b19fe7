// The pool server's socket protocol (version 1), shared by vramswapd and its clients.
//
// Socket: <runtime dir>/<device key>.sock, a SOCK_SEQPACKET Unix socket (message
// boundaries kept, so each struct below is one message). Runtime dir: VRAMSWAP_RUNTIME_DIR,
// default /tmp/vramswap-<uid>, mode 0700 (0770 with VRAMSWAP_GROUP). The server checks the
// peer's uid with SO_PEERCRED: the server's own uid, root, or (with VRAMSWAP_GROUP) a member
// of that group.
//
// Exchange:
//   client -> hello
//   server -> welcome (status 0, or a negative vramswap::status with a message)
//   server -> frame_batch messages carrying the frames' descriptors (SCM_RIGHTS), in order,
//             until frame_count have been sent. The client imports each and closes it.
//   then the connection stays open, silent, for the client's lifetime: its hang-up is how
//   the server learns that the client died (and repairs: frees and scrubs its frames,
//   releases the lock it held); the server's hang-up tells the client the pool is gone.
#pragma once

#include <cstdint>
#include <string>

namespace vramswap::pool_protocol {

constexpr uint32_t k_magic = 0x50575356;  // "VSWP"
constexpr uint32_t k_version = 1;

struct hello {
  uint32_t magic;
  uint32_t version;
  int32_t pid;
  uint32_t reserved;
  uint64_t start_time;  // /proc start time of the client (PID reuse)
};

struct welcome {
  uint32_t magic;
  uint32_t version;
  int32_t status;        // 0, or a negative vramswap::status (then `message` says why)
  uint32_t member;       // the client's member index in the pool segment
  uint32_t frame_count;  // descriptors that follow
  int32_t server_pid;
  uint64_t frame_size;
  char segment_name[160];  // shm name of the pool segment
  char message[256];
};

struct frame_batch {
  uint32_t first;  // pool index of the first descriptor in this message
  uint32_t count;  // descriptors in this message (SCM_RIGHTS)
};

}  // namespace vramswap::pool_protocol
