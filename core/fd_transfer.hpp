// Passing descriptors between processes over a Unix socket (SCM_RIGHTS): how frames move
// from one process to another on both backends.
#pragma once

#include <cstddef>

namespace vramswap::detail {

// Send `fd` with `len` bytes of payload (len >= 1: a message must carry data). Blocks.
int send_fd(int socket, int fd, const void* payload, size_t len) noexcept;

// Receive one message: the descriptor into *fd (-1 when the message carried none; any
// received descriptor is close-on-exec) and up to `cap` bytes of payload, *len set to what
// came. A peer that closed the socket gives err_system naming the hang-up.
int recv_fd(int socket, int* fd, void* payload, size_t cap, size_t* len) noexcept;

// Up to k_max_fds_per_message descriptors in one message, with `len` >= 1 bytes of payload.
constexpr size_t k_max_fds_per_message = 250;  // the kernel's SCM_MAX_FD is 253
int send_fds(int socket, const int* fds, size_t count, const void* payload, size_t len) noexcept;
// Receive one message with up to `cap` descriptors (close-on-exec) into fds, *count set to
// how many came. More descriptors than `cap` is an error; on any error none is left open
// (*count 0: those that came are closed).
int recv_fds(int socket, int* fds, size_t cap, size_t* count, void* payload, size_t payload_cap, size_t* len) noexcept;

}  // namespace vramswap::detail
