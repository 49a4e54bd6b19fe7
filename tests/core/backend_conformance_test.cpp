// The backend conformance suite: the same tests against every backend (host and cuda).
// A backend that cannot run here (the cuda one without a GPU) is skipped, saying why.
#include <fcntl.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/fd_transfer.hpp"
#include "core/status.hpp"
#include "support/backends.hpp"
#include "support/faulty_backend.hpp"
#include "support/random_bytes.hpp"

extern char** environ;

namespace vramswap::detail {
namespace {



// Owns pinned host buffers for a test and frees them at its end.
struct pinned_buffer {
  backend* be = nullptr;
  void* ptr = nullptr;
  size_t size = 0;
  pinned_buffer(backend* b, size_t n) : be(b), size(n) { EXPECT_EQ(be->host_alloc(n, &ptr), ok) << last_error(); }
  ~pinned_buffer() {
    if (ptr != nullptr) be->host_free(ptr);
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
};

class BackendConformance : public ::testing::TestWithParam<backend_kind> {
 protected:
  void SetUp() override {
    std::string why;
    be = test::shared_backend(GetParam(), &why);
    if (be == nullptr) GTEST_SKIP() << "backend " << backend_kind_name(GetParam()) << " unavailable here: " << why;
    device_info info;
    ASSERT_EQ(be->get_device_info(0, &info), ok) << last_error();
    gran = info.granularity;
    ASSERT_EQ(be->stream_create(0, &stream), ok) << last_error();
  }
  void TearDown() override {
    if (be == nullptr) return;
    for (auto [va, size] : mapped) EXPECT_EQ(be->unmap(va, size), ok) << last_error();
    for (frame_id f : frames) EXPECT_EQ(be->release_frame(f), ok) << last_error();
    for (auto [va, size] : reserved) EXPECT_EQ(be->unreserve(va, size), ok) << last_error();
    if (stream != 0) {
      EXPECT_EQ(be->stream_destroy(stream), ok) << last_error();
    }
  }

  // Helpers that record what to clean up. Each asserts success.
  device_ptr reserve(size_t size) {
    device_ptr va = 0;
    EXPECT_EQ(be->reserve(0, size, 0, &va), ok) << last_error();
    reserved.emplace_back(va, size);
    return va;
  }
  frame_id create(size_t size) {
    frame_id f = 0;
    EXPECT_EQ(be->create_frame(0, size, &f), ok) << last_error();
    frames.push_back(f);
    return f;
  }
  void map_rw(device_ptr va, size_t size, frame_id f) {
    ASSERT_EQ(be->map(va, size, f, 0), ok) << last_error();
    mapped.emplace_back(va, size);
    ASSERT_EQ(be->set_access(va, size, access_flags::read_write), ok) << last_error();
  }
  void forget_mapping(device_ptr va) {
    std::erase_if(mapped, [&](auto& m) { return m.first == va; });
  }
  void write(device_ptr va, size_t size, uint64_t seed) {
    pinned_buffer buf(be, size);
    test::fill_random(buf.ptr, size, seed);
    ASSERT_EQ(be->copy_h2d(va, buf.ptr, size, stream), ok) << last_error();
    ASSERT_EQ(be->stream_synchronize(stream), ok) << last_error();
  }
  // Every byte of [va, va+size) equals fill_random(seed).
  void expect_bytes(device_ptr va, size_t size, uint64_t seed) {
    pinned_buffer buf(be, size);
    std::memset(buf.ptr, 0, size);
    ASSERT_EQ(be->copy_d2h(buf.ptr, va, size, stream), ok) << last_error();
    ASSERT_EQ(be->stream_synchronize(stream), ok) << last_error();
    EXPECT_EQ(test::first_mismatch(buf.ptr, size, seed), size) << "first differing byte (size " << size << ")";
  }

  backend* be = nullptr;
  size_t gran = 0;
  stream_id stream = 0;
  std::vector<std::pair<device_ptr, size_t>> reserved, mapped;
  std::vector<frame_id> frames;
};

TEST_P(BackendConformance, DeviceInfoIsComplete) {
  int n = 0;
  ASSERT_EQ(be->device_count(&n), ok);
  EXPECT_GE(n, 1);
  device_info info;
  ASSERT_EQ(be->get_device_info(0, &info), ok);
  EXPECT_EQ(info.ordinal, 0);
  EXPECT_FALSE(info.name.empty());
  EXPECT_FALSE(info.uuid.empty());
  EXPECT_GT(info.total_bytes, 0u);
  EXPECT_LE(info.free_bytes, info.total_bytes);
  EXPECT_GT(info.granularity, 0u);
  EXPECT_EQ(info.granularity & (info.granularity - 1), 0u) << "granularity is a power of two";
  std::printf("[ info     ] %s backend: %s, uuid %s, %.1f GiB total, %.1f GiB free, granularity %llu KiB\n", be->name(),
              info.name.c_str(), info.uuid.c_str(), info.total_bytes / 1073741824.0, info.free_bytes / 1073741824.0,
              static_cast<unsigned long long>(info.granularity >> 10));
}

// unmap() hands a run of mappings to the implementation one at a time, striking each from
// the books as it goes: a failure part way leaves them true (the mappings before it
// unmapped, the rest mapped), in the failing backend's books and in the real one's below.
TEST_P(BackendConformance, AnUnmapThatFailsPartWayLeavesTheRestMapped) {
  test::faulty_backend fb(*be);
  device_ptr va = 0;
  ASSERT_EQ(fb.reserve(0, 3 * gran, 0, &va), ok) << last_error();
  frame_id f[3] = {};
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(fb.create_frame(0, gran, &f[i]), ok) << last_error();
    ASSERT_EQ(fb.map(va + i * gran, gran, f[i], 0), ok) << last_error();
  }
  fb.fail_at(test::fault_op::unmap, 1);
  EXPECT_FAILS(fb.unmap(va, 3 * gran), err_cuda, "1 of its 3 mappings were unmapped, then injected fault");
  fb.disarm();
  EXPECT_FAILS(fb.unmap(va, gran), err_not_mapped, "no mapping starts at");
  EXPECT_FAILS(be->unmap(va, gran), err_not_mapped, "no mapping starts at");
  EXPECT_FAILS(fb.release_frame(f[1]), err_busy, "still mapped");
  EXPECT_EQ(fb.release_frame(f[0]), ok) << last_error();
  ASSERT_EQ(fb.unmap(va + gran, 2 * gran), ok) << last_error();
  EXPECT_EQ(fb.release_frame(f[1]), ok) << last_error();
  EXPECT_EQ(fb.release_frame(f[2]), ok) << last_error();
  EXPECT_EQ(fb.unreserve(va, 3 * gran), ok) << last_error();
}

TEST_P(BackendConformance, FrameKeepsItsBytesAcrossUnmapAndRemap) {
  const size_t size = 4 * gran;
  const device_ptr va = reserve(2 * size);
  const frame_id f = create(size);
  map_rw(va, size, f);
  write(va, size, 11);
  expect_bytes(va, size, 11);
  ASSERT_EQ(be->unmap(va, size), ok) << last_error();
  forget_mapping(va);
  // Same address again: the bytes are the frame's, not the address's.
  map_rw(va, size, f);
  expect_bytes(va, size, 11);
  ASSERT_EQ(be->unmap(va, size), ok);
  forget_mapping(va);
  // And at another address of the reservation.
  map_rw(va + size, size, f);
  expect_bytes(va + size, size, 11);
}

// A frame mapped at two addresses at once, as remap_pages does (its scratch slot and the
// page's address): both show the same bytes, a write through one is read through the other,
// a copy from one to a third frame's address is whole, and unmapping one leaves the other.
// Device and host frames alike.
TEST_P(BackendConformance, AFrameMapsAtTwoAddressesAtOnce) {
  const size_t size = 2 * gran;
  frame_id host = 0;
  ASSERT_EQ(be->create_host_frame(0, size, &host), ok) << last_error();
  frames.push_back(host);
  for (const frame_id f : {create(size), host}) {
    const device_ptr va = reserve(3 * size);
    map_rw(va, size, f);
    map_rw(va + size, size, f);
    map_rw(va + 2 * size, size, create(size));
    write(va, size, 61);
    expect_bytes(va + size, size, 61);
    write(va + size, size, 62);
    expect_bytes(va, size, 62);
    ASSERT_EQ(be->copy_d2d(va + 2 * size, va + size, size, stream), ok) << last_error();
    ASSERT_EQ(be->stream_synchronize(stream), ok) << last_error();
    expect_bytes(va + 2 * size, size, 62);
    ASSERT_EQ(be->unmap(va + size, size), ok) << last_error();
    forget_mapping(va + size);
    expect_bytes(va, size, 62);
  }
}

// A host frame (create_host_frame) maps beside device frames, keeps its bytes across
// remaps, costs no device memory, and is refused for export (process-local).
TEST_P(BackendConformance, HostFramesMapLikeDeviceFramesAndUseNoDeviceMemory) {
  const size_t size = 4 * gran;
  const size_t big = 32 * gran;
  device_info before;
  ASSERT_EQ(be->get_device_info(0, &before), ok) << last_error();
  frame_id host = 0;
  ASSERT_EQ(be->create_host_frame(0, big, &host), ok) << last_error();
  frames.push_back(host);
  device_info after;
  ASSERT_EQ(be->get_device_info(0, &after), ok) << last_error();
  EXPECT_LT(before.free_bytes - std::min(before.free_bytes, after.free_bytes), big / 2)
      << "a host frame of " << big << " bytes took device memory";

  frame_location where = frame_location::device;
  ASSERT_EQ(be->frame_location_of(host, &where), ok);
  EXPECT_EQ(where, frame_location::host);
  const frame_id dev = create(size);
  ASSERT_EQ(be->frame_location_of(dev, &where), ok);
  EXPECT_EQ(where, frame_location::device);

  // Side by side in one reservation: a device frame, then the host frame.
  const device_ptr va = reserve(size + 2 * big);
  map_rw(va, size, dev);
  map_rw(va + size, big, host);
  write(va, size, 21);
  write(va + size, big, 22);
  expect_bytes(va, size, 21);
  expect_bytes(va + size, big, 22);
  ASSERT_EQ(be->memset_d8(va + size, 0x3C, gran, stream), ok) << last_error();
  ASSERT_EQ(be->stream_synchronize(stream), ok);
  {
    pinned_buffer buf(be, gran);
    ASSERT_EQ(be->copy_d2h(buf.ptr, va + size, gran, stream), ok);
    ASSERT_EQ(be->stream_synchronize(stream), ok);
    for (size_t i = 0; i < gran; ++i) ASSERT_EQ(static_cast<unsigned char*>(buf.ptr)[i], 0x3C) << i;
  }
  // Its bytes are the frame's: mapped again elsewhere, they are still there.
  write(va + size, big, 23);
  ASSERT_EQ(be->unmap(va + size, big), ok) << last_error();
  forget_mapping(va + size);
  map_rw(va + size + big, big, host);
  expect_bytes(va + size + big, big, 23);
  expect_bytes(va, size, 21);

  int fd = -1;
  EXPECT_FAILS(be->export_frame(host, &fd), err_invalid_argument, "host memory");
  frame_id bad = 0;
  EXPECT_FAILS(be->create_host_frame(0, gran + 1, &bad), err_invalid_argument, "granularity");
  EXPECT_FAILS(be->frame_location_of(987654321, &where), err_invalid_argument, "does not exist");
}

// One set_access over several mappings side by side grants access to all of them (the
// pager grants access once per run of pages): device frames, and host frames.
TEST_P(BackendConformance, OneSetAccessCoversSeveralMappings) {
  for (const bool host : {false, true}) {
    SCOPED_TRACE(host ? "host frames" : "device frames");
    const device_ptr va = reserve(4 * gran);
    for (size_t i = 0; i < 3; ++i) {
      frame_id f = 0;
      ASSERT_EQ(host ? be->create_host_frame(0, gran, &f) : be->create_frame(0, gran, &f), ok) << last_error();
      frames.push_back(f);
      ASSERT_EQ(be->map(va + i * gran, gran, f, 0), ok) << last_error();
      mapped.emplace_back(va + i * gran, gran);
    }
    EXPECT_FAILS(be->set_access(va, 4 * gran, access_flags::read_write), err_not_mapped, "is not mapped");
    ASSERT_EQ(be->set_access(va, 3 * gran, access_flags::read_write), ok) << last_error();
    write(va, 3 * gran, host ? 32 : 31);
    expect_bytes(va, 3 * gran, host ? 32 : 31);
    // Each mapping has its access: one of them read on its own.
    pinned_buffer buf(be, gran);
    ASSERT_EQ(be->copy_d2h(buf.ptr, va + 2 * gran, gran, stream), ok) << last_error();
    ASSERT_EQ(be->stream_synchronize(stream), ok) << last_error();
  }
}

TEST_P(BackendConformance, FramesMapWhole) {
  const size_t size = 4 * gran;
  const device_ptr va = reserve(2 * size);
  const frame_id f = create(size);
  EXPECT_FAILS(be->map(va, size / 2, f, 0), err_invalid_argument, "whole");
  EXPECT_FAILS(be->map(va, size / 2, f, size / 2), err_invalid_argument, "whole");
  map_rw(va, size, f);
  write(va, size, 21);
  expect_bytes(va, size, 21);
}

TEST_P(BackendConformance, CopiesOnOneStreamRunInOrder) {
  // Many writes of different data to the same place, each followed by a read: each read
  // must see exactly the write just before it.
  const size_t size = gran;
  const device_ptr va = reserve(size);
  map_rw(va, size, create(size));
  constexpr int rounds = 16;
  std::vector<std::unique_ptr<pinned_buffer>> in, out;
  for (int i = 0; i < rounds; ++i) {
    in.push_back(std::make_unique<pinned_buffer>(be, size));
    out.push_back(std::make_unique<pinned_buffer>(be, size));
    test::fill_random(in.back()->ptr, size, 100 + i);
  }
  for (int i = 0; i < rounds; ++i) {
    ASSERT_EQ(be->copy_h2d(va, in[i]->ptr, size, stream), ok);
    ASSERT_EQ(be->copy_d2h(out[i]->ptr, va, size, stream), ok);
  }
  event_id done = 0;
  ASSERT_EQ(be->event_create(0, &done), ok);
  ASSERT_EQ(be->event_record(done, stream), ok);
  ASSERT_EQ(be->event_synchronize(done), ok);
  bool complete = false;
  ASSERT_EQ(be->event_query(done, &complete), ok);
  EXPECT_TRUE(complete);
  for (int i = 0; i < rounds; ++i) EXPECT_EQ(test::first_mismatch(out[i]->ptr, size, 100 + i), size) << "round " << i;
  EXPECT_EQ(be->event_destroy(done), ok);
}

TEST_P(BackendConformance, EventsOrderWorkAcrossStreams) {
  const size_t size = 8 * gran;
  const device_ptr va = reserve(size);
  map_rw(va, size, create(size));
  stream_id reader = 0;
  ASSERT_EQ(be->stream_create(0, &reader), ok);
  event_id written = 0;
  ASSERT_EQ(be->event_create(0, &written), ok);
  pinned_buffer in(be, size), out(be, size);
  test::fill_random(in.ptr, size, 31);
  std::memset(out.ptr, 0, size);
  ASSERT_EQ(be->copy_h2d(va, in.ptr, size, stream), ok);
  ASSERT_EQ(be->event_record(written, stream), ok);
  ASSERT_EQ(be->stream_wait_event(reader, written), ok);
  ASSERT_EQ(be->copy_d2h(out.ptr, va, size, reader), ok);
  ASSERT_EQ(be->stream_synchronize(reader), ok);
  EXPECT_EQ(test::first_mismatch(out.ptr, size, 31), size);
  ASSERT_EQ(be->stream_destroy(reader), ok);
  ASSERT_EQ(be->event_destroy(written), ok);
}

TEST_P(BackendConformance, EventNeverRecordedIsComplete) {
  event_id e = 0;
  ASSERT_EQ(be->event_create(0, &e), ok);
  bool complete = false;
  ASSERT_EQ(be->event_query(e, &complete), ok);
  EXPECT_TRUE(complete);
  EXPECT_EQ(be->event_synchronize(e), ok);
  EXPECT_EQ(be->event_destroy(e), ok);
  EXPECT_EQ(be->event_destroy(e), err_invalid_argument);
}

TEST_P(BackendConformance, MemsetWritesEveryByte) {
  const size_t size = 2 * gran;
  const device_ptr va = reserve(size);
  map_rw(va, size, create(size));
  write(va, size, 41);
  ASSERT_EQ(be->memset_d8(va + 4096, 0xA5, size - 8192, stream), ok) << last_error();
  pinned_buffer out(be, size);
  ASSERT_EQ(be->copy_d2h(out.ptr, va, size, stream), ok);
  ASSERT_EQ(be->stream_synchronize(stream), ok);
  std::vector<unsigned char> expect(size);
  test::fill_random(expect.data(), size, 41);
  std::memset(expect.data() + 4096, 0xA5, size - 8192);
  EXPECT_EQ(std::memcmp(out.ptr, expect.data(), size), 0);
}

// Device-to-device copies run between device and host frames both ways (oversubscription
// moves pages between the two kinds this way), and bad ranges are refused untouched.
TEST_P(BackendConformance, DeviceToDeviceCopiesCrossFrameKinds) {
  const size_t size = 2 * gran;
  const device_ptr va = reserve(3 * size);
  map_rw(va, size, create(size));
  frame_id host = 0;
  ASSERT_EQ(be->create_host_frame(0, size, &host), ok) << last_error();
  frames.push_back(host);
  map_rw(va + size, size, host);
  map_rw(va + 2 * size, size, create(size));
  write(va, size, 51);
  ASSERT_EQ(be->copy_d2d(va + size, va, size, stream), ok) << last_error();       // device -> host frame
  ASSERT_EQ(be->copy_d2d(va + 2 * size, va + size, size, stream), ok) << last_error();  // host -> device frame
  ASSERT_EQ(be->stream_synchronize(stream), ok);
  expect_bytes(va + size, size, 51);
  expect_bytes(va + 2 * size, size, 51);
  EXPECT_FAILS(be->copy_d2d(va + 4096, va, size, stream), err_invalid_argument, "overlap");
  EXPECT_FAILS(be->copy_d2d(va, va + 2 * size, 2 * size, stream), err_not_mapped, "reservation");  // past its end
  expect_bytes(va, size, 51);
}

// Spawn frame_importer, hand it the frame over a Unix socket, and check both directions.
TEST_P(BackendConformance, FrameExportedToAnotherProcessShowsTheSameBytes) {
  const size_t size = 4 * gran;
  const device_ptr va = reserve(size);
  const frame_id f = create(size);
  map_rw(va, size, f);
  write(va, size, 51);

  int fd = -1;
  ASSERT_EQ(be->export_frame(f, &fd), ok) << last_error();
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  // The child's end must survive exec; everything else stays close-on-exec.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sv[1], 3);
  const std::string size_arg = std::to_string(size);
  const char* argv[] = {VRAMSWAP_FRAME_IMPORTER, be->name(), "3", size_arg.c_str(), "51", nullptr};
  pid_t pid = -1;
  ASSERT_EQ(::posix_spawn(&pid, VRAMSWAP_FRAME_IMPORTER, &actions, nullptr, const_cast<char**>(argv), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(sv[1]);

  ASSERT_EQ(send_fd(sv[0], fd, "frame", 5), ok) << last_error();
  ::close(fd);  // the child holds its own reference now
  char reply[512] = {};
  int none = -1;
  size_t len = 0;
  ASSERT_EQ(recv_fd(sv[0], &none, reply, sizeof reply - 1, &len), ok) << last_error();
  ::close(sv[0]);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  EXPECT_STREQ(reply, "ok");
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child status " << wstatus;
  // The child wrote seed 52 through its own mapping of the same frame.
  expect_bytes(va, size, 52);
}

// What a pool server's restart rests on: a frame whose creator released it and exited lives
// on in another process's import, with its bytes, and the descriptor that importer was given
// and kept serves a third process (the next server), which sees and writes the same memory.
// Exporting the import again is refused, as the CUDA driver refuses it.
TEST_P(BackendConformance, AnImportedFrameOutlivesItsCreatorAndItsKeptDescriptorServesAThirdProcess) {
  const size_t size = 4 * gran;
  const std::string size_arg = std::to_string(size);
  auto spawn_importer = [&](int child_end, const char* seed, const char* mode, pid_t* pid) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, child_end, 3);
    const char* argv[] = {VRAMSWAP_FRAME_IMPORTER, be->name(), "3", size_arg.c_str(), seed, mode, nullptr};
    ASSERT_EQ(::posix_spawn(pid, VRAMSWAP_FRAME_IMPORTER, &actions, nullptr, const_cast<char**>(argv), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
  };
  // The creator: makes the frame with seed 61, sends it, exits.
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  pid_t creator = -1;
  spawn_importer(sv[1], "61", "create", &creator);
  ::close(sv[1]);
  int fd = -1;
  char tag[16] = {};
  size_t len = 0;
  ASSERT_EQ(recv_fd(sv[0], &fd, tag, sizeof tag, &len), ok) << last_error();
  ASSERT_GE(fd, 0) << "the creator sent no frame: " << std::string(tag, len);
  ::close(sv[0]);
  frame_id f = 0;
  ASSERT_EQ(be->import_frame(0, fd, size, &f), ok) << last_error();
  frames.push_back(f);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(creator, &wstatus, 0), creator);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "creator status " << wstatus;
  const device_ptr va = reserve(size);
  map_rw(va, size, f);
  expect_bytes(va, size, 61);

  int again = -1;
  EXPECT_FAILS(be->export_frame(f, &again), err_invalid_argument, "imported");
  // The kept descriptor, to a third process: it reads 61 and writes 62.
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  pid_t third = -1;
  spawn_importer(sv[1], "61", nullptr, &third);
  ::close(sv[1]);
  ASSERT_EQ(send_fd(sv[0], fd, "frame", 5), ok) << last_error();
  ::close(fd);
  char reply[512] = {};
  int none = -1;
  ASSERT_EQ(recv_fd(sv[0], &none, reply, sizeof reply - 1, &len), ok) << last_error();
  ::close(sv[0]);
  ASSERT_EQ(::waitpid(third, &wstatus, 0), third);
  EXPECT_STREQ(reply, "ok");
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "third process status " << wstatus;
  expect_bytes(va, size, 62);
}

// --- bad arguments: a clear error, and nothing changed ------------------------------------


TEST_P(BackendConformance, BadSizesAndAlignmentsAreRejected) {
  frame_id f = 0;
  device_ptr va = 0;
  EXPECT_FAILS(be->create_frame(0, gran + 4096, &f), err_invalid_argument, "granularity");
  EXPECT_FAILS(be->create_frame(0, 0, &f), err_invalid_argument, "create_frame");
  EXPECT_FAILS(be->reserve(0, gran / 2, 0, &va), err_invalid_argument, "reserve");
  EXPECT_FAILS(be->reserve(0, gran, 3 * gran, &va), err_invalid_argument, "alignment");
  EXPECT_FAILS(be->create_frame(7, gran, &f), err_invalid_argument, "device 7");
  const device_ptr base = reserve(4 * gran);
  const frame_id good = create(2 * gran);
  EXPECT_FAILS(be->map(base + 4096, 2 * gran, good, 0), err_invalid_argument, "multiples");
  EXPECT_FAILS(be->map(base, 2 * gran, good, 4096), err_invalid_argument, "multiples");
  EXPECT_FAILS(be->map(base, 4 * gran, good, 0), err_invalid_argument, "whole");
  EXPECT_FAILS(be->map(base, gran, 987654321, 0), err_invalid_argument, "frame 987654321");
  // None of that left a trace: the range maps and works.
  map_rw(base, 2 * gran, good);
  write(base, 2 * gran, 61);
  expect_bytes(base, 2 * gran, 61);
}

TEST_P(BackendConformance, UnmapTwiceIsAnError) {
  const device_ptr va = reserve(2 * gran);
  const frame_id f = create(gran);
  map_rw(va, gran, f);
  ASSERT_EQ(be->unmap(va, gran), ok);
  forget_mapping(va);
  EXPECT_FAILS(be->unmap(va, gran), err_not_mapped, "unmap");
  EXPECT_FAILS(be->unmap(va + gran, gran), err_not_mapped, "unmap");
  map_rw(va, gran, f);  // still usable
  write(va, gran, 71);
  expect_bytes(va, gran, 71);
}

TEST_P(BackendConformance, MappingOverAMappedRangeIsRefusedAndKeepsTheOriginal) {
  const device_ptr va = reserve(4 * gran);
  const frame_id a = create(2 * gran);
  const frame_id b = create(2 * gran);
  map_rw(va + gran, 2 * gran, a);
  write(va + gran, 2 * gran, 81);
  EXPECT_FAILS(be->map(va + gran, 2 * gran, b, 0), err_already_mapped, "overlaps");
  EXPECT_FAILS(be->map(va, 2 * gran, b, 0), err_already_mapped, "overlaps");
  EXPECT_FAILS(be->map(va + 2 * gran, 2 * gran, b, 0), err_already_mapped, "overlaps");
  expect_bytes(va + gran, 2 * gran, 81);
  // Partial unmaps are refused too.
  EXPECT_FAILS(be->unmap(va + gran, gran), err_invalid_argument, "whole mappings");
  expect_bytes(va + gran, 2 * gran, 81);
}

TEST_P(BackendConformance, AddressesOutsideAnyReservationAreRejected) {
  const frame_id f = create(gran);
  const device_ptr va = reserve(2 * gran);
  EXPECT_FAILS(be->map(va + 2 * gran, gran, f, 0), err_not_mapped, "reservation");
  EXPECT_FAILS(be->map(va + gran, 2 * gran, f, 0), err_invalid_argument, "whole");
  EXPECT_FAILS(be->set_access(va, gran, access_flags::read_write), err_not_mapped, "not mapped");
  pinned_buffer buf(be, gran);
  EXPECT_FAILS(be->copy_d2h(buf.ptr, va, gran, stream), err_not_mapped, "copy_d2h");
  EXPECT_FAILS(be->copy_h2d(0x1000, buf.ptr, gran, stream), err_not_mapped, "reservation");
  EXPECT_FAILS(be->unreserve(va + gran, gran), err_invalid_argument, "unreserve");
}

TEST_P(BackendConformance, CopiesNeedPinnedMemoryAndAccess) {
  const device_ptr va = reserve(gran);
  const frame_id f = create(gran);
  ASSERT_EQ(be->map(va, gran, f, 0), ok);
  mapped.emplace_back(va, gran);
  pinned_buffer buf(be, gran);
  EXPECT_FAILS(be->copy_d2h(buf.ptr, va, gran, stream), err_not_mapped, "set_access");
  ASSERT_EQ(be->set_access(va, gran, access_flags::read), ok);
  EXPECT_FAILS(be->copy_h2d(va, buf.ptr, gran, stream), err_not_mapped, "read-write");
  ASSERT_EQ(be->set_access(va, gran, access_flags::read_write), ok);
  std::vector<char> pageable(gran);
  EXPECT_FAILS(be->copy_h2d(va, pageable.data(), gran, stream), err_invalid_argument, "not pinned");
  EXPECT_FAILS(be->copy_h2d(va, buf.ptr, gran, 424242), err_invalid_argument, "stream 424242");
  // host_register makes pageable memory usable.
  ASSERT_EQ(be->host_register(pageable.data(), gran), ok) << last_error();
  test::fill_random(pageable.data(), gran, 91);
  ASSERT_EQ(be->copy_h2d(va, pageable.data(), gran, stream), ok) << last_error();
  ASSERT_EQ(be->stream_synchronize(stream), ok);
  EXPECT_FAILS(be->host_register(pageable.data(), gran), err_already_mapped, "already pinned");
  ASSERT_EQ(be->host_unregister(pageable.data()), ok);
  EXPECT_FAILS(be->host_unregister(pageable.data()), err_invalid_argument, "host_unregister");
  EXPECT_FAILS(be->host_free(pageable.data()), err_invalid_argument, "host_free");
  expect_bytes(va, gran, 91);
}

TEST_P(BackendConformance, FramesAndReservationsInUseCannotBeFreed) {
  const device_ptr va = reserve(gran);
  frame_id f = 0;
  ASSERT_EQ(be->create_frame(0, gran, &f), ok);
  ASSERT_EQ(be->map(va, gran, f, 0), ok);
  EXPECT_FAILS(be->release_frame(f), err_busy, "still mapped");
  EXPECT_FAILS(be->unreserve(va, gran), err_busy, "unmap");
  ASSERT_EQ(be->unmap(va, gran), ok);
  ASSERT_EQ(be->release_frame(f), ok);
  EXPECT_FAILS(be->release_frame(f), err_invalid_argument, "released twice");
  EXPECT_FAILS(be->map(va, gran, f, 0), err_invalid_argument, "does not exist");
}

TEST_P(BackendConformance, BadDescriptorsAreRejected) {
  frame_id f = 0;
  EXPECT_FAILS(be->import_frame(0, -1, gran, &f), err_invalid_argument, "descriptor -1");
  // A descriptor that is not open.
  const int closed = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ::close(closed);
  clear_error();
  EXPECT_NE(be->import_frame(0, closed, gran, &f), ok);
  EXPECT_NE(std::string(last_error()), "");
  // A descriptor of something that is not a frame.
  int pipefd[2];
  ASSERT_EQ(::pipe2(pipefd, O_CLOEXEC), 0);
  clear_error();
  EXPECT_NE(be->import_frame(0, pipefd[0], gran, &f), ok);
  EXPECT_NE(std::string(last_error()), "");
  ::close(pipefd[0]);
  ::close(pipefd[1]);
  // Still works afterwards.
  const device_ptr va = reserve(gran);
  map_rw(va, gran, create(gran));
  write(va, gran, 95);
  expect_bytes(va, gran, 95);
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendConformance, ::testing::Values(backend_kind::host, backend_kind::cuda),
                         test::param_name);

// --- host-backend specifics -------------------------------------------------------------

TEST(HostBackend, EmulatedDeviceMemoryRunsOut) {
  std::unique_ptr<backend> be;
  ASSERT_EQ(make_backend(backend_kind::host, &be), ok);
  device_info info;
  ASSERT_EQ(be->get_device_info(0, &info), ok);
  frame_id f = 0;
  EXPECT_FAILS(be->create_frame(0, info.total_bytes + info.granularity, &f), err_out_of_memory, "VRAMSWAP_HOST_DEVICE_MEMORY");
  ASSERT_EQ(be->create_frame(0, info.granularity, &f), ok);
  device_info after;
  ASSERT_EQ(be->get_device_info(0, &after), ok);
  EXPECT_EQ(after.free_bytes, info.free_bytes - info.granularity);
  ASSERT_EQ(be->release_frame(f), ok);
}

TEST(BackendSelection, MalformedValueIsAClearError) {
  std::unique_ptr<backend> be;
  EXPECT_FAILS(select_backend("gpu", &be), err_invalid_argument, "host, cuda, auto");
  EXPECT_EQ(be, nullptr);
  ASSERT_EQ(select_backend("host", &be), ok);
  EXPECT_EQ(be->kind(), backend_kind::host);
  std::unique_ptr<backend> any;
  ASSERT_EQ(select_backend("auto", &any), ok) << last_error();
}

}  // namespace
}  // namespace vramswap::detail
