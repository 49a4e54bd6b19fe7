#include "pool/process_label.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace vramswap::detail {

namespace {

// The whole of a small /proc file (up to `max` bytes); "" when unreadable.
std::string read_proc(pid_t pid, const char* what, size_t max) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/%s", static_cast<int>(pid), what);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string out;
  char buf[4096];
  while (out.size() < max) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (out.size() > max) out.resize(max);
  return out;
}

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos || slash + 1 == path.size() ? path : path.substr(slash + 1);
}

// Programs whose first argument that is not an option is the script they run.
bool is_interpreter(const std::string& program) {
  static const char* const k_names[] = {"python", "pypy", "bash", "sh", "dash", "zsh", "perl", "ruby", "node", "Rscript", "julia", "lua"};
  for (const char* name : k_names) {
    const size_t n = std::strlen(name);
    if (program.compare(0, n, name) != 0) continue;
    // "python", "python3", "python3.11", "pypy3": the name, then a version or nothing.
    bool version = true;
    for (size_t i = n; i < program.size(); ++i) version = version && (std::isdigit(static_cast<unsigned char>(program[i])) || program[i] == '.');
    if (version) return true;
  }
  return false;
}

bool is_hex(const std::string& s, size_t from, size_t n) {
  if (from + n > s.size()) return false;
  for (size_t i = from; i < from + n; ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

// The run of characters of `s` from `from` that `keep` accepts.
template <typename Keep>
std::string run_of(const std::string& s, size_t from, Keep keep) {
  size_t end = from;
  while (end < s.size() && keep(static_cast<unsigned char>(s[end]))) ++end;
  return s.substr(from, end - from);
}

// `tag` + the 12 hex digits after `marker` in `path` ("docker-<64 hex>.scope"); "" when absent.
std::string container_id(const std::string& path, const char* marker, const char* tag) {
  for (size_t at = path.find(marker); at != std::string::npos; at = path.find(marker, at + 1)) {
    const size_t id = at + std::strlen(marker);
    if (is_hex(path, id, 12)) return std::string(tag) + " " + path.substr(id, 12);
  }
  return "";
}

std::string container_in_path(const std::string& path) {
  // A pod first: inside it, the runtime's own scope (cri-containerd-..., crio-..., docker-...)
  // names only one of the pod's containers.
  if (path.find("kubepods") != std::string::npos) {
    for (size_t at = path.find("pod"); at != std::string::npos; at = path.find("pod", at + 1)) {
      // kubepods-burstable-pod<uid with _>.slice, or /kubepods/burstable/pod<uid>/
      if (at >= 5 && path.compare(at - 5, 8, "kubepods") == 0) continue;  // the "pod" of "kubepods"
      std::string uid = run_of(path, at + 3, [](unsigned char c) { return std::isxdigit(c) || c == '-' || c == '_'; });
      if (uid.size() < 8 || !is_hex(uid, 0, 8)) continue;
      return "pod " + uid.substr(0, 8);
    }
  }
  for (const auto& [marker, tag] : {std::pair{"docker-", "docker"}, std::pair{"/docker/", "docker"}, std::pair{"libpod-", "podman"},
                                    std::pair{"cri-containerd-", "containerd"}, std::pair{"crio-", "cri-o"}}) {
    std::string found = container_id(path, marker, tag);
    if (!found.empty()) return found;
  }
  if (path.find("slurm") != std::string::npos) {
    const size_t at = path.find("/job_");
    if (at != std::string::npos) {
      const std::string job = run_of(path, at + 5, [](unsigned char c) { return std::isdigit(c) != 0; });
      if (!job.empty()) return "slurm " + job;
    }
  }
  for (const char* marker : {"/lxc.payload.", "/lxc/"}) {
    const size_t at = path.find(marker);
    if (at == std::string::npos) continue;
    const std::string name = run_of(path, at + std::strlen(marker), [](unsigned char c) { return c != '/'; });
    if (!name.empty()) return "lxc " + name;
  }
  return "";
}

}  // namespace

std::string cut_utf8(const std::string& text, size_t max) noexcept {
  try {
    if (text.size() <= max) return text;
    size_t n = max;
    // Back up over continuation bytes (10xxxxxx) to the start of the character cut in two.
    while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
    return text.substr(0, n);
  } catch (...) {
    return "";
  }
}

std::string shorten_command_line(const std::string& raw) noexcept {
  try {
    std::vector<std::string> argv;
    for (size_t at = 0; at < raw.size();) {
      size_t end = raw.find('\0', at);
      if (end == std::string::npos) end = raw.size();
      argv.push_back(raw.substr(at, end - at));
      at = end + 1;
    }
    while (!argv.empty() && argv.back().empty()) argv.pop_back();
    if (argv.empty()) return "";
    // Rewritten into one string ("python train.py --lr 3e-4" with no NULs): a '/' may be
    // anywhere in it, so only a leading directory of the program is dropped.
    if (argv.size() == 1 && argv[0].find(' ') != std::string::npos) {
      const size_t space = argv[0].find(' ');
      return base_name(argv[0].substr(0, space)) + argv[0].substr(space);
    }
    std::string out = base_name(argv[0]);
    bool script_next = is_interpreter(out);
    for (size_t i = 1; i < argv.size(); ++i) {
      std::string a = argv[i];
      if (script_next && !a.empty() && a[0] != '-') {
        a = base_name(a);
        script_next = false;
      } else if (script_next && (a == "-m" || a == "-c")) {
        script_next = false;  // a module or a program text follows, not a script's path
      }
      const bool quote = a.empty() || a.find_first_of(" \t") != std::string::npos;
      out += quote ? " '" + a + "'" : " " + a;
    }
    return out;
  } catch (...) {
    return "";
  }
}

std::string command_line_of(pid_t pid) noexcept {
  try {
    return shorten_command_line(read_proc(pid, "cmdline", 8192));
  } catch (...) {
    return "";
  }
}

std::string container_from_cgroup(const std::string& text) noexcept {
  try {
    // "0::/system.slice/docker-<id>.scope" (v2), or one line per hierarchy (v1): the first
    // line that names something wins.
    for (size_t at = 0; at < text.size();) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(at, end - at);
      at = end + 1;
      const size_t first = line.find(':');
      const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
      if (second == std::string::npos) continue;
      std::string found = container_in_path(line.substr(second + 1));
      if (!found.empty()) return found;
    }
    return "";
  } catch (...) {
    return "";
  }
}

std::string container_of(pid_t pid) noexcept {
  try {
    return container_from_cgroup(read_proc(pid, "cgroup", 16384));
  } catch (...) {
    return "";
  }
}

bool effective_uid_of(pid_t pid, uid_t* out) noexcept {
  try {
    const std::string status = read_proc(pid, "status", 8192);
    const size_t at = status.find("\nUid:");
    if (at == std::string::npos) return false;
    unsigned long real = 0, effective = 0;
    if (std::sscanf(status.c_str() + at + 5, "%lu %lu", &real, &effective) != 2) return false;
    *out = static_cast<uid_t>(effective);
    return true;
  } catch (...) {
    return false;
  }
}

std::string user_name(uid_t uid) noexcept {
  try {
    // Remembered: a directory service (LDAP, sssd) may take milliseconds a lookup, and a
    // metrics endpoint or `vramswap status --watch` asks again at every refresh.
    static std::mutex mutex;
    static std::map<uid_t, std::string> known;
    std::lock_guard<std::mutex> hold(mutex);
    auto it = known.find(uid);
    if (it != known.end()) return it->second;
    char buf[4096];
    passwd entry{};
    passwd* found = nullptr;
    std::string name = ::getpwuid_r(uid, &entry, buf, sizeof buf, &found) == 0 && found != nullptr ? found->pw_name : std::to_string(uid);
    if (known.size() < 4096) known.emplace(uid, name);
    return name;
  } catch (...) {
    return "";
  }
}

}  // namespace vramswap::detail
