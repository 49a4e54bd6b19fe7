#include "pool/pool_frame_source.hpp"

#include <cstring>

#include <algorithm>
#include <cinttypes>
#include <string>

#include "core/status.hpp"
#include "lock/futex.hpp"
#include "lock/process_identity.hpp"
#include "lock/wait_bounds.hpp"
#include "pool/victim_order.hpp"

namespace vramswap::detail {
using namespace pool_layout;

namespace {
constexpr uint64_t k_wait_slice_ns = 10'000'000;  // re-check timeouts and the server this often
}

pool_frame_source::pool_frame_source(pool_segment& pool, uint32_t me, std::vector<frame_id> local, uint64_t evict_timeout_ns,
                                     std::function<bool()> pool_alive)
    : pool_(pool), me_(me), view_(pool, me, std::move(local)), evict_timeout_ns_(evict_timeout_ns),
      pool_alive_(std::move(pool_alive)) {}

int pool_frame_source::prepare(int, size_t count) {
  const uint32_t n = pool_.frame_count();
  uint32_t free_now = 0, mine = 0, asked = 0;
  for (uint32_t f = 0; f < n; ++f) {
    const frame_word w = frame_word::decode(pool_.read(f));
    if (w.state == frame_free) ++free_now;
    if (w.owner == me_ && w.state != frame_free) ++mine;
    // Frames asked of their owners, by us or by a member that asked ahead of its acquire
    // (ask_ahead): they come free, and we take whatever is free first.
    if (w.state == frame_requested && w.owner != me_) ++asked;
  }
  if (count > n - mine) {
    return fail(err_out_of_memory,
                "acquire: this process needs %zu more frame(s) of %" PRIu64 " MiB but the pool has %u in all, %u of them already "
                "this process's: its memory does not fit the pool (VRAMSWAP_POOL_SIZE sets the pool's size)",
                count, pool_.frame_size() >> 20, n, mine);
  }
  if (free_now + asked >= count) return ok;
  const uint32_t shortfall = static_cast<uint32_t>(count) - free_now - asked;
  victim_order::options o;
  o.me = me_;
  const uint32_t got = ask_in_order(victim_order::order(pool_, monotonic_ns(), o), shortfall);
  asked_at_acquire_.fetch_add(got, std::memory_order_relaxed);
  // Any shortfall left is frames that others hold active (a holder that died and is being
  // repaired): take() waits for them, within the timeout.
  return ok;
}

uint32_t pool_frame_source::ask_in_order(const std::vector<uint32_t>& frames, uint32_t wanted) {
  uint32_t got = 0;
  std::vector<uint32_t> owners_to_wake;
  for (uint32_t f : frames) {
    if (got == wanted) break;
    uint64_t raw = pool_.read(f);
    const frame_word w = frame_word::decode(raw);
    if ((w.state != frame_idle && w.state != frame_lent) || w.owner == me_) continue;  // moved since the scan
    if (!pool_.move(f, raw, frame_requested, w.owner, me_)) continue;
    ++got;
    if (std::find(owners_to_wake.begin(), owners_to_wake.end(), w.owner) == owners_to_wake.end()) owners_to_wake.push_back(w.owner);
  }
  for (uint32_t owner : owners_to_wake) pool_.notify_member(owner);
  return got;
}

uint32_t pool_frame_source::ask_ahead(size_t need, uint64_t now_ns) {
  if (need == 0) return 0;
  const victim_order::mean_gap_of_members others = victim_order::mean_gap(pool_);
  const victim_order::prediction mine = victim_order::predict(pool_, me_, now_ns, others);
  // Predicted by the others' mean gap (we have no gap of our own, or one while another member
  // has a rhythm), or at our release while nobody has a gap: in the first turns of jobs that
  // take turns this is their order (the one that released first comes back first). It is
  // trusted for one gap only: a member overdue by more than the mean gap is not keeping the
  // others' rhythm (a job that has finished its work but lives on), and its asks would evict
  // the live jobs' memory on every turn. While nobody has a gap the rule holds until one
  // does, after a turn or two.
  const bool by_fallback = !mine.at_lock && !mine.from_history;
  const bool overdue = others.ns > 0 && now_ns > mine.next_ns + others.ns;
  if (by_fallback && (mine.released_ns == 0 || overdue)) return 0;
  // Are we next? Nobody else may be bringing memory in (a holder that still needs frames has
  // them first), and every other member must be predicted to acquire after us.
  for (uint32_t m = 0; m < k_member_count; ++m) {
    if (m == me_) continue;
    const member_slot& s = pool_.member(m);
    if (s.state.load(std::memory_order_acquire) != member_live) continue;
    const uint32_t phase = s.phase.load(std::memory_order_relaxed);
    if (phase == phase_restoring) return 0;
    if (phase == phase_running) continue;  // the holder, its memory in: it needs no more
    const victim_order::prediction p = victim_order::predict(pool_, m, now_ns, others);
    // Waiting for the lock, we come before every member not at it, which would queue behind
    // us; without history an idle member is predicted back at its release, which would
    // otherwise keep a queued member from asking ahead until the jobs have a rhythm.
    if (mine.at_lock && !p.at_lock) continue;
    if (p.next_ns < mine.next_ns || (p.next_ns == mine.next_ns && m < me_)) return 0;
  }
  uint32_t free_now = 0, asked = 0;
  for (uint32_t f = 0; f < pool_.frame_count(); ++f) {
    const frame_word w = frame_word::decode(pool_.read(f));
    if (w.state == frame_free) ++free_now;
    if (w.state == frame_requested) {
      // Someone else's request in flight: theirs to finish (a holder's, or another member
      // that thought itself next); never two at once.
      if (w.requester != me_) return 0;
      ++asked;
    }
  }
  if (free_now + asked >= need) return 0;
  victim_order::options o;
  o.me = me_;
  o.only_after_ns = mine.next_ns;  // never the frames of a member that comes before us
  o.asker_queued = mine.at_lock;
  // Frames lent to an oversubscribed job only for a turn that is sure to come: that job moves
  // its pages back into free frames after a quiet second, so frames taken from it for a
  // predicted turn would go back and forth, its launch gate closing each time, for as long
  // as the prediction stands (indefinitely for a member that never comes).
  o.lent = mine.at_lock;
  const uint32_t got = ask_in_order(victim_order::order(pool_, now_ns, o), static_cast<uint32_t>(need - free_now - asked));
  asked_ahead_.fetch_add(got, std::memory_order_relaxed);
  return got;
}

int pool_frame_source::take(int device, size_t size, frame_id* out) {
  if (size != pool_.frame_size()) {
    return fail(err_invalid_argument, "pool: a %zu-byte frame was asked for; this pool's frames are %" PRIu64 " bytes", size,
                pool_.frame_size());
  }
  const uint64_t start = monotonic_ns();
  bool signal_ran = false;
  for (;;) {
    // Read the futex word before scanning, so a frame freed after the scan wakes us.
    const uint32_t seen = pool_.header()->frames_freed.load(std::memory_order_acquire);
    if (view_.take_free(frame_active, out)) return ok;
    const uint64_t waited = monotonic_ns() - start;
    if (waited >= evict_timeout_ns_) return timed_out_error(waited, "VRAMSWAP_EVICT_TIMEOUT");
    // An acquire's timeout and Ctrl-C bound this wait too (lock/wait_bounds.hpp): the frames
    // an acquire needs after its grant are part of the call its caller timed.
    if (const int stop = wait_may_go_on(signal_ran, "other processes to give back the pool frames this process needs");
        stop != ok) {
      return stop == err_timeout ? timed_out_error(waited, "the acquire's timeout") : stop;
    }
    if (pool_alive_ && !pool_alive_()) {
      return fail(err_unavailable, "pool: this process's pool is gone (its pool server, pid %d, ended, and the next server did "
                  "not take this process back: its log says why) while it waited for a frame; restart the job",
                  pool_.header()->server_pid);
    }
    // Nothing free and nothing asked for (e.g. our earlier requests were served to someone
    // else): ask again for one more.
    if (!view_.asked_by_me()) VS_TRY(prepare(device, 1));
    const uint64_t slice_ns = std::min<uint64_t>(k_wait_slice_ns, static_cast<uint64_t>(wait_slice_ms(10)) * 1'000'000);
    signal_ran = slice_ns > 0 && futex_wait(&pool_.header()->frames_freed, seen, slice_ns) == EINTR;
  }
}

int pool_frame_source::try_take(int device, size_t size, frame_id* out) {
  if (size != pool_.frame_size()) return take(device, size, out);  // the same error
  if (!view_.take_free(frame_active, out)) return err_busy;  // a hint to the caller, not an error: no detail
  return ok;
}

int pool_frame_source::try_take_not_resident(int device, size_t size, frame_id* out) {
  if (size != pool_.frame_size()) return take(device, size, out);  // the same error
  uint32_t f = 0;
  if (!view_.take_free(frame_idle, out, &f)) {
    return fail(err_busy, "pool: no free frame among its %u of %" PRIu64 " MiB (%u of them this process's)", pool_.frame_count(),
                pool_.frame_size() >> 20, view_.owned());
  }
  // A hint, after the state: a holder that reads the stale stamp in between only orders it
  // differently among the idle frames it may ask for.
  pool_.frame(f).last_use.store(pool_.header()->clock.fetch_add(1, std::memory_order_acq_rel) + 1, std::memory_order_relaxed);
  return ok;
}

int pool_frame_source::timed_out_error(uint64_t waited_ns, const char* bound) const {
  // An owner cannot evict while the shared host pool has no slot for the pages: say so.
  std::string host_pool;
  if (pool_.host_slot_count() > 0 && pool_.count_slots(slot_free) + pool_.count_slots(slot_dirty) == 0) {
    host_pool = " The shared host pool (VRAMSWAP_HOST_POOL, " + std::to_string(pool_.host_slot_count()) +
                " slots) is full, so the owner has nowhere to save the pages: the host pool must hold what all processes of this "
                "device save at once (their memory less the device pool) plus slack; raise VRAMSWAP_HOST_POOL and restart "
                "vramswapd.";
  }
  for (uint32_t f = 0; f < pool_.frame_count(); ++f) {
    const frame_word w = frame_word::decode(pool_.read(f));
    if (w.state == frame_requested && w.requester == me_) {
      const member_slot& owner = pool_.member(w.owner);
      // Only a low-priority member holds lent frames, and it never holds idle or active ones.
      const bool low_priority = pool_.count(frame_lent, w.owner) > 0 ||
                                pool_.count(frame_idle, w.owner) + pool_.count(frame_active, w.owner) == 0;
      // An owner whose eviction failed says why in its slot.
      const int32_t failed = owner.evict_status.load(std::memory_order_acquire);
      if (failed != ok) {
        char why[sizeof owner.evict_error];
        std::memcpy(why, owner.evict_error, sizeof why);
        why[sizeof why - 1] = '\0';
        const uint64_t at = owner.evict_failed_ns.load(std::memory_order_relaxed);
        const uint64_t now = monotonic_ns();
        const double ago = now > at ? (now - at) / 1e9 : 0.0;
        if (low_priority) {
          return fail(err_timeout,
                      "pool: process %d (pool member %u), a low-priority job (VRAMSWAP_OVERSUBSCRIBE=1), could not move the "
                      "pages of frame %u to host memory: its last try failed %.1f s ago (%s: %s); it runs on with them and tries "
                      "again every second, and no frame of it was taken in %.1f s (%s). Fix what its error "
                      "names (at its VRAMSWAP_OVERSUBSCRIBE_LIMIT: raise it), or run this job when it has ended; its log has "
                      "the whole error",
                      owner.pid, w.owner, f, ago, status_name(failed), why, waited_ns / 1e9, bound);
        }
        return fail(err_timeout,
                    "pool: process %d (pool member %u) could not evict frame %u: its eviction failed %.1f s ago (%s: %s); it "
                    "keeps its pages resident and tries again every second, and no frame of it was taken in %.1f s "
                    "(%s). Fix what its error names (for a full swap disk: free space in its "
                    "VRAMSWAP_SWAP_DIR, or give it more VRAMSWAP_HOST_LIMIT), or ask again when it has exited; its log has the "
                    "whole error",
                    owner.pid, w.owner, f, ago, status_name(failed), why, waited_ns / 1e9, bound);
      }
      // Without a published failure (none yet, or one the job could not publish), its limit
      // is the likely cause.
      if (low_priority && host_pool.empty()) {
        return fail(err_timeout,
                    "pool: process %d (pool member %u), a low-priority job (VRAMSWAP_OVERSUBSCRIBE=1), did not move the pages "
                    "of frame %u to host memory within %.1f s (%s); its frames were not taken. It is "
                    "probably at its VRAMSWAP_OVERSUBSCRIBE_LIMIT or out of host memory (its log says which): raise its limit, "
                    "or run this job when it has ended",
                    owner.pid, w.owner, f, waited_ns / 1e9, bound);
      }
      // An owner that exited while processes it forked hold its connection (and its GPU
      // context) keeps its frames until they exit; its pool server names them.
      if (visible_here(owner.pid_ns) && check_liveness({owner.pid, owner.start_time}) == liveness::dead) {
        return fail(err_timeout,
                    "pool: process %d (pool member %u), which owns frame %u, has exited, but its frames are not back in the "
                    "pool after %.1f s (%s). Its pool server frees them once no process holds its GPU "
                    "context: processes it forked without exec (DataLoader workers, a multiprocessing pool) still do, or the "
                    "server is not running. The server's log (in %s) names them; stop them, or start such helpers with the "
                    "spawn start method",
                    owner.pid, w.owner, f, waited_ns / 1e9, bound, pool_.header()->server_runtime_dir);
      }
      return fail(err_timeout,
                  "pool: process %d (pool member %u) did not evict frame %u within %.1f s (%s); its frames "
                  "were not taken. %s",
                  owner.pid, w.owner, f, waited_ns / 1e9, bound,
                  host_pool.empty() ? "Is it stopped (SIGSTOP, a debugger) or stuck in a driver call?" : host_pool.c_str() + 1);
    }
  }
  // No frame asked for is late: others hold theirs active. A member that holds active frames
  // without the lock keeps its memory resident (keep_resident) until it sleeps: name them.
  std::string awake;
  for (uint32_t m = 0; m < k_member_count; ++m) {
    if (m == me_) continue;
    const member_slot& s = pool_.member(m);
    if (s.state.load(std::memory_order_acquire) != member_live || s.holding.load(std::memory_order_relaxed) != 0) continue;
    const uint32_t active = pool_.count(frame_active, m);
    if (active == 0) continue;
    awake += (awake.empty() ? "" : ", ") + std::string("process ") + std::to_string(s.pid) + " (" + std::to_string(active) + " frames)";
  }
  if (!awake.empty()) {
    const char* verb_s = awake.find(',') == std::string::npos ? "s" : "";  // one process, or several
    return fail(err_timeout,
                "pool: no frame became free within %.1f s (%s): %s keep%s its memory resident without the lock and give%s "
                "its frames back only when it sleeps its memory (vramswap.sleep, torch_memory_saver.pause); put it to sleep "
                "first, or give this process more time (VRAMSWAP_EVICT_TIMEOUT)",
                waited_ns / 1e9, bound, awake.c_str(), verb_s, verb_s);
  }
  return fail(err_timeout, "pool: no frame became free within %.1f s (%s): other processes hold the pool's frames",
              waited_ns / 1e9, bound);
}

int pool_frame_source::give_back(frame_id frame) {
  uint32_t index = 0;
  if (!view_.index_of(frame, &index)) return fail(err_invalid_argument, "pool: frame %" PRIu64 " is not a pool frame", frame);
  return pool_.give_back(index, me_);
}

void pool_frame_source::reclaim_own() {
  for (uint32_t f = 0; f < pool_.frame_count(); ++f) {
    for (;;) {
      uint64_t raw = pool_.read(f);
      const frame_word w = frame_word::decode(raw);
      if (w.owner != me_ || (w.state != frame_idle && w.state != frame_requested)) break;
      if (pool_.move(f, raw, frame_active, me_, k_no_member)) break;
    }
  }
}

void pool_frame_source::release_own() {
  const uint64_t stamp = pool_.header()->clock.fetch_add(1, std::memory_order_acq_rel) + 1;
  for (uint32_t f = 0; f < pool_.frame_count(); ++f) {
    for (;;) {
      uint64_t raw = pool_.read(f);
      const frame_word w = frame_word::decode(raw);
      if (w.owner != me_ || w.state != frame_active) break;
      pool_.frame(f).last_use.store(stamp, std::memory_order_relaxed);  // hint first, then the state
      if (pool_.move(f, raw, frame_idle, me_, k_no_member)) break;
    }
  }
}

}  // namespace vramswap::detail
