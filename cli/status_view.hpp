// status_view: `vramswap status` as a person reads it (text) and as a program reads it (JSON).
//
// Text: per device, a few lines (pool, daemon, holder, queue with each waiter's wait and whom
// it waits behind) and a table of the pool's processes, in at most `width` columns (100 by
// default): the command column takes what the others leave, and any value too long for its
// column is cut with "…". Sizes in binary units (KiB, MiB, GiB), times in ms, s, min or h.
// With `color`, ANSI colors mark states (running green, waiting yellow, stopped and a dead
// daemon red); the caller decides (a terminal, NO_COLOR unset). Text from processes (command
// lines, job names) has its control characters replaced, so a job cannot write escape
// sequences to an operator's terminal.
//
// JSON: schema version 2 (docs/observability.md). One unit per kind: sizes in bytes (whole
// numbers), times in seconds (floating point); unknown values are null.
#pragma once

#include <string>
#include <vector>

#include "pool/pool_report.hpp"

namespace vramswap::detail {

struct text_options {
  int width = 100;     // columns the screen must fit
  bool wide = false;   // every per-process column, values never cut (width ignored)
  bool color = false;  // ANSI colors
};

std::string render_text(const std::vector<device_report>& devices, const text_options& options = {});

// pretty: indented over several lines; else one line (JSON Lines, for --watch).
std::string render_json(const std::vector<device_report>& devices, bool pretty = true);

// "64 MiB", "1.50 GiB", "512 B": three significant digits, whole numbers without decimals.
std::string human_bytes(uint64_t bytes);
// "850 ms", "12.3 s", "4 min 05 s", "2 h 05 min".
std::string human_duration(double seconds);

// How a device is named on screen: "device 0", or "device ?" when its number is unknown.
std::string device_label(const device_report& d);

}  // namespace vramswap::detail
