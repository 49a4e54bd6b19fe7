// Real filesystems made by a test: a mount (tmpfs, or a loop-mounted image) and a small
// ext4 image, for the cases a full or read-only disk must show. Mounting needs root; the
// helpers say why when it is not possible here, for the test to skip with that reason.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace vramswap::detail::test {

// A filesystem mounted by the test, unmounted (and its mount point removed) at the end.
class scratch_mount {
 public:
  // Mount `args` ("-t tmpfs -o size=8m,ro tmpfs" or "-o loop IMAGE") on a new directory.
  bool mount(const std::string& args, std::string* why) {
    char tmpl[] = "/tmp/vramswap-mnt-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      *why = std::string("mkdtemp: ") + std::strerror(errno);
      return false;
    }
    dir_ = tmpl;
    const std::string cmd = "mount " + args + " " + dir_ + " 2>/dev/null";
    if (::geteuid() != 0 || std::system(cmd.c_str()) != 0) {
      *why = "cannot mount a scratch filesystem here (needs root and mount permission): `" + cmd + "` failed";
      return false;
    }
    mounted_ = true;
    return true;
  }
  ~scratch_mount() {
    // The kernel may drop its last reference to a closed file a moment later (io_uring
    // tears its ring down asynchronously): retry, then detach lazily.
    for (int i = 0; mounted_ && i < 50; ++i) {
      if (std::system(("umount " + dir_ + " 2>/dev/null").c_str()) == 0) mounted_ = false;
      else ::usleep(20000);
    }
    // Last resort, lazily: a failure here leaves a mount behind, which the next run replaces.
    if (mounted_ && std::system(("umount -l " + dir_).c_str()) != 0) std::fprintf(stderr, "could not unmount %s\n", dir_.c_str());
    if (!dir_.empty()) ::rmdir(dir_.c_str());
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

// A 24 MiB ext4 image, loop-mounted on `m` (about 20 MiB free); the image is removed when
// `img` goes. False with `why` where that is not possible here.
struct scratch_image {
  char path[64] = "/var/tmp/vramswap-enospc-XXXXXX";
  ~scratch_image() {
    if (path[0] != '\0') ::unlink(path);
  }
};
inline bool mount_small_ext4(scratch_mount& m, scratch_image& img, std::string* why) {
  if (::system("command -v mkfs.ext4 >/dev/null 2>&1") != 0) {
    *why = "mkfs.ext4 is not installed";
    return false;
  }
  const int fd = ::mkstemp(img.path);
  if (fd < 0 || ::close(fd) != 0 || ::truncate(img.path, 24ull << 20) != 0 ||
      std::system(("mkfs.ext4 -q -F -m 0 " + std::string(img.path) + " >/dev/null 2>&1").c_str()) != 0) {
    *why = std::string("cannot make an ext4 image in /var/tmp: ") + std::strerror(errno);
    return false;
  }
  return m.mount("-o loop " + std::string(img.path), why);
}

}  // namespace vramswap::detail::test
