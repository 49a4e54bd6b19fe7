#include "runtime/memory_tags.hpp"

#include <algorithm>
#include <cinttypes>
#include <new>

#include "core/status.hpp"

namespace vramswap::detail {

namespace {
// A tag's first region holds this many pages; each later one twice the previous, up to
// k_region_growth_limit doublings: few regions for a large model, little address space for
// a small tag. (Addresses only: a region's pages get frames as allocations touch them.)
constexpr uint64_t k_first_region_pages = 16;
constexpr unsigned k_region_growth_limit = 5;

bool valid_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.' || c == ':' ||
         c == '/';
}

}  // namespace

int memory_tags::check_name(const std::string& name) {
  if (name.empty() || name.size() > memory_tags::k_max_name) {
    return fail(err_invalid_argument, "memory tag '%s': a tag is 1 to %zu characters", name.c_str(), memory_tags::k_max_name);
  }
  if (!std::all_of(name.begin(), name.end(), valid_name_char)) {
    return fail(err_invalid_argument, "memory tag '%s': a tag is made of letters, digits and _ - . : / only", name.c_str());
  }
  return ok;
}

const char* sleep_mode_name(sleep_mode m) noexcept { return m == sleep_mode::discard ? "discard" : "offload"; }

memory_tags::tag_entry* memory_tags::find(const std::string& name) {
  for (auto& t : tags_) {
    if (t->name == name) return t.get();
  }
  return nullptr;
}

std::string memory_tags::known_names() const {
  if (tags_.empty()) return "none yet";
  std::string s;
  for (const auto& t : tags_) s += (s.empty() ? "'" : ", '") + t->name + "'";
  return s;
}

int memory_tags::entry_for(const std::string& name, tag_entry** out) {
  VS_TRY(check_name(name));
  if ((*out = find(name)) != nullptr) return ok;
  if (tags_.size() >= k_max_tags) {
    return fail(err_invalid_argument, "memory tag '%s': this process has %zu tags already (%s), the most there may be", name.c_str(),
                tags_.size(), known_names().c_str());
  }
  auto t = std::make_unique<tag_entry>();
  t->name = name;
  tags_.push_back(std::move(t));
  *out = tags_.back().get();
  return ok;
}

int memory_tags::known(const std::string& name, tag_entry** out) {
  VS_TRY(check_name(name));
  if ((*out = find(name)) == nullptr) {
    return fail(err_invalid_argument, "memory tag '%s': no memory of this process on the device was ever allocated with it (its tags: %s)",
                name.c_str(), known_names().c_str());
  }
  return ok;
}

int memory_tags::grow(tag_entry& t, uint64_t size) {
  const uint64_t page = memory_.frame_size();
  const uint64_t need = (size + page - 1) / page * page;
  const unsigned doublings = static_cast<unsigned>(std::min<size_t>(t.regions.size(), k_region_growth_limit));
  const uint64_t wanted = std::max(need, (k_first_region_pages * page) << doublings);
  device_ptr base = 0;
  uint64_t got = wanted;
  int rc = memory_.reserve(wanted, page, &base);
  if (rc != ok && wanted > need) {  // a nearly full arena may still hold what is needed
    clear_error();
    got = need;
    rc = memory_.reserve(need, page, &base);
  }
  VS_TRY(add_context(rc, "memory tag '%s': reserving %" PRIu64 " MiB of addresses for it: ", t.name.c_str(), got >> 20));
  auto r = std::make_unique<region>();
  r->base = base;
  r->size = got;
  if (const int init = r->placement.init(base, got, page); init != ok) {
    memory_.unreserve(base);
    return init;
  }
  t.regions.push_back(std::move(r));
  return ok;
}

int memory_tags::malloc(const std::string& tag, uint64_t size, backing when_not_resident, device_ptr* out) {
  if (size == 0) return fail(err_invalid_argument, "malloc(tag '%s'): size 0", tag.c_str());
  std::lock_guard<std::mutex> guard(mutex_);
  try {
    tag_entry* t = nullptr;
    VS_TRY(entry_for(tag, &t));
    if (t->asleep) {
      return fail(err_invalid_argument, "malloc(%" PRIu64 " bytes, tag '%s'): the tag is asleep (%s); wake it before allocating in it",
                  size, tag.c_str(), sleep_mode_name(t->mode));
    }
    uint64_t addr = 0;
    region* in = nullptr;
    for (auto& r : t->regions) {
      if (r->placement.allocate(size, &addr, nullptr) == ok) {
        in = r.get();
        break;
      }
      clear_error();
    }
    if (in == nullptr) {
      VS_TRY(grow(*t, size));
      in = t->regions.back().get();
      VS_TRY(add_context(in->placement.allocate(size, &addr, nullptr), "malloc(%" PRIu64 " bytes, tag '%s'): ", size, tag.c_str()));
    }
    if (const int rc = memory_.malloc_at(addr, size, when_not_resident); rc != ok) {
      const std::string why = last_error();
      in->placement.deallocate(addr, nullptr);
      return fail(rc, "%s", why.c_str());
    }
    *out = addr;
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "malloc(%" PRIu64 " bytes, tag '%s'): out of host memory", size, tag.c_str());
  }
}

memory_tags::region* memory_tags::region_of(device_ptr ptr) const {
  for (const auto& t : tags_) {
    for (const auto& r : t->regions) {
      if (ptr >= r->base && ptr - r->base < r->size) return r.get();
    }
  }
  return nullptr;
}

bool memory_tags::owns(device_ptr ptr) const {
  std::lock_guard<std::mutex> guard(mutex_);
  return region_of(ptr) != nullptr;
}

int memory_tags::free(device_ptr ptr) {
  std::lock_guard<std::mutex> guard(mutex_);
  region* r = region_of(ptr);
  if (r == nullptr) return fail(err_invalid_argument, "free(0x%" PRIxPTR "): not tagged memory of this process", ptr);
  range_allocation a;
  if (r->placement.find(ptr, &a) != ok || a.addr != ptr) {
    clear_error();
    return fail(err_invalid_argument, "free(0x%" PRIxPTR "): not the start of a live tagged allocation (an interior pointer, or freed already)",
                ptr);
  }
  VS_TRY(memory_.free(ptr));
  return r->placement.deallocate(ptr, nullptr);
}

std::vector<page_range> memory_tags::pages_of(const tag_entry& t) const {
  std::vector<page_range> pages;
  pages.reserve(t.regions.size());
  for (const auto& r : t.regions) pages.push_back(memory_.pages_of(r->base, r->size));
  return pages;
}

std::vector<page_range> memory_tags::pages_of(const std::vector<tag_entry*>& tags, std::string* names) const {
  std::vector<page_range> pages;
  for (const tag_entry* t : tags) {
    const std::vector<page_range> p = pages_of(*t);
    pages.insert(pages.end(), p.begin(), p.end());
    *names += (names->empty() ? "'" : ", '") + t->name + "'";
  }
  return pages;
}

int memory_tags::sleep_all_of(const std::vector<tag_entry*>& tags, sleep_mode mode) {
  if (tags.empty()) return ok;
  std::string names;
  const std::vector<page_range> pages = pages_of(tags, &names);
  const int rc = memory_.sleep(pages, mode == sleep_mode::discard);
  for (tag_entry* t : tags) {
    // Discarded bytes are gone whatever happened next; otherwise a tag sleeps when any of its
    // pages does (the pager put back what it could: then the tag is awake and whole).
    const bool asleep = rc == ok || mode == sleep_mode::discard || memory_.asleep_pages_in(pages_of(*t)) > 0;
    if (asleep && !(t->asleep && t->mode == sleep_mode::discard)) t->mode = mode;
    t->asleep = t->asleep || asleep;
  }
  if (rc != ok) return add_context(rc, "sleep (%s, %s): ", names.c_str(), sleep_mode_name(mode));
  return ok;
}

int memory_tags::sleep(const std::vector<tag_sleep>& tags) {
  std::lock_guard<std::mutex> guard(mutex_);
  try {
    std::vector<tag_entry*> discard, offload;
    for (size_t i = 0; i < tags.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (tags[j].tag == tags[i].tag) return fail(err_invalid_argument, "sleep: tag '%s' is named twice", tags[i].tag.c_str());
      }
      if (tags[i].mode != sleep_mode::offload && tags[i].mode != sleep_mode::discard) {
        return fail(err_invalid_argument, "sleep: tag '%s': mode %u is neither offload (0) nor discard (1)", tags[i].tag.c_str(),
                    static_cast<unsigned>(tags[i].mode));
      }
    }
    for (const tag_sleep& s : tags) {
      tag_entry* t = nullptr;
      VS_TRY(known(s.tag, &t));
      // Asleep already: a discard drops what an offload kept; anything else changes nothing.
      if (t->asleep && (s.mode == sleep_mode::offload || t->mode == sleep_mode::discard)) continue;
      (s.mode == sleep_mode::discard ? discard : offload).push_back(t);
    }
    VS_TRY(sleep_all_of(discard, sleep_mode::discard));
    return sleep_all_of(offload, sleep_mode::offload);
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "sleep: out of host memory; nothing more was put to sleep");
  }
}

int memory_tags::wake(const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> guard(mutex_);
  try {
    std::vector<tag_entry*> chosen;
    if (names.empty()) {
      for (auto& t : tags_) {
        if (t->asleep) chosen.push_back(t.get());
      }
    } else {
      for (const std::string& n : names) {
        tag_entry* t = nullptr;
        VS_TRY(known(n, &t));
        if (t->asleep && std::find(chosen.begin(), chosen.end(), t) == chosen.end()) chosen.push_back(t);
      }
    }
    if (chosen.empty()) return ok;
    std::string listed;
    const std::vector<page_range> pages = pages_of(chosen, &listed);
    const int rc = memory_.wake(pages);
    for (tag_entry* t : chosen) t->asleep = rc != ok && memory_.asleep_pages_in(pages_of(*t)) > 0;
    if (rc != ok) return add_context(rc, "wake (%s): ", listed.c_str());
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "wake: out of host memory; nothing was woken");
  }
}

std::vector<tag_report> memory_tags::report() const {
  std::lock_guard<std::mutex> guard(mutex_);
  std::vector<tag_report> out;
  out.reserve(tags_.size());
  for (const auto& t : tags_) {
    tag_report r;
    r.name = t->name;
    for (const auto& g : t->regions) {
      r.allocated_bytes += g->placement.bytes_allocated();
      r.allocations += g->placement.allocation_count();
      r.reserved_bytes += g->size;
    }
    r.asleep = t->asleep;
    r.mode = t->mode;
    out.push_back(std::move(r));
  }
  return out;
}

uint64_t memory_tags::asleep_bytes() const {
  std::lock_guard<std::mutex> guard(mutex_);
  uint64_t n = 0;
  for (const auto& t : tags_) {
    if (!t->asleep) continue;
    for (const auto& g : t->regions) n += g->placement.bytes_allocated();
  }
  return n;
}

}  // namespace vramswap::detail
