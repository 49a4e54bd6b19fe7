#include "pool/listen_address.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

namespace vramswap::detail {

namespace {

constexpr const char* k_listen_state = "0A";  // TCP_LISTEN, as the kernel prints it

// "0100007F" (IPv4) or four such words (IPv6): the kernel prints each 32-bit word of the
// address as it lies in memory, read as a native integer, so storing the words back as
// native integers gives the address's bytes.
bool parse_address(const std::string& hex, bool ipv6, std::string* host) {
  const size_t words = ipv6 ? 4 : 1;
  if (hex.size() != words * 8) return false;
  uint32_t raw[4] = {};
  for (size_t i = 0; i < words; ++i) {
    char* end = nullptr;
    const std::string word = hex.substr(i * 8, 8);
    raw[i] = static_cast<uint32_t>(std::strtoul(word.c_str(), &end, 16));
    if (*end != '\0') return false;
  }
  char text[INET6_ADDRSTRLEN] = {};
  if (!ipv6) {
    in_addr a{};
    std::memcpy(&a.s_addr, &raw[0], sizeof a.s_addr);
    if (a.s_addr == htonl(INADDR_ANY)) a.s_addr = htonl(INADDR_LOOPBACK);
    if (::inet_ntop(AF_INET, &a, text, sizeof text) == nullptr) return false;
    *host = text;
    return true;
  }
  in6_addr a{};
  std::memcpy(a.s6_addr, raw, sizeof a.s6_addr);
  if (IN6_IS_ADDR_UNSPECIFIED(&a)) a = in6addr_loopback;
  if (::inet_ntop(AF_INET6, &a, text, sizeof text) == nullptr) return false;
  *host = std::string("[") + text + "]";
  return true;
}

std::string read_all(const char* path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::string listening_host_in(const std::string& table, bool ipv6, uint16_t port) noexcept {
  try {
    std::istringstream lines(table);
    std::string line;
    std::getline(lines, line);  // the heading
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      if (!(fields >> slot >> local >> remote >> state) || state != k_listen_state) continue;
      const size_t colon = local.find(':');
      if (colon == std::string::npos) continue;
      char* end = nullptr;
      const unsigned long p = std::strtoul(local.c_str() + colon + 1, &end, 16);
      if (*end != '\0' || p != port) continue;
      std::string host;
      if (parse_address(local.substr(0, colon), ipv6, &host)) return host;
    }
  } catch (const std::bad_alloc&) {
  }
  return "";
}

std::string listening_host(uint16_t port) noexcept {
  try {
    std::string host = listening_host_in(read_all("/proc/net/tcp"), false, port);
    if (host.empty()) host = listening_host_in(read_all("/proc/net/tcp6"), true, port);
    return host;
  } catch (const std::bad_alloc&) {
    return "";
  }
}

}  // namespace vramswap::detail
