#include "core/host/host_stream.hpp"

namespace vramswap::detail::host {

uint64_t host_event::next_point() {
  std::lock_guard<std::mutex> lock(mutex_);
  return ++taken_;
}

uint64_t host_event::last_point() {
  std::lock_guard<std::mutex> lock(mutex_);
  return taken_;
}

void host_event::complete(uint64_t point) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (point > completed_) completed_ = point;
  }
  cv_.notify_all();
}

bool host_event::reached(uint64_t point) {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ >= point;
}

void host_event::wait(uint64_t point) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return completed_ >= point; });
}

host_stream::host_stream(int device) : device_(device), worker_([this] { run(); }) {}

host_stream::~host_stream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_one();
  worker_.join();
}

void host_stream::submit(std::function<void()> op) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(op));
    ++submitted_;
  }
  work_cv_.notify_one();
}

void host_stream::synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t target = submitted_;
  idle_cv_.wait(lock, [&] { return done_ >= target; });
}

void host_stream::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) return;  // stopping, and everything submitted has run
    std::function<void()> op = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    op();
    lock.lock();
    ++done_;
    idle_cv_.notify_all();
  }
}

}  // namespace vramswap::detail::host
