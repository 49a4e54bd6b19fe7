// CU(call): a CUDA driver call in the standalone GPU benchmarks (bench/cuda), which print
// where and what failed and exit 2 rather than report a rate for work that did not run.
#pragma once

#include <cuda.h>

#include <cstdio>
#include <cstdlib>

#define CU(x)                                                               \
  do {                                                                      \
    CUresult r_ = (x);                                                      \
    if (r_ != CUDA_SUCCESS) {                                               \
      const char* s_ = nullptr;                                             \
      cuGetErrorString(r_, &s_);                                            \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, s_); \
      std::exit(2);                                                         \
    }                                                                       \
  } while (0)
