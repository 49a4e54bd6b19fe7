// member_observer: what a session publishes about itself for observers.
//
// A device session reports its phase, its statistics and its trace events through this
// class into its member slot and trace ring of the pool segment (pool/pool_layout.hpp), where
// `vramswap status`, `vramswap trace` and the pool server's metrics endpoint read them. Each
// call is a handful of relaxed atomic stores plus, for events, one record appended to the
// ring: called at acquire, release and each served eviction, never per allocation or per
// page. Debug-level log lines go with the events (one comparison when debug is off).
#pragma once

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/log.hpp"
#include "lock/device_lock.hpp"
#include "pool/pool_layout.hpp"
#include "pool/pool_segment.hpp"

namespace vramswap::detail {

class member_observer {
 public:
  member_observer(pool_segment& pool, uint32_t member) noexcept : pool_(pool), member_(member), slot_(pool.member(member)) {}

  // Who this process is, for observers that cannot read its environment or its /proc
  // (pool/pool_layout.hpp, member_slot's last lines): once, when it joins.
  void identify(uint32_t uid, const std::string& job_name, const std::string& command) noexcept {
    slot_.uid = uid;
    copy_cut(slot_.job_name, sizeof slot_.job_name, job_name);
    copy_cut(slot_.command, sizeof slot_.command, command);
    slot_.identity.store(1, std::memory_order_release);
  }
  // What predicts this member's next acquire (pool/victim_order.hpp), zeroed when it joins:
  // the server zeroes only the fields it knows.
  void reset_prediction() noexcept {
    slot_.released_ns.store(0, std::memory_order_relaxed);
    slot_.asked_ns.store(0, std::memory_order_relaxed);
    slot_.idle_gap_ns.store(0, std::memory_order_relaxed);
    slot_.idle_gaps.store(0, std::memory_order_relaxed);
    slot_.frames_asked_ahead.store(0, std::memory_order_relaxed);
    slot_.frames_asked_at_acquire.store(0, std::memory_order_relaxed);
  }
  // acquire() called (not a re-entry). The gap since the last release updates the moving
  // mean of idle gaps (weight 1/2: a job whose rhythm changes is followed within a few turns).
  // The first gap follows the member's first turn, which is most often its setup (building a
  // model, loading data) rather than its rhythm: the second gap replaces it instead of being
  // averaged with it.
  void asked(lock_priority priority, uint64_t ns) noexcept {
    const uint64_t released = slot_.released_ns.load(std::memory_order_relaxed);
    if (released != 0 && ns >= released) {
      const uint64_t gap = ns - released;
      const uint32_t gaps = slot_.idle_gaps.load(std::memory_order_relaxed);
      const uint64_t mean = gaps < 2 ? gap : (slot_.idle_gap_ns.load(std::memory_order_relaxed) + gap) / 2;
      slot_.idle_gap_ns.store(mean, std::memory_order_relaxed);
      if (gaps < UINT32_MAX) slot_.idle_gaps.store(gaps + 1, std::memory_order_relaxed);
    }
    slot_.asked_ns.store(ns, std::memory_order_relaxed);
    slot_.phase.store(pool_layout::phase_waiting, std::memory_order_relaxed);
    pool_.trace(member_, pool_layout::trace_asked, ns, 0, 0, static_cast<uint64_t>(priority));
  }
  // The lock was not granted (timeout, error).
  void gave_up() noexcept { slot_.phase.store(pool_layout::phase_idle, std::memory_order_relaxed); }
  // The lock is ours; memory is about to be brought in.
  void granted(lock_priority priority, uint64_t asked_ns, uint64_t granted_ns) noexcept {
    slot_.holding_since_ns.store(granted_ns, std::memory_order_relaxed);
    slot_.phase.store(pool_layout::phase_restoring, std::memory_order_relaxed);
    slot_.lock_wait_ns.fetch_add(granted_ns - asked_ns, std::memory_order_relaxed);
    pool_.trace(member_, pool_layout::trace_granted, asked_ns, granted_ns - asked_ns, 0, static_cast<uint64_t>(priority));
    log(log_level::debug, "acquire: lock granted after %.3f ms", (granted_ns - asked_ns) / 1e6);
  }
  // Memory resident after `bytes_in` bytes were copied in.
  void resident(uint64_t granted_ns, uint64_t resident_ns, uint64_t bytes_in) noexcept {
    slot_.acquires.fetch_add(1, std::memory_order_relaxed);
    slot_.bytes_in.fetch_add(bytes_in, std::memory_order_relaxed);
    slot_.restore_ns.fetch_add(resident_ns - granted_ns, std::memory_order_relaxed);
    if (bytes_in > 0) slot_.swaps_in.fetch_add(1, std::memory_order_relaxed);
    slot_.phase.store(pool_layout::phase_running, std::memory_order_relaxed);
    pool_.trace(member_, pool_layout::trace_resident, granted_ns, resident_ns - granted_ns, bytes_in, 0);
    log(log_level::debug, "acquire: memory resident, %" PRIu64 " bytes brought in in %.3f ms", bytes_in,
        (resident_ns - granted_ns) / 1e6);
  }
  // Bringing memory in failed; the lock is released again.
  void restore_failed() noexcept {
    slot_.holding_since_ns.store(0, std::memory_order_relaxed);
    slot_.phase.store(pool_layout::phase_idle, std::memory_order_relaxed);
  }
  // About to hand the lock on at `unlock_ns`, after evicting `bytes_out` bytes (eager or
  // strict release) from `evict_start_ns`.
  void released(uint64_t evict_start_ns, uint64_t unlock_ns, uint64_t bytes_out) noexcept {
    const uint64_t since = slot_.holding_since_ns.load(std::memory_order_relaxed);
    if (bytes_out > 0) {
      slot_.bytes_out.fetch_add(bytes_out, std::memory_order_relaxed);
      slot_.evict_ns.fetch_add(unlock_ns - evict_start_ns, std::memory_order_relaxed);
    }
    slot_.holding_since_ns.store(0, std::memory_order_relaxed);
    slot_.released_ns.store(unlock_ns, std::memory_order_relaxed);
    slot_.phase.store(pool_layout::phase_idle, std::memory_order_relaxed);
    pool_.trace(member_, pool_layout::trace_released, since, since != 0 ? unlock_ns - since : 0, bytes_out, 0);
    log(log_level::debug, "release: held %.3f ms; %" PRIu64 " bytes evicted at release", since != 0 ? (unlock_ns - since) / 1e6 : 0.0,
        bytes_out);
  }
  // `frames` frames evicted at other processes' request.
  void evicted(uint64_t start_ns, uint64_t end_ns, uint64_t bytes_out, uint64_t frames) noexcept {
    slot_.evictions_served.fetch_add(frames, std::memory_order_relaxed);
    slot_.bytes_out.fetch_add(bytes_out, std::memory_order_relaxed);
    slot_.evict_ns.fetch_add(end_ns - start_ns, std::memory_order_relaxed);
    pool_.trace(member_, pool_layout::trace_evicted, start_ns, end_ns - start_ns, bytes_out, frames);
    log(log_level::debug, "evicted %" PRIu64 " frame(s) for another process: %" PRIu64 " bytes in %.3f ms", frames, bytes_out,
        (end_ns - start_ns) / 1e6);
  }
  // An eviction other processes asked for failed with `status`: published for the lock
  // holder that waits on it (its timeout error quotes it), until evict_succeeded().
  void evict_failed(int status, const char* detail, uint64_t ns) noexcept {
    slot_.evict_status.store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    // Too long for the slot: the start says what failed and the end why (the innermost
    // cause, with what to do): both are kept, the middle cut.
    constexpr size_t cap = sizeof slot_.evict_error;
    constexpr size_t head = 60;
    constexpr char cut[] = " ... ";
    const size_t n = std::strlen(detail);
    if (n < cap) {
      std::memcpy(slot_.evict_error, detail, n + 1);
    } else {
      const size_t tail = cap - 1 - head - (sizeof cut - 1);
      std::memcpy(slot_.evict_error, detail, head);
      std::memcpy(slot_.evict_error + head, cut, sizeof cut - 1);
      std::memcpy(slot_.evict_error + head + sizeof cut - 1, detail + n - tail, tail);
      slot_.evict_error[cap - 1] = '\0';
    }
    slot_.evict_failed_ns.store(ns, std::memory_order_relaxed);
    slot_.evict_status.store(status, std::memory_order_release);
  }
  void evict_succeeded() noexcept { slot_.evict_status.store(0, std::memory_order_release); }
  // Frames this member asked others for, ahead of its acquires and during them (totals).
  void asked_frames(uint64_t ahead, uint64_t at_acquire) noexcept {
    slot_.frames_asked_ahead.store(ahead, std::memory_order_relaxed);
    slot_.frames_asked_at_acquire.store(at_acquire, std::memory_order_relaxed);
  }
  // Device memory this process got past vramswap, changed by `delta` bytes.
  void outside_pool(int64_t delta) noexcept {
    slot_.outside_pool_bytes.fetch_add(static_cast<uint64_t>(delta), std::memory_order_relaxed);
  }
  // Where this process's saved pages are now, and the host memory it pinned of its own.
  void stored(uint64_t host_bytes, uint64_t disk_bytes, uint64_t pinned_bytes) noexcept {
    slot_.host_bytes.store(host_bytes, std::memory_order_relaxed);
    slot_.disk_bytes.store(disk_bytes, std::memory_order_relaxed);
    slot_.host_pinned_bytes.store(pinned_bytes, std::memory_order_relaxed);
  }

 private:
  // NUL-terminated, cut to fit without splitting a UTF-8 character.
  static void copy_cut(char* to, size_t size, const std::string& from) noexcept {
    size_t n = std::min(from.size(), size - 1);
    while (n > 0 && n < from.size() && (static_cast<unsigned char>(from[n]) & 0xC0) == 0x80) --n;
    std::memcpy(to, from.data(), n);
    to[n] = '\0';
  }

  pool_segment& pool_;
  uint32_t member_;
  pool_layout::member_slot& slot_;
};

}  // namespace vramswap::detail
