#include "pool/start_record.hpp"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>

namespace vramswap::detail {

namespace {

uint32_t fnv1a(const char* data, size_t size) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < size; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 16777619u;
  }
  return h;
}

// One line at most this long: the numbers, the state and a path.
constexpr size_t k_max_record = PATH_MAX + 96;

// The record in `text` (what a read found), when it is one whole line whose checksum matches.
bool parse_record(const char* text, size_t size, start_record* r) {
  const char* end = static_cast<const char*>(std::memchr(text, '\n', size));
  if (end == nullptr) return false;  // nothing yet, or cut short by a write in progress
  const char* hash = nullptr;
  for (const char* p = end; p > text; --p) {
    if (p[-1] == '#') {
      hash = p - 1;
      break;
    }
  }
  if (hash == nullptr || hash == text || hash[-1] != ' ') return false;
  const std::string digits(hash + 1, end);
  char* digits_end = nullptr;
  const unsigned long sum = std::strtoul(digits.c_str(), &digits_end, 16);
  if (digits.empty() || *digits_end != '\0' || sum != fnv1a(text, static_cast<size_t>(hash - 1 - text))) return false;

  const std::string body(text, hash - 1);
  char state[16] = {};
  int used = 0;
  if (std::sscanf(body.c_str(), "%d %d %15s %d %n", &r->client, &r->server_pid, state, &r->status, &used) < 4 || used == 0) {
    return false;
  }
  r->state = state;
  r->server = body.substr(static_cast<size_t>(used));
  return true;
}

}  // namespace

bool write_start_record(int lock_fd, pid_t server_pid, const char* state, int status, const std::string& server) noexcept {
  try {
    std::string text = std::to_string(::getpid()) + " " + std::to_string(server_pid) + " " + state + " " +
                       std::to_string(status) + " " + server;
    char sum[16];
    std::snprintf(sum, sizeof sum, " #%08x\n", fnv1a(text.data(), text.size()));
    text += sum;
    // Over the old record first, then cut to length: truncating first would leave the file
    // empty for a reader in between. What is past the new line until the cut is ignored.
    if (::pwrite(lock_fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
      if (errno == 0) errno = EIO;
      return false;
    }
    return ::ftruncate(lock_fd, static_cast<off_t>(text.size())) == 0;
  } catch (const std::bad_alloc&) {
    errno = ENOMEM;
    return false;
  }
}

bool read_start_record(int lock_fd, start_record* record, int retry_ms) noexcept {
  try {
    char text[k_max_record];
    for (int waited = 0;; waited += 2) {
      const ssize_t n = ::pread(lock_fd, text, sizeof text, 0);
      if (n > 0 && parse_record(text, static_cast<size_t>(n), record)) return true;
      // An empty file has no write in progress (a record, once written, is only ever written
      // over): nobody wrote one yet.
      if (n <= 0 || waited >= retry_ms) return false;
      ::usleep(2000);
    }
  } catch (const std::bad_alloc&) {
    return false;
  }
}

}  // namespace vramswap::detail
