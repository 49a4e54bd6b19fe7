// pool_server's adoption of a running pool (pool/pool_layout.hpp, "Members outlive their
// server"): the members of the previous server taken as orphans; their rejoin, the first of
// which hands over a descriptor of every frame and of the host pool; the newcomers that wait
// for those meanwhile; the orphans that die before they rejoin; and the pool built anew when
// every one of them did, since the frames' memory lived only in them.
#include "server/pool_server.hpp"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include "core/fd_guard.hpp"
#include "core/fd_transfer.hpp"
#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/process_identity.hpp"
#include "pool/pool_protocol.hpp"
#include "pool/pool_segment.hpp"
#include "server/human_size.hpp"

namespace vramswap::detail {

using namespace pool_layout;

namespace {

// A pidfd of `who`, a process of this PID namespace, or -1: opened first, then checked to be
// that process still (not a later one with its pid), so that it can only ever refer to it.
int pidfd_of(const process_identity& who) {
  const int fd = open_pidfd(who.pid);
  if (fd < 0) return -1;
  if (check_liveness(who) != liveness::alive) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string pids_of(const std::vector<uint32_t>& pids) {
  std::string text;
  for (size_t i = 0; i < pids.size() && i < 8; ++i) text += (i == 0 ? "" : ", ") + std::to_string(pids[i]);
  if (pids.size() > 8) text += ", ...";
  return text;
}

}  // namespace

int pool_server::adopt_pool() noexcept {
  try {
    adopted_ = true;
    adopted_ns_ = monotonic_ns();
    const pool_header* h = segment_->header();
    frame_size_ = h->frame_size;
    frame_count_ = h->frame_count;
    host_slots_ = h->host_slot_count;
    // The frames' descriptors come from a member: as many as build_pool keeps.
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
      lim.rlim_cur = lim.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &lim);
    }
    VS_TRY(prepare_scrub());
    uint64_t option_frame = 0;
    if (option_size(option_id::frame_size, &option_frame) == ok && option_frame != frame_size_) {
      log(log_level::info, "vramswapd: the adopted pool's frames are %s; VRAMSWAP_FRAME_SIZE (%s) applies to the next new pool",
          human_size(frame_size_).c_str(), human_size(option_frame).c_str());
    }
    clear_error();
    const uint64_t now = monotonic_ns();
    std::vector<uint32_t> alive, dead;
    for (uint32_t m = 0; m < k_member_count; ++m) {
      const member_slot& slot = segment_->member(m);
      if (slot.state.load(std::memory_order_acquire) != member_live) continue;
      client c;
      c.orphan = true;
      c.member = m;
      c.pid = slot.pid;
      c.start_time = slot.start_time;
      // Where this server sees the member, its exit is watched as a connected client's is.
      if (visible_here(slot.pid_ns)) {
        c.peer_pid = slot.pid;
        c.pidfd = pidfd_of({slot.pid, slot.start_time, slot.pid_ns});
      }
      // No lease: it died while no server ran (or during its handshake with the last one).
      if (!segment_->member_leased(m)) c.hung_up_ns = now;
      (c.hung_up_ns == 0 ? alive : dead).push_back(static_cast<uint32_t>(c.pid));
      clients_.push_back(c);
    }
    log(log_level::info,
        "vramswapd: adopted the running pool of device %d: %u frames of %s%s; %zu member(s) still attached (pid %s), waiting for "
        "them to rejoin; %zu ended while no server ran (repaired once the frames are back)",
        device_, frame_count_, human_size(frame_size_).c_str(),
        host_slots_ > 0 ? (", a shared host pool of " + std::to_string(host_slots_) + " slots").c_str() : "", alive.size(),
        alive.empty() ? "none" : pids_of(alive).c_str(), dead.size());
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "vramswapd: out of host memory");
  }
}

void pool_server::serve_rejoin(int fd, const pool_protocol::hello& h, pid_t peer_pid, int pidfd_in) noexcept {
  using namespace pool_protocol;
  fd_guard pidfd(pidfd_in);
  client* orphan = rejoining_orphan(fd, h);
  if (orphan == nullptr) return;
  // Asked of the first member back that kept the descriptors; one that could not keep them
  // rejoins without (its imports are its own), and newcomers wait for another.
  const bool send_frames = frames_.empty() && (h.flags & k_hello_has_frames) != 0;
  if (send_rejoin_welcome(fd, h, send_frames) != ok) {
    const std::string why = last_error();
    ::close(fd);
    note_failed_rejoin(h, why);
    return;
  }
  orphan->fd = fd;
  if (orphan->pidfd >= 0) ::close(orphan->pidfd);
  orphan->pidfd = pidfd.release();
  orphan->peer_pid = peer_pid;
  orphan->orphan = false;
  log(log_level::info, "vramswapd: member %u: pid %d rejoined the pool, %.1f s after this server adopted it%s", h.member,
      static_cast<int>(h.pid), static_cast<double>(monotonic_ns() - adopted_ns_) / 1e9,
      send_frames               ? ", and handed over the frames"
      : frames_.empty()         ? " without the frames' descriptors (it could not keep them: RLIMIT_NOFILE); waiting for another member"
                                : "");
}

pool_server::client* pool_server::rejoining_orphan(int fd, const pool_protocol::hello& h) noexcept {
  using namespace pool_protocol;
  const uint64_t pool_id = segment_->header()->pool_id;
  if (h.pool_id != pool_id) {
    refuse(fd, err_version_mismatch,
           "pid %d asks to rejoin pool %#" PRIx64 ", but this server (pid %d) serves pool %#" PRIx64 " of the device: the pool it "
           "belonged to is gone (it was replaced while no member used it, or removed), and its memory with it. Restart the job",
           static_cast<int>(h.pid), h.pool_id, static_cast<int>(::getpid()), pool_id);
    return nullptr;
  }
  client* orphan = nullptr;
  for (client& c : clients_) {
    if (c.member != h.member) continue;
    if (!c.orphan) {
      refuse(fd, err_busy, "pid %d asks to rejoin as member %u, which is attached already (pid %d)", static_cast<int>(h.pid), h.member,
             static_cast<int>(c.pid));
      return nullptr;
    }
    orphan = &c;
  }
  const bool in_table = h.member < k_member_count;
  const member_slot* slot = in_table ? &segment_->member(h.member) : nullptr;
  if (orphan == nullptr || slot->state.load(std::memory_order_acquire) != member_live || slot->pid != h.pid ||
      slot->start_time != h.start_time || slot->pid_ns != h.pid_ns || orphan->hung_up_ns != 0 || !segment_->member_leased(h.member)) {
    refuse(fd, err_invalid_argument,
           "pid %d asks to rejoin as member %u of this pool, but that membership is not its (any more): %s. Its frames are not "
           "its own: restart the job",
           static_cast<int>(h.pid), h.member,
           !in_table                 ? "there is no such member slot"
           : orphan == nullptr       ? "the slot was repaired as a dead member's, or is another process's"
           : orphan->hung_up_ns != 0 ? "its lease went, so it is being repaired as a dead member's"
           : slot->pid != h.pid      ? "the slot names another process"
                                     : "the slot's identity or lease does not match");
    return nullptr;
  }
  return orphan;
}

int pool_server::send_rejoin_welcome(int fd, const pool_protocol::hello& h, bool send_frames) noexcept {
  using namespace pool_protocol;
  welcome w{};
  w.magic = pool_protocol::k_magic;
  w.version = k_version;
  w.status = ok;
  w.member = h.member;
  w.frame_count = frame_count_;
  w.server_pid = ::getpid();
  w.frame_size = frame_size_;
  std::snprintf(w.segment_name, sizeof w.segment_name, "%s", segment_->name().c_str());
  w.host_slot_count = host_slots_;
  w.host_pool_bytes = uint64_t{host_slots_} * frame_size_;
  w.flags = k_welcome_rejoined | (send_frames ? k_welcome_send_frames : 0);
  w.pool_id = segment_->header()->pool_id;
  int rc = send_fds(fd, nullptr, 0, &w, sizeof w);
  if (rc == ok && send_frames) rc = receive_frames(fd);
  if (rc == ok) {
    const attach done{pool_protocol::k_magic, ok};
    rc = send_fds(fd, nullptr, 0, &done, sizeof done);
  }
  return rc;
}

void pool_server::note_failed_rejoin(const pool_protocol::hello& h, const std::string& why) noexcept {
  // A member tries again every few hundred ms: one line per member and half minute says
  // it, with what was left out.
  const uint64_t now = monotonic_ns();
  ++rejoin_failures_;
  if (rejoin_warned_ns_ != 0 && now - rejoin_warned_ns_ < k_rejoin_warn_interval_ns) return;
  const uint64_t more = rejoin_failures_ - 1;
  rejoin_failures_ = 0;
  rejoin_warned_ns_ = now;
  const std::string limit = descriptor_limit_note(why);
  log(log_level::warn, "vramswapd: member %u (pid %d) could not rejoin: %s%s; it stays out until it tries again or ends%s", h.member,
      static_cast<int>(h.pid), why.c_str(), limit.c_str(),
      more > 0 ? (" (" + std::to_string(more) + " more failed rejoins in the last 30 s not logged)").c_str() : "");
}

// When `why` (a failed rejoin) comes from this server's descriptor limit: what the limit is,
// what the pool needs, and how to raise it; else "".
std::string pool_server::descriptor_limit_note(const std::string& why) const {
  if (why.find("Too many open files") == std::string::npos && why.find("file descriptor limit") == std::string::npos) return "";
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return "";
  auto text = [](rlim_t v) { return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(static_cast<unsigned long long>(v)); };
  return "; this server's descriptor limit (RLIMIT_NOFILE: soft " + text(lim.rlim_cur) + ", hard " + text(lim.rlim_max) +
         ") is too low to take over the pool's " + std::to_string(frame_count_) + " frames (one descriptor each, twice while " +
         "they are imported, and more for its clients): raise it where the server starts (ulimit -n in the shell of the job "
         "that starts it on demand, whose limit it inherits; LimitNOFILE= in deploy/systemd/vramswapd@.service), then restart it";
}

// The frames' descriptors from a rejoining member, the ones it was given and kept, and the host
// pool's memfd; imported here (for scrubbing) and kept (for newcomers), as build_pool's are.
int pool_server::receive_frames(int fd) noexcept {
  using namespace pool_protocol;
  std::vector<frame_id> got;
  std::vector<int> kept;
  fd_guard memfd;
  int rc = ok;
  try {
    got.reserve(frame_count_);
    kept.reserve(frame_count_);
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "vramswapd: out of host memory");
  }
  int fds[k_max_fds_per_message];
  while (rc == ok && got.size() < frame_count_) {
    frame_batch b{};
    size_t len = 0;
    size_t n = 0;
    rc = recv_fds(fd, fds, k_max_fds_per_message, &n, &b, sizeof b, &len);
    if (rc != ok) {
      rc = add_context(rc, "receiving frames %zu.. of %u: ", got.size(), frame_count_);
      break;
    }
    if (len != sizeof b || b.first != got.size() || b.count != n || n == 0 || got.size() + n > frame_count_) {
      rc = fail(err_version_mismatch, "a malformed frame batch (first %u, count %u, %zu descriptors; expected first %zu of %u)", b.first,
                b.count, n, got.size(), frame_count_);
    }
    for (size_t i = 0; i < n; ++i) {
      frame_id id = 0;
      if (rc == ok) rc = add_context(be_->import_frame(device_, fds[i], frame_size_, &id), "importing frame %zu: ", got.size());
      if (rc == ok) {
        got.push_back(id);
        kept.push_back(fds[i]);
      } else {
        ::close(fds[i]);
      }
    }
  }
  if (rc == ok && host_slots_ > 0) {
    host_pool hp{};
    size_t len = 0;
    size_t n = 0;
    rc = add_context(recv_fds(fd, fds, k_max_fds_per_message, &n, &hp, sizeof hp, &len), "receiving the host pool: ");
    if (rc == ok) {
      memfd.fd = n >= 1 ? fds[0] : -1;
      for (size_t i = 1; i < n; ++i) ::close(fds[i]);
      const uint64_t bytes = uint64_t{host_slots_} * frame_size_;
      struct stat st {};
      if (len != sizeof hp || n != 1 || hp.bytes != bytes || hp.slot_count != host_slots_ || ::fstat(memfd.fd, &st) != 0 ||
          static_cast<uint64_t>(st.st_size) != bytes) {
        rc = fail(err_version_mismatch, "a malformed host pool message (%zu bytes, %zu descriptors, %" PRIu64 " bytes; the pool has %u slots of %s)",
                  len, n, hp.bytes, host_slots_, human_size(frame_size_).c_str());
      }
    }
  }
  if (rc != ok) {
    for (frame_id f : got) be_->release_frame(f);
    for (int k : kept) ::close(k);
    return rc;
  }
  frames_ = std::move(got);
  exported_ = std::move(kept);
  host_pool_fd_ = memfd.release();
  return ok;
}

void pool_server::tend_adoption(uint64_t now) noexcept {
  for (client& c : clients_) {
    if (c.orphan && c.hung_up_ns == 0 && !segment_->member_leased(c.member)) {
      c.hung_up_ns = now;
      log(log_level::info, "vramswapd: member %u (pid %d) ended before it rejoined; repaired %s", c.member, static_cast<int>(c.pid),
          frames_.empty() ? "once a member hands over the frames" : "now");
    }
  }
  if (frames_.empty()) {
    // Every member gone: the frames' memory went with the last one, and nobody owns anything.
    const uint64_t grace = uint64_t{k_repair_grace_ms} * 1'000'000;
    const bool all_gone = std::all_of(clients_.begin(), clients_.end(), [&](const client& c) {
      return c.hung_up_ns != 0 && (client_exited(c) || now - c.hung_up_ns >= grace);
    });
    if (all_gone && rebuild_pool() != ok) {
      const std::string why = last_error();
      log(log_level::error, "vramswapd: cannot build the pool anew: %s; stopping", why.c_str());
      for (newcomer& n : waiting_) {
        refuse(n.fd, err_unavailable, "the pool server (pid %d) could not build its pool anew: %s", static_cast<int>(::getpid()), why.c_str());
        if (n.pidfd >= 0) ::close(n.pidfd);
      }
      waiting_.clear();
      request_stop();
      return;
    }
  }
  if (!frames_.empty()) {
    std::vector<newcomer> ready;
    ready.swap(waiting_);
    for (const newcomer& n : ready) welcome_newcomer(n.fd, n.hello, n.peer_pid, n.pidfd);
    return;
  }
  for (size_t i = 0; i < waiting_.size();) {
    newcomer& n = waiting_[i];
    if (now < n.since_ns + uint64_t{pool_protocol::k_adopt_wait_ms} * 1'000'000) {
      ++i;
      continue;
    }
    std::vector<uint32_t> pids;
    for (const client& c : clients_) {
      if (c.hung_up_ns == 0) pids.push_back(static_cast<uint32_t>(c.pid));
    }
    refuse(n.fd, err_unavailable,
           "the pool server (pid %d) adopted the running pool of device %d and waits for one of its members (pid %s) to rejoin "
           "and hand over the frames; none has in %d s (stopped? a debugger?). Try again when they run, or when they have ended",
           static_cast<int>(::getpid()), device_, pids_of(pids).c_str(), pool_protocol::k_adopt_wait_ms / 1000);
    if (n.pidfd >= 0) ::close(n.pidfd);
    waiting_.erase(waiting_.begin() + static_cast<ptrdiff_t>(i));
  }
}

int pool_server::rebuild_pool() noexcept {
  log(log_level::info,
      "vramswapd: every member of the adopted pool ended before one rejoined, and its frames went with them: building the "
      "pool anew (%u frames of %s)", frame_count_, human_size(frame_size_).c_str());
  for (client& c : clients_) {
    if (c.pidfd >= 0) ::close(c.pidfd);
  }
  clients_.clear();
  VS_TRY(build_pool(uint64_t{frame_count_} * frame_size_));
  if (host_slots_ > 0) VS_TRY(build_host_pool(uint64_t{host_slots_} * frame_size_));
  segment_->reset_tables();
  adopted_ = false;
  return ok;
}
}  // namespace vramswap::detail
