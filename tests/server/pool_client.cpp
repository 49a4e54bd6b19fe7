// Description: a small pool client for the pool server's process tests (pool_server_test).
// It runs its arguments as a script, in order, on the backend VRAMSWAP_BACKEND selects:
//   connect | connect-noauto   pool_connection::connect with / without autostart
//   join                       pool_member::join: a member that rejoins the next server
//                              when its server ends (what sessions use)
//   zero A B                   pool frames [A, B) read all zero
//   write I SEED               fill pool frame I with random bytes (SEED)
//   check I SEED               pool frame I holds those bytes
//   own I                      frame I: free -> active(me) in the pool segment
//   own-slot I SEED            host slot I (shared host pool): free -> used(me), filled with
//                              random bytes (SEED)
//   slot-zero A B              host slots [A, B) read all zero
//   lock                       acquire the device lock
//   ready                      print "ready <member> <frame_count> <server pid>" and flush
//   wait-server-gone SECONDS   poll server_alive() until false; print "server-gone"
//   wait-rejoined SECONDS      (after join) wait until a server other than the first serves
//                              this member; print "rejoined <server pid>"
//   fork-child                 fork a child that runs nothing else (it inherits the
//                              connection, as a DataLoader worker would) and waits to be
//                              killed; print "forked <pid>"
//   hold                       wait until stdin closes (the test kills us meanwhile)
//   sleep SECONDS              sleep (the test kills us meanwhile)
// Exit 0 when every step worked; 1 with "pool_client: <step>: <why>" on stderr otherwise.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.hpp"
#include "core/status.hpp"
#include "lock/crash_points.hpp"
#include "lock/device_lock.hpp"
#include "pool/pool_connection.hpp"
#include "pool/pool_member.hpp"
#include "pool/pool_segment.hpp"
#include "support/random_bytes.hpp"

namespace {

using namespace vramswap;
using namespace vramswap::detail;

int die(const std::string& step, const std::string& why) {
  std::fprintf(stderr, "pool_client[%d]: %s: %s\n", static_cast<int>(::getpid()), step.c_str(), why.c_str());
  return 1;
}

// Map pool frame `index` at a scratch address and copy it to/from `host` (pinned).
int transfer(backend& be, pool_connection& c, uint32_t index, void* host, bool to_device) {
  device_ptr va = 0;
  stream_id s = 0;
  VS_TRY(be.reserve(c.device(), c.frame_size(), 0, &va));
  int rc = be.map(va, c.frame_size(), c.frame(index), 0);
  if (rc == ok) {
    rc = be.set_access(va, c.frame_size(), access_flags::read_write);
    if (rc == ok) rc = be.stream_create(c.device(), &s);
    if (rc == ok) rc = to_device ? be.copy_h2d(va, host, c.frame_size(), s) : be.copy_d2h(host, va, c.frame_size(), s);
    if (rc == ok) rc = be.stream_synchronize(s);
    if (s != 0) be.stream_destroy(s);
    be.unmap(va, c.frame_size());
  }
  be.unreserve(va, c.frame_size());
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  backend* be = nullptr;
  if (default_backend(&be) != ok) return die("backend", last_error());
  std::unique_ptr<pool_connection> owned;
  std::unique_ptr<pool_member> member;
  pool_connection* conn = nullptr;
  pid_t first_server = 0;
  device_lock lock;
  void* buf = nullptr;
  std::vector<unsigned char> zeros;
  const std::vector<std::string> args(argv + 1, argv + argc);
  auto need = [&](const char* step) { return conn ? 0 : die(step, "not connected"); };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& step = args[i];
    auto arg = [&](size_t k) { return std::strtoull(args.at(i + k).c_str(), nullptr, 10); };
    if (step == "connect" || step == "connect-noauto" || step == "join") {
      if (step == "join") {
        if (pool_member::join(*be, 0, &member) != ok) return die(step, last_error());
        conn = &member->connection();
      } else {
        if (pool_connection::connect(*be, 0, step == "connect", &owned) != ok) return die(step, last_error());
        conn = owned.get();
      }
      first_server = conn->server_pid();
      if (be->host_alloc(conn->frame_size(), &buf) != ok) return die(step, last_error());
    } else if (step == "zero") {
      if (need("zero")) return 1;
      for (uint64_t f = arg(1); f < arg(2); ++f) {
        if (transfer(*be, *conn, static_cast<uint32_t>(f), buf, false) != ok) return die(step, last_error());
        if (zeros.size() != conn->frame_size()) zeros.assign(conn->frame_size(), 0);
        if (std::memcmp(buf, zeros.data(), zeros.size()) != 0) {
          const auto* p = static_cast<const unsigned char*>(buf);
          uint64_t b = 0;
          while (p[b] == 0) ++b;
          return die(step, "frame " + std::to_string(f) + " byte " + std::to_string(b) + " is not zero");
        }
      }
      i += 2;
    } else if (step == "write" || step == "check") {
      if (need(step.c_str())) return 1;
      const auto f = static_cast<uint32_t>(arg(1));
      if (step == "write") {
        test::fill_random(buf, conn->frame_size(), arg(2));
        if (transfer(*be, *conn, f, buf, true) != ok) return die(step, last_error());
      } else {
        if (transfer(*be, *conn, f, buf, false) != ok) return die(step, last_error());
        const size_t bad = test::first_mismatch(buf, conn->frame_size(), arg(2));
        if (bad != conn->frame_size()) return die(step, "frame " + std::to_string(f) + " differs at byte " + std::to_string(bad));
      }
      i += 2;
    } else if (step == "own") {
      if (need("own")) return 1;
      const auto f = static_cast<uint32_t>(arg(1));
      const uint64_t seen = conn->segment().read(f);
      if (pool_layout::frame_word::decode(seen).state != pool_layout::frame_free ||
          !conn->segment().move(f, seen, pool_layout::frame_active, conn->member(), pool_layout::k_no_member)) {
        return die(step, "frame " + std::to_string(f) + " is not free");
      }
      i += 1;
    } else if (step == "own-slot" || step == "slot-zero") {
      if (need(step.c_str())) return 1;
      if (conn->host_pool() == nullptr) return die(step, "the server has no shared host pool");
      const uint64_t size = conn->frame_size();
      if (step == "own-slot") {
        const auto slot = static_cast<uint32_t>(arg(1));
        const uint64_t seen = conn->segment().read_slot(slot);
        if (pool_layout::slot_word::decode(seen).state != pool_layout::slot_free ||
            !conn->segment().move_slot(slot, seen, pool_layout::slot_used, conn->member())) {
          return die(step, "host slot " + std::to_string(slot) + " is not free");
        }
        test::fill_random(conn->host_pool() + slot * size, size, arg(2));
      } else {
        for (uint64_t slot = arg(1); slot < arg(2); ++slot) {
          const auto* p = reinterpret_cast<const unsigned char*>(conn->host_pool() + slot * size);
          for (uint64_t b = 0; b < size; ++b) {
            if (p[b] != 0) return die(step, "host slot " + std::to_string(slot) + " byte " + std::to_string(b) + " is not zero");
          }
        }
      }
      i += 2;
    } else if (step == "lock") {
      if (!conn) return die(step, "not connected");
      if (device_lock::open(conn->device_key(), &lock) != ok || lock.acquire() != ok) return die(step, last_error());
    } else if (step == "lock-stop-inside") {
      // Stops itself (SIGSTOP) inside the lock's internal mutex, in the middle of an acquire.
      if (!conn) return die(step, "not connected");
      set_crash_hook([](crash_point point) {
        if (point == crash_point::enqueue_published) ::raise(SIGSTOP);
      });
      if (device_lock::open(conn->device_key(), &lock) != ok || lock.acquire() != ok) return die(step, last_error());
    } else if (step == "ready") {
      if (need("ready")) return 1;
      std::printf("ready %u %u %d\n", conn->member(), conn->frame_count(), static_cast<int>(conn->server_pid()));
      std::fflush(stdout);
    } else if (step == "wait-server-gone") {
      if (need("wait-server-gone")) return 1;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(arg(1));
      while (conn->server_alive()) {
        if (std::chrono::steady_clock::now() > deadline) return die(step, "the server still looks alive");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      std::printf("server-gone\n");
      std::fflush(stdout);
      i += 1;
    } else if (step == "wait-rejoined") {
      if (need("wait-rejoined")) return 1;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(arg(1));
      while (conn->server_pid() == first_server || !conn->server_alive()) {
        if (!conn->pool_alive()) return die(step, "the pool is gone");
        if (std::chrono::steady_clock::now() > deadline) return die(step, "no other server took this member back");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      std::printf("rejoined %d\n", static_cast<int>(conn->server_pid()));
      std::fflush(stdout);
      i += 1;
    } else if (step == "sleep") {
      std::this_thread::sleep_for(std::chrono::seconds(arg(1)));
      i += 1;
    } else if (step == "fork-child") {
      const pid_t child = ::fork();
      if (child < 0) return die(step, std::strerror(errno));
      if (child == 0) {
        for (;;) ::pause();
      }
      std::printf("forked %d\n", static_cast<int>(child));
      std::fflush(stdout);
    } else if (step == "hold") {
      char c;
      while (::read(0, &c, 1) > 0) {
      }
    } else {
      return die(step, "unknown step");
    }
  }
  if (lock.held()) lock.release();
  if (buf != nullptr) be->host_free(buf);
  return 0;
}
