// Description: whose segments vramswap uses. Names carry the owner (u<uid>, g<gid> in group
// mode); a lock or pool segment that another user made first at our name, or one of ours
// that is open to others, is refused with err_not_owner, naming it and its owner, and left
// alone. The foreign objects are real files in the runtime dir given to uid 65534 (nobody) with
// fchown, so those cases need root (CI runs as root) and skip otherwise.
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <functional>
#include <string>

#include "lock/device_lock.hpp"
#include "lock/ownership.hpp"
#include "lock/runtime_dir.hpp"
#include "lock/shared_segment.hpp"
#include "pool/pool_segment.hpp"
#include "lock_test_support.hpp"

namespace vramswap::detail::lock_test {
namespace {

constexpr uid_t k_nobody = 65534;

class Ownership : public lock_fixture {
 protected:
  void TearDown() override {
    for (const std::string& p : made_) ::unlink(p.c_str());
    pool_segment::remove(key_);
    lock_fixture::TearDown();
  }
  // A file at `path` owned by `uid` with `mode`, as a squatter would leave it.
  void make_file(const std::string& path, uid_t uid, mode_t mode) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
    made_.push_back(path);
    ASSERT_EQ(::fchown(fd, uid, uid), 0) << std::strerror(errno);
    ASSERT_EQ(::fchmod(fd, mode), 0);
    ::close(fd);
  }
  std::string pool_path() const {
    std::string name, dir;
    EXPECT_EQ(pool_segment::name_for(key_, &name), ok) << last_error();
    EXPECT_EQ(runtime_dir(/*create=*/true, &dir), ok) << last_error();
    return dir + name;
  }
  std::vector<std::string> made_;
};

TEST_F(Ownership, NamesCarryTheOwner) {
  std::string lock_name, pool_name;
  ASSERT_EQ(shared_segment::name_for(key_, &lock_name), ok);
  ASSERT_EQ(pool_segment::name_for(key_, &pool_name), ok);
  const std::string user = "u" + std::to_string(::geteuid());
  EXPECT_EQ(lock_name, "/" + prefix_ + "vramswap-" + user + "-" + key_);
  EXPECT_EQ(pool_name, "/" + prefix_ + "vramswap-" + user + "-pool-" + key_);
  option_set(option_id::group, std::to_string(::getegid()).c_str());
  const int rc = shared_segment::name_for(key_, &lock_name);
  option_set(option_id::group, nullptr);
  ASSERT_EQ(rc, ok);
  EXPECT_EQ(lock_name, "/" + prefix_ + "vramswap-g" + std::to_string(::getegid()) + "-" + key_);
}

TEST_F(Ownership, AnotherUsersLockSegmentIsRefusedAndLeftAlone) {
  if (::geteuid() != 0) GTEST_SKIP() << "skipped: needs root to give a file to uid 65534";
  // What a squatter leaves: the victim's name, made first, open to everyone. Used, it would
  // let them forge a holder or hold the internal mutex.
  make_file(segment_path(), k_nobody, 0666);
  device_lock lock;
  clear_error();
  EXPECT_EQ(device_lock::open(key_, &lock), err_not_owner);
  const std::string said = last_error();
  EXPECT_NE(said.find("the lock segment " + segment_path()), std::string::npos) << said;
  EXPECT_NE(said.find("belongs to uid 65534"), std::string::npos) << said;
  EXPECT_NE(said.find("rm " + segment_path()), std::string::npos) << said;
  struct stat st {};
  ASSERT_EQ(::stat(segment_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, k_nobody) << "the foreign segment was touched";
  EXPECT_EQ(st.st_size, 0) << "the foreign segment was initialized";
}

TEST_F(Ownership, OwnLockSegmentOpenToOthersIsRefused) {
  device_lock user;  // keeps the segment (its last user to close removes it)
  ASSERT_EQ(device_lock::open(key_, &user), ok) << last_error();
  ASSERT_EQ(::chmod(segment_path().c_str(), 0666), 0);
  device_lock lock;
  clear_error();
  EXPECT_EQ(device_lock::open(key_, &lock), err_not_owner);
  const std::string said = last_error();
  EXPECT_NE(said.find(segment_path() + " is open to other users"), std::string::npos) << said;
  EXPECT_NE(said.find("mode 0666"), std::string::npos) << said;
  EXPECT_NE(said.find("at most 0600): anyone could have written into it; it is left alone"), std::string::npos) << said;
}

TEST_F(Ownership, AnotherUsersPoolSegmentIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "skipped: needs root to give a file to uid 65534";
  make_file(pool_path(), k_nobody, 0644);
  std::string name;
  ASSERT_EQ(pool_segment::name_for(key_, &name), ok);
  std::unique_ptr<pool_segment> seg;
  clear_error();
  EXPECT_EQ(pool_segment::open(name, &seg, /*read_only=*/true), err_not_owner);
  EXPECT_NE(std::string(last_error()).find("belongs to uid 65534"), std::string::npos) << last_error();
  // A server never takes it over either: the name is refused, by owner, not replaced.
  clear_error();
  EXPECT_EQ(pool_segment::create(key_, 4, 2 << 20, 0, ::getpid(), 0, &seg), err_not_owner);
  const std::string said = last_error();
  EXPECT_NE(said.find("the pool segment " + pool_path() + " belongs to uid 65534"), std::string::npos) << said;
  struct stat st {};
  ASSERT_EQ(::stat(pool_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, k_nobody);
}

TEST_F(Ownership, LivePoolSegmentIsNeverRemovedOrReplaced) {
  process_identity me{};
  ASSERT_EQ(current_process(&me), ok);
  std::unique_ptr<pool_segment> first;
  ASSERT_EQ(pool_segment::create(key_, 4, 2 << 20, 0, me.pid, me.start_time, &first), ok) << last_error();
  struct stat before {};
  ASSERT_EQ(::stat(pool_path().c_str(), &before), 0);
  clear_error();
  EXPECT_EQ(pool_segment::remove(key_), err_busy);
  EXPECT_NE(std::string(last_error()).find("pool server pid " + std::to_string(::getpid())), std::string::npos) << last_error();
  // A second claimant in another process (flocks are per open file, so it must be one).
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::unique_ptr<pool_segment> second;
    ::_exit(pool_segment::create(key_, 4, 2 << 20, 0, ::getpid(), 0, &second) == err_busy ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a second server took a live pool segment";
  struct stat after {};
  ASSERT_EQ(::stat(pool_path().c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino) << "the live segment was replaced";
  EXPECT_EQ(first->header()->magic.load(), pool_layout::k_magic);
  // Its server gone, the name goes with it.
  first.reset();
  EXPECT_NE(::access(pool_path().c_str(), F_OK), 0);
}

// Users of one group (VRAMSWAP_GROUP) who create the same file at the same moment, as pods
// starting together do with the device lock's segment: each one opens it, none meets it
// half made (its creator's, mode 0600, before the group and mode are set).
// In a child: become uid `uid`, primary group `primary`, supplementary group `group`, and
// set VRAMSWAP_GROUP to it. False when the kernel refuses.
bool become_member(uid_t uid, gid_t primary, gid_t group) {
  const gid_t groups[] = {group};
  if (::setgroups(1, groups) != 0 || ::setresgid(primary, primary, primary) != 0 || ::setresuid(uid, uid, uid) != 0) return false;
  option_set(option_id::group, std::to_string(group).c_str());
  return true;
}

// A new directory of `group`, mode 02770 (a node's shared runtime dir); "" (the failure
// reported) when it cannot be made.
std::string make_group_dir(gid_t group) {
  char dir_template[] = "/tmp/vsgroupXXXXXX";
  if (::mkdtemp(dir_template) == nullptr || ::chown(dir_template, 0, group) != 0 || ::chmod(dir_template, 02770) != 0) {
    ADD_FAILURE() << "a directory of group " << group << ": " << std::strerror(errno);
    return "";
  }
  return dir_template;
}

// `users` members of `group` (uids 4791 on), each in a process of its own, run `step` for
// `rounds` rounds, all released together each round (the start line of a race). Their
// primary group is `group`, or their own with `own_primary_group`. Returns how many steps
// failed; *first: the first failure's detail.
int race_members(gid_t group, bool own_primary_group, int users, int rounds, const std::function<bool(int round)>& step,
                 std::string* first) {
  struct barrier {
    std::atomic<int> arrived{0};
    std::atomic<int> failures{0};
    char first_failure[512];
  };
  barrier* b = shared_object<barrier>();
  std::vector<pid_t> children;
  for (int u = 0; u < users; ++u) {
    children.push_back(spawn([&, u] {
      const uid_t uid = 4791 + u;
      if (!become_member(uid, own_primary_group ? uid : group, group)) return 2;
      for (int round = 0; round < rounds; ++round) {
        b->arrived.fetch_add(1);
        while (b->arrived.load() < (round + 1) * users) sched_yield();
        if (!step(round) && b->failures.fetch_add(1) == 0) {
          std::snprintf(b->first_failure, sizeof b->first_failure, "uid %d, round %d: %s", static_cast<int>(uid), round, last_error());
        }
      }
      return 0;
    }));
  }
  for (pid_t p : children) EXPECT_EQ(reap(p), 0);
  const int failures = b->failures.load();
  *first = b->first_failure;
  free_shared_object(b);
  return failures;
}

TEST_F(Ownership, UsersOfTheGroupCreatingAFileAtOnceAllOpenIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "skipped: needs root to run processes as other users";
  constexpr gid_t k_group = 4790;
  constexpr int k_users = 4, k_rounds = 300;
  const std::string dir = make_group_dir(k_group);
  ASSERT_FALSE(dir.empty());
  std::string first;
  const int failures = race_members(k_group, /*own_primary_group=*/false, k_users, k_rounds, [&](int round) {
    int fd = -1;
    if (open_owned(dir + "/segment-" + std::to_string(round), O_RDWR | O_CREAT, "the test file", "", &fd) != ok) return false;
    ::close(fd);
    return true;
  }, &first);
  EXPECT_EQ(failures, 0) << "opens that failed; the first: " << first;
  // Nothing left behind but the files themselves.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_NE(entry.path().filename().string()[0], '.') << "a temporary name left behind: " << entry.path();
    ++files;
  }
  EXPECT_EQ(files, k_rounds);
  std::filesystem::remove_all(dir);
}

// Group mode: members starting at once on a node where the runtime dir does not exist yet
// all get it, whole (group and mode right): it is never seen half-made.
TEST_F(Ownership, MembersMakingTheRuntimeDirAtOnceAllGetItWhole) {
  if (::geteuid() != 0) GTEST_SKIP() << "skipped: needs root to run processes as other users";
  constexpr gid_t k_group = 4790;
  constexpr int k_users = 4, k_rounds = 3000;
  char dir_template[] = "/tmp/vsrtXXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr) << std::strerror(errno);
  const std::string base = dir_template;
  ASSERT_EQ(::chmod(base.c_str(), 01777), 0);  // like /dev/shm
  std::string first;
  const int failures = race_members(k_group, /*own_primary_group=*/true, k_users, k_rounds, [&](int round) {
    option_set(option_id::runtime_dir, (base + "/rt-" + std::to_string(round)).c_str());
    std::string dir;
    return runtime_dir(/*create=*/true, &dir) == ok;
  }, &first);
  EXPECT_EQ(failures, 0) << "members refused; the first: " << first;
  int dirs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(base)) {
    EXPECT_EQ(entry.path().filename().string().find(".new-"), std::string::npos) << "a temporary name left behind: " << entry.path();
    struct stat st {};
    ASSERT_EQ(::stat(entry.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_gid, k_group) << entry.path();
    EXPECT_EQ(st.st_mode & 07777, 02770u) << entry.path();
    ++dirs;
  }
  EXPECT_EQ(dirs, k_rounds);
  std::filesystem::remove_all(base);
}

// A member of the node's pool group that runs without VRAMSWAP_GROUP, pointed at the shared
// runtime dir: it is told to set VRAMSWAP_GROUP, not that another user made the dir and to
// have it removed (the node's live pool).
TEST_F(Ownership, AMemberWithoutVramswapGroupIsToldToSetIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "skipped: needs root to run processes as other users";
  constexpr gid_t k_group = 4790;
  const std::string dir = make_group_dir(k_group);
  ASSERT_FALSE(dir.empty());
  struct shared_text {
    char why[1024];
  };
  shared_text* said = shared_object<shared_text>();
  EXPECT_EQ(reap(spawn([&] {
              if (!become_member(4791, 4791, k_group)) return 2;
              option_set(option_id::group, nullptr);  // a member of the group, without VRAMSWAP_GROUP
              option_set(option_id::runtime_dir, dir.c_str());
              std::string out;
              if (runtime_dir(/*create=*/true, &out) == ok) return 3;
              std::snprintf(said->why, sizeof said->why, "%s", last_error());
              return 0;
            })),
            0);
  const std::string why = said->why;
  EXPECT_NE(why.find("set VRAMSWAP_GROUP=4790"), std::string::npos) << why;
  EXPECT_EQ(why.find("rm -r"), std::string::npos) << why;
  free_shared_object(said);
  std::filesystem::remove_all(dir);
}

// Group mode: a member dies between making the device's lock segment and building it. The
// next member builds it, although it may change neither the file's group nor its mode
// (they are right already); it used to be refused as if it were not in the group.
TEST_F(Ownership, AMemberBuildsTheSegmentAnotherMemberMadeAndDidNotBuild) {
  if (::geteuid() != 0) GTEST_SKIP() << "skipped: needs root to run processes as other users";
  constexpr gid_t k_group = 4790;
  const std::string dir = make_group_dir(k_group);
  ASSERT_FALSE(dir.empty());
  auto as_member = [&](uid_t uid, const std::function<int()>& body) {
    return reap(spawn([&] {
      if (!become_member(uid, uid, k_group)) return 2;
      option_set(option_id::runtime_dir, dir.c_str());
      return body();
    }));
  };
  // The first member makes the file, as open does before it builds it, and dies.
  EXPECT_EQ(as_member(4791, [&] {
              std::string path;
              int fd = -1;
              if (shared_segment::path_for(key_, /*create_dir=*/true, &path) != ok) return 3;
              if (open_owned(path, O_RDWR | O_CREAT, "the lock segment", "", &fd) != ok) return 4;
              ::_exit(0);
            }),
            0);
  EXPECT_EQ(as_member(4792, [&] {
              device_lock lock;
              if (device_lock::open(key_, &lock) != ok) {
                std::fprintf(stderr, "%s\n", last_error());
                return 5;
              }
              return lock.acquire() == ok && lock.release() == ok ? 0 : 6;
            }),
            0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace vramswap::detail::lock_test
