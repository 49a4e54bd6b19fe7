// string_format: printf into a std::string of whatever length the text needs.
//
// Reports (the status view, the metrics text) build lines from names a process chose (its
// command line, its job name): a fixed buffer would cut such a line short without a word.
#pragma once

#include <string>

namespace vramswap::detail {

std::string string_format(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace vramswap::detail
