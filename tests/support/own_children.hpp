// Stopping every child of the test process, whether the test started it or adopted it as a
// child subreaper (PR_SET_CHILD_SUBREAPER: a vramswapd that a client started and that
// detached). A fixture calls it in TearDown so that nothing it started outlives the test,
// even when an assertion ended the test halfway: a server left running holds its pid, its
// socket and its /dev/shm segments, and with VRAMSWAP_POOL_IDLE_EXIT=0 it never ends.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace vramswap::detail::test {

// A /proc file's text; "" when the process went away meanwhile (libstdc++'s filebuf throws
// on the read error, ESRCH, that a process ending between the open and the read gives).
inline std::string read_proc_file(const std::string& path) {
  try {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  } catch (const std::exception&) {
    return "";
  }
}

// The live children of this process (from /proc/<pid>/stat's ppid field), with their command.
inline std::vector<std::pair<pid_t, std::string>> live_children() {
  std::vector<std::pair<pid_t, std::string>> kids;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return kids;
  const pid_t me = ::getpid();
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    const std::string stat = read_proc_file("/proc/" + std::string(e->d_name) + "/stat");
    // pid (comm) state ppid ...: comm may hold spaces and parentheses; the last ')' ends it.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    char state = 0;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid != me || state == 'Z') continue;
    std::string cmd = read_proc_file("/proc/" + std::string(e->d_name) + "/cmdline");
    for (char& c : cmd) c = c == '\0' ? ' ' : c;
    kids.emplace_back(static_cast<pid_t>(pid), cmd);
  }
  ::closedir(d);
  return kids;
}

// SIGTERM to every live child (a server then removes its socket and segments), SIGKILL to
// those still running after `grace`, and every child reaped. What had to be stopped, a line
// each, for the caller to show ("" when nothing was left).
inline std::string stop_own_children(std::chrono::milliseconds grace = std::chrono::seconds(10)) {
  std::string said;
  auto kids = live_children();
  for (const auto& [pid, cmd] : kids) {
    said += "pid " + std::to_string(pid) + " (" + cmd + ") was still running\n";
    ::kill(pid, SIGTERM);
    ::kill(pid, SIGCONT);  // a stopped one acts on SIGTERM only once it runs
  }
  const auto until = std::chrono::steady_clock::now() + grace;
  while (!kids.empty() && std::chrono::steady_clock::now() < until) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    kids = live_children();
    if (!kids.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (const auto& [pid, cmd] : kids) {
    said += "pid " + std::to_string(pid) + " (" + cmd + ") ignored SIGTERM for " + std::to_string(grace.count()) + " ms: killed\n";
    ::kill(pid, SIGKILL);
  }
  // SIGKILL ends a process however it is stuck in user space; one in the kernel (D state)
  // ends when the kernel lets it: bounded, and said.
  const auto kill_until = std::chrono::steady_clock::now() + grace;
  while (!kids.empty() && std::chrono::steady_clock::now() < kill_until) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    kids = live_children();
    if (!kids.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (const auto& [pid, cmd] : kids) said += "pid " + std::to_string(pid) + " (" + cmd + ") did not end even after SIGKILL\n";
  return said;
}

}  // namespace vramswap::detail::test
