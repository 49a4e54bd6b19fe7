// pool_segment: a mapped pool segment (pool/pool_layout.hpp) and the operations on it.
//
// The server creates it (create), clients map the one the server names (open). Frame
// transitions are single compare-and-swaps (see pool_layout.hpp for the state machine);
// this class offers them as small operations and leaves the policy (which frame to take,
// whom to ask) to its callers: pool_frame_source in clients, the repair loop in the server.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pool/pool_layout.hpp"

namespace vramswap::detail {

class pool_segment {
 public:
  // The file name ("/<p>vramswap-<owner>-pool-<key>") of `device_key`'s pool segment in the
  // runtime dir, under the current VRAMSWAP_SHM_PREFIX.
  static int name_for(const std::string& device_key, std::string* out) noexcept;

  // Where a server serves, for the message that a second server of the device gets.
  struct server_identity {
    pid_t pid = 0;
    uint64_t start_time = 0;
    uint64_t pid_ns = 0;  // read from the header; claim records this process's own
    std::string runtime_dir;
    std::string socket;
    uint32_t flags = 0;   // pool_header::server_flags (k_server_managed)
  };

  // Server, first thing: become the one server of `device_key` (pool/pool_layout.hpp): take
  // the exclusive flock of its pool segment, kept until this object is destroyed, and
  // publish `who` in its header. A stale segment (nobody holds its flock: its server
  // stopped or died) whose members still lease their slots is ADOPTED: kept as it is, mapped
  // whole, adopted() true, its adoption counted; the caller then serves that pool (frames
  // from its members) instead of building one. A stale segment that nobody uses any more is
  // replaced by a new one (its users, if any, keep their mapping); initialize() that one.
  // Returns 0; err_busy when another server holds it (the detail names its pid, runtime dir
  // and socket); err_version_mismatch when a stale segment still in use was made by another
  // layout version, or is truncated (the detail names the versions, how many processes use
  // it and what to do); err_not_owner when an object of that name belongs to another user or
  // is open to others (named, with its owner); err_invalid_argument; err_system.
  static int claim(const std::string& device_key, const server_identity& who, std::unique_ptr<pool_segment>* out) noexcept;
  // Server, on a claimed segment: size it for `frame_count` frames of `frame_size` bytes and
  // `host_slots` host slots of the same size (0: no shared host pool), all frames, host slots
  // and member slots free, and publish it. Mode 0600, or 0660 with VRAMSWAP_GROUP.
  int initialize(uint32_t frame_count, uint64_t frame_size, uint32_t host_slots) noexcept;
  // Server, on an adopted segment whose members all died before one handed over the frames
  // (their memory went with them): every frame, host slot and member slot free again, as
  // initialize() leaves them, under a new pool_id (a late rejoin is refused), in place (same
  // size, same mapping). The server has made new frames and a new host pool first.
  void reset_tables() noexcept;
  // claim, then initialize (tests, tools).
  static int create(const std::string& device_key, uint32_t frame_count, uint64_t frame_size, uint32_t host_slots,
                    pid_t server_pid, uint64_t server_start_time, std::unique_ptr<pool_segment>* out) noexcept;
  // Client: map the segment named by the server. err_unavailable when it is claimed and not
  // initialized yet: by a server that is still building its pool (the detail names it: wait
  // for its socket, pool_connection does), or by one that died while it did (the next server
  // replaces it; the detail says so). err_version_mismatch when its magic, format or size are
  // not what this build expects; err_not_owner when it belongs to another user or is open to
  // others. read_only: map it PROT_READ (observers such as `vramswap status`); then only the
  // const readers below may be used.
  static int open(const std::string& name, std::unique_ptr<pool_segment>* out, bool read_only = false) noexcept;
  // Is `device_key`'s segment claimed by a live server that has not initialized it yet (it
  // is building its pool, and listens once it has)? *who (may be null): that server, as far
  // as it has said. Never fails: anything unreadable is false.
  static bool starting(const std::string& device_key, server_identity* who) noexcept;
  // What a client sees of `device_key`'s segment in one look: no live server's claim; claimed
  // by a live server still building its pool (starting, above); or initialized, by a server
  // that lives (it opens its socket just after it initializes its segment, and closes it just
  // before it goes: a client that finds no listener then waits a moment). *who (may be null):
  // the claiming server, for the last two. Never fails: anything unreadable is `none`.
  enum class claim_state { none, starting, built };
  static claim_state claim_of(const std::string& device_key, server_identity* who) noexcept;
  // Remove the name of a dead server's segment: 0 when removed or absent; err_busy (naming
  // the server) when a server holds it: a live pool is never removed.
  static int remove(const std::string& device_key) noexcept;

  ~pool_segment();
  pool_segment(const pool_segment&) = delete;
  pool_segment& operator=(const pool_segment&) = delete;

  // Server: claim() adopted a running pool (its tables are live; no initialize()).
  bool adopted() const noexcept { return adopted_; }
  // Server, stopping while members still use the pool: leave the segment where it is for
  // the next server to adopt. The destructor then drops the flock without removing the name.
  void keep_for_next_server() noexcept { keep_ = true; }

  // --- member leases (pool/pool_layout.hpp; lock/liveness_lease.hpp) ----------------------
  // Client: lease member slot `m` for as long as this object lives (on a description of the
  // file of its own, which a forked child does not keep). err_busy when another process
  // holds it; err_system (OFD locks refused by the file system, or no segment opened for
  // writing).
  int lease_member(uint32_t m) noexcept;
  // Server: does some process hold member `m`'s lease, i.e. is a process attached as `m`?
  bool member_leased(uint32_t m) const noexcept;

  const std::string& name() const noexcept { return name_; }
  const std::string& path() const noexcept { return path_; }
  uint32_t frame_count() const noexcept { return header()->frame_count; }
  uint64_t frame_size() const noexcept { return header()->frame_size; }
  pool_layout::pool_header* header() const noexcept { return pool_layout::header_of(base_); }
  pool_layout::member_slot& member(uint32_t index) const noexcept { return pool_layout::members_of(base_)[index]; }
  pool_layout::frame_entry& frame(uint32_t index) const noexcept { return pool_layout::frames_of(base_)[index]; }

  // --- frames -----------------------------------------------------------------------------
  uint64_t read(uint32_t f) const noexcept { return frame(f).word.load(std::memory_order_acquire); }
  // CAS frame `f` from the raw word `seen` to (state, owner, requester); false if it moved.
  bool move(uint32_t f, uint64_t seen, pool_layout::frame_state state, uint32_t owner, uint32_t requester) noexcept;
  // Bump the "a frame became free" futex and wake every waiter.
  void notify_freed() noexcept;
  // The first free frame from *scan_hint on, moved to (state, owner); false when none is free.
  // *scan_hint advances past it, so successive takes spread over the table.
  bool take_free(pool_layout::frame_state state, uint32_t owner, uint32_t* scan_hint, uint32_t* out) noexcept;
  // Frame `f`, owned by `owner`, back to free (retrying a lost race with a requester), then
  // every waiter woken. err_internal, naming the frame's state, when `owner` does not own it.
  int give_back(uint32_t f, uint32_t owner) noexcept;
  // Bump member `m`'s request futex and wake its pager thread.
  void notify_member(uint32_t m) noexcept;
  // Count frames in `state` (any owner when owner == k_no_member).
  uint32_t count(pool_layout::frame_state state, uint32_t owner = pool_layout::k_no_member) const noexcept;

  // --- host slots (the shared host pool; none when host_slot_count() is 0) ----------------
  uint32_t host_slot_count() const noexcept { return header()->host_slot_count; }
  uint64_t host_slot_size() const noexcept { return header()->host_slot_size; }
  pool_layout::slot_entry& slot(uint32_t index) const noexcept { return pool_layout::slots_of(base_)[index]; }
  uint64_t read_slot(uint32_t s) const noexcept { return slot(s).word.load(std::memory_order_acquire); }
  // CAS host slot `s` from the raw word `seen` to (state, owner); false if it moved.
  bool move_slot(uint32_t s, uint64_t seen, pool_layout::slot_state state, uint32_t owner) noexcept;
  // Bump the "a host slot became free" futex and wake every waiter.
  void notify_slots_freed() noexcept;
  // Count host slots in `state` (any owner when owner == k_no_member).
  uint32_t count_slots(pool_layout::slot_state state, uint32_t owner = pool_layout::k_no_member) const noexcept;
  // Server, repairing after member `owner` hung up: take back its dirty slots (given back,
  // not yet zeroed: pool_layout.hpp) as used by it, so that no other member takes one while
  // the server zeroes it. Returns how many.
  uint32_t claim_dirty_slots_of(uint32_t owner) noexcept;
  // Server, repairing after member `owner` hung up, its slots zeroed: free every host slot it
  // held, wake the waiters if any was freed. Returns how many were freed.
  uint32_t free_slots_of(uint32_t owner) noexcept;

  // --- trace (pool/pool_layout.hpp: trace_record) ----------------------------------------
  struct trace_event {
    uint64_t index;  // position in the member's ring (monotonic)
    pool_layout::trace_kind kind;
    int32_t pid;
    uint64_t ns, duration_ns, bytes, extra;
  };
  pool_layout::trace_ring& trace_ring_of(uint32_t m) const noexcept { return pool_layout::traces_of(base_)[m]; }
  // Append one event to member `m`'s ring (its session; any thread). Lock-free, never blocks.
  void trace(uint32_t m, pool_layout::trace_kind kind, uint64_t ns, uint64_t duration_ns, uint64_t bytes,
             uint64_t extra) noexcept;
  // Read member `m`'s events from *cursor on (clamped to what the ring still holds), append
  // the complete ones to *out and advance *cursor. Returns how many records were lost
  // (overwritten before they were read, or torn by a writer's death).
  uint64_t read_trace(uint32_t m, uint64_t* cursor, std::vector<trace_event>* out) const;

  // --- members (server) ----------------------------------------------------------------
  // A free member slot for (pid, start time, PID namespace), published live. err_busy when
  // all are taken.
  int add_member(pid_t pid, uint64_t start_time, uint64_t pid_ns, uint32_t* index) noexcept;

  void remove_member(uint32_t index) noexcept;

 private:
  pool_segment() = default;
  // Wrap a mapping of `size` bytes as a pool_segment (unmapping it if that fails).
  static int wrap(void* base, size_t size, const std::string& name, const std::string& path,
                   std::unique_ptr<pool_segment>* out) noexcept;
  void* base_ = nullptr;
  size_t size_ = 0;
  std::string name_;   // "/<p>vramswap-<owner>-pool-<key>", as the welcome names it
  std::string path_;   // in this process's view of the runtime dir
  int claim_fd_ = -1;  // the server's flock on the segment (claim); -1 in clients
  int lease_fd_ = -1;  // a client's description for its member lease (open, not read-only)
  int leased_ = -1;    // the member slot it leases (-1: none)
  bool adopted_ = false;
  bool keep_ = false;
};

}  // namespace vramswap::detail
