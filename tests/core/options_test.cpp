#include "core/options.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "core/status.hpp"

namespace vramswap::detail {
namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t GiB = 1ull << 30;

TEST(ParseSize, AcceptsBinaryUnits) {
  uint64_t v = 0;
  ASSERT_EQ(parse_size("4096", &v, "x"), ok);
  EXPECT_EQ(v, 4096u);
  ASSERT_EQ(parse_size("32M", &v, "x"), ok);
  EXPECT_EQ(v, 32 * MiB);
  ASSERT_EQ(parse_size("32MiB", &v, "x"), ok);
  EXPECT_EQ(v, 32 * MiB);
  ASSERT_EQ(parse_size("1.5g", &v, "x"), ok);
  EXPECT_EQ(v, 3 * GiB / 2);
  ASSERT_EQ(parse_size("2KB", &v, "x"), ok);
  EXPECT_EQ(v, 2048u);
}

TEST(ParseSize, PercentNeedsABase) {
  uint64_t v = 0;
  ASSERT_EQ(parse_size("50%", &v, "x", 10 * GiB), ok);
  EXPECT_EQ(v, 5 * GiB);
  EXPECT_EQ(parse_size("50%", &v, "VRAMSWAP_FRAME_SIZE"), err_invalid_argument);
  EXPECT_NE(std::string(last_error()).find("VRAMSWAP_FRAME_SIZE"), std::string::npos) << last_error();
}

TEST(ParseSize, RejectsGarbageAndNamesIt) {
  uint64_t v = 77;
  for (const char* bad : {"", "abc", "-1", "12Q", "1.5", "3 MiBs", "nan", "inf"}) {
    EXPECT_EQ(parse_size(bad, &v, "VRAMSWAP_TEST"), err_invalid_argument) << bad;
    EXPECT_NE(std::string(last_error()).find("VRAMSWAP_TEST"), std::string::npos) << last_error();
    EXPECT_EQ(v, 77u) << "a failed parse must not write its output";
  }
}

TEST(Options, OverrideBeatsEnvironmentBeatsDefault) {
  ::unsetenv("VRAMSWAP_FRAME_SIZE");
  option_set(option_id::frame_size, nullptr);
  EXPECT_TRUE(option_is_default(option_id::frame_size));
  EXPECT_EQ(option_text(option_id::frame_size), "32MiB");
  ::setenv("VRAMSWAP_FRAME_SIZE", "64M", 1);
  options_reread_for_testing();
  EXPECT_EQ(option_text(option_id::frame_size), "64M");
  option_set(option_id::frame_size, "2M");
  uint64_t v = 0;
  ASSERT_EQ(option_size(option_id::frame_size, &v), ok);
  EXPECT_EQ(v, 2 * MiB);
  option_set(option_id::frame_size, nullptr);
  ::unsetenv("VRAMSWAP_FRAME_SIZE");
  options_reread_for_testing();
}

TEST(ParseDuration, SecondsByDefaultAndUnitsSMH) {
  uint64_t ns = 0;
  ASSERT_EQ(parse_duration_ns("0.3", &ns, "VRAMSWAP_TEST"), ok) << last_error();
  EXPECT_EQ(ns, 300'000'000u);
  ASSERT_EQ(parse_duration_ns("90s", &ns, "VRAMSWAP_TEST"), ok);
  EXPECT_EQ(ns, 90'000'000'000u);
  ASSERT_EQ(parse_duration_ns("1.5m", &ns, "VRAMSWAP_TEST"), ok);
  EXPECT_EQ(ns, 90'000'000'000u);
  ASSERT_EQ(parse_duration_ns("2h", &ns, "VRAMSWAP_TEST"), ok);
  EXPECT_EQ(ns, 7'200'000'000'000u);
  EXPECT_EQ(parse_duration_ns("2 h", &ns, "VRAMSWAP_TEST"), err_invalid_argument);
  EXPECT_NE(std::string(last_error()).find("VRAMSWAP_TEST"), std::string::npos) << last_error();
  option_set(option_id::max_hold, "0.3");
  ASSERT_EQ(option_duration_ns(option_id::max_hold, &ns), ok) << last_error();
  EXPECT_EQ(ns, 300'000'000u);
  option_set(option_id::max_hold, nullptr);
  ASSERT_EQ(option_duration_ns(option_id::max_hold, &ns), ok) << last_error();
  EXPECT_EQ(ns, 0u) << "off by default";
}

TEST(Options, UintRangeIsChecked) {
  option_set(option_id::host_devices, "0");
  uint64_t v = 0;
  EXPECT_EQ(option_uint(option_id::host_devices, &v), err_invalid_argument);
  EXPECT_NE(std::string(last_error()).find("VRAMSWAP_HOST_DEVICES"), std::string::npos);
  option_set(option_id::host_devices, "3x");
  EXPECT_EQ(option_uint(option_id::host_devices, &v), err_invalid_argument);
  option_set(option_id::host_devices, "3");
  ASSERT_EQ(option_uint(option_id::host_devices, &v), ok);
  EXPECT_EQ(v, 3u);
  option_set(option_id::host_devices, nullptr);
}

// Every option, from the table: a new one is covered without touching this file.
std::vector<option_id> all_options() {
  std::vector<option_id> ids;
  for (size_t i = 0; i < static_cast<size_t>(option_id::count_); ++i) ids.push_back(static_cast<option_id>(i));
  return ids;
}

// Values that the option's form must refuse.
std::vector<std::string> bad_values(option_id id) {
  const option_form& f = describe(id).form;
  std::vector<std::string> bad;
  switch (f.kind) {
    case option_kind::text: break;
    case option_kind::name: bad = {"a b", "a/b", "pre fix", "x\t", std::string(129, 'a')}; break;
    case option_kind::choice: {
      const std::string first(f.choices, std::strcspn(f.choices, "|"));
      bad = {"abc", first + " ", " " + first, first + "x", "1.5"};
      // Case matters: the first choice in the other case (upper, or lower for one in capitals).
      std::string other = first;
      for (char& c : other) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      if (other == first) {
        for (char& c : other) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      }
      bad.push_back(other);
      // A choice "word:N" takes a number in the form's range, nothing else after "word:".
      std::stringstream in(f.choices);
      for (std::string c; std::getline(in, c, '|');) {
        if (c.size() < 2 || c.compare(c.size() - 2, 2, ":N") != 0) continue;
        const std::string word = c.substr(0, c.size() - 1);
        bad.insert(bad.end(), {word, word + "x", word + "N", word + " 5", word + std::to_string(f.max + 1)});
        if (f.min > 0) bad.push_back(word + std::to_string(f.min - 1));
      }
      break;
    }
    case option_kind::flag: bad = {"abc", "1.5", "2", "yes", "true", "1 ", " 1", "-1", "+1", "0x1"}; break;
    case option_kind::count:
      bad = {"abc", "1.5", "-1", "+1", " 5", "5 ", "0x10", "1e3", std::to_string(f.max) + "0", "99999999999999999999999"};
      if (f.min > 0) bad.push_back(std::to_string(f.min - 1));
      break;
    case option_kind::size:
      bad = {"abc", "1.5", "1GiB ", " 1GiB", "1 GiB ", "-1", "1e3", "0x10", "12Q", "nan", "inf", "1.5.5", "1GiBs", "%", "abc%"};
      if (f.percent_of == nullptr) bad.push_back("50%");
      if (f.min > 0) bad.push_back("0");
      if (f.multiple > 1) bad.push_back(std::to_string(f.multiple + 1));
      if (f.max != UINT64_MAX) bad.push_back(std::to_string(f.max + f.multiple));
      break;
    case option_kind::duration:
      bad = {"abc", "-1", "+1", " 5", "5 ", "1e3", "0x10", "1.5.5", "5 s", "5sec", "5d", "5ms", "nan", "inf", ".5", "5."};
      if (f.max != UINT64_MAX) bad.push_back(std::to_string(f.max / 1'000'000'000 + 1));
      break;
  }
  return bad;
}

// Values that the option's form must accept.
std::vector<std::string> good_values(option_id id) {
  const option_form& f = describe(id).form;
  switch (f.kind) {
    case option_kind::text: return {"anything at all", "/a/path", "x=y"};
    case option_kind::name: return {"abc", "run-1_a.b", std::string(128, 'a')};
    case option_kind::choice: {
      std::vector<std::string> all;
      std::stringstream in(f.choices);
      for (std::string c; std::getline(in, c, '|');) {
        if (c.size() >= 2 && c.compare(c.size() - 2, 2, ":N") == 0) {
          const std::string word = c.substr(0, c.size() - 1);
          all.push_back(word + std::to_string(f.min));
          all.push_back(word + std::to_string(f.max));
        } else {
          all.push_back(c);
        }
      }
      return all;
    }
    case option_kind::flag: return {"0", "1"};
    case option_kind::count: return {std::to_string(f.min), std::to_string(f.max)};
    case option_kind::size: {
      std::vector<std::string> good = {"1MiB", "1M", "1 MiB", "1mb", "1048576", "0.5GiB"};
      if (f.percent_of != nullptr) good.insert(good.end(), {"50%", "12.5%", "200%"});
      return good;
    }
    case option_kind::duration: return {"0", "0.3", "90", "90s", "1.5m", "2h", std::to_string(f.max / 1'000'000'000)};
  }
  return {};
}

// Sets an environment variable for the scope of one test, and has the options read it (they
// read the environment once per process otherwise).
struct scoped_env {
  std::string name;
  scoped_env(std::string n, const std::string& value) : name(std::move(n)) {
    ::setenv(name.c_str(), value.c_str(), 1);
    options_reread_for_testing();
  }
  ~scoped_env() {
    ::unsetenv(name.c_str());
    options_reread_for_testing();
  }
};

// What this process writes to stderr (the log) while it lives.
class stderr_capture {
 public:
  stderr_capture() : path_("/tmp/vramswap-options-test-" + std::to_string(::getpid()) + ".err") {
    saved_ = ::dup(STDERR_FILENO);
    const int fd = ::open(path_.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  ~stderr_capture() {
    restore();
    ::unlink(path_.c_str());
  }
  std::string text() {
    restore();
    std::ifstream in(path_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  std::string path_;
  int saved_ = -1;
};

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(OptionForms, EveryDefaultIsAcceptedByItsOwnForm) {
  for (option_id id : all_options()) {
    EXPECT_EQ(option_check(id, describe(id).default_text), ok) << describe(id).env_name << ": " << last_error();
  }
}

TEST(OptionForms, EveryOptionRefusesEveryKindOfBadValueNamingItAndWhatItAccepts) {
  for (option_id id : all_options()) {
    const char* name = describe(id).env_name;
    const std::string accepted = option_accepted(id);
    for (const std::string& bad : bad_values(id)) {
      SCOPED_TRACE(std::string(name) + "=\"" + bad + "\"");
      ASSERT_EQ(option_check(id, bad.c_str()), err_invalid_argument);
      const std::string detail = last_error();
      EXPECT_NE(detail.find(name), std::string::npos) << detail;
      EXPECT_NE(detail.find("\"" + bad + "\""), std::string::npos) << detail;
      EXPECT_NE(detail.find(accepted), std::string::npos) << detail;

      // The same from the environment, through the check at start and through the typed
      // accessors that the readers use.
      scoped_env env(name, bad);
      ASSERT_EQ(validate_options(), err_invalid_argument);
      EXPECT_NE(std::string(last_error()).find(name), std::string::npos) << last_error();
      EXPECT_NE(std::string(last_error()).find(accepted), std::string::npos) << last_error();
      uint64_t v = 77;
      const option_form& f = describe(id).form;
      if (f.kind == option_kind::size) {
        EXPECT_EQ(option_size(id, &v, f.percent_of != nullptr ? 1000 : 0), err_invalid_argument) << "option_size took it";
      } else if (f.kind == option_kind::count || f.kind == option_kind::flag) {
        EXPECT_EQ(option_uint(id, &v), err_invalid_argument) << "option_uint took it";
      } else if (f.kind == option_kind::duration) {
        EXPECT_EQ(option_duration_ns(id, &v), err_invalid_argument) << "option_duration_ns took it";
      }
      EXPECT_EQ(v, 77u) << "a refused value must not be written";
    }
  }
}

TEST(OptionForms, EveryOptionAcceptsTheDocumentedForms) {
  for (option_id id : all_options()) {
    for (const std::string& good : good_values(id)) {
      SCOPED_TRACE(std::string(describe(id).env_name) + "=\"" + good + "\"");
      EXPECT_EQ(option_check(id, good.c_str()), ok) << last_error();
      scoped_env env(describe(id).env_name, good);
      EXPECT_EQ(validate_options(), ok) << last_error();
    }
  }
}

TEST(OptionForms, AnEmptyValueIsTheDefault) {
  // An empty variable is an unset one (option_text); an empty override is a value, and only
  // the options whose default is empty take it.
  for (option_id id : all_options()) {
    scoped_env env(describe(id).env_name, "");
    EXPECT_EQ(validate_options(), ok) << describe(id).env_name << ": " << last_error();
    EXPECT_EQ(option_check(id, ""), *describe(id).default_text == '\0' ? ok : err_invalid_argument) << describe(id).env_name;
  }
}

TEST(OptionForms, TheSizesReadAreTheOnesChecked) {
  uint64_t v = 0;
  option_set(option_id::swap_block, "64KiB");
  ASSERT_EQ(option_size(option_id::swap_block, &v), ok) << last_error();
  EXPECT_EQ(v, 64u << 10);
  option_set(option_id::swap_block, "6000");  // not a multiple of 4 KiB
  EXPECT_EQ(option_size(option_id::swap_block, &v), err_invalid_argument);
  EXPECT_NE(std::string(last_error()).find("multiple of 4 KiB"), std::string::npos) << last_error();
  option_set(option_id::swap_block, nullptr);
  option_set(option_id::host_limit, "25%");
  ASSERT_EQ(option_size(option_id::host_limit, &v, 1000), ok);
  EXPECT_EQ(v, 250u);
  option_set(option_id::host_limit, nullptr);
}

TEST(ValidateOptions, NamesEveryBadSettingAtOnce) {
  scoped_env a("VRAMSWAP_HOST_LIMIT", "abc");
  scoped_env b("VRAMSWAP_SWAP_QUEUE_DEPTH", "1.5");
  scoped_env c("VRAMSWAP_SWAP_EXTENT", "1GiB ");
  scoped_env d("VRAMSWAP_SWAP_BLOCK", "1.5");
  ASSERT_EQ(validate_options(), err_invalid_argument);
  const std::string detail = last_error();
  for (const char* name : {"VRAMSWAP_HOST_LIMIT", "VRAMSWAP_SWAP_QUEUE_DEPTH", "VRAMSWAP_SWAP_EXTENT", "VRAMSWAP_SWAP_BLOCK"}) {
    EXPECT_NE(detail.find(name), std::string::npos) << name << " missing from: " << detail;
  }
  EXPECT_NE(detail.find("4 bad settings"), std::string::npos) << detail;
  EXPECT_NE(detail.find("percentage of RAM"), std::string::npos) << detail;
}

TEST(ValidateOptions, AnOverrideIsCheckedToo) {
  option_set(option_id::evict_timeout, "0");
  EXPECT_EQ(validate_options(), err_invalid_argument);
  EXPECT_NE(std::string(last_error()).find("VRAMSWAP_EVICT_TIMEOUT=\"0\" is out of range; expected a whole number from 1 to 86400"),
            std::string::npos)
      << last_error();
  option_set(option_id::evict_timeout, nullptr);
  EXPECT_EQ(validate_options(), ok) << last_error();
}

TEST(UnknownNames, AClosestKnownNameIsSuggestedForATypo) {
  EXPECT_EQ(closest_known_name("VRAMSWAP_POOLSIZE"), "VRAMSWAP_POOL_SIZE");
  EXPECT_EQ(closest_known_name("VRAMSWAP_host_limit"), "VRAMSWAP_HOST_LIMIT");
  EXPECT_EQ(closest_known_name("VRAMSWAP_SWAPDIR"), "VRAMSWAP_SWAP_DIR");
  EXPECT_EQ(closest_known_name("VRAMSWAP_EVICT_TIMOUT"), "VRAMSWAP_EVICT_TIMEOUT");
  EXPECT_EQ(closest_known_name("VRAMSWAP_SOMETHING_ELSE_ENTIRELY"), "");
}

TEST(UnknownNames, AnUnknownNameGetsOneWarningPerProcess) {
  if (!log_enabled(log_level::warn)) GTEST_SKIP() << "VRAMSWAP_LOG hides warnings";
  scoped_env typo("VRAMSWAP_POOLSIZE", "1");
  scoped_env odd("VRAMSWAP_NOTHING_LIKE_ANY_SETTING", "1");
  stderr_capture err;
  EXPECT_EQ(validate_options(), ok) << "an unknown name is a warning, not an error: " << last_error();
  EXPECT_EQ(validate_options(), ok);
  EXPECT_EQ(validate_options(), ok);
  const std::string text = err.text();
  EXPECT_EQ(count_of(text, "VRAMSWAP_POOLSIZE"), 1u) << text;
  EXPECT_EQ(count_of(text, "did you mean VRAMSWAP_POOL_SIZE?"), 1u) << text;
  EXPECT_EQ(count_of(text, "VRAMSWAP_NOTHING_LIKE_ANY_SETTING"), 1u) << text;
  EXPECT_EQ(count_of(text, "warn:"), 2u) << text;
}

TEST(UnknownNames, OptionsAndTheOtherKnownVariablesNeverWarn) {
  if (!log_enabled(log_level::warn)) GTEST_SKIP() << "VRAMSWAP_LOG hides warnings";
  std::vector<std::unique_ptr<scoped_env>> set;
  size_t n = 0;
  const other_variable* others = other_variables(&n);
  for (size_t i = 0; i < n; ++i) set.push_back(std::make_unique<scoped_env>(others[i].env_name, "1"));
  for (option_id id : all_options()) {
    if (std::getenv(describe(id).env_name) == nullptr) set.push_back(std::make_unique<scoped_env>(describe(id).env_name, ""));
  }
  stderr_capture err;
  EXPECT_EQ(validate_options(), ok) << last_error();
  EXPECT_EQ(err.text(), "");
}

// The names that any part of vramswap reads from the environment (C++ getenv and the tests'
// helpers around it, Python os.environ) must be options or other_variables, or a user who
// sets them gets a warning that they have no effect. A new reader helper goes in `readers`.
TEST(UnknownNames, EveryVariableTheSourcesReadIsKnown) {
  namespace fs = std::filesystem;
  const std::vector<std::string> readers = {"getenv(\"", "env_or(\"", "env_u64(\"", "environ.get(\"", "environ[\""};
  std::set<std::string> read;
  size_t files = 0;
  for (auto it = fs::recursive_directory_iterator(VRAMSWAP_SOURCE_DIR); it != fs::recursive_directory_iterator(); ++it) {
    const std::string leaf = it->path().filename().string();
    if (it->is_directory() && (leaf.rfind("build", 0) == 0 || leaf[0] == '.')) {
      it.disable_recursion_pending();
      continue;
    }
    const std::string ext = it->path().extension().string();
    if (!it->is_regular_file() || (ext != ".cpp" && ext != ".hpp" && ext != ".c" && ext != ".h" && ext != ".py")) continue;
    ++files;
    std::ifstream in(it->path());
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    for (const std::string& r : readers) {
      for (size_t at = text.find(r + "VRAMSWAP_"); at != std::string::npos; at = text.find(r + "VRAMSWAP_", at + 1)) {
        const size_t begin = at + r.size();
        const size_t end = text.find('"', begin);
        if (end != std::string::npos) read.insert(text.substr(begin, end - begin) + " (" + it->path().string() + ")");
      }
    }
  }
  ASSERT_GT(files, 50u) << "the source tree was not found at " << VRAMSWAP_SOURCE_DIR;
  ASSERT_FALSE(read.empty());
  bool torch = false;
  for (const std::string& entry : read) {
    const std::string name = entry.substr(0, entry.find(' '));
    torch |= name == "VRAMSWAP_TORCH";
    bool known = false;
    for (option_id id : all_options()) known |= name == describe(id).env_name;
    size_t n = 0;
    const other_variable* others = other_variables(&n);
    for (size_t i = 0; i < n; ++i) known |= name == others[i].env_name;
    EXPECT_TRUE(known) << entry << " is read from the environment but is neither an option nor an other_variable (core/options.cpp)";
  }
  EXPECT_TRUE(torch) << "the scan missed the Python package's VRAMSWAP_TORCH";
}

// The done criterion of "settings read once": in the code of vramswap's programs and
// libraries, only the settings room (core/options.cpp) calls getenv; everything else asks it
// (an option, or foreign_environment). The tests and benchmarks read their own variables, and
// examples/ are programs of the public API's users, which has no way to ask the room.
TEST(SettingsRoom, NoOtherFileOfTheProductCallsGetenv) {
  namespace fs = std::filesystem;
  const fs::path root = VRAMSWAP_SOURCE_DIR;
  std::vector<std::string> readers;
  size_t files = 0;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const std::string leaf = it->path().filename().string();
    const fs::path relative = it->path().lexically_relative(root);
    if (it->is_directory() && (leaf.rfind("build", 0) == 0 || leaf[0] == '.' ||
                               relative == "tests" || relative == "bench" || relative == "examples")) {
      it.disable_recursion_pending();
      continue;
    }
    const std::string ext = it->path().extension().string();
    if (!it->is_regular_file() || (ext != ".cpp" && ext != ".hpp" && ext != ".c" && ext != ".h" && ext != ".cu")) continue;
    if (relative == "core/options.cpp") continue;
    ++files;
    std::ifstream in(it->path());
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    for (const char* call : {"getenv(", "secure_getenv("}) {
      if (text.find(call) != std::string::npos) readers.push_back(relative.string() + " (" + call + ")");
    }
  }
  ASSERT_GT(files, 50u) << "the source tree was not found at " << VRAMSWAP_SOURCE_DIR;
  for (const std::string& r : readers) {
    ADD_FAILURE() << r << " reads the environment itself: read it in core/options.{hpp,cpp} (an option, or a member of "
                       "foreign_environment) and ask there";
  }
}

// Sets (or, with nullptr, unsets) a variable for the scope of one test, and has the settings
// room read the environment again; the variable is restored after.
struct scoped_foreign {
  std::string name;
  std::optional<std::string> saved;
  scoped_foreign(std::string n, const char* value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) saved = v;
    if (value != nullptr) {
      ::setenv(name.c_str(), value, 1);
    } else {
      ::unsetenv(name.c_str());
    }
    options_reread_for_testing();
  }
  ~scoped_foreign() {
    if (saved) {
      ::setenv(name.c_str(), saved->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
    options_reread_for_testing();
  }
};

TEST(ForeignEnvironment, EachVariableInTheFormItsReaderNeeds) {
  {
    scoped_foreign a("CUDA_VISIBLE_DEVICES", nullptr), b("NOTIFY_SOCKET", nullptr), c("LD_PRELOAD", nullptr),
        d("NO_COLOR", nullptr), e("TERM", nullptr), f("VRAMSWAP_NO_GPU_NOTED", nullptr);
    const foreign_environment unset = process_foreign_environment();
    EXPECT_FALSE(unset.cuda_visible_devices.has_value());
    EXPECT_EQ(unset.notify_socket, "");
    EXPECT_FALSE(unset.ld_preload.has_value());
    EXPECT_FALSE(unset.no_color);
    EXPECT_FALSE(unset.dumb_terminal);
    EXPECT_EQ(unset.no_gpu_noted_by, "");
  }
  {
    // An empty CUDA_VISIBLE_DEVICES is a value (no device is visible) and is quoted as one;
    // an empty NO_COLOR is no request (no-color.org).
    scoped_foreign a("CUDA_VISIBLE_DEVICES", ""), b("NO_COLOR", ""), c("TERM", "xterm"), d("NOTIFY_SOCKET", "");
    const foreign_environment empty = process_foreign_environment();
    ASSERT_TRUE(empty.cuda_visible_devices.has_value());
    EXPECT_EQ(*empty.cuda_visible_devices, "");
    EXPECT_FALSE(empty.no_color);
    EXPECT_FALSE(empty.dumb_terminal);
    EXPECT_EQ(empty.notify_socket, "");
  }
  {
    scoped_foreign a("CUDA_VISIBLE_DEVICES", "1,0"), b("NO_COLOR", "1"), c("TERM", "dumb"), d("NOTIFY_SOCKET", "@manager"),
        e("LD_PRELOAD", "/opt/libvramswap_preload.so"), f("VRAMSWAP_NO_GPU_NOTED", "4242");
    const foreign_environment set = process_foreign_environment();
    EXPECT_EQ(set.cuda_visible_devices.value_or("?"), "1,0");
    EXPECT_TRUE(set.no_color);
    EXPECT_TRUE(set.dumb_terminal);
    EXPECT_EQ(set.notify_socket, "@manager");
    EXPECT_EQ(set.ld_preload.value_or("?"), "/opt/libvramswap_preload.so");
    EXPECT_EQ(set.no_gpu_noted_by, "4242");
  }
}

TEST(ForeignEnvironment, IsReadOnceLikeTheOptions) {
  scoped_foreign term("TERM", "xterm");
  EXPECT_FALSE(process_foreign_environment().dumb_terminal);
  ::setenv("TERM", "dumb", 1);
  EXPECT_FALSE(process_foreign_environment().dumb_terminal) << "the environment is read once per process";
  options_reread_for_testing();
  EXPECT_TRUE(process_foreign_environment().dumb_terminal);
}

// The no-GPU marker is the one foreign variable vramswap writes: into the environment, for the
// processes it starts, and into what this process reads, for its own next choice.
TEST(ForeignEnvironment, TheNoGpuMarkerReachesTheChildrenAndThisProcess) {
  scoped_foreign marker("VRAMSWAP_NO_GPU_NOTED", nullptr);
  EXPECT_EQ(process_foreign_environment().no_gpu_noted_by, "");
  mark_no_gpu_noted();
  const std::string pid = std::to_string(::getpid());
  EXPECT_EQ(process_foreign_environment().no_gpu_noted_by, pid);
  const char* inherited = std::getenv("VRAMSWAP_NO_GPU_NOTED");
  EXPECT_EQ(std::string(inherited != nullptr ? inherited : "(unset)"), pid);
}

// VRAMSWAP_PRELOAD_BACKTRACE is an option: checked at start like the others (it used to be
// read by the shim alone, where "yes" silently meant off); the shim's read at load takes
// exactly "1" as on, as it always did.
TEST(PreloadBacktrace, IsAnOptionCheckedAtStartAndOnlyOneTurnsItOn) {
  for (const char* off : {"0", "", "yes", "true", "1 "}) {
    scoped_env env("VRAMSWAP_PRELOAD_BACKTRACE", off);
    EXPECT_FALSE(preload_backtrace_at_load()) << "\"" << off << "\"";
  }
  {
    scoped_env env("VRAMSWAP_PRELOAD_BACKTRACE", "1");
    EXPECT_TRUE(preload_backtrace_at_load());
    EXPECT_EQ(validate_options(), ok) << last_error();
  }
  scoped_env env("VRAMSWAP_PRELOAD_BACKTRACE", "yes");
  ASSERT_EQ(validate_options(), err_invalid_argument);
  EXPECT_NE(std::string(last_error()).find("VRAMSWAP_PRELOAD_BACKTRACE=\"yes\" is not a whole number; expected 0 or 1"),
            std::string::npos)
      << last_error();
}

// The table's bounds are the typed accessors' bounds: each edge of every count, flag and
// bounded size is taken, and one step past it refused, naming the variable and the range.
TEST(OptionBounds, TheTypedAccessorsTakeExactlyTheTablesRange) {
  for (option_id id : all_options()) {
    const option_desc& d = describe(id);
    const option_form& f = d.form;
    SCOPED_TRACE(d.env_name);
    uint64_t v = 0;
    if (f.kind == option_kind::count || f.kind == option_kind::flag) {
      for (uint64_t edge : {f.min, f.max}) {
        option_set(id, std::to_string(edge).c_str());
        ASSERT_EQ(option_uint(id, &v), ok) << last_error();
        EXPECT_EQ(v, edge);
      }
      std::vector<uint64_t> outside = {f.max + 1};
      if (f.min > 0) outside.push_back(f.min - 1);
      for (uint64_t past : outside) {
        option_set(id, std::to_string(past).c_str());
        v = 77;
        EXPECT_EQ(option_uint(id, &v), err_invalid_argument) << past;
        EXPECT_EQ(v, 77u);
        EXPECT_NE(std::string(last_error()).find(option_accepted(id)), std::string::npos) << last_error();
      }
    } else if (f.kind == option_kind::duration) {
      for (uint64_t edge : {f.min, f.max}) {
        option_set(id, std::to_string(edge / 1'000'000'000).c_str());
        ASSERT_EQ(option_duration_ns(id, &v), ok) << last_error();
        EXPECT_EQ(v, edge);
      }
      option_set(id, (std::to_string(f.max / 1'000'000'000) + ".001").c_str());
      v = 77;
      EXPECT_EQ(option_duration_ns(id, &v), err_invalid_argument);
      EXPECT_EQ(v, 77u);
      EXPECT_NE(std::string(last_error()).find(option_accepted(id)), std::string::npos) << last_error();
    } else if (f.kind == option_kind::size && f.percent_of == nullptr) {
      const uint64_t step = f.multiple > 1 ? f.multiple : 1;
      const uint64_t low = f.min == 0 ? 0 : (f.min + step - 1) / step * step;
      option_set(id, std::to_string(low).c_str());
      ASSERT_EQ(option_size(id, &v), ok) << last_error();
      EXPECT_EQ(v, low);
      if (f.min > 0) {
        option_set(id, std::to_string(f.min - 1).c_str());
        EXPECT_EQ(option_size(id, &v), err_invalid_argument);
        EXPECT_NE(std::string(last_error()).find(d.env_name), std::string::npos) << last_error();
      }
      if (f.max != UINT64_MAX) {
        option_set(id, std::to_string(f.max / step * step).c_str());
        ASSERT_EQ(option_size(id, &v), ok) << last_error();
        option_set(id, std::to_string(f.max + step).c_str());
        EXPECT_EQ(option_size(id, &v), err_invalid_argument);
        EXPECT_NE(std::string(last_error()).find("out of range"), std::string::npos) << last_error();
      }
    }
    option_set(id, nullptr);
  }
}

TEST(OptionsReadOnce, AVariableSetLaterIsSeenOnlyAfterTheTestOnlyReread) {
  ::unsetenv("VRAMSWAP_SWAP_QUEUE_DEPTH");
  options_reread_for_testing();
  EXPECT_EQ(option_text(option_id::swap_queue_depth), "32");
  ::setenv("VRAMSWAP_SWAP_QUEUE_DEPTH", "7", 1);
  uint64_t v = 0;
  EXPECT_EQ(option_text(option_id::swap_queue_depth), "32") << "the environment is read once per process";
  EXPECT_TRUE(option_is_default(option_id::swap_queue_depth));
  ASSERT_EQ(option_uint(option_id::swap_queue_depth, &v), ok);
  EXPECT_EQ(v, 32u);
  options_reread_for_testing();
  EXPECT_EQ(option_text(option_id::swap_queue_depth), "7");
  EXPECT_FALSE(option_is_default(option_id::swap_queue_depth));
  ::unsetenv("VRAMSWAP_SWAP_QUEUE_DEPTH");
  options_reread_for_testing();
  EXPECT_EQ(option_text(option_id::swap_queue_depth), "32");
}

// Run only as the child of the test below (a fresh process, whose first use of an option
// is here): it changes the environment after the first read and expects no effect.
TEST(OptionsReadOnceChild, DISABLED_ReadsTheEnvironmentOnce) {
  EXPECT_EQ(option_text(option_id::swap_queue_depth), "7");
  ::setenv("VRAMSWAP_SWAP_QUEUE_DEPTH", "9", 1);
  ::setenv("VRAMSWAP_SWAP_DIR", "/nowhere", 1);
  uint64_t v = 0;
  ASSERT_EQ(option_uint(option_id::swap_queue_depth, &v), ok) << last_error();
  EXPECT_EQ(v, 7u);
  EXPECT_EQ(option_text(option_id::swap_dir), "/var/tmp");
  EXPECT_EQ(validate_options(), ok) << last_error();
}

// A fresh process with VRAMSWAP_LOG=debug: the options in force are logged once, at the
// first read, each with where its value came from; later changes to the environment are
// neither seen nor logged.
TEST(OptionsReadOnce, AFreshProcessLogsTheOptionsInForceOnceAtDebugLevel) {
  const std::string err_path = "/tmp/vramswap-options-child-" + std::to_string(::getpid()) + ".err";
  std::string self(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  ASSERT_GT(n, 0) << std::strerror(errno);
  self.resize(static_cast<size_t>(n));
  std::string filter = "--gtest_filter=OptionsReadOnceChild.DISABLED_ReadsTheEnvironmentOnce";
  std::string disabled = "--gtest_also_run_disabled_tests";
  char* argv[] = {self.data(), filter.data(), disabled.data(), nullptr};
  std::string env_log = "VRAMSWAP_LOG=debug", env_depth = "VRAMSWAP_SWAP_QUEUE_DEPTH=7", env_path = "PATH=/usr/bin:/bin";
  char* envp[] = {env_log.data(), env_depth.data(), env_path.data(), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, self.c_str(), &fa, nullptr, argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  ASSERT_EQ(rc, 0) << "posix_spawn " << self << ": " << std::strerror(rc);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  std::ifstream in(err_path);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  ::unlink(err_path.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child test failed; its log:\n" << text;
  for (option_id id : all_options()) {
    EXPECT_EQ(count_of(text, std::string("options: ") + describe(id).env_name + "=\""), 1u) << describe(id).env_name << "\n" << text;
  }
  EXPECT_EQ(count_of(text, "options: VRAMSWAP_SWAP_QUEUE_DEPTH=\"7\" (from the environment)"), 1u) << text;
  EXPECT_EQ(count_of(text, "options: VRAMSWAP_LOG=\"debug\" (from the environment)"), 1u) << text;
  EXPECT_EQ(count_of(text, "options: VRAMSWAP_SWAP_DIR=\"/var/tmp\" (the default)"), 1u) << text;
  EXPECT_EQ(count_of(text, "/nowhere"), 0u) << text;
}

}  // namespace
}  // namespace vramswap::detail
