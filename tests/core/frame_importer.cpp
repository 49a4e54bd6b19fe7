// Child process of the conformance suite's cross-process test (spawned, never forked, so
// that it initializes the backend itself, as a real client would).
//
// usage: frame_importer <host|cuda> <socket-fd> <frame-bytes> <seed> [create]
// Receives one frame descriptor over the socket, imports and maps it, checks that every
// byte equals fill_random(seed), overwrites it with fill_random(seed + 1), synchronizes and
// answers "ok" (or "error: <what>") on the socket.
// With "create" it is the frame's creator instead: creates a frame, fills it with
// fill_random(seed), sends its exported descriptor on the socket, releases everything and
// exits, so that the frame lives on only in the receiver's import (how a pool server that
// stopped leaves its frames to its clients).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "core/backend.hpp"
#include "core/fd_transfer.hpp"
#include "core/status.hpp"
#include "support/random_bytes.hpp"

using namespace vramswap;
using namespace vramswap::detail;

namespace {
int sock = -1;

[[noreturn]] void answer(const std::string& text, int code) {
  send_fd(sock, -1, text.data(), text.size());
  std::exit(code);
}

void check(int rc, const char* what) {
  if (rc != ok) answer(std::string("error: ") + what + ": " + status_name(rc) + ": " + last_error(), 2);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: %s <host|cuda> <socket-fd> <frame-bytes> <seed> [create]\n", argv[0]);
    return 64;
  }
  sock = std::atoi(argv[2]);
  const size_t size = std::strtoull(argv[3], nullptr, 10);
  const uint64_t seed = std::strtoull(argv[4], nullptr, 10);

  std::unique_ptr<backend> be;
  check(make_backend(std::string(argv[1]) == "cuda" ? backend_kind::cuda : backend_kind::host, &be), "make_backend");

  if (argc == 6 && std::string(argv[5]) == "create") {
    frame_id made = 0;
    check(be->create_frame(0, size, &made), "create_frame");
    device_ptr mva = 0;
    check(be->reserve(0, size, 0, &mva), "reserve");
    check(be->map(mva, size, made, 0), "map");
    check(be->set_access(mva, size, access_flags::read_write), "set_access");
    void* src = nullptr;
    check(be->host_alloc(size, &src), "host_alloc");
    test::fill_random(src, size, seed);
    stream_id cs = 0;
    check(be->stream_create(0, &cs), "stream_create");
    check(be->copy_h2d(mva, src, size, cs), "copy_h2d");
    check(be->stream_synchronize(cs), "stream_synchronize");
    int out = -1;
    check(be->export_frame(made, &out), "export_frame");
    check(send_fd(sock, out, "frame", 5), "send_fd");
    ::close(out);
    check(be->stream_destroy(cs), "stream_destroy");
    check(be->unmap(mva, size), "unmap");
    check(be->release_frame(made), "release_frame");
    check(be->unreserve(mva, size), "unreserve");
    check(be->host_free(src), "host_free");
    return 0;  // and with the process goes its context: the frame is the receiver's alone
  }

  int fd = -1;
  char tag[16];
  size_t len = 0;
  check(recv_fd(sock, &fd, tag, sizeof tag, &len), "recv_fd");
  if (fd < 0) answer("error: no descriptor arrived", 2);

  frame_id frame = 0;
  check(be->import_frame(0, fd, size, &frame), "import_frame");
  ::close(fd);
  device_ptr va = 0;
  check(be->reserve(0, size, 0, &va), "reserve");
  check(be->map(va, size, frame, 0), "map");
  check(be->set_access(va, size, access_flags::read_write), "set_access");
  void* buf = nullptr;
  check(be->host_alloc(size, &buf), "host_alloc");
  stream_id s = 0;
  check(be->stream_create(0, &s), "stream_create");
  check(be->copy_d2h(buf, va, size, s), "copy_d2h");
  check(be->stream_synchronize(s), "stream_synchronize");
  const size_t bad = test::first_mismatch(buf, size, seed);
  if (bad != size) answer("error: byte " + std::to_string(bad) + " of the imported frame differs from what the parent wrote", 3);

  test::fill_random(buf, size, seed + 1);
  check(be->copy_h2d(va, buf, size, s), "copy_h2d");
  check(be->stream_synchronize(s), "stream_synchronize");
  check(be->stream_destroy(s), "stream_destroy");
  check(be->unmap(va, size), "unmap");
  check(be->release_frame(frame), "release_frame");
  check(be->unreserve(va, size), "unreserve");
  check(be->host_free(buf), "host_free");
  answer("ok", 0);
}
