// Pods: processes in separate containers that share only the runtime dir share a device
// safely. Each "pod" is made here the way a container runtime makes one: unshare gives it a
// PID, mount, IPC and UTS namespace of its own, a fresh /tmp and /dev/shm (tmpfs), its own
// /proc, and a uid of its own (setpriv); the only thing the pods have in common is the
// runtime dir, a group-shared directory (VRAMSWAP_GROUP) outside /tmp. Their pids repeat
// (each worker is pid 1 of its namespace) and none sees another's /proc.
//
// Needs root (namespaces, mounts, other uids); skipped, saying why, elsewhere.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/process_identity.hpp"
#include "pool/pool_layout.hpp"
#include "pool/pool_segment.hpp"
#include "support/backends.hpp"

extern char** environ;

namespace vramswap::detail::test {
namespace {

constexpr gid_t k_group = 4711;  // the pods' shared group (numeric: needs no /etc/group entry)
constexpr uid_t k_outsider = 4799;

struct pod {
  pid_t pid = -1;  // the unshare process, outside the pod
  int out = -1;    // the worker's stdout
  int in = -1;     // the write end of its stdin, held open until the test ends: a step that
                   // reads stdin to its end (pool_client's "hold") holds until then, whatever
                   // stdin the test itself was given
  std::string err_path;
};

class Pods : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "skipped: making pods (namespaces, mounts, other uids) needs root";
    if (std::system("unshare --pid --fork --kill-child --mount --ipc --uts --mount-proc true >/dev/null 2>&1") != 0 ||
        std::system("command -v setpriv >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "skipped: cannot make PID, mount, IPC and UTS namespaces here (unshare failed), or setpriv is missing";
    }
    // The pool and its files are named by the device's key: "host-0", or the GPU's UUID.
    ASSERT_TRUE(test::device0_key(test::backend_under_test(), &key_));
    static int counter = 0;
    // Outside /tmp and /dev/shm, which every pod replaces with a fresh tmpfs of its own.
    dir_ = "/var/tmp/vramswap-pods-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0) << dir_;
    ASSERT_EQ(::chown(dir_.c_str(), 0, k_group), 0);
    ASSERT_EQ(::chmod(dir_.c_str(), 02770), 0);
    // The pods' programs, where their uids may run them (a build tree may be in a private
    // home), as an image would carry them: the worker, the demo, and vramswapd beside it.
    bin_ = dir_ + "-bin";
    ASSERT_EQ(::mkdir(bin_.c_str(), 0755), 0) << bin_;
    ASSERT_EQ(::chmod(bin_.c_str(), 0755), 0);
    for (const char* program : {VRAMSWAP_POD_WORKER, VRAMSWAP_DEMO, VRAMSWAP_SERVER_BINARY, VRAMSWAP_POOL_CLIENT}) {
      const std::string name = std::filesystem::path(program).filename();
      std::filesystem::copy_file(program, bin_ + "/" + name);
      ASSERT_EQ(::chmod((bin_ + "/" + name).c_str(), 0755), 0);
    }
    worker_ = bin_ + "/" + std::filesystem::path(VRAMSWAP_POD_WORKER).filename().string();
    demo_ = bin_ + "/" + std::filesystem::path(VRAMSWAP_DEMO).filename().string();
    server_binary_ = bin_ + "/" + std::filesystem::path(VRAMSWAP_SERVER_BINARY).filename().string();
    pool_client_ = bin_ + "/" + std::filesystem::path(VRAMSWAP_POOL_CLIENT).filename().string();
  }
  void TearDown() override {
    for (pod& p : pods_) {
      if (p.pid > 0) {
        ::kill(p.pid, SIGKILL);
        ::waitpid(p.pid, nullptr, 0);
      }
      if (p.out >= 0) ::close(p.out);
      if (p.in >= 0) ::close(p.in);
    }
    if (server_ > 0) {
      ::kill(server_, SIGKILL);
      ::waitpid(server_, nullptr, 0);
    }
    // Best effort: a leftover scratch folder only costs disk space.
    if (!dir_.empty() && std::system(("rm -rf " + dir_ + " " + bin_ + " " + dir_ + "-pod*.err").c_str()) != 0) {
      std::fprintf(stderr, "pods_test: could not remove %s\n", dir_.c_str());
    }
  }

  // The pods' whole environment: the runtime dir and group, the backend (host, or
  // VRAMSWAP_TEST_BACKEND=cuda on a GPU machine: frames then pass between the pods as CUDA
  // descriptors over the socket), and what the programs need to load and to sanitize.
  std::vector<std::string> env() const {
    std::vector<std::string> e = {"VRAMSWAP_RUNTIME_DIR=" + dir_, "VRAMSWAP_GROUP=" + std::to_string(k_group),
                                  "VRAMSWAP_BACKEND=" + test::backend_under_test(),
                                  "VRAMSWAP_HOST_DEVICE_MEMORY=256MiB", "VRAMSWAP_FRAME_SIZE=2MiB", "VRAMSWAP_POOL_SIZE=64MiB",
                                  "VRAMSWAP_LOG=warn",
                                  "PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
    for (const char* name : {"ASAN_OPTIONS", "UBSAN_OPTIONS", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES"}) {
      if (const char* v = std::getenv(name)) e.push_back(std::string(name) + "=" + v);
    }
    return e;
  }

  // Starts `args` as pid 1 of a new pod running as `uid` (in the shared group unless it is
  // the outsider).
  pod& start(uid_t uid, const std::vector<std::string>& args) {
    pod p;
    p.err_path = dir_ + "-pod" + std::to_string(pods_.size()) + ".err";
    // Each pod's primary group is its own (as a pod's runAsGroup would be); the shared group
    // is a supplementary one (supplementalGroups), so that sharing rests on the supplementary
    // groups the kernel reports (SO_PEERGROUPS, the runtime dir's permissions), not on a
    // primary group the pods happen to have in common.
    const std::string gid = std::to_string(uid);
    const std::string groups = uid == k_outsider ? std::to_string(k_outsider) : std::to_string(uid) + "," + std::to_string(k_group);
    std::vector<std::string> argv = {"unshare", "--pid", "--fork", "--kill-child", "--mount", "--ipc", "--uts", "--mount-proc",
                                     "--", "sh", "-c",
                                     "u=$1 g=$2 gs=$3; shift 3; "
                                     "mount -t tmpfs pod-tmp /tmp && mount -t tmpfs pod-shm /dev/shm && hostname pod && "
                                     "exec setpriv --reuid=\"$u\" --regid=\"$g\" --groups=\"$gs\" -- \"$@\"",
                                     "pod", std::to_string(uid), gid, groups};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    std::vector<std::string> e = env();
    std::vector<char*> cenv;
    for (std::string& v : e) cenv.push_back(v.data());
    cenv.push_back(nullptr);
    int out[2], in[2];
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(in, O_CLOEXEC), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addopen(&actions, 2, p.err_path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    EXPECT_EQ(::posix_spawnp(&p.pid, "unshare", &actions, nullptr, cargv.data(), cenv.data()), 0);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    ::close(in[0]);
    p.out = out[0];
    p.in = in[1];
    pods_.push_back(p);
    return pods_.back();
  }

  static std::string line_of(const pod& p) {
    std::string line;
    char ch;
    while (::read(p.out, &ch, 1) == 1 && ch != '\n') line += ch;
    return line;
  }
  static std::string errors_of(const pod& p) {
    std::ifstream in(p.err_path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Waits for the pod to end; what it wrote to stderr goes to *errors when given.
  static int finish(pod& p, std::string* errors = nullptr) {
    int status = 0;
    const pid_t got = ::waitpid(p.pid, &status, 0);
    p.pid = -1;
    if (errors != nullptr) *errors = errors_of(p);
    ::unlink(p.err_path.c_str());
    if (got < 0) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  // The pod's process inside its namespaces: the child of unshare's. Found by each process's
  // parent in /proc/<pid>/stat, not /proc/<pid>/task/<tid>/children, which the kernel says is
  // reliable only while the children are stopped (it was seen empty for a running child).
  static pid_t worker_of(const pod& p) {
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      const std::string name = entry.path().filename().string();
      if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream in(entry.path() / "stat");
      std::string stat;
      std::getline(in, stat);
      const size_t paren = stat.rfind(')');  // the command name may hold spaces and parentheses
      if (paren == std::string::npos) continue;
      std::istringstream rest(stat.substr(paren + 1));
      char state = 0;
      pid_t parent = 0;
      if (rest >> state >> parent && parent == p.pid) return static_cast<pid_t>(std::stol(name));
    }
    return 0;
  }

  std::string key_;  // the device's key
  std::string dir_;
  std::string bin_, worker_, demo_, server_binary_, pool_client_;
  std::deque<pod> pods_;  // a deque: start() hands out references that later starts keep valid
  pid_t server_ = -1;
};

TEST_F(Pods, ThreePodsIncrementACounterExactlyUnderTheLock) {
  const std::string counter = dir_ + "/counter";
  {
    const int fd = ::open(counter.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0660);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, sizeof(uint64_t)), 0);
    ASSERT_EQ(::fchown(fd, 0, k_group), 0);
    ASSERT_EQ(::fchmod(fd, 0660), 0);  // past the umask
    ::close(fd);
  }
  constexpr int k_each = 10000;
  for (uid_t uid : {4701u, 4702u, 4703u}) start(uid, {worker_, "count", counter, std::to_string(k_each)});
  for (pod& p : pods_) {
    std::string errors;
    EXPECT_EQ(finish(p, &errors), 0) << errors;
  }
  uint64_t total = 0;
  std::ifstream in(counter, std::ios::binary);
  in.read(reinterpret_cast<char*>(&total), sizeof total);
  EXPECT_EQ(total, 3u * k_each) << "three pods each incremented " << k_each << " times under the lock; a lost update means two "
                                << "held it at once";
}

TEST_F(Pods, AHolderKilledInOnePodLetsAWaiterInAnotherProceedWithin100ms) {
  pod& holder = start(4701, {worker_, "hold"});
  ASSERT_EQ(line_of(holder), "holding") << errors_of(holder);
  pod& waiter = start(4702, {worker_, "wait"});
  ASSERT_EQ(line_of(waiter), "waiting") << errors_of(waiter);
  // Still waiting a while later: the live holder in another PID namespace is not taken for dead.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  pollfd none{waiter.out, POLLIN, 0};
  EXPECT_EQ(::poll(&none, 1, 0), 0) << "the waiter was granted while the holder lived: " << line_of(waiter);
  const pid_t worker = worker_of(holder);
  ASSERT_GT(worker, 0) << "the holder pod's process is gone: " << errors_of(holder);
  struct stat holder_ns {};
  ASSERT_EQ(::stat(("/proc/" + std::to_string(worker) + "/ns/pid").c_str(), &holder_ns), 0);
  const uint64_t killed = monotonic_ns();
  ASSERT_EQ(::kill(worker, SIGKILL), 0);
  const std::string granted = line_of(waiter);
  uint64_t at = 0;
  int died = 0;
  uint64_t dead_ns = 0;
  ASSERT_EQ(std::sscanf(granted.c_str(), "granted %" SCNu64 " previous_holder_died=%d dead_holder_pid_ns=%" SCNu64, &at, &died, &dead_ns), 3)
      << granted << errors_of(waiter);
  EXPECT_EQ(dead_ns, static_cast<uint64_t>(holder_ns.st_ino)) << "the dead holder's pid is named with its PID namespace";
  EXPECT_LT(at - killed, 100'000'000u) << "granted " << (at - killed) / 1e6 << " ms after the holder's SIGKILL";
  EXPECT_EQ(died, 1) << "the waiter learns that its predecessor died holding the lock";
  EXPECT_EQ(finish(waiter), 0) << errors_of(waiter);
  EXPECT_NE(finish(holder), 0) << "the holder was killed";
}

// Thread ids repeat across pods (each pod's worker is pid 1, its main thread tid 1). One pod's
// thread is inside the lock's internal critical section; another pod's, blocked on entering
// it, is killed. Nothing may take that death for the first one's: a third pod's thread stays
// outside until the first leaves, and no repair runs. (A robust pthread mutex, whose owner is
// a thread id, took it for the owner's death: the kernel compares ids from each thread's own
// namespace, and the third pod repaired the state while the first was still inside.)
TEST_F(Pods, AWaiterKilledInOnePodIsNotTakenForTheInternalMutexsOwnerInAnother) {
  pod& holder = start(4701, {worker_, "hold"});
  ASSERT_EQ(line_of(holder), "holding") << errors_of(holder);
  pod& inside = start(4702, {worker_, "stall-inside"});
  ASSERT_EQ(line_of(inside), "waiting") << errors_of(inside);
  ASSERT_EQ(line_of(inside), "inside") << errors_of(inside);
  pod& doomed = start(4703, {worker_, "wait"});
  ASSERT_EQ(line_of(doomed), "waiting") << errors_of(doomed);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // blocked on the internal mutex by now
  const pid_t doomed_worker = worker_of(doomed);
  ASSERT_GT(doomed_worker, 0) << errors_of(doomed);
  ASSERT_EQ(::kill(doomed_worker, SIGKILL), 0);
  EXPECT_NE(finish(doomed), 0);
  pod& next = start(4704, {worker_, "wait"});
  ASSERT_EQ(line_of(next), "waiting") << errors_of(next);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(errors_of(next).find("died inside"), std::string::npos)
      << "a waiter's death was taken for the death of the live owner of the internal mutex: " << errors_of(next);
  // The first pod goes on; the holder dies, the first pod is granted, then the last.
  ASSERT_EQ(::write(inside.in, "\n", 1), 1);
  const pid_t holder_worker = worker_of(holder);
  ASSERT_GT(holder_worker, 0);
  ASSERT_EQ(::kill(holder_worker, SIGKILL), 0);
  EXPECT_EQ(line_of(inside).rfind("granted ", 0), 0u) << errors_of(inside);
  EXPECT_EQ(line_of(next).rfind("granted ", 0), 0u) << errors_of(next);
  std::string errors;
  EXPECT_EQ(finish(inside, &errors), 0) << errors;
  EXPECT_EQ(finish(next, &errors), 0) << errors;
  EXPECT_EQ(errors.find("died inside"), std::string::npos) << errors;
  EXPECT_NE(finish(holder), 0) << "the holder was killed";
}

TEST_F(Pods, TwoPodsTakeTurnsOnTheDeviceWithEveryByteIntact) {
  // The node's pool server, as a DaemonSet runs it: outside the pods, in the runtime dir.
  std::vector<std::string> e = env();
  std::vector<char*> cenv;
  for (std::string& v : e) cenv.push_back(v.data());
  cenv.push_back(nullptr);
  const char* argv[] = {server_binary_.c_str(), "--foreground", "--pool-size", "64M", nullptr};
  ASSERT_EQ(::posix_spawn(&server_, server_binary_.c_str(), nullptr, nullptr, const_cast<char**>(argv), cenv.data()), 0);
  const std::string socket = dir_ + "/" + key_ + ".sock";
  for (int i = 0; i < 300 && ::access(socket.c_str(), F_OK) != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(::access(socket.c_str(), F_OK), 0) << "vramswapd did not create " << socket;
  // 40 MiB each, 80 MiB together over a 64 MiB pool: every turn brings memory back.
  const std::string bytes = std::to_string(40u << 20);
  pod& a = start(4701, {demo_, "--worker", "0", bytes, "4"});
  pod& b = start(4702, {demo_, "--worker", "1", bytes, "4"});
  std::string turns_a, turns_b;
  for (std::string l = line_of(a); !l.empty(); l = line_of(a)) turns_a += l + "\n";
  for (std::string l = line_of(b); !l.empty(); l = line_of(b)) turns_b += l + "\n";
  const std::string errors = errors_of(a) + errors_of(b);
  EXPECT_EQ(finish(a), 0) << errors;
  EXPECT_EQ(finish(b), 0) << errors;
  EXPECT_EQ(errors.find("DIFFERS"), std::string::npos) << errors;
  auto count_turns = [](const std::string& t) {
    size_t n = 0;
    for (size_t at = t.find("turn "); at != std::string::npos; at = t.find("turn ", at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count_turns(turns_a), 4u) << turns_a;
  EXPECT_EQ(count_turns(turns_b), 4u) << turns_b;
}

TEST_F(Pods, APodOutsideTheGroupIsRefusedClearly) {
  pod& p = start(k_outsider, {worker_, "hold"});
  const std::string line = line_of(p);
  const std::string errors = errors_of(p);
  EXPECT_EQ(finish(p), 1) << line << errors;
  EXPECT_NE(errors.find("the runtime dir " + dir_), std::string::npos) << errors;
  EXPECT_NE(errors.find("may not enter it"), std::string::npos) << errors;
  EXPECT_NE(errors.find("gid " + std::to_string(k_group)), std::string::npos) << "the message names the group to join:\n" << errors;
  EXPECT_NE(errors.find("VRAMSWAP_GROUP=" + std::to_string(k_group) + ")"), std::string::npos)
      << "the setting to use, as it would be typed:\n" << errors;
}

TEST_F(Pods, AServerInItsOwnPodRepairsAKilledPodsFramesAtOnce) {
  // The server in a pod of its own, as a DaemonSet runs it: it cannot see the clients' pids
  // (sibling PID namespaces), so only the pidfd each client sent can tell it of a death
  // before the grace period after the hang-up.
  pod& server = start(0, {server_binary_, "--foreground", "--pool-size", "64M"});
  const std::string socket = dir_ + "/" + key_ + ".sock";
  for (int i = 0; i < 300 && ::access(socket.c_str(), F_OK) != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(::access(socket.c_str(), F_OK), 0) << "vramswapd did not create " << socket << ": " << errors_of(server);
  pod& client = start(4701, {pool_client_, "connect-noauto", "own", "3", "write", "3", "11", "ready", "hold"});
  const std::string ready = line_of(client);
  ASSERT_EQ(ready.rfind("ready ", 0), 0u) << ready << errors_of(client) << errors_of(server);
  option_set(option_id::runtime_dir, dir_.c_str());
  option_set(option_id::group, std::to_string(k_group).c_str());
  std::string name;
  std::unique_ptr<pool_segment> pool;
  ASSERT_EQ(pool_segment::name_for(key_, &name), ok) << last_error();
  ASSERT_EQ(pool_segment::open(name, &pool, /*read_only=*/true), ok) << last_error();
  option_set(option_id::runtime_dir, nullptr);
  option_set(option_id::group, nullptr);
  const uint32_t frames = pool->frame_count();
  EXPECT_LT(pool->count(pool_layout::frame_free), frames) << "the client owns frame 3";
  const pid_t worker = worker_of(client);
  ASSERT_GT(worker, 0) << "the client pod's process is gone: " << errors_of(client) << errors_of(server);
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(worker, SIGKILL), 0);
  while (pool->count(pool_layout::frame_free) != frames && std::chrono::steady_clock::now() - killed < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_EQ(pool->count(pool_layout::frame_free), frames) << "the killed pod's frames were never repaired";
  EXPECT_LT(waited, 1.5) << "repaired " << waited << " s after the kill: the grace period (2 s), not the pidfd, decided";
  finish(client);
}

TEST_F(Pods, AnyMemberRestartsThePoolAnotherMemberStarted) {
  // Member 4701's pod starts the pool on demand; its namespace ends with it, and the server
  // with it (killed: its files stay behind). Member 4702's pod then starts the pool again
  // over the files 4701 made: they were made for the group.
  pod& first = start(4701, {demo_, "--worker", "0", std::to_string(8u << 20), "1"});
  while (!line_of(first).empty()) {
  }
  const std::string errors_first = errors_of(first);
  ASSERT_EQ(finish(first), 0) << errors_first;
  struct stat st {};
  ASSERT_EQ(::stat((dir_ + "/" + key_ + ".server.lock").c_str(), &st), 0) << "the first pod's server made its lock file";
  EXPECT_EQ(st.st_uid, 4701u);
  EXPECT_EQ(st.st_gid, k_group) << "files in the runtime dir belong to the group";
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  pod& second = start(4702, {demo_, "--worker", "1", std::to_string(8u << 20), "1"});
  std::string turns;
  for (std::string l = line_of(second); !l.empty(); l = line_of(second)) turns += l + "\n";
  const std::string errors = errors_of(second);
  EXPECT_EQ(finish(second), 0) << errors;
  EXPECT_NE(turns.find("turn 1 "), std::string::npos) << turns << errors;
}

}  // namespace
}  // namespace vramswap::detail::test
