// prometheus_report: the metrics rendering of device reports (render_prometheus, declared
// in pool/pool_report.hpp) and the labels it puts on them. docs/observability.md lists the
// metrics.
//
// Labels, chosen so that series join with other exporters' and stay few:
//   gpu, UUID  on every series: the device's index as its pool server serves it (vramswapd
//              --device; absent when not known) and its key (the GPU's UUID, "host-N" on the
//              host backend). The names are dcgm-exporter's, so `on(UUID)` joins a vramswap
//              series with that GPU's DCGM series.
//   job_name   on per-process series: the job the process belongs to (job_name_of). Not
//              "job": Prometheus owns that label (the scrape job) and would rename ours.
//   member     on per-process series: the process's member slot in the pool (0..255), which
//              tells apart two processes of one job. A new process in a slot starts its
//              counters from zero, which Prometheus takes as a counter reset.
// No pid or command: pids change with every run and a command is "python" for every job.
// Per device, the per-process series number at most the pool's members (256) times the
// per-process families; over time, one series per (member, job name) pair seen.
#pragma once

#include <string>

#include "pool/pool_report.hpp"

namespace vramswap::detail {

// The value of the job_name label of process `p`: the program its command line runs (see
// program_name), else its command (comm); "unknown" for a process this one cannot see (another
// PID namespace) or that is gone. At most k_job_name_max bytes.
std::string job_name_of(const process_report& p);
constexpr size_t k_job_name_max = 64;

// The program a command line (/proc/PID/cmdline: arguments separated by NULs) runs, by the
// base name of its file: "train.py" for "python3 -u /jobs/train.py --lr 3", the module for
// "python -m torch.distributed.run ..." ("torch.distributed.run"), the interpreter itself for
// "python -c ..."; "trainer" for "/opt/bin/trainer --steps 9". "" for an empty command line
// (a kernel thread, a zombie).
std::string program_name(const std::string& cmdline);

}  // namespace vramswap::detail
