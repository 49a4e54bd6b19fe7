// train_loop: a C++ training loop that time-shares the GPU. It fits a linear model y = X w by
// gradient descent; each step is two CUDA kernels (residuals and loss, then gradient and
// update) run under vramswap::gpu_lock, so between steps other processes may have the device
// and this one's data may be evicted to host memory: it comes back at the same addresses.
// At the end the loss must have fallen and w must match a CPU run of the same steps.
//
// Build and run (from the repository root; built where CMake finds nvcc):
//   cmake -S . -B build -G Ninja && ninja -C build vramswap_train_loop vramswapd
//   ./build/examples/vramswap_train_loop [iterations=500] [rows=4096] [columns=256] [print-every=100]
// Several copies may run at once; they take turns on the device, a step at a time:
//   for i in 1 2 3; do ./build/examples/vramswap_train_loop & done; wait
// It needs a usable GPU and the cuda backend (kernels cannot run on the host emulation). The
// pool server vramswapd is started on demand and exits when idle. Exit status 0: converged
// and matched the CPU; 1: did not, or an error.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <vector>

#include <vramswap/vramswap.hpp>

namespace {

#define CUDA_CHECK(expr)                                                                          \
  do {                                                                                            \
    const cudaError_t e_ = (expr);                                                                \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "train_loop[%d]: %s failed: %s\n", static_cast<int>(getpid()), #expr, \
                   cudaGetErrorString(e_));                                                       \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

constexpr int k_device = 0;

// X is uniform in [-1, 1], so the largest eigenvalue of X^T X / n is about
// (1 + sqrt(d / n))^2 / 3 (Marchenko-Pastur); a step of its inverse converges for any shape.
double learning_rate(int n, int d) {
  const double edge = 1.0 + std::sqrt(static_cast<double>(d) / n);
  return 3.0 / (edge * edge);
}

// r = X w - y and *loss += |r|^2 / 2n: one thread per row. Each row's dot product is summed in
// column order, as the CPU reference does; only the loss's sum is in atomic (any) order.
__global__ void residual_kernel(const double* x, const double* y, const double* w, double* r, double* loss, int n,
                                int d) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const double* row = x + static_cast<size_t>(i) * d;
  double s = 0;
  for (int j = 0; j < d; ++j) s += row[j] * w[j];
  r[i] = s - y[i];
  atomicAdd(loss, r[i] * r[i] / (2.0 * n));
}

// w -= lr * X^T r / n: one thread per column, the gradient summed in row order.
__global__ void update_kernel(const double* x, const double* r, double* w, int n, int d, double lr) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  double g = 0;
  for (int i = 0; i < n; ++i) g += x[static_cast<size_t>(i) * d + j] * r[i];
  w[j] -= lr * g / n;
}

// The same steps on the CPU, in the same order; returns the loss before each step.
std::vector<double> cpu_reference(const std::vector<double>& x, const std::vector<double>& y, std::vector<double>& w,
                                  int n, int d, int iterations) {
  const double lr = learning_rate(n, d);
  std::vector<double> r(n), losses;
  for (int it = 0; it < iterations; ++it) {
    double loss = 0;
    for (int i = 0; i < n; ++i) {
      double s = 0;
      for (int j = 0; j < d; ++j) s += x[static_cast<size_t>(i) * d + j] * w[j];
      r[i] = s - y[i];
      loss += r[i] * r[i] / (2.0 * n);
    }
    losses.push_back(loss);
    for (int j = 0; j < d; ++j) {
      double g = 0;
      for (int i = 0; i < n; ++i) g += x[static_cast<size_t>(i) * d + j] * r[i];
      w[j] -= lr * g / n;
    }
  }
  return losses;
}

double relative_difference(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-300); }

int run(int iterations, int n, int d, int print_every) {
  const int pid = static_cast<int>(getpid());
  // Data with a known answer, the same in every run: y = X w_true + noise.
  std::mt19937_64 rng(2026);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> x(static_cast<size_t>(n) * d), y(n), w_true(d), w0(d, 0.0);
  for (double& v : x) v = uniform(rng);
  for (double& v : w_true) v = normal(rng);
  for (int i = 0; i < n; ++i) {
    double s = 0;
    for (int j = 0; j < d; ++j) s += x[static_cast<size_t>(i) * d + j] * w_true[j];
    y[i] = s + 0.01 * normal(rng);
  }

  // Device memory from vramswap: its addresses never change, whatever is swapped. Allocating
  // needs no lock; the memory is backed when the lock is next taken.
  auto* dx = static_cast<double*>(vramswap::malloc(x.size() * sizeof(double), k_device));
  auto* dy = static_cast<double*>(vramswap::malloc(n * sizeof(double), k_device));
  auto* dw = static_cast<double*>(vramswap::malloc(d * sizeof(double), k_device));
  auto* dr = static_cast<double*>(vramswap::malloc(n * sizeof(double), k_device));
  auto* dloss = static_cast<double*>(vramswap::malloc(sizeof(double), k_device));
  {
    vramswap::gpu_lock lock(k_device);  // the device may be touched only while holding it
    CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * sizeof(double), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dy, y.data(), n * sizeof(double), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dw, w0.data(), d * sizeof(double), cudaMemcpyHostToDevice));
  }
  std::printf("train_loop[%d]: %d x %d doubles (%.1f MiB on the device), %d iterations\n", pid, n, d,
              (x.size() + 2.0 * n + d) * sizeof(double) / 1048576.0, iterations);

  constexpr int threads = 256;
  // One step: the loss of the current w (copied back), then the update. Under the lock
  // because the kernels touch vramswap memory; ~gpu_lock synchronizes them and hands the
  // device on, after which this process's memory may be evicted for the next holder.
  auto step = [&](bool update, double* wait_ms) {
    const auto t0 = std::chrono::steady_clock::now();
    vramswap::gpu_lock lock(k_device);
    *wait_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    CUDA_CHECK(cudaMemset(dloss, 0, sizeof(double)));
    residual_kernel<<<(n + threads - 1) / threads, threads>>>(dx, dy, dw, dr, dloss, n, d);
    CUDA_CHECK(cudaGetLastError());
    if (update) {
      update_kernel<<<(d + threads - 1) / threads, threads>>>(dx, dr, dw, n, d, learning_rate(n, d));
      CUDA_CHECK(cudaGetLastError());
    }
    double loss = 0;
    CUDA_CHECK(cudaMemcpy(&loss, dloss, sizeof loss, cudaMemcpyDeviceToHost));
    return loss;
  };

  std::vector<double> losses;
  double wait_ms = 0, total_wait_ms = 0;
  for (int it = 0; it < iterations; ++it) {
    losses.push_back(step(true, &wait_ms));
    total_wait_ms += wait_ms;
    if (it % print_every == 0 || it == iterations - 1) {
      std::printf("train_loop[%d]: iteration %5d  loss %.6e  (waited %.1f ms for the device)\n", pid, it, losses.back(),
                  wait_ms);
    }
  }
  const double final_loss = step(false, &wait_ms);
  std::vector<double> w(d);
  {
    vramswap::gpu_lock lock(k_device);
    CUDA_CHECK(cudaMemcpy(w.data(), dw, d * sizeof(double), cudaMemcpyDeviceToHost));
  }
  const vramswap::stats st = vramswap::get_stats(k_device);
  for (void* p : {static_cast<void*>(dx), static_cast<void*>(dy), static_cast<void*>(dw), static_cast<void*>(dr),
                  static_cast<void*>(dloss)}) {
    vramswap::free(p, k_device);
  }
  std::printf("train_loop[%d]: %llu acquisitions, %.1f ms waiting in all; %.1f MiB brought in, %.1f MiB evicted\n",
              pid, static_cast<unsigned long long>(st.acquires), total_wait_ms, st.bytes_in / 1048576.0,
              st.bytes_out / 1048576.0);

  // Check: the loss fell, and the GPU's steps are the CPU's. The two differ only in rounding
  // (fused multiply-adds, the loss's summation order), which gradient descent does not amplify.
  std::vector<double> w_cpu = w0;
  const std::vector<double> cpu_losses = cpu_reference(x, y, w_cpu, n, d, iterations);
  double worst = 0;
  for (int it = 0; it < iterations; ++it) worst = std::max(worst, relative_difference(losses[it], cpu_losses[it]));
  double w_norm = 0, w_diff = 0;
  for (int j = 0; j < d; ++j) {
    w_norm = std::max(w_norm, std::fabs(w_cpu[j]));
    w_diff = std::max(w_diff, std::fabs(w[j] - w_cpu[j]));
  }
  const double w_worst = w_diff / std::max(w_norm, 1e-300);
  constexpr double tolerance = 1e-8;
  if (!(final_loss < losses.front())) {
    std::printf("train_loop[%d]: FAILED: the loss did not fall (%.6e, then %.6e)\n", pid, losses.front(), final_loss);
    return 1;
  }
  if (!(worst <= tolerance && w_worst <= tolerance)) {
    std::printf("train_loop[%d]: FAILED: the GPU's run differs from the CPU's (loss by %.2e, w by %.2e; tolerance %.0e)\n",
                pid, worst, w_worst, tolerance);
    return 1;
  }
  std::printf("train_loop[%d]: OK: loss %.6e -> %.6e in %d iterations; matches the CPU (loss %.1e, w %.1e apart)\n",
              pid, losses.front(), final_loss, iterations, worst, w_worst);
  return 0;
}

int positive_arg(int argc, char** argv, int i, int fallback) {
  if (argc <= i) return fallback;
  char* end = nullptr;
  const long v = std::strtol(argv[i], &end, 10);
  if (end == argv[i] || *end != '\0' || v <= 0 || v > (1 << 24)) {
    std::fprintf(stderr, "usage: %s [iterations=500] [rows=4096] [columns=256] [print-every=100]\n", argv[0]);
    std::exit(1);
  }
  return static_cast<int>(v);
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = positive_arg(argc, argv, 1, 500);
  const int rows = positive_arg(argc, argv, 2, 4096);
  const int columns = positive_arg(argc, argv, 3, 256);
  const int print_every = positive_arg(argc, argv, 4, 100);
  // Before vramswap is used, so that a machine without a GPU starts no pool server for nothing.
  const char* backend = std::getenv("VRAMSWAP_BACKEND");
  if (backend != nullptr && std::strcmp(backend, "host") == 0) {
    std::fprintf(stderr, "train_loop: needs the cuda backend (VRAMSWAP_BACKEND=host gives memory no kernel can touch)\n");
    return 1;
  }
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "train_loop: no usable GPU: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "no device");
    return 1;
  }
  try {
    return run(iterations, rows, columns, print_every);
  } catch (const std::exception& e) {  // vramswap::error, or std::bad_alloc for a huge size
    std::fprintf(stderr, "train_loop[%d]: %s\n", static_cast<int>(getpid()), e.what());
    return 1;
  }
}
