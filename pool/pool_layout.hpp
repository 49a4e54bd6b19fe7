// The byte layout of a device's pool segment: the frame table and the member table that
// every process sharing the pool maps. Created by the pool server (vramswapd) when it
// starts, a file in the runtime dir (lock/runtime_dir.hpp) named
// "<VRAMSWAP_SHM_PREFIX>vramswap-<owner>-pool-<device key>" (owner "u<uid>", or "g<gid>"
// with VRAMSWAP_GROUP), mode 0600 (0660 with VRAMSWAP_GROUP). Clients open it by that name
// in their own view of the runtime dir (a container may mount it anywhere).
//
// The segment is also the pool's identity: every server of the device that uses this
// runtime dir meets at this one name (another runtime dir is another pool, with a lock of its
// own). The server that holds an exclusive flock on it (for
// its whole life) is the pool's one server, and its header says who it is (pid, start
// time, runtime dir, socket) before anything else is built. A segment whose flock is held
// is never removed or written by anyone else. A segment whose flock nobody holds is a stopped
// or dead server's: a new server adopts it while its members still use it (below), and
// replaces it (unlinks, then creates anew) only once nobody does.
//
// Members' liveness is the server's to judge, from the client's connection and the pidfd
// it sent with its hello (pool/pool_protocol.hpp): it repairs a member once its process has
// exited, whatever its PID namespace, or a grace period after a hang-up otherwise (a process
// that lives on, or one that sent no pidfd and that the server cannot see).
//
// Members outlive their server. Each member also leases its slot (lock/liveness_lease.hpp):
// an OFD write lock on byte k_lease_base + its index of this file, taken before its
// handshake completes and dropped only when it leaves, so that a server that never saw the
// member connect (the next one, after its server stopped or died) can tell a live member
// from a dead one in any PID namespace. The frame table, the member table and the host slot
// table need no server to work: members keep taking, releasing and asking for frames
// while none runs. A server that finds a segment whose flock nobody holds and whose members
// still lease their slots ADOPTS it instead of replacing it: it keeps every table as it is,
// gets the frames' handles from the first member that reconnects (each member imported
// every frame), repairs the members that died meanwhile, and serves on. These leases (the
// byte range k_lease_base .. + k_member_count) and the header's first three words (magic,
// format, segment size) are the same in every layout from version 7 on, so that a server of
// any later layout can tell that a pool of another layout is still in use, and refuse it by
// name rather than replace it under its members.
//
// Glossary
//   frame   one physical allocation of the pool; index 0..frame_count-1 here, the same
//           index in every process (each imports frame i from the server's descriptor i)
//   member  one client process attached to the pool; index 0..k_member_count-1, assigned
//           by the server when the process connects
//   owner   the member whose pages a frame backs (mapped in that member's address space)
//
// Frame states (frame_entry::word). Every transition is ONE compare-and-swap of the word,
// so a process killed between any two instructions leaves each frame in a state listed
// here, and what a dead member owned is found by its member index and repaired by the
// server (scrubbed, then freed):
//
//   free      owner none. Contents zero (scrubbed). The lock holder takes free frames; so
//             may a member outside the lock (only free ones, to idle: take-idle below).
//   active    owned; the owner holds the lock (or is bringing its memory in).
//   idle      owned; the owner released the lock. last_use: when (the pool clock). Which
//             idle frames a lock holder asks for first: by their owners' predicted next
//             acquire, furthest first (the member slot's last line; pool/victim_order.hpp).
//   requested owned and idle (or lent), and a lock holder (requester) asked the owner to
//             evict it. The owner's pager thread copies the page out, scrubs and unmaps the
//             frame, then frees it. The owner may also take it back (-> active) when it
//             acquires. An oversubscribed owner moves the page to host memory instead.
//   lent      owned by an oversubscribed member (VRAMSWAP_OVERSUBSCRIBE=1), which runs
//             without the lock: its kernels may be using the frame right now. A lock holder
//             asks for lent frames before idle ones; the owner then moves the page into a
//             host frame at its next safe point (core/launch_gate.hpp) and frees the frame.
//
//   take     free -> active(me)                     lock holder
//   take-idle free -> idle(me)                      a member not holding the lock, for memory
//                                                   it allocates then; never waits nor asks
//   release  active(me) -> idle(me)                 owner, at lock release
//   reclaim  idle(me) | requested(me) -> active(me)  owner, at acquire
//   request  idle(Y) | lent(Y) -> requested(Y, by me)  lock holder; then wakes Y
//   lend     free -> lent(me)                       oversubscribed member, without the lock
//   give     any(me) -> free                        owner, after scrubbing; then wakes all
//   repair   any(dead Y) -> free                    server, after scrubbing
//
// Host slots (slot_entry::word), present when the server runs with a shared host pool
// (VRAMSWAP_HOST_POOL): one frame-sized slot of one memfd that every member maps, holding
// one saved page of its owner. Two states, each transition one compare-and-swap:
//
//   free      owner none. Contents zero: every member maps the whole host pool, so a page
//             left in a free slot would be readable by the others after its owner left.
//             The owner zeroes a slot before it gives it back; the server zeroes a dead
//             member's slots before it repairs them.
//   used      owner holds a saved page (or is copying one in) in the slot.
//
//   take     free -> used(me)          any member saving a page (lock holder or not)
//   give     used(me) -> free          owner, once the page is back on the device or dropped
//                                       and the slot zeroed; then bumps slots_freed, wakes all
//   repair   used(dead Y) -> free      server, when Y hung up, after zeroing; then wakes all
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace vramswap::detail::pool_layout {

constexpr uint64_t k_magic = 0x4C4F4F5057535256ull;  // "VRSWPOOL" in little-endian bytes
// 2: member slots of two cache lines (statistics for `vramswap status`), a per-member trace
//    ring between the member table and the frame table, the metrics port in the header.
// 3: the header is two cache lines (host pool: slot count, slot size, slots_freed futex);
//    the host slot table follows the frame table; frame state lent (oversubscribed members).
// 4: the header holds the server's identity (claimed, runtime dir, socket): ten lines.
// 5: a member slot is six lines: the last failure of an eviction asked of it; a member
//    outside the lock may move a frame free -> idle (memory allocated between turns).
// 6: a file in the runtime dir; each member slot records the client's PID namespace, the
//    header the server's.
// 7: members lease their slots (above); the header names the pool (pool_id), counts the
//    servers that adopted it and says whether its server answers to a service manager; a
//    member slot is nine lines: the last three say who the member is (uid, job name,
//    command line), for observers that cannot look the process up themselves.
// 8: a member slot is ten lines: the last one predicts the member's next acquire (its last
//    release, a moving mean of its idle gaps) and counts the frames it asked others for
//    ahead of its acquires and during them.
// 9: a host slot may be dirty: given back by its owner and not yet zeroed (below).
constexpr uint64_t k_layout_version = 9;
constexpr size_t k_cache_line = 64;
constexpr uint32_t k_member_count = 256;
constexpr uint32_t k_no_member = 0xFFFF;
// The least a shared host pool may hold, in slots: the pager's copies in flight (16: an
// eviction writes that many slots before the first frame comes back) and one more.
// vramswapd refuses less; what a pool should hold is in docs/swap.md ("Shared host pool").
constexpr uint32_t k_min_host_slots = 17;

enum frame_state : uint8_t { frame_free = 0, frame_active = 1, frame_idle = 2, frame_requested = 3, frame_lent = 4 };

// word = state | owner << 8 | requester << 24 | generation << 40. The generation counts
// transitions, so a compare-and-swap never succeeds on a stale read (no ABA).
struct frame_word {
  frame_state state;
  uint32_t owner;      // member index, or k_no_member
  uint32_t requester;  // member index, or k_no_member
  uint32_t generation;

  static frame_word decode(uint64_t w) {
    return frame_word{static_cast<frame_state>(w & 0xFF), static_cast<uint32_t>((w >> 8) & 0xFFFF),
                      static_cast<uint32_t>((w >> 24) & 0xFFFF), static_cast<uint32_t>(w >> 40)};
  }
  uint64_t encode() const {
    return uint64_t{state} | uint64_t{owner & 0xFFFF} << 8 | uint64_t{requester & 0xFFFF} << 24 |
           uint64_t{generation & 0xFFFFFF} << 40;
  }
};

// Host slot word = state | owner << 8 | generation << 24 (40 bits of generation).
// free: zeroed, anyone's to take. used: holds the owner's saved page (or is being written).
// dirty: the owner gave it back and it still holds the owner's bytes; any member may take it
// (CAS to used) to write a whole page over them, and the owner's scrubber zeroes the ones left
// (CAS to used(owner), zero, free). Handing a slot on without zeroing it first takes the
// memset off the path of the handoff in which one process restores (gives slots back) while
// another evicts (takes them). The server's repair claims a dead member's dirty slots the same
// way before it zeroes them, so no slot ever holds the bytes of a member that is gone.
enum slot_state : uint8_t { slot_free = 0, slot_used = 1, slot_dirty = 2 };

struct slot_word {
  slot_state state;
  uint32_t owner;  // member index, or k_no_member
  uint64_t generation;

  static slot_word decode(uint64_t w) {
    return slot_word{static_cast<slot_state>(w & 0xFF), static_cast<uint32_t>((w >> 8) & 0xFFFF), w >> 24};
  }
  uint64_t encode() const {
    return uint64_t{state} | uint64_t{owner & 0xFFFF} << 8 | (generation & 0xFFFFFFFFFFull) << 24;
  }
};

struct slot_entry {
  std::atomic<uint64_t> word;  // authoritative (see above)
};
static_assert(sizeof(slot_entry) == 8);

struct frame_entry {
  std::atomic<uint64_t> word;      // authoritative (see above)
  std::atomic<uint64_t> last_use;  // hint: the pool clock when the frame last became idle
};
static_assert(sizeof(frame_entry) == 16);

enum member_state : uint32_t { member_free = 0, member_live = 1 };

// What a member is doing, for `vramswap status` (member_slot::phase).
enum member_phase : uint32_t {
  phase_idle = 0,       // not holding the lock, not asking for it
  phase_waiting = 1,    // in acquire(): queued for the lock
  phase_restoring = 2,  // holds the lock, bringing its memory in (may wait for evictions)
  phase_running = 3,    // holds the lock, memory resident
};

// The first line is written by the server only (state last, with release order), except
// the futex words and counters, which clients update atomically. The second line is the
// member's statistics, published by its own session with single atomic stores after
// acquire, release and each served eviction (never on a hot path); the server zeroes the
// slot before publishing it. Readers (`vramswap status`, the metrics endpoint) take each
// word as it is: the words are independent hints, not a consistent snapshot.
struct alignas(k_cache_line) member_slot {
  std::atomic<uint32_t> state;     // member_state
  int32_t pid;                     // the client process
  uint64_t start_time;             // its /proc start time (PID reuse)
  std::atomic<uint32_t> requests;  // futex: bumped by a lock holder after requesting frames of this member
  std::atomic<uint32_t> holding;   // hint for status: 1 while this member holds the device lock
  std::atomic<uint64_t> bytes_out;  // statistics, for `vramswap status`
  std::atomic<uint64_t> bytes_in;
  std::atomic<uint64_t> evictions_served;  // frames evicted at other members' requests
  std::atomic<uint64_t> trace_start;       // server: this member's trace ring head when it was added
  std::atomic<uint64_t> swaps_in;          // acquires that brought memory in (moved bytes)
  // --- second line: published by the member's session ---
  std::atomic<uint32_t> phase;             // member_phase
  uint32_t reserved_;
  std::atomic<uint64_t> holding_since_ns;  // CLOCK_MONOTONIC of the grant; 0 when not holding
  std::atomic<uint64_t> host_bytes;        // saved pages with a copy in host memory
  std::atomic<uint64_t> disk_bytes;        // saved pages only in the swap file
  std::atomic<uint64_t> acquires;          // lock acquisitions (re-entries not counted)
  std::atomic<uint64_t> lock_wait_ns;      // total time queued for the lock
  std::atomic<uint64_t> restore_ns;        // total time bringing memory in after the grant
  std::atomic<uint64_t> evict_ns;          // total time evicting (served requests and eager releases)
  // --- third to sixth lines: why this member could not evict for another (a hint) ---
  // Written by the member after an eviction it was asked for failed: the detail first,
  // then the status (release); cleared (status 0) by its next eviction that succeeds. A lock
  // holder waiting on this member's frames reads the status (acquire), then the detail, and
  // puts both in its timeout error.
  std::atomic<int32_t> evict_status;        // 0, or the vramswap status of the failure
  uint32_t reserved2_;
  std::atomic<uint64_t> evict_failed_ns;    // CLOCK_MONOTONIC of the failure
  // (Not part of the failure: the member's PID namespace, in which `pid` means something.)
  uint64_t pid_ns;
  char evict_error[k_cache_line * 4 - 24];  // its detail, NUL-terminated, cut to fit
  // --- seventh to ninth lines: who the member is, written once by the member itself ---
  // The environment of a process (VRAMSWAP_JOB_NAME) is not readable by other users, and a
  // process of another PID namespace cannot be looked up in an observer's /proc at all: so
  // the member says it here. Publication: the member fills uid, job_name and command, then
  // stores identity = 1 (release); a reader reads them only after loading 1 (acquire).
  // add_member stores 0 before it publishes the slot. Hints for display, never for
  // decisions: any member could write anything here.
  std::atomic<uint32_t> identity;
  uint32_t uid;                           // the member's effective uid (in its user namespace)
  char job_name[k_cache_line - 8];        // VRAMSWAP_JOB_NAME, NUL-terminated, cut to fit; "": not set
  char command[2 * k_cache_line];         // its command line, shortened (pool/process_label.hpp), cut to fit
  // --- tenth line: when the member will next acquire, written by the member itself ---
  // Hints that order the idle frames a lock holder asks for (pool/victim_order.hpp) and tell
  // a member whether it is the one predicted to acquire next (eviction ahead of need). Any
  // of them may be stale or torn between words: a wrong guess costs an eviction that was
  // not needed yet, never a frame. The member zeroes them when it joins.
  std::atomic<uint64_t> released_ns;   // CLOCK_MONOTONIC of its last release; 0: none yet
  std::atomic<uint64_t> asked_ns;      // CLOCK_MONOTONIC of its last acquire() call (not a re-entry)
  std::atomic<uint64_t> idle_gap_ns;   // moving mean of release -> next acquire() call
  std::atomic<uint32_t> idle_gaps;     // gaps measured (saturates); 0: idle_gap_ns means nothing
  uint32_t reserved3_;
  std::atomic<uint64_t> frames_asked_ahead;       // frames it asked others to evict before its acquire
  std::atomic<uint64_t> frames_asked_at_acquire;  // frames it asked others to evict while holding the lock
  // Published with host_bytes, by the member's session: host memory it pinned of its own
  // (vramswap_stats_t::host_pinned_bytes). Zero in slots of members built before it.
  std::atomic<uint64_t> host_pinned_bytes;
  // Published by the member's session: device memory the process got past vramswap (the
  // preload shim counts what it sees go to the driver: preload/bypass.cpp). Zero in slots of
  // members built before it.
  std::atomic<uint64_t> outside_pool_bytes;
};
static_assert(sizeof(member_slot) == 10 * k_cache_line);

// Trace events (`vramswap trace`). Each member has a ring of k_trace_records records in the
// segment; its session appends, any reader polls. Writers of one member (its acquiring
// thread and its eviction thread) claim a record with fetch_add on `head`, zero its `seq`,
// fill the fields, then store seq = claimed index + 1 (release), last. A reader accepts a
// record only when seq equals the index it expects both before and after copying the
// fields (a seqlock): a writer that dies mid-record leaves a seq that never matches, and a
// record overwritten during the copy is dropped. Readers never write.
enum trace_kind : uint32_t {
  trace_asked = 1,     // acquire() called.              ns: the call; extra: priority
  trace_granted = 2,   // the lock was granted.          ns: the call; duration: the wait; extra: priority
  trace_resident = 3,  // memory brought in.             ns: the grant; duration; bytes: copied in
  trace_released = 4,  // the lock was handed on.        ns: the grant; duration: held; bytes: evicted at release
  trace_evicted = 5,   // frames evicted for others.     ns: start; duration; bytes: copied out; extra: frames
};
constexpr uint32_t k_trace_records = 256;  // per member, a power of two

struct trace_record {
  std::atomic<uint64_t> seq;  // claimed index + 1, written last; 0 while being written
  std::atomic<uint64_t> ns;   // CLOCK_MONOTONIC
  std::atomic<uint64_t> duration_ns;
  std::atomic<uint64_t> bytes;
  std::atomic<uint64_t> extra;
  std::atomic<uint32_t> kind;  // trace_kind
  std::atomic<int32_t> pid;
};
static_assert(sizeof(trace_record) == 48);

struct alignas(k_cache_line) trace_ring {
  std::atomic<uint64_t> head;  // records ever claimed in this ring (never reset)
  uint64_t reserved_[7];
  trace_record records[k_trace_records];
};

constexpr size_t k_server_path_bytes = 256;
// pool_header::server_flags: the server answers to a service manager (NOTIFY_SOCKET), which
// restarts it; its members give it a while to come back before they start one themselves.
constexpr uint32_t k_server_managed = 1;

// Written in two steps by the server. Claim: it holds the flock and writes server_pid,
// server_start_time, server_runtime_dir and server_socket, then stores claimed = 1 (release):
// from then on a second server can name it. Initialize: everything else, magic last. Clients
// and observers use a segment only once they see the magic.
struct alignas(k_cache_line) pool_header {
  std::atomic<uint64_t> magic;  // published last by the creator
  uint64_t format;              // format_word()
  uint64_t segment_size;
  uint64_t frame_size;
  uint32_t frame_count;
  int32_t server_pid;
  uint64_t server_start_time;
  std::atomic<uint64_t> clock;          // LRU clock: bumped at each lock release
  std::atomic<uint32_t> frames_freed;   // futex: bumped whenever a frame becomes free
  std::atomic<uint32_t> metrics_port;   // the server's Prometheus endpoint (port only; 0: none)
  // --- second line: the shared host pool (all zero without one) ---
  uint32_t host_slot_count;             // slots in the host pool's memfd; 0: no shared host pool
  uint32_t reserved_;
  uint64_t host_slot_size;              // bytes per slot (the frame size)
  std::atomic<uint32_t> slots_freed;    // futex: bumped whenever a host slot becomes free
  std::atomic<uint32_t> claimed;        // 1 once the server's identity below (and pid, start time) is written
  uint64_t server_pid_ns;               // the server's PID namespace, in which server_pid means something
  uint64_t pool_id;                     // random, made with the pool; a server that adopts the pool keeps it
  std::atomic<uint32_t> adoptions;      // servers that adopted this pool (0: its first server serves it)
  std::atomic<uint32_t> server_flags;   // k_server_managed, ...: written with the identity
  uint32_t reserved2_[2];
  // --- lines 3-10: where the server serves (for the message of a second server) ---
  char server_runtime_dir[k_server_path_bytes];  // NUL-terminated, truncated if longer
  char server_socket[k_server_path_bytes];
};
static_assert(sizeof(pool_header) == 10 * k_cache_line);

constexpr size_t k_members_offset = sizeof(pool_header);
constexpr size_t k_traces_offset = k_members_offset + k_member_count * sizeof(member_slot);
constexpr size_t k_frames_offset = k_traces_offset + k_member_count * sizeof(trace_ring);
constexpr size_t slots_offset_for(uint32_t frames) { return k_frames_offset + size_t{frames} * sizeof(frame_entry); }
constexpr size_t segment_size_for(uint32_t frames, uint32_t host_slots) {
  return slots_offset_for(frames) + size_t{host_slots} * sizeof(slot_entry);
}

// version:16 | sizeof(frame_entry):8 | sizeof(member_slot) in cache lines:8 | k_member_count:16 | k_trace_records:16
// (sizeof(pool_header) and sizeof(slot_entry) are fixed by the version.)
static_assert(sizeof(frame_entry) < 256 && sizeof(member_slot) / k_cache_line < 256);
constexpr uint64_t format_word() {
  return (k_layout_version << 48) | (uint64_t{sizeof(frame_entry)} << 40) | (uint64_t{sizeof(member_slot) / k_cache_line} << 32) |
         (uint64_t{k_member_count} << 16) | uint64_t{k_trace_records};
}

inline pool_header* header_of(void* base) { return static_cast<pool_header*>(base); }
inline member_slot* members_of(void* base) {
  return reinterpret_cast<member_slot*>(static_cast<char*>(base) + k_members_offset);
}
inline trace_ring* traces_of(void* base) { return reinterpret_cast<trace_ring*>(static_cast<char*>(base) + k_traces_offset); }
inline frame_entry* frames_of(void* base) { return reinterpret_cast<frame_entry*>(static_cast<char*>(base) + k_frames_offset); }
inline slot_entry* slots_of(void* base) {
  return reinterpret_cast<slot_entry*>(static_cast<char*>(base) + slots_offset_for(header_of(base)->frame_count));
}

}  // namespace vramswap::detail::pool_layout
