// A backend that forwards every call to a real one and fails the n-th call of a chosen
// operation: the fault layer through which tests walk a failure across every step of an
// eviction or a restore. An operation that queues work fails before it reaches the real
// backend (nothing is queued); a wait (a synchronize, an event query) waits for real, then
// reports the failure, as a driver reports an asynchronous error. Either way the call
// returns err_cuda with a detail that names the operation and its ordinal.
//
// It keeps the checked entry points' books of its own (backend's public face validates
// every call against them), and the real backend keeps its own: the two agree because every
// call goes through both.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>

#include "core/backend.hpp"
#include "core/status.hpp"

namespace vramswap::detail::test {

enum class fault_op : unsigned {
  map,
  unmap,
  set_access,
  stream_synchronize,
  copy_d2h,
  copy_h2d,
  memset_d8,
  event_record,
  event_synchronize,
  event_query,
  device_synchronize,
  copy_d2d,
  host_register,
  count_
};

inline const char* fault_op_name(fault_op op) {
  static const char* const names[] = {"map",          "unmap",           "set_access",        "stream_synchronize",
                                      "copy_d2h",     "copy_h2d",        "memset_d8",         "event_record",
                                      "event_synchronize", "event_query", "device_synchronize", "copy_d2d",
                                      "host_register"};
  return names[static_cast<unsigned>(op)];
}

class faulty_backend final : public backend {
 public:
  explicit faulty_backend(backend& real) : backend(real.kind()), real_(real) {}

  // Fail the n-th (0-based, counted from now) call of `op`; disarm() stops injecting.
  void fail_at(fault_op op, uint64_t n) {
    for (auto& c : calls_) c.store(0);
    armed_op_ = op;
    armed_n_ = n;
    armed_ = true;
    every_ = false;
    second_ = false;
    fired_ = false;
    second_fired_ = false;
  }
  // Fail every call of `op` from the n-th on (host memory that stays unpinnable).
  void fail_from(fault_op op, uint64_t n) {
    fail_at(op, n);
    every_ = true;
  }
  // With fail_at, a second fault: the first call of `op` after the first fault fired fails
  // too (a failure met while undoing the first).
  void then_fail(fault_op op) {
    second_op_ = op;
    second_ = true;
  }
  void disarm() {
    armed_ = false;
    every_ = false;
    second_ = false;
  }
  // The host backend captures no CUDA graph: from now on, application stream `app_stream`
  // is reported as being captured (0: none), as cuStreamIsCapturing would during a capture.
  void set_capturing(uintptr_t app_stream) { capturing_.store(app_stream); }
  bool fired() const { return fired_; }
  bool second_fired() const { return second_fired_; }
  // Calls of `op` since the last fail_at() (or count_calls()).
  uint64_t calls(fault_op op) const { return calls_[static_cast<unsigned>(op)].load(); }
  void count_calls() {
    for (auto& c : calls_) c.store(0);
    granted_bytes_.store(0);
    armed_ = false;
  }
  // Bytes set_access was asked to grant since the last count_calls() (what a grant costs
  // grows with them).
  uint64_t granted_bytes() const { return granted_bytes_.load(); }

 private:
  // The fault, or ok: every wrapped entry point asks first.
  int inject(fault_op op) {
    const uint64_t nth = calls_[static_cast<unsigned>(op)].fetch_add(1);
    if (armed_ && second_ && fired_ && !second_fired_ && op == second_op_) {
      second_fired_ = true;
      return fail(err_cuda, "injected second fault: %s call #%llu failed", fault_op_name(op), static_cast<unsigned long long>(nth));
    }
    if (!armed_ || op != armed_op_ || nth < armed_n_ || (!every_ && nth != armed_n_)) return ok;
    fired_ = true;
    return fail(err_cuda, "injected fault: %s call #%llu failed", fault_op_name(op), static_cast<unsigned long long>(nth));
  }

  int do_device_count(int* count) override { return real_.device_count(count); }
  int do_device_info(int device, device_info* out) override { return real_.get_device_info(device, out); }
  int do_reserve(int device, size_t size, size_t alignment, device_ptr* out) override {
    return real_.reserve(device, size, alignment, out);
  }
  int do_unreserve(int, device_ptr va, size_t size) override { return real_.unreserve(va, size); }
  int do_create_frame(int device, size_t size, frame_id* out) override { return real_.create_frame(device, size, out); }
  int do_create_host_frame(int device, size_t size, frame_id* out) override { return real_.create_host_frame(device, size, out); }
  int do_export_frame(frame_id frame, int* fd_out) override { return real_.export_frame(frame, fd_out); }
  int do_import_frame(int device, int fd, size_t size, frame_id* out) override { return real_.import_frame(device, fd, size, out); }
  int do_release_frame(frame_id frame) override { return real_.release_frame(frame); }
  int do_map(int, device_ptr va, size_t size, frame_id frame, size_t offset) override {
    VS_TRY(inject(fault_op::map));
    return real_.map(va, size, frame, offset);
  }
  int do_unmap(int, device_ptr va, size_t size) override {
    VS_TRY(inject(fault_op::unmap));
    return real_.unmap(va, size);
  }
  int do_set_access(int, device_ptr va, size_t size, access_flags flags) override {
    VS_TRY(inject(fault_op::set_access));
    granted_bytes_.fetch_add(size);
    return real_.set_access(va, size, flags);
  }
  int do_host_alloc(size_t size, void** out) override { return real_.host_alloc(size, out); }
  int do_host_free(void* ptr, size_t) override { return real_.host_free(ptr); }
  int do_host_register(void* ptr, size_t size) override {
    VS_TRY(inject(fault_op::host_register));
    return real_.host_register(ptr, size);
  }
  int do_host_unregister(void* ptr, size_t) override { return real_.host_unregister(ptr); }
  int do_stream_create(int device, stream_id* out) override { return real_.stream_create(device, out); }
  int do_stream_destroy(stream_id stream) override { return real_.stream_destroy(stream); }
  int do_stream_synchronize(stream_id stream) override {
    VS_TRY(real_.stream_synchronize(stream));
    return inject(fault_op::stream_synchronize);
  }
  int do_copy_d2h(int, void* dst, device_ptr src, size_t size, stream_id stream) override {
    VS_TRY(inject(fault_op::copy_d2h));
    return real_.copy_d2h(dst, src, size, stream);
  }
  int do_copy_h2d(int, device_ptr dst, const void* src, size_t size, stream_id stream) override {
    VS_TRY(inject(fault_op::copy_h2d));
    return real_.copy_h2d(dst, src, size, stream);
  }
  int do_memset_d8(int, device_ptr dst, uint8_t value, size_t size, stream_id stream) override {
    VS_TRY(inject(fault_op::memset_d8));
    return real_.memset_d8(dst, value, size, stream);
  }
  int do_copy_d2d(int, device_ptr dst, device_ptr src, size_t size, stream_id stream) override {
    VS_TRY(inject(fault_op::copy_d2d));
    return real_.copy_d2d(dst, src, size, stream);
  }
  int do_event_create(int device, event_id* out) override { return real_.event_create(device, out); }
  int do_event_destroy(event_id event) override { return real_.event_destroy(event); }
  int do_event_record(event_id event, stream_id stream) override {
    VS_TRY(inject(fault_op::event_record));
    return real_.event_record(event, stream);
  }
  int do_event_synchronize(event_id event) override {
    VS_TRY(real_.event_synchronize(event));
    return inject(fault_op::event_synchronize);
  }
  int do_event_query(event_id event, bool* complete) override {
    VS_TRY(real_.event_query(event, complete));
    return inject(fault_op::event_query);
  }
  int do_stream_wait_event(stream_id stream, event_id event) override { return real_.stream_wait_event(stream, event); }
  int do_device_synchronize(int device) override {
    VS_TRY(real_.device_synchronize(device));
    return inject(fault_op::device_synchronize);
  }
  int do_app_stream_capturing(int device, uintptr_t app_stream, bool* capturing) override {
    VS_TRY(real_.app_stream_capturing(device, app_stream, capturing));
    if (capturing_.load() != 0 && app_stream == capturing_.load()) *capturing = true;
    return ok;
  }

  backend& real_;
  std::array<std::atomic<uint64_t>, static_cast<size_t>(fault_op::count_)> calls_{};
  std::atomic<uint64_t> granted_bytes_{0};
  bool armed_ = false;
  bool every_ = false;  // every call of the op from armed_n_ on, not only that one
  fault_op armed_op_ = fault_op::map;
  uint64_t armed_n_ = 0;
  bool fired_ = false;
  bool second_ = false;
  fault_op second_op_ = fault_op::map;
  bool second_fired_ = false;
  std::atomic<uintptr_t> capturing_{0};
};

}  // namespace vramswap::detail::test
