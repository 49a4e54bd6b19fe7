// The pool server's socket protocol (version 3), shared by vramswapd and its clients.
//
// Socket: <runtime dir>/<VRAMSWAP_SHM_PREFIX><device key>.sock, a SOCK_SEQPACKET Unix
// socket (message boundaries kept, so each struct below is one message of exactly its
// size). Runtime dir:
// lock/runtime_dir.hpp (mode 0700, or 2770 with VRAMSWAP_GROUP) and docs/pool_server.md.
// The server checks the peer with SO_PEERCRED and SO_PEERGROUPS: the server's own uid,
// root, or (with VRAMSWAP_GROUP) a member of that group.
//
// Exchange:
//   client -> hello (exactly sizeof(hello) bytes) with one descriptor attached, a pidfd of
//             the client (pidfd_open), or none where the kernel or a seccomp policy has no
//             pidfd_open: `pid`, `start_time` (its /proc start time) and `pid_ns` (the inode
//             of its PID namespace), each as the client sees itself. A server that can see
//             the peer (SO_PEERCRED's pid is not 0: the same or a child namespace) checks
//             them against the kernel (the namespace against /proc/<pid>/ns/pid, in its own
//             namespace the pid too, the start time) and that the pidfd is the peer's; one
//             that cannot (the client is in a sibling container) takes them at its word,
//             kept for messages only. Liveness is the pidfd (readable once the client has
//             exited, after all its files are released), else for a visible peer its
//             zombie state, else the socket's hang-up and a grace period.
//   server -> welcome (exactly sizeof(welcome) bytes). status 0: `member`, `frame_count`,
//             `frame_size` and `segment_name` are valid. status < 0 (a vramswap::detail::status):
//             only `magic`, `version`, `server_pid` and the NUL-terminated `message` are;
//             the server closes the connection next. Refusals: err_not_owner (peer's uid
//             not allowed), err_version_mismatch (bad magic, version or size of the hello;
//             the welcome then carries the server's own version), err_invalid_argument
//             (a visible peer's pid, namespace, start time or pidfd wrong), err_busy (no
//             member slot).
//             A client reads magic and status first: a welcome of another version still
//             has them at the same offsets.
//   server -> frame_batch messages carrying the frames' descriptors (SCM_RIGHTS), in pool
//             order: `first` is the number of frames sent before, `count` (1..250, see
//             k_max_fds_per_message) the descriptors attached, until frame_count have been
//             sent. The client imports each and closes it at once.
//   server -> when the welcome's `host_slot_count` is not 0 (the server runs with a shared
//             host pool, VRAMSWAP_HOST_POOL): one host_pool message carrying the host pool's
//             memfd (SCM_RIGHTS, exactly one descriptor). The client maps it MAP_SHARED,
//             faults it in, registers it with its backend once (pinned), closes the
//             descriptor, and takes host slots from the pool segment's slot table.
//   client -> opens the pool segment by `segment_name` in its own view of the runtime dir (a
//             container may mount it elsewhere than the server sees it), checks that it names
//             this server and `pool_id`, leases its member slot there (pool/pool_layout.hpp),
//             then one attach message: status 0, or why it could not (the server then frees
//             the slot and closes).
//   server -> one attached message (status 0): from now on the member is the server's to
//             repair. A client that does not get it (the server died in between) is not a
//             member: it drops its lease and everything it received, and connects anew.
//   then the connection stays open, silent both ways, for the client's lifetime: its
//   hang-up is how the server learns that the client died (and repairs: scrubs and frees
//   its frames, frees its member slot, passes on the lock it held); the server's hang-up
//   (the socket becomes readable with nothing to read) tells the client that its server
//   stopped. The pool itself lives on (pool/pool_layout.hpp): the client rejoins it.
//   Data a client sends after its handshake is ignored (and logged).
//
// Rejoining (version 4): a member whose server stopped or died connects to the next server
// (the one that adopted the pool) with a hello whose `flags` has k_hello_rejoin and whose
// `member` and `pool_id` say which membership it holds; it leases that slot already. The
// server checks that it serves that pool, that slot `member` is live with the hello's pid,
// start time and PID namespace, and that no connection serves it now; else an error
// welcome, which ends the membership for good (the client's pool is gone: restart the job).
//   server -> welcome with k_welcome_rejoined, and k_welcome_send_frames when the server has
//             no handle of the pool's frames yet (it is the first member to come back):
//   client -> then frame_batch messages carrying a descriptor of every frame, the ones it
//             was given and kept (pool/kept_descriptors.hpp: CUDA does not export an
//             imported allocation again), in pool order, and with a shared host pool one
//             host_pool message carrying its memfd; the server imports them.
// Only a client whose hello has k_hello_has_frames (it kept every descriptor) is asked for
// the frames; one without rejoins all the same, and the server waits for another.
//   server -> one attached message (status 0).
// A newcomer that connects while the server waits for a member to hand it the frames waits
// for its welcome (at most k_adopt_wait_ms, then err_unavailable saying why).
//
// Versioning: a change of any struct's size or meaning bumps k_version; both sides refuse
// a mismatch by name, never misread.
//   1: hello, welcome, frame batches.
//   2: the welcome announces the shared host pool (host_slot_count, host_pool_bytes); the
//      host_pool message follows the frame batches when there is one.
//   3: the hello carries the client's PID namespace and a pidfd of it; segment_name is a
//      file name in the runtime dir (it was a /dev/shm name).
//   4: the attach / attached exchange that ends a handshake; rejoining (hello flags, member,
//      pool_id; welcome flags, pool_id; frames sent by the client).
//   5: the client sends the descriptors it was given (it exported its imports), and says in
//      its hello that it has them (k_hello_has_frames).
#pragma once

#include <cstdint>
#include <string>

namespace vramswap::detail::pool_protocol {

constexpr uint32_t k_magic = 0x50575356;  // "VSWP"
constexpr uint32_t k_version = 5;
// How long a newcomer's welcome waits while the server has adopted a pool and no member has
// come back yet to hand it the frames.
constexpr int k_adopt_wait_ms = 10'000;

constexpr uint32_t k_hello_rejoin = 1;      // hello::flags: rejoin membership `member` of pool `pool_id`
constexpr uint32_t k_hello_has_frames = 2;  // and this client kept every frame's descriptor to hand over

struct hello {
  uint32_t magic;
  uint32_t version;
  int32_t pid;
  uint32_t reserved;
  uint64_t start_time;  // /proc start time of the client (PID reuse)
  uint64_t pid_ns;      // inode of the client's PID namespace (/proc/self/ns/pid)
  // version 4
  uint32_t flags;       // k_hello_rejoin, k_hello_has_frames
  uint32_t member;      // with k_hello_rejoin: the member slot this client holds (and leases)
  uint64_t pool_id;     // with k_hello_rejoin: pool_header::pool_id of the pool it belongs to
};

constexpr uint32_t k_welcome_rejoined = 1;     // welcome::flags: the membership goes on
constexpr uint32_t k_welcome_send_frames = 2;  // and the server needs the frames' descriptors from this client

struct welcome {
  uint32_t magic;
  uint32_t version;
  int32_t status;        // 0, or a negative vramswap::detail::status (then `message` says why)
  uint32_t member;       // the client's member index in the pool segment
  uint32_t frame_count;  // descriptors that follow
  int32_t server_pid;
  uint64_t frame_size;
  char segment_name[160];  // the pool segment's file name in the runtime dir ("/<name>")
  char message[256];
  // version 2: the shared host pool. 0 slots: none (each client keeps its own host tier).
  uint32_t host_slot_count;  // frame-size slots in the host pool
  uint32_t reserved;
  uint64_t host_pool_bytes;  // the memfd's size: host_slot_count * frame_size
  // version 4
  uint32_t flags;            // k_welcome_rejoined, k_welcome_send_frames
  uint32_t reserved2;
  uint64_t pool_id;          // pool_header::pool_id
};

// The end of a handshake: the client's attach (status 0 once its lease is taken, else why
// not), then the server's attached (status 0: the client is a member).
struct attach {
  uint32_t magic;
  int32_t status;
};

struct host_pool {
  uint64_t bytes;        // the memfd's size, as in the welcome
  uint32_t slot_count;   // as in the welcome
  uint32_t reserved;
};

struct frame_batch {
  uint32_t first;  // pool index of the first descriptor in this message
  uint32_t count;  // descriptors in this message (SCM_RIGHTS)
};

}  // namespace vramswap::detail::pool_protocol
