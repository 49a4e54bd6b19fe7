// Streams and events of the host backend: the CUDA stream model on worker threads.
//
// A host_stream owns one worker thread that runs the operations submitted to it one at a
// time, in submission order, exactly as a CUDA stream orders its work. A host_event
// counts record points: record() takes a ticket, the stream's worker completes it when it
// gets there; synchronize() waits for the last ticket taken before the call, like
// cuEventSynchronize waits for the most recent record. Waiting on an event from another
// stream (stream_wait_event) is an operation that blocks that stream's worker.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace vramswap::detail::host {

class host_event {
 public:
  // Take the next record point; the caller submits complete(point) to a stream.
  uint64_t next_point();
  // The last point taken (0 when never recorded).
  uint64_t last_point();
  void complete(uint64_t point);
  bool reached(uint64_t point);
  void wait(uint64_t point);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  uint64_t taken_ = 0;
  uint64_t completed_ = 0;
};

class host_stream {
 public:
  explicit host_stream(int device);
  ~host_stream();  // runs what was submitted, then stops the worker
  host_stream(const host_stream&) = delete;
  host_stream& operator=(const host_stream&) = delete;

  int device() const noexcept { return device_; }
  void submit(std::function<void()> op);
  void synchronize();

 private:
  void run();

  const int device_;
  std::mutex mutex_;
  std::condition_variable work_cv_;  // worker waits for work
  std::condition_variable idle_cv_;  // synchronize() waits for done_ == submitted_
  std::deque<std::function<void()>> queue_;
  uint64_t submitted_ = 0;
  uint64_t done_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace vramswap::detail::host
