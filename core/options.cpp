#include "core/options.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "core/status.hpp"

extern char** environ;

namespace vramswap::detail {
namespace {

constexpr option_desc k_table[] = {
#define VRAMSWAP_OPTION_DESC(id, env, def, form, help) {env, def, form, help},
    VRAMSWAP_OPTIONS(VRAMSWAP_OPTION_DESC)
#undef VRAMSWAP_OPTION_DESC
};
static_assert(sizeof k_table / sizeof k_table[0] == static_cast<size_t>(option_id::count_));

// The marker of foreign_environment::no_gpu_noted_by: a known name, but no setting.
constexpr const char* k_no_gpu_noted = "VRAMSWAP_NO_GPU_NOTED";

constexpr other_variable k_other[] = {
    {"VRAMSWAP_TORCH", "the Python package (1: vramswap.torch.enable() at import)"},
    {k_no_gpu_noted, "the library: set by the first process of a process tree that warned it found no GPU "
                     "(its pid), so that the processes it starts do not warn again; set it to silence that warning"},
    {"VRAMSWAP_TEST_SERVER", "the Python tests (the vramswapd they start)"},
    {"VRAMSWAP_TEST_BACKEND", "the multi-process C++ tests (cuda on a GPU run)"},
    {"VRAMSWAP_FUZZ_SEED", "the range allocator's fuzz test"},
    {"VRAMSWAP_FUZZ_STEPS", "the range allocator's and the pager's fuzz tests"},
    {"VRAMSWAP_TORTURE_ROUNDS", "the lock's SIGKILL torture test"},
    {"VRAMSWAP_TORTURE_SEED", "the lock's SIGKILL torture test"},
    {"VRAMSWAP_GANG_ROUNDS", "the lock's gang test (rounds per worker of its random mix)"},
    {"VRAMSWAP_BENCH_PARTS", "bench/python/bench_oversubscribe.py"},
    {"VRAMSWAP_BUILD_DIR", "bench/python/bench_oversubscribe.py"},
    {"VRAMSWAP_BENCH_TORCH_STEPS", "bench/python/bench_oversubscribe.py (steps of the oversubscribed PyTorch runs)"},
    {"VRAMSWAP_TEST_HOT_BLOCK", "the oversubscription tests' job (the block whose use it declares)"},
    {"VRAMSWAP_TEST_WAIT_PLACED", "the oversubscription tests' job (run on until pages were placed by use)"},
    {"VRAMSWAP_TEST_STEPS", "the oversubscription tests' job (launches per tensor per step of its stepping thread)"},
    {"VRAMSWAP_TEST_LIGHT_USE", "the oversubscription tests' job (uses a second of one page, for the cost model)"},
    {"VRAMSWAP_TEST_ROTATE", "the oversubscription tests' job (seconds between changes of the tensor it uses)"},
};

constexpr size_t k_options = static_cast<size_t>(option_id::count_);

// The values in force: overrides (option_set) and the environment's values, the latter read
// once per process, on the first use of any option, and kept (mimalloc reads its options
// the same way). A process's settings are then one consistent set however late a part of
// it asks, and reading an option costs no walk of the environment. Empty means unset.
std::mutex g_values_mutex;  // guards the three below
std::optional<std::string> g_override[k_options];
std::optional<std::string> g_environment[k_options];
bool g_environment_read = false;

void read_environment_locked() {
  for (size_t i = 0; i < k_options; ++i) {
    const char* env = std::getenv(k_table[i].env_name);
    if (env != nullptr && *env != '\0') {
      g_environment[i] = env;
    } else {
      g_environment[i].reset();
    }
  }
  g_environment_read = true;
}

// The effective options, one line each, at debug level. Called outside g_values_mutex: the
// log reads VRAMSWAP_LOG through option_text.
void log_effective_options(const char* when) {
  if (!log_enabled(log_level::debug)) return;
  struct line {
    std::string text;
    const char* source;
  };
  std::vector<line> lines;
  {
    std::lock_guard<std::mutex> lock(g_values_mutex);
    for (size_t i = 0; i < k_options; ++i) {
      if (g_override[i]) {
        lines.push_back({*g_override[i], "set by the program"});
      } else if (g_environment[i]) {
        lines.push_back({*g_environment[i], "from the environment"});
      } else {
        lines.push_back({k_table[i].default_text, "the default"});
      }
    }
  }
  log(log_level::debug, "options: %s; in force for this process:", when);
  for (size_t i = 0; i < k_options; ++i) {
    log(log_level::debug, "options: %s=\"%s\" (%s)", k_table[i].env_name, lines[i].text.c_str(), lines[i].source);
  }
}

// f() under g_values_mutex, with the environment read; the caller that read it first then
// logs what is in force.
template <class F>
auto with_values(F&& f) {
  bool first = false;
  decltype(f()) result{};
  {
    std::lock_guard<std::mutex> lock(g_values_mutex);
    if (!g_environment_read) {
      read_environment_locked();
      first = true;
    }
    result = f();
  }
  if (first) log_effective_options("read the environment once");
  return result;
}

// The foreign environment as read (foreign_environment in options.hpp), apart from the
// options' values: asking for it reads no option, so it neither logs the options in force nor
// fixes them early (vramswapd asks for it before it parses its arguments).
std::mutex g_foreign_mutex;  // guards the two below
foreign_environment g_foreign;
bool g_foreign_read = false;

void read_foreign_locked() {
  foreign_environment f;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) f.cuda_visible_devices = v;
  if (const char* v = std::getenv("NOTIFY_SOCKET")) f.notify_socket = v;
  if (const char* v = std::getenv("LD_PRELOAD")) f.ld_preload = v;
  const char* no_color = std::getenv("NO_COLOR");
  f.no_color = no_color != nullptr && no_color[0] != '\0';
  const char* term = std::getenv("TERM");
  f.dumb_terminal = term != nullptr && std::strcmp(term, "dumb") == 0;
  if (const char* v = std::getenv(k_no_gpu_noted)) f.no_gpu_noted_by = v;
  g_foreign = std::move(f);
  g_foreign_read = true;
}

constexpr const char* k_size_forms = "bytes, or a number with a K/M/G/T suffix (\"4096\", \"32MiB\", \"1.5G\")";

// "4 KiB" for whole binary units, else the bytes.
std::string human(uint64_t bytes) {
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB"};
  std::string unit;
  uint64_t v = bytes;
  for (const char* u : units) {
    if (v == 0 || v % 1024 != 0) break;
    v /= 1024;
    unit = u;
  }
  return unit.empty() ? std::to_string(bytes) + " bytes" : std::to_string(v) + " " + unit;
}

// Why `text` is not a size (nullptr when it is one; then *out and *percent are set). A
// number is decimal digits with an optional fraction, directly followed by an optional suffix
// (one space before a suffix is allowed): no sign, exponent, hex or surrounding blanks.
const char* size_problem(const char* text, uint64_t percent_base, uint64_t* out, bool* percent) {
  if (text == nullptr || *text == '\0') return "is empty";
  const char* p = text;
  while (std::isdigit(static_cast<unsigned char>(*p))) ++p;
  if (p == text) return "is not a size";
  if (*p == '.') {
    const char* frac = ++p;
    while (std::isdigit(static_cast<unsigned char>(*p))) ++p;
    if (p == frac) return "is not a size";
  }
  errno = 0;
  const double number = std::strtod(std::string(text, p).c_str(), nullptr);
  if (errno == ERANGE || std::isinf(number)) return "is too large";
  if (*p == ' ' && p[1] != '\0' && std::strchr("kKmMgGtT%", p[1]) != nullptr) ++p;
  double scale = 1;
  bool is_percent = false;
  switch (*p) {
    case 'k': case 'K': scale = 1024.0; ++p; break;
    case 'm': case 'M': scale = 1024.0 * 1024; ++p; break;
    case 'g': case 'G': scale = 1024.0 * 1024 * 1024; ++p; break;
    case 't': case 'T': scale = 1024.0 * 1024 * 1024 * 1024; ++p; break;
    case '%': is_percent = true; ++p; break;
    default: break;
  }
  if (!is_percent && scale != 1 && (*p == 'i' || *p == 'I')) ++p;
  if (!is_percent && (*p == 'b' || *p == 'B')) ++p;
  if (*p != '\0') return *p == ' ' ? "has trailing blanks" : "has trailing characters";
  if (is_percent && percent_base == 0) return "is a percentage, which this setting does not take";
  const double bytes = is_percent ? number / 100.0 * static_cast<double>(percent_base) : number * scale;
  if (bytes >= 18446744073709551615.0) return "is too large";
  if (!is_percent && scale == 1 && bytes != std::floor(bytes)) return "is a fraction of a byte";
  *out = static_cast<uint64_t>(bytes);
  *percent = is_percent;
  return nullptr;
}

// Why `text` is not a whole number in [min, max] (nullptr when it is one).
const char* count_problem(const char* text, uint64_t min, uint64_t max, uint64_t* out) {
  if (*text == '\0') return "is empty";
  for (const char* p = text; *p != '\0'; ++p) {
    if (!std::isdigit(static_cast<unsigned char>(*p))) return *p == ' ' ? "has blanks" : "is not a whole number";
  }
  errno = 0;
  const unsigned long long v = std::strtoull(text, nullptr, 10);
  if (errno == ERANGE || v < min || v > max) return "is out of range";
  *out = v;
  return nullptr;
}

// Why `text` is not a duration (nullptr when it is one; then *out_ns is set): decimal digits
// with an optional fraction, directly followed by an optional unit s, m or h (seconds when
// none); no sign, exponent or blanks.
const char* duration_problem(const char* text, uint64_t* out_ns) {
  if (text == nullptr || *text == '\0') return "is empty";
  const char* p = text;
  while (std::isdigit(static_cast<unsigned char>(*p))) ++p;
  if (p == text) return "is not a duration";
  if (*p == '.') {
    const char* frac = ++p;
    while (std::isdigit(static_cast<unsigned char>(*p))) ++p;
    if (p == frac) return "is not a duration";
  }
  const double number = std::strtod(std::string(text, p).c_str(), nullptr);
  double scale = 1e9;
  switch (*p) {
    case 's': ++p; break;
    case 'm': scale = 60e9; ++p; break;
    case 'h': scale = 3600e9; ++p; break;
    default: break;
  }
  if (*p != '\0') return *p == ' ' ? "has blanks" : "has trailing characters";
  const double ns = number * scale;
  if (!(ns < 18446744073709551615.0)) return "is too large";
  *out_ns = static_cast<uint64_t>(ns);
  return nullptr;
}

// "90 s", "30 min", "7 days": a duration in the largest unit that divides it.
std::string human_duration(uint64_t ns) {
  const uint64_t s = ns / 1'000'000'000;
  if (ns % 1'000'000'000 != 0) {
    char text[32];
    std::snprintf(text, sizeof text, "%g s", static_cast<double>(ns) / 1e9);
    return text;
  }
  if (s != 0 && s % 86400 == 0) return std::to_string(s / 86400) + " days";
  if (s != 0 && s % 3600 == 0) return std::to_string(s / 3600) + " h";
  if (s != 0 && s % 60 == 0) return std::to_string(s / 60) + " min";
  return std::to_string(s) + " s";
}

std::string accepted(const option_form& f) {
  switch (f.kind) {
    case option_kind::text: return "any text";
    case option_kind::name: return "letters, digits, '-', '_' and '.' (at most 128)";
    case option_kind::flag: return "0 or 1";
    case option_kind::choice: {
      std::string s = "one of ";
      for (const char* c = f.choices; *c != '\0'; ++c) s += *c == '|' ? std::string(", ") : std::string(1, *c);
      if (std::strstr(f.choices, ":N") != nullptr) {
        s += " (N: a whole number from " + std::to_string(f.min) + " to " + std::to_string(f.max) + ")";
      }
      return s;
    }
    case option_kind::count: return "a whole number from " + std::to_string(f.min) + " to " + std::to_string(f.max);
    case option_kind::size: {
      std::string s = std::string("a size: ") + k_size_forms;
      if (f.multiple > 1) s += ", a multiple of " + human(f.multiple);
      if (f.max != UINT64_MAX) {
        s += ", from " + human(f.min) + " to " + human(f.max);
      } else if (f.min > 1) {
        s += ", at least " + human(f.min);
      } else if (f.min == 1) {
        s += ", not 0";
      }
      if (f.percent_of != nullptr) s += std::string("; or a percentage of ") + f.percent_of + " (\"50%\")";
      return s;
    }
    case option_kind::duration:
      return "a duration: seconds with an optional fraction, or with a unit s, m or h (\"0.5\", \"90s\", \"30m\", \"2h\"), "
             "at most " + human_duration(f.max);
  }
  return "?";
}

// The detail of a bad value: what, the value, why, what is accepted, the way out.
int bad_value(option_id id, const char* text, const char* why) {
  const option_desc& d = describe(id);
  const std::string expected = accepted(d.form);
  const std::string fallback = *d.default_text == '\0' ? std::string("not set") : "\"" + std::string(d.default_text) + "\"";
  return fail(err_invalid_argument, "%s=\"%s\" %s; expected %s. Correct it, or unset %s for the default (%s)", d.env_name, text, why,
              expected.c_str(), d.env_name, fallback.c_str());
}

// The size `text` of option `id`, checked against its form.
int check_size(option_id id, const char* text, uint64_t percent_base, uint64_t* out) {
  const option_form& f = describe(id).form;
  bool percent = false;
  uint64_t v = 0;
  if (const char* why = size_problem(text, f.percent_of != nullptr ? percent_base : 0, &v, &percent)) return bad_value(id, text, why);
  if (!percent) {
    if (v < f.min || v > f.max) return bad_value(id, text, ("is " + human(v) + ", out of range").c_str());
    if (f.multiple > 1 && v % f.multiple != 0) return bad_value(id, text, ("is not a multiple of " + human(f.multiple)).c_str());
  }
  *out = v;
  return ok;
}

// The duration `text` of option `id`, checked against its form.
int check_duration(option_id id, const char* text, uint64_t* out_ns) {
  const option_form& f = describe(id).form;
  uint64_t ns = 0;
  if (const char* why = duration_problem(text, &ns)) return bad_value(id, text, why);
  if (ns < f.min || ns > f.max) return bad_value(id, text, "is out of range");
  *out_ns = ns;
  return ok;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      const bool same = std::toupper(static_cast<unsigned char>(a[i - 1])) == std::toupper(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

bool is_known_name(const std::string& name) {
  for (const option_desc& d : k_table) {
    if (name == d.env_name) return true;
  }
  for (const other_variable& v : k_other) {
    if (name == v.env_name) return true;
  }
  return false;
}

std::mutex g_warned_mutex;
std::set<std::string> g_warned;  // unknown names already reported by this process

void warn_unknown_names() {
  std::vector<std::string> unknown;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, "VRAMSWAP_", 9) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    std::string name = eq != nullptr ? std::string(*e, static_cast<size_t>(eq - *e)) : std::string(*e);
    if (!is_known_name(name)) unknown.push_back(std::move(name));
  }
  for (const std::string& name : unknown) {
    {
      std::lock_guard<std::mutex> guard(g_warned_mutex);
      if (!g_warned.insert(name).second) continue;
    }
    const std::string near = closest_known_name(name);
    if (!near.empty()) {
      log(log_level::warn, "%s is set, but vramswap has no such setting, so it has no effect; did you mean %s?", name.c_str(),
          near.c_str());
    } else {
      log(log_level::warn,
          "%s is set, but vramswap has no such setting, so it has no effect (the settings: core/options.hpp, or the "
          "README's Configuration)",
          name.c_str());
    }
  }
}

}  // namespace

const option_desc& describe(option_id id) noexcept { return k_table[static_cast<size_t>(id)]; }

const other_variable* other_variables(size_t* count) noexcept {
  *count = sizeof k_other / sizeof k_other[0];
  return k_other;
}

std::string option_text(option_id id) {
  const auto i = static_cast<size_t>(id);
  return with_values([i]() -> std::string {
    if (g_override[i]) return *g_override[i];
    if (g_environment[i]) return *g_environment[i];
    return k_table[i].default_text;
  });
}

bool option_is_default(option_id id) {
  const auto i = static_cast<size_t>(id);
  return with_values([i] { return !g_override[i] && !g_environment[i]; });
}

void options_reread_for_testing() {
  {
    std::lock_guard<std::mutex> lock(g_values_mutex);
    read_environment_locked();
  }
  {
    std::lock_guard<std::mutex> lock(g_foreign_mutex);
    read_foreign_locked();
  }
  log_effective_options("read the environment again (a test asked)");
}

bool preload_backtrace_at_load() noexcept {
  const char* on = std::getenv(describe(option_id::preload_backtrace).env_name);
  return on != nullptr && std::strcmp(on, "1") == 0;
}

foreign_environment process_foreign_environment() {
  std::lock_guard<std::mutex> lock(g_foreign_mutex);
  if (!g_foreign_read) read_foreign_locked();
  return g_foreign;
}

void mark_no_gpu_noted() {
  const std::string pid = std::to_string(::getpid());
  std::lock_guard<std::mutex> lock(g_foreign_mutex);
  if (!g_foreign_read) read_foreign_locked();
  // setenv while other threads may read the environment is a risk taken once per process
  // tree, at the first session: the variable is how the children hear of it.
  ::setenv(k_no_gpu_noted, pid.c_str(), 1);
  g_foreign.no_gpu_noted_by = pid;
}

void option_set(option_id id, const char* value) {
  std::lock_guard<std::mutex> lock(g_values_mutex);
  auto& slot = g_override[static_cast<size_t>(id)];
  if (value == nullptr) {
    slot.reset();
  } else {
    slot = value;
  }
}

int parse_size(const char* text, uint64_t* out, const char* what, uint64_t percent_base) noexcept {
  try {
    uint64_t v = 0;
    bool percent = false;
    if (const char* why = size_problem(text, percent_base, &v, &percent)) {
      return fail(err_invalid_argument, "%s: \"%s\" %s; expected %s%s", what, text == nullptr ? "" : text, why, k_size_forms,
                  percent_base != 0 ? ", or a percentage (\"50%\")" : "");
    }
    *out = v;
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "%s: out of host memory", what);
  }
}

int option_size(option_id id, uint64_t* out, uint64_t percent_base) {
  const std::string text = option_text(id);
  return check_size(id, text.c_str(), percent_base, out);
}

int option_duration_ns(option_id id, uint64_t* out) {
  const std::string text = option_text(id);
  return check_duration(id, text.c_str(), out);
}

int parse_duration_ns(const char* text, uint64_t* out, const char* what) noexcept {
  try {
    uint64_t ns = 0;
    if (const char* why = duration_problem(text, &ns)) {
      return fail(err_invalid_argument, "%s: \"%s\" %s; expected seconds with an optional fraction, or with a unit s, m or h "
                  "(\"0.5\", \"90s\", \"30m\", \"2h\")", what, text == nullptr ? "" : text, why);
    }
    *out = ns;
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "%s: out of host memory", what);
  }
}

int option_uint(option_id id, uint64_t* out) {
  const std::string text = option_text(id);
  const option_form& f = describe(id).form;
  uint64_t v = 0;
  if (const char* why = count_problem(text.c_str(), f.min, f.max, &v)) return bad_value(id, text.c_str(), why);
  *out = v;
  return ok;
}

std::string option_accepted(option_id id) { return accepted(describe(id).form); }

int option_check(option_id id, const char* text) {
  const option_desc& d = describe(id);
  if (*text == '\0') return *d.default_text == '\0' ? ok : bad_value(id, text, "is empty");
  uint64_t v = 0;
  switch (d.form.kind) {
    case option_kind::text: return ok;
    case option_kind::name: {
      if (std::strlen(text) > 128) return bad_value(id, text, "is longer than 128 characters");
      for (const char* p = text; *p != '\0'; ++p) {
        if (!std::isalnum(static_cast<unsigned char>(*p)) && *p != '-' && *p != '_' && *p != '.') {
          return bad_value(id, text, *p == ' ' ? "has blanks" : "has a character not allowed in a file name");
        }
      }
      return ok;
    }
    case option_kind::choice: {
      const size_t n = std::strlen(text);
      for (const char* c = d.form.choices;;) {
        const char* bar = std::strchr(c, '|');
        const size_t len = bar != nullptr ? static_cast<size_t>(bar - c) : std::strlen(c);
        // "word:N": "word:" and a number in the form's range (not the letter N).
        const bool numbered = len >= 2 && std::strncmp(c + len - 2, ":N", 2) == 0;
        if (!numbered && len == n && std::strncmp(c, text, n) == 0) return ok;
        if (numbered && n > len - 1 && std::strncmp(c, text, len - 1) == 0) {
          if (const char* why = count_problem(text + len - 1, d.form.min, d.form.max, &v)) {
            return bad_value(id, text, (std::string("has a number that ") + why).c_str());
          }
          return ok;
        }
        if (bar == nullptr) break;
        c = bar + 1;
      }
      return bad_value(id, text, "is none of the choices");
    }
    case option_kind::flag:
    case option_kind::count:
      if (const char* why = count_problem(text, d.form.min, d.form.max, &v)) return bad_value(id, text, why);
      return ok;
    case option_kind::size: return check_size(id, text, 1, &v);
    case option_kind::duration: return check_duration(id, text, &v);
  }
  return ok;
}

std::string closest_known_name(const std::string& name) {
  std::vector<const char*> names;
  for (const option_desc& d : k_table) names.push_back(d.env_name);
  for (const other_variable& v : k_other) names.push_back(v.env_name);
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const char* candidate : names) {
    const size_t d = edit_distance(name, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  // A typo changes a few characters of the part after VRAMSWAP_; beyond that a suggestion
  // would be a guess.
  const size_t rest = name.size() > 9 ? name.size() - 9 : 0;
  return best_distance <= std::max<size_t>(1, rest / 3) ? best : std::string();
}

int validate_options() {
  try {
    warn_unknown_names();
    std::vector<std::string> problems;
    std::vector<const char*> names;
    for (size_t i = 0; i < static_cast<size_t>(option_id::count_); ++i) {
      const auto id = static_cast<option_id>(i);
      if (option_is_default(id)) continue;
      if (option_check(id, option_text(id).c_str()) != ok) {
        problems.emplace_back(last_error());
        names.push_back(describe(id).env_name);
      }
    }
    if (problems.empty()) return ok;
    // Every bad one in full while the detail has room, then the rest by name.
    std::string text = problems.size() == 1 ? std::string() : std::to_string(problems.size()) + " bad settings: ";
    size_t shown = 0;
    for (; shown < problems.size() && (shown == 0 || text.size() + problems[shown].size() < 800); ++shown) {
      text += (shown > 0 ? ". " : "") + problems[shown];
    }
    if (shown < problems.size()) {
      text += ". And";
      for (size_t i = shown; i < problems.size(); ++i) text += std::string(i > shown ? ", " : " ") + names[i];
    }
    return fail(err_invalid_argument, "%s", text.c_str());
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "checking the VRAMSWAP_* settings: out of host memory");
  }
}

uint64_t physical_ram() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

}  // namespace vramswap::detail
