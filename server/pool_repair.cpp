// pool_server's repair of a member whose process is gone: its frames scrubbed and freed, its
// host slots and member slot freed, waiters woken, and the device lock repaired; and the
// members that died while processes they forked hold their connection, named.
#include "server/pool_server.hpp"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "core/status.hpp"
#include "lock/device_lock.hpp"
#include "lock/process_identity.hpp"
#include "pool/pool_segment.hpp"
#include "server/socket_holders.hpp"

namespace vramswap::detail {

using namespace pool_layout;

void pool_server::repair(const client& c) noexcept {
  std::vector<uint32_t> owned;
  for (uint32_t f = 0; f < frame_count(); ++f) {
    const frame_word w = frame_word::decode(segment_->read(f));
    if (w.state != frame_free && w.owner == c.member) owned.push_back(f);
  }
  uint32_t freed = 0;
  if (!owned.empty()) {
    if (scrub(owned.data(), owned.size()) != ok) {
      // Never hand out a frame that still holds the dead member's data: keep them owned.
      log(log_level::error, "vramswapd: cannot scrub the %zu frames of dead member %u (pid %d); they stay out of the pool: %s",
          owned.size(), c.member, static_cast<int>(c.pid), last_error());
      owned.clear();
    }
    for (uint32_t f : owned) {
      // Only the state can change under us (a lock holder may request an idle frame of the
      // dead member); the owner cannot, so retry until it is ours to free.
      for (uint64_t seen = segment_->read(f);; seen = segment_->read(f)) {
        const frame_word w = frame_word::decode(seen);
        if (w.state == frame_free || w.owner != c.member) break;
        if (segment_->move(f, seen, frame_free, k_no_member, k_no_member)) {
          ++freed;
          break;
        }
      }
    }
  }
  frames_repaired_ += freed;
  // Its host slots: zeroed, then freed (every member maps the whole host pool: a free slot
  // must hold no one's bytes; pool_layout.hpp). A slot that cannot be zeroed stays out of
  // the pool. Before remove_member, so a new member in this slot index never finds slots it
  // did not take.
  uint32_t slots = 0;
  if (host_slots_ > 0) {
    const uint32_t unscrubbed = scrub_host_slots_of(c.member);
    if (unscrubbed == 0) {
      slots = segment_->free_slots_of(c.member);
    } else {
      log(log_level::error, "vramswapd: cannot zero %u host slots of dead member %u (pid %d); they stay out of the host pool: %s",
          unscrubbed, c.member, static_cast<int>(c.pid), last_error());
    }
  }
  slots_repaired_ += slots;
  segment_->member(c.member).holding.store(0, std::memory_order_relaxed);
  segment_->remove_member(c.member);
  segment_->notify_freed();
  const bool lock_repaired = repair_lock();
  const bool dead = client_exited(c);
  char held[160] = "";
  if (c.held_told) {
    std::snprintf(held, sizeof held, " (%.1f s after it exited: processes it forked held its connection until then)",
                  static_cast<double>(monotonic_ns() - c.exited_ns) / 1e9);
  }
  log(log_level::info, "vramswapd: member %u: pid %d %s%s; %u frames scrubbed and freed, %u host slots zeroed and freed (%zu clients left)%s",
      c.member, static_cast<int>(c.pid), dead ? "is gone" : "closed its connection", held, freed, slots, clients_.size() - 1,
      lock_repaired ? "" : "; the device lock's repair did not run (see the warning above)");
}

uint32_t pool_server::scrub_host_slots_of(uint32_t member) noexcept {
  const uint64_t size = frame_size_;
  uint32_t failed = 0;
  // Its dirty slots first: claimed back, so that no member takes one while it is zeroed.
  segment_->claim_dirty_slots_of(member);
  for (uint32_t s = 0; s < host_slots_; ++s) {
    const slot_word w = slot_word::decode(segment_->read_slot(s));
    if (w.state != slot_used || w.owner != member) continue;
    // Mapped for the moment only: the server keeps no mapping of its members' saved pages.
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, host_pool_fd_, static_cast<off_t>(uint64_t{s} * size));
    if (p == MAP_FAILED) {
      if (failed++ == 0) fail_errno(errno, "mapping host slot %u", s);
      continue;
    }
    std::memset(p, 0, size);
    ::munmap(p, size);
  }
  return failed;
}

namespace {

bool pidfd_exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

}  // namespace

bool pool_server::client_exited(const client& c) noexcept {
  // Processes it forked without exec that held its connection hold its GPU driver files
  // too, and with them its context and whatever work it queued: they must be gone as well.
  // Where none of them could be found (another PID namespace's, no socket diagnostics),
  // their exit is not known: the grace period after the hang-up decides.
  if (c.exited_ns != 0 && c.holder_pidfds.empty()) return false;
  for (const int h : c.holder_pidfds) {
    if (!pidfd_exited(h)) return false;
  }
  // A pidfd becomes readable when its process has exited: after every file it held was
  // released (the GPU driver's among them), so its device work is gone too. It works across
  // PID namespaces, where the pid itself means nothing.
  if (c.pidfd >= 0) return pidfd_exited(c.pidfd);
  // No pidfd: a process this server can see is gone once it is a zombie or reaped, which
  // also comes after all its files are released. One it cannot see: not known to be gone
  // (the grace period after its hang-up decides).
  return c.peer_pid != 0 && check_liveness({c.peer_pid, c.start_time}) == liveness::dead;
}

bool pool_server::repair_lock() noexcept {
  const int lrc = lock_->repair_now(k_lock_repair_wait_ns);
  if (lrc == err_timeout) {
    // Its internal mutex is held by a client that does not run (stopped): the waiters'
    // own liveness scans do the same repair once it is free; retry meanwhile, and say so once.
    if (!lock_repair_pending_) log(log_level::warn, "vramswapd: %s; the lock's repair is retried every %d ms", last_error(), k_lock_repair_retry_ms);
    lock_repair_pending_ = true;
    return false;
  }
  if (lrc != ok) log(log_level::warn, "vramswapd: device lock repair failed: %s", last_error());
  if (lock_repair_pending_ && lrc == ok) log(log_level::info, "vramswapd: the device lock's repair ran");
  lock_repair_pending_ = false;
  return lrc == ok;
}

void pool_server::close_client(client* c) noexcept {
  if (c->fd >= 0) ::close(c->fd);
  if (c->pidfd >= 0) ::close(c->pidfd);
  for (const int h : c->holder_pidfds) ::close(h);
  c->fd = -1;
  c->pidfd = -1;
  c->holder_pidfds.clear();
}

void pool_server::tell_held_connections(uint64_t now) noexcept {
  for (client& c : clients_) {
    if (c.fd < 0 || c.exited_ns == 0) continue;
    // The holders are looked for at once, so that the repair can wait for their exit however
    // soon the connection closes; again when one of them has exited (it may have forked
    // holders of its own).
    const bool look = c.exited_ns == now || std::any_of(c.holder_pidfds.begin(), c.holder_pidfds.end(), pidfd_exited);
    const bool tell = !c.held_told && now - c.exited_ns >= uint64_t{k_held_connection_grace_ms} * 1'000'000;
    if (!look && !tell) continue;
    char probe;
    if (::recv(c.fd, &probe, 1, MSG_PEEK | MSG_DONTWAIT) == 0) continue;  // closed just now: the repair's
    try {
      std::vector<pid_t> holders;
      std::string why;
      uint64_t peer = 0;
      if (peer_socket_inode(c.fd, &peer, &why)) holders = processes_holding_socket(peer);
      std::vector<int> pidfds;
      for (const pid_t h : holders) {
        const int fd = open_pidfd(h);
        if (fd >= 0) pidfds.push_back(fd);
      }
      for (const int h : c.holder_pidfds) ::close(h);
      c.holder_pidfds = std::move(pidfds);
      if (!tell) continue;
      c.held_told = true;
      uint32_t owned = 0;
      for (uint32_t f = 0; f < frame_count(); ++f) {
        const frame_word w = frame_word::decode(segment_->read(f));
        if (w.state != frame_free && w.owner == c.member) ++owned;
      }
      const std::string named =
          !holders.empty() ? "by " + describe_processes(holders)
          : why.empty()    ? "by processes this server cannot see (another user's, or another PID namespace's)"
                           : "by processes this server cannot name (" + why + ")";
      std::string kill = holders.empty() ? "" : " (kill";
      for (const pid_t h : holders) kill += " " + std::to_string(h);
      if (!holders.empty()) kill += ")";
      log(log_level::warn,
          "vramswapd: member %u (pid %d) has exited, but its connection to this server is still held %s: processes it forked "
          "without exec (DataLoader workers, a multiprocessing pool or os.fork() with the fork start method). They hold its "
          "GPU context too, so its %u frames stay out of the pool until they exit; stop them%s, or start such helpers with "
          "the spawn start method (multiprocessing_context='spawn' for a DataLoader)",
          c.member, static_cast<int>(c.pid), named.c_str(), owned, kill.c_str());
    } catch (const std::bad_alloc&) {
      c.held_told = true;
      log(log_level::warn, "vramswapd: member %u (pid %d) has exited, but its connection to this server is still held (out of "
          "host memory naming by whom); its frames stay out of the pool until it closes", c.member, static_cast<int>(c.pid));
    }
  }
}
}  // namespace vramswap::detail
