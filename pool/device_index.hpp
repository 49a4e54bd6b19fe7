// device_index: devices numbered as operators number them, for `vramswap status --device 0`
// and the status screen. A pool is keyed by the device's UUID ("GPU-8a3f...", or "host-N" on
// the host backend); people say "GPU 0". The number is nvidia-smi's: the GPUs the NVIDIA
// driver lists in /proc/driver/nvidia/gpus/<PCI bus id>/information, in PCI bus order (the
// order of NVML, and of CUDA with CUDA_DEVICE_ORDER=PCI_BUS_ID; CUDA's default order puts
// the fastest first, which is the same on a machine of one kind of GPU). Inside a container
// the driver lists only the container's GPUs, so the numbers are the container's, as its
// nvidia-smi shows them. "host-N" is device N of the host backend.
//
// Reads only /proc; never initializes CUDA (the GPU may be busy, or absent here).
#pragma once

#include <string>
#include <vector>

namespace vramswap::detail {

struct numbered_device {
  int index = -1;
  std::string key;     // "GPU-<uuid>"
  std::string bus_id;  // "0000:18:00.0"
};

// The GPUs the NVIDIA driver lists under `proc_root` ("/proc"; a test passes a tree of its
// own), in nvidia-smi's order; empty without the driver.
std::vector<numbered_device> nvidia_gpus(const std::string& proc_root = "/proc") noexcept;

// The index of device `key` ("host-3": 3; a GPU's UUID: its place in `gpus`); -1 unknown.
int device_index_of(const std::string& key, const std::vector<numbered_device>& gpus) noexcept;

}  // namespace vramswap::detail
