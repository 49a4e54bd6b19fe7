/* vramswap C API: the same operations as vramswap/vramswap.hpp, with return codes, for FFI
 * (ctypes, Rust, Go...) and the LD_PRELOAD shim.
 *
 * Every function returns VRAMSWAP_OK (0) or one of the negative codes below, and records a
 * message for the calling thread that vramswap_last_error() returns until the next failure
 * on that thread. Nothing here throws or aborts. Thread-safe.
 *
 * The rules of the C++ header apply (ownership per thread, re-entry counted, device order,
 * fork): see the comment at the top of vramswap/vramswap.hpp and docs/api.md.
 */
#ifndef VRAMSWAP_VRAMSWAP_H
#define VRAMSWAP_VRAMSWAP_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define VRAMSWAP_C_API __attribute__((visibility("default")))
#else
#define VRAMSWAP_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes: the library's own (core/status.hpp), in a reserved range that never
 * collides with -errno values. vramswap_status_name() gives the short name in brackets. */
#define VRAMSWAP_OK 0
#define VRAMSWAP_ERR_INVALID_ARGUMENT (-1000)  /* [invalid_argument] bad argument or usage rule; nothing changed */
#define VRAMSWAP_ERR_OUT_OF_MEMORY (-1001)     /* [out_of_memory] device, pool or host memory exhausted */
#define VRAMSWAP_ERR_CUDA (-1002)              /* [cuda_error] the CUDA driver returned an error */
#define VRAMSWAP_ERR_UNAVAILABLE (-1003)       /* [unavailable] no usable backend/device/server; a forked child */
#define VRAMSWAP_ERR_NOT_MAPPED (-1004)        /* [not_mapped] address range not mapped / not reserved */
#define VRAMSWAP_ERR_ALREADY_MAPPED (-1005)    /* [already_mapped] address range already mapped */
#define VRAMSWAP_ERR_SYSTEM (-1006)            /* [system_error] an OS call failed (message has errno's text) */
#define VRAMSWAP_ERR_OWNER_DIED (-1007)        /* [owner_died] a lock holder died; state was repaired */
#define VRAMSWAP_ERR_VERSION_MISMATCH (-1008)  /* [version_mismatch] shared state or server of another version */
#define VRAMSWAP_ERR_TIMEOUT (-1009)           /* [timeout] a timed wait expired */
#define VRAMSWAP_ERR_NOT_OWNER (-1010)         /* [not_owner] unlock without lock, or by another thread */
#define VRAMSWAP_ERR_BUSY (-1011)              /* [busy] a try (timeout 0) found the lock taken */
#define VRAMSWAP_ERR_IO (-1012)                /* [io_error] a swap read/write failed; data stayed where it was */
#define VRAMSWAP_ERR_NO_SPACE (-1013)          /* [no_space] the swap tier is full; data stayed where it was */
#define VRAMSWAP_ERR_INTERRUPTED (-1014)       /* [interrupted] vramswap_lock_interruptible: a signal handler ran */
#define VRAMSWAP_ERR_INTERNAL (-1099)          /* [internal_error] a bug in vramswap: please report */

/* Lock priorities: high waiters are served before normal ones, FIFO within a class. */
#define VRAMSWAP_PRIORITY_NORMAL 1
#define VRAMSWAP_PRIORITY_HIGH 2

/* Memory advice (vramswap_advise). */
#define VRAMSWAP_ADVICE_NORMAL 0
#define VRAMSWAP_ADVICE_DISCARDABLE 1 /* contents need not survive eviction: restored zero-filled */
#define VRAMSWAP_ADVICE_READ_MOSTLY 2 /* not written while the hint stands: host copy kept */

/* Take `device`'s lock. timeout_ns: -1 waits forever; 0 only tries (VRAMSWAP_ERR_BUSY when
 * that would wait); > 0 waits at most that long (VRAMSWAP_ERR_TIMEOUT). Returns when this
 * process's memory on the device is resident. A thread holding the lock may take it again
 * (counted). VRAMSWAP_ERR_INVALID_ARGUMENT for a bad device or priority, or a waiting lock of
 * a device below one this thread holds (take devices in increasing order). A timeout's message
 * names the holder (pid, command, how long, whether stopped) and the waiters ahead.
 * Signals do not end the wait: their handlers run and it goes on (like pthread_mutex_lock). */
VRAMSWAP_C_API int vramswap_lock(int device, int priority, int64_t timeout_ns);
/* vramswap_lock, but a signal handler that runs on this thread while it waits ends the wait
 * (like sem_wait's EINTR): VRAMSWAP_ERR_INTERRUPTED, with this thread out of the queue and
 * nothing held. For a program whose SIGINT handler sets a flag and wants the wait to stop.
 * Direct the signal at the waiting thread (pthread_kill, or block it in other threads): a
 * handler that runs on another thread does not end the wait. When the grant and the signal
 * cross, the grant wins: VRAMSWAP_OK, held. */
VRAMSWAP_C_API int vramswap_lock_interruptible(int device, int priority, int64_t timeout_ns);
/* Undo one vramswap_lock of this thread; the last one hands the lock on, then waits for this
 * process's device work to finish before it returns. VRAMSWAP_ERR_NOT_OWNER when this thread does not hold it. */
VRAMSWAP_C_API int vramswap_unlock(int device);

/* Device memory, cudaMalloc-like (256-byte aligned); *out is set only on success. */
VRAMSWAP_C_API int vramswap_malloc(void** out, size_t size, int device);
/* Free what vramswap_malloc returned; NULL is ignored. */
VRAMSWAP_C_API int vramswap_free(void* ptr, int device);
/* Stream-ordered allocation, cudaMallocAsync-like, for frameworks that allocate and free at a
 * high rate (vramswap.torch uses it). `stream` is a CUstream / cudaStream_t (NULL: the legacy
 * default stream). vramswap_free_async(ptr, stream) is ordered on `stream`: the block is kept
 * and reused by later allocations on that same stream at once (stream order makes it safe);
 * other streams get it only after vramswap_release_cached() or after an allocation that
 * found no room synchronized the device and gave the caches back. Kept blocks cost no
 * transfer time: evictions drop them. Memory allocated for, or freed on, a stream that is
 * being captured into a CUDA graph belongs to the graph and is held until the process exits.
 * Blocks from vramswap_malloc_async go back only through vramswap_free_async. */
VRAMSWAP_C_API int vramswap_malloc_async(void** out, size_t size, int device, void* stream);
VRAMSWAP_C_API int vramswap_free_async(void* ptr, int device, void* stream);
/* Synchronize the device and give every kept block back (vramswap_stats' cached_bytes -> 0). */
VRAMSWAP_C_API int vramswap_release_cached(int device);

/* Attach advice (VRAMSWAP_ADVICE_*) to [ptr, ptr + size), a range inside one allocation. */
VRAMSWAP_C_API int vramswap_advise(void* ptr, size_t size, int advice, int device);

/* This process's numbers on one device. Versioned by size: set `size` to
 * sizeof(vramswap_stats_t) before the call; the library fills the fields that fit in it
 * (fields are only ever added at the end) and sets `size` to what it filled. */
typedef struct vramswap_stats_t {
  uint64_t size;               /* in: sizeof the caller's struct; out: bytes filled */
  uint64_t allocated_bytes;    /* live allocations (rounded to 256 bytes) */
  uint64_t allocations;
  uint64_t resident_bytes;     /* pages mapped in frames (device, or host for oversubscribed processes) */
  uint64_t host_bytes;         /* saved pages in host memory */
  uint64_t disk_bytes;         /* saved pages only in the swap file */
  uint64_t bytes_in;           /* copied host -> device, total */
  uint64_t bytes_out;          /* copied device -> host, total */
  uint64_t acquires;           /* lock acquisitions (re-entries not counted) */
  uint64_t evictions_served;   /* frames evicted because another process needed them */
  uint64_t lock_holder_deaths; /* acquisitions that took over from a dead holder */
  double acquire_seconds;      /* total time in acquisitions, waiting included */
  double lock_wait_seconds;    /* of which waiting for the lock */
  double evict_seconds;        /* total time evicting this process's memory */
  double restore_seconds;      /* total time bringing it back */
  uint64_t cached_bytes;       /* freed by vramswap_free_async, kept for reuse (of allocated_bytes) */
  uint64_t graph_bytes;        /* malloc_async memory held for CUDA graphs (of allocated_bytes) */
  /* Oversubscribed processes (VRAMSWAP_OVERSUBSCRIBE=1); 0 otherwise: */
  uint64_t host_frame_bytes;   /* pages in host memory mapped at their addresses (of resident_bytes) */
  uint64_t pages_demoted;      /* moved from pool frames to host frames for lock holders */
  uint64_t pages_promoted;     /* moved back into free pool frames */
  double reclaim_seconds;      /* total time demoting (the launch gate closed) */
} vramswap_stats_t;
/* VRAMSWAP_ERR_INVALID_ARGUMENT when out is NULL or out->size is smaller than 16 bytes. */
VRAMSWAP_C_API int vramswap_stats(int device, vramswap_stats_t* out);

/* The message of the last failure on this thread ("" if none). Valid until the thread's
 * next vramswap call. */
VRAMSWAP_C_API const char* vramswap_last_error(void);
/* The short, stable name of a code ("timeout"); "unknown" for anything else. */
VRAMSWAP_C_API const char* vramswap_status_name(int code);

#ifdef __cplusplus
}
#endif

#endif /* VRAMSWAP_VRAMSWAP_H */
