// Which processes hold the other end of a client's connection: for a member whose process has
// exited while its connection stays open, because a process it forked without exec (a
// DataLoader worker, a multiprocessing pool with the fork start method) inherited the socket,
// and with it the dead process's GPU driver files. The peer's inode comes from the kernel's
// socket diagnostics (NETLINK_SOCK_DIAG, UDIAG_SHOW_PEER); its holders from /proc/<pid>/fd,
// as far as this server may read them (its own user's processes; all of them as root).
//
// Never throws; these serve a warning, and their failure only leaves it less precise.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace vramswap::detail {

// The inode of the socket at the other end of the connected Unix socket `fd`. false (with
// *why) where the kernel has no Unix socket diagnostics (the unix_diag module) or refuses.
bool peer_socket_inode(int fd, uint64_t* inode, std::string* why) noexcept;

// The processes (pids of this server's PID namespace) with a descriptor open on socket
// `inode`, in pid order; those whose /proc/<pid>/fd this server may not read are not seen.
std::vector<pid_t> processes_holding_socket(uint64_t inode) noexcept;

// "pid 123 (python3), pid 456 (pt_data_worker)": the holders as the warning names them.
std::string describe_processes(const std::vector<pid_t>& pids) noexcept;

}  // namespace vramswap::detail
