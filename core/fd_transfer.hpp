// Passing descriptors between processes over a Unix socket (SCM_RIGHTS): how frames move
// from one process to another on both backends.
#pragma once

#include <cstddef>

namespace vramswap {

// Send `fd` with `len` bytes of payload (len >= 1: a message must carry data). Blocks.
int send_fd(int socket, int fd, const void* payload, size_t len) noexcept;

// Receive one message: the descriptor into *fd (-1 when the message carried none; any
// received descriptor is close-on-exec) and up to `cap` bytes of payload, *len set to what
// came. A peer that closed the socket gives err_system naming the hang-up.
int recv_fd(int socket, int* fd, void* payload, size_t cap, size_t* len) noexcept;

}  // namespace vramswap
