#include "pool/pool_paths.hpp"

#include <new>
#include <string>
#include <utility>

#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/runtime_dir.hpp"
#include "lock/shared_segment.hpp"

namespace vramswap::detail {

int pool_paths::make(const std::string& device_key, bool create_dir, pool_paths* out) noexcept {
  try {
    std::string unused;
    VS_TRY(shared_segment::name_for(device_key, &unused));  // the key's character rules
    pool_paths p;
    VS_TRY(runtime_dir(create_dir, &p.dir));
    // The prefix names the files as it names the segments: pools under two prefixes are two
    // pools, each with its own server, even in one runtime dir.
    const std::string base = p.dir + "/" + option_text(option_id::shm_prefix) + device_key;
    p.socket = base + ".sock";
    p.server_lock = base + ".server.lock";
    p.start_lock = base + ".start.lock";
    p.log = base + ".log";
    *out = std::move(p);
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "pool: out of host memory");
  }
}

}  // namespace vramswap::detail
