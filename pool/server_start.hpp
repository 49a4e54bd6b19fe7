// Starting a device's pool server on demand (docs/pool_server.md, "Started on demand"):
// which binary (find_server), one start at a time under an flock on the start lock, the
// spawn (detached, in a session of its own, with the client's options and without the
// preload shim), the ready report on a pipe, and one bound over all of it.
//
// Return codes: 0, or a negative vramswap::detail::status with the detail in last_error(); never
// throws.
#pragma once

#include <string>

#include "pool/pool_paths.hpp"

namespace vramswap::detail {

// The bound over a whole start: waiting for the start lock, the spawn, the ready report (and,
// in pool_connection, each message of the handshake).
inline constexpr int k_server_start_timeout_s = 30;
// How long a server that has claimed the device's pool and is building it (alive, its claim
// in the pool segment, the segment not yet initialized: pool_segment::starting) is waited
// for past k_server_start_timeout_s: faulting in and pinning a host pool of hundreds of GiB
// takes minutes, and is no reason to kill it. A server still building after this is taken
// for hung.
inline constexpr int k_server_build_limit_s = 600;
// How long a live server whose pool segment is initialized is waited for to listen: it opens
// its socket right after it initializes the segment, so only a server in that moment (or in
// the one of its stop) is found so; generous for a loaded machine.
inline constexpr int k_server_listen_grace_s = 10;

// How long a connect waits while the server's queue of new connections is full (a server
// that is stopped, stuck in a driver call, or swamped): a blocking connect would wait for
// as long as that lasts, with nothing said.
inline constexpr int k_server_connect_patience_ms = 10'000;

// Connects to the server's SOCK_SEQPACKET socket at `socket_path`: *fd, err_unavailable
// when nobody listens there (no such file, or a stale file of a dead server), err_timeout
// when the server took no connection within `patience_ms`.
int dial_server(const std::string& socket_path, int* fd, int patience_ms = k_server_connect_patience_ms) noexcept;

// After dial_server found nobody: starts the device's server, or waits for the client that
// is starting one, then connects (*fd). err_unavailable (no binary found, or it could not
// start or died before it was ready: the detail names what was tried or its log),
// err_timeout (nothing ready within k_server_start_timeout_s), err_not_owner, err_system.
int start_or_join_server(const pool_paths& paths, const std::string& device_key, int device, int* fd) noexcept;

// After dial_server found nobody: if a live server has claimed `device_key`'s pool and is
// building it (pool_segment::starting), wait for it to listen and connect (*fd); it serves
// once its pool is built; a live server whose pool is built and that does not listen yet is
// waited for up to k_server_listen_grace_s. err_unavailable when no server is starting (then
// nobody serves the device: start one), or when the one that was starting ended before it listened;
// err_timeout after k_server_build_limit_s (the detail names the server, its pid and its
// log).
int wait_for_starting_server(const pool_paths& paths, const std::string& device_key, int device, int* fd) noexcept;

// Where vramswapd is looked for: VRAMSWAP_SERVER; else next to the object holding this
// code (libvramswap, the Python module, the shim; found with dladdr), then ../bin and
// ../libexec from there. *tried lists the candidates looked at.
int find_server(std::string* path, std::string* tried) noexcept;

}  // namespace vramswap::detail
