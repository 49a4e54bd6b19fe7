// The shared host pool is charged to vramswapd's memory cgroup (a DaemonSet container's
// limit, the cgroup of the job that started it). A pool larger than what that cgroup has
// left is refused at start, naming the limit, instead of the OOM killer ending the server
// silently while it faults the pool in. A real vramswapd on the host backend, in a memory
// cgroup of 256 MiB made here (cgroup v2 or v1); skipped, saying why, where none can be made.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return static_cast<bool>(out);
}

TEST(HostPoolCgroup, AHostPoolLargerThanTheServersCgroupAllowsIsRefusedByName) {
  if (::geteuid() != 0) GTEST_SKIP() << "skipped: making a memory cgroup needs root";
  const std::string name = "vramswap-test-" + std::to_string(::getpid());
  // v2 where the unified hierarchy has the memory controller, else v1's memory hierarchy.
  std::string dir, limit_file;
  if (slurp("/sys/fs/cgroup/cgroup.controllers").find("memory") != std::string::npos) {
    dir = "/sys/fs/cgroup/" + name;
    limit_file = "memory.max";
  } else {
    dir = "/sys/fs/cgroup/memory/" + name;
    limit_file = "memory.limit_in_bytes";
  }
  if (::mkdir(dir.c_str(), 0755) != 0) GTEST_SKIP() << "skipped: cannot make a memory cgroup at " << dir << ": " << std::strerror(errno);
  if (!write_file(dir + "/" + limit_file, std::to_string(256u << 20))) {
    ::rmdir(dir.c_str());
    GTEST_SKIP() << "skipped: cannot set " << dir << "/" << limit_file;
  }
  char rt_template[] = "/tmp/vscgXXXXXX";
  ASSERT_NE(::mkdtemp(rt_template), nullptr);
  const std::string rt = rt_template;
  const std::string err = rt + "/server.err";
  const std::string command = "echo $$ > " + dir + "/cgroup.procs && exec env VRAMSWAP_RUNTIME_DIR=" + rt +
                              " VRAMSWAP_BACKEND=host VRAMSWAP_HOST_DEVICE_MEMORY=256MiB VRAMSWAP_FRAME_SIZE=2MiB VRAMSWAP_LOG=warn " +
                              VRAMSWAP_SERVER_BINARY " --foreground --pool-size 16MiB --host-pool 512MiB 2> " + err;
  const int status = std::system(command.c_str());
  const std::string said = slurp(err);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << "status " << status << " (137: killed by the OOM killer): " << said;
  EXPECT_NE(said.find("does not fit this server's memory cgroup"), std::string::npos) << said;
  EXPECT_NE(said.find(limit_file), std::string::npos) << said;
  ::rmdir(dir.c_str());
  (void)!std::system(("rm -rf " + rt).c_str());
}

}  // namespace
