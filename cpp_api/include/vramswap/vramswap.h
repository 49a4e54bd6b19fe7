/* vramswap C API: the same operations as vramswap/vramswap.hpp, with return codes, for FFI
 * (ctypes, Rust, Go...) and the LD_PRELOAD shim.
 *
 * Every function returns VRAMSWAP_OK (0) or one of the negative codes below, and records a
 * message for the calling thread that vramswap_last_error() returns until the next failure
 * on that thread: it names the call and what it was about, and says what to do. Nothing
 * here throws or aborts. Thread-safe. Each function's comment lists the codes it returns.
 *
 * Caveats
 * =======
 * What a user must know so as not to hurt themselves (docs/api.md has the reasons):
 *
 * - One runtime per process, in libvramswap.so. The Python module (vramswap._vramswap) and
 *   the preload shim (libvramswap_preload.so) use this library's runtime, so a process may
 *   use any of them together: one session per device, one lock view, one set of stats. A
 *   module or shim of another vramswap release than the library loaded first refuses to
 *   load (docs/troubleshooting.md, "One process, one runtime").
 * - The lock is per device and per thread. A thread that holds a device's lock may lock it
 *   again (counted: each vramswap_lock needs its vramswap_unlock, and only the last one
 *   hands the lock on); another thread of the same process that locks the device waits
 *   like another process would. Unlock on the thread that locked.
 * - Several devices: lock them in increasing device order (0 before 1). A thread that holds
 *   device d and makes a waiting lock (timeout_ns != 0) of a device below d gets
 *   VRAMSWAP_ERR_INVALID_ARGUMENT instead of a possible deadlock with another process. A
 *   try (timeout_ns 0) may go in any order.
 * - fork after first use: a child forked after this process first used vramswap (any call
 *   that opened a device's session) cannot use vramswap, nor CUDA: every call there returns
 *   VRAMSWAP_ERR_UNAVAILABLE, and it never holds the parent's locks. Start helpers with
 *   posix_spawn or fork + exec. A child forked before first use is a fresh user.
 * - Memory is the device's only while the lock is held. Allocating and freeing need no
 *   lock, but the device (kernels, copies) may touch this process's memory only while one
 *   of its threads holds the device's lock. Outside the lock, an allocation is backed at
 *   once only if the pool has free frames for it; vramswap_malloc otherwise backs it at the
 *   next lock (touching it before then is an illegal address on CUDA, a SIGSEGV on the host
 *   backend), vramswap_malloc_async fails with VRAMSWAP_ERR_OUT_OF_MEMORY. Memory touched
 *   outside the lock may have gone to another process since: allocate and first-touch
 *   outside the lock only at start-up, everything else under it.
 * - Device memory that is not vramswap's (cudaMalloc without the shim, CUDA's own context,
 *   cuBLAS and cuDNN workspaces) is never swapped: it stays on the device outside the pool.
 * - Oversubscription (VRAMSWAP_OVERSUBSCRIBE=1, docs/oversubscription.md): such a process is
 *   low priority and never takes the lock (vramswap_lock returns
 *   VRAMSWAP_ERR_INVALID_ARGUMENT); its memory is always mapped, in pool frames while free,
 *   else in host memory up to VRAMSWAP_OVERSUBSCRIBE_LIMIT (then VRAMSWAP_ERR_OUT_OF_MEMORY),
 *   and its kernels run at any time. Its device work is made safe to move only through the
 *   preload shim's launch gate: use it through the shim. The processes that take turns get
 *   its frames back when they need them; one that cannot give them back (at its limit) makes
 *   their vramswap_lock fail with VRAMSWAP_ERR_TIMEOUT after VRAMSWAP_EVICT_TIMEOUT.
 * - A lock taken over from a process that died holding it is granted normally (VRAMSWAP_OK):
 *   the lock was repaired and this process's memory is intact; the death is logged and
 *   counted (vramswap_stats_t.lock_holder_deaths). The dead process's work is not undone.
 * - Configuration is read from VRAMSWAP_* environment variables when a device's session
 *   opens; a malformed one fails that call and every later one until it is corrected
 *   (VRAMSWAP_ERR_INVALID_ARGUMENT, naming the variable).
 *
 * Opening a session. The first call about a device (any of the functions below but
 * vramswap_unlock, vramswap_last_error and vramswap_status_name) opens the device's session:
 * it checks the VRAMSWAP_* settings, connects to the device's pool server vramswapd (starting
 * it when none runs) and opens the device's lock. A failed open is not cached: the next call
 * tries again. Besides their own, those functions return the errors of opening it:
 *   VRAMSWAP_ERR_UNAVAILABLE       a forked child (above); no usable backend
 *                                  (no CUDA driver or device); vramswapd not found, or it
 *                                  could not start, or it exited while this process waited.
 *   VRAMSWAP_ERR_INVALID_ARGUMENT  no such device; a malformed VRAMSWAP_* setting; a runtime
 *                                  dir whose socket path is too long.
 *   VRAMSWAP_ERR_TIMEOUT           vramswapd did not get ready, or did not answer, in time.
 *   VRAMSWAP_ERR_VERSION_MISMATCH  vramswapd, or a shared segment, of another vramswap version.
 *   VRAMSWAP_ERR_NOT_OWNER         the pool server or the runtime dir belongs to another user
 *                                  (VRAMSWAP_GROUP shares them), or the server refused this uid.
 *   VRAMSWAP_ERR_BUSY              the pool server has no free member slot.
 *   VRAMSWAP_ERR_OUT_OF_MEMORY     out of host memory.
 *   VRAMSWAP_ERR_CUDA              the CUDA driver failed.
 *   VRAMSWAP_ERR_SYSTEM            an OS call failed (the message has errno's text).
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

/* Take `device`'s lock. timeout_ns: -1 waits forever; 0 only tries; > 0 waits at most that
 * long. Returns when this process's memory on the device is resident. A thread holding the
 * lock may take it again (counted; priority and timeout are then ignored). Signals do not end
 * the wait: their handlers run and it goes on (like pthread_mutex_lock).
 * Errors (nothing is held after any of them):
 *   VRAMSWAP_ERR_BUSY              timeout_ns 0 and the lock is taken.
 *   VRAMSWAP_ERR_TIMEOUT           timeout_ns > 0 ran out; the message names the holder (pid,
 *                                  command, how long, whether stopped) and the waiters ahead.
 *                                  Also: granted, but a process did not give back the frames
 *                                  this one needs within VRAMSWAP_EVICT_TIMEOUT (it is named).
 *   VRAMSWAP_ERR_INVALID_ARGUMENT  priority not VRAMSWAP_PRIORITY_*; timeout_ns < -1; a waiting
 *                                  lock of a device below one this thread holds; an
 *                                  oversubscribed process (VRAMSWAP_OVERSUBSCRIBE=1).
 *   VRAMSWAP_ERR_OUT_OF_MEMORY, VRAMSWAP_ERR_IO, VRAMSWAP_ERR_CUDA, VRAMSWAP_ERR_UNAVAILABLE
 *                                  granted, but bringing this process's memory back failed
 *                                  (host memory, a swap read, the driver, or the pool server
 *                                  exited meanwhile); the lock was released again.
 *   VRAMSWAP_ERR_INTERNAL          a bug in vramswap (the lock's state is inconsistent).
 *   and the errors of opening a session (above). */
VRAMSWAP_C_API int vramswap_lock(int device, int priority, int64_t timeout_ns);
/* vramswap_lock, but a signal handler that runs on this thread while it waits ends the wait
 * (like sem_wait's EINTR). For a program whose SIGINT handler sets a flag and wants the wait
 * to stop. Direct the signal at the waiting thread (pthread_kill, or block it in other
 * threads): a handler that runs on another thread does not end the wait. When the grant and
 * the signal cross, the grant wins: VRAMSWAP_OK, held.
 * Errors: those of vramswap_lock, and
 *   VRAMSWAP_ERR_INTERRUPTED       a signal handler ran on this thread while it waited; it is
 *                                  out of the queue and holds nothing. */
VRAMSWAP_C_API int vramswap_lock_interruptible(int device, int priority, int64_t timeout_ns);
/* Undo one vramswap_lock of this thread; the last one hands the lock on, then waits for this
 * process's device work to finish before it returns.
 * Errors:
 *   VRAMSWAP_ERR_NOT_OWNER         this thread does not hold the lock (unlock without lock, one
 *                                  too many, or a lock taken by another thread); nothing changed.
 *   VRAMSWAP_ERR_UNAVAILABLE       a forked child (the lock is the parent's); nothing changed.
 *   VRAMSWAP_ERR_CUDA              the lock was handed on, but this process's device work failed
 *                                  (the message has the driver's error).
 *   VRAMSWAP_ERR_IO, VRAMSWAP_ERR_NO_SPACE, VRAMSWAP_ERR_OUT_OF_MEMORY
 *                                  with VRAMSWAP_EAGER_RELEASE or VRAMSWAP_STRICT: evicting
 *                                  failed; the lock was released, memory not evicted stays.
 *   VRAMSWAP_ERR_INTERNAL          a bug in vramswap. */
VRAMSWAP_C_API int vramswap_unlock(int device);
/* A gang: take the locks of devices[0..count) at once, all or none (docs/lock.md, "Gangs").
 * The devices may come in any order, each once; count 1 is vramswap_lock. The call waits in
 * FIFO order on every device and is granted them together when it is next on each; meanwhile
 * a member device that is free idles rather than serve those queued behind the gang (which
 * keeps the gang from starving behind single-device users). It returns when this process's
 * memory on every one of them is resident; each device is then held as by vramswap_lock (one
 * vramswap_unlock each, or vramswap_unlock_devices). timeout_ns and priority as for
 * vramswap_lock. Device order: the gang takes all its devices at its lowest one.
 * Errors (nothing is held after any of them): those of vramswap_lock, and
 *   VRAMSWAP_ERR_INVALID_ARGUMENT  devices NULL, count 0 or over 64, a device listed twice; a
 *                                  waiting gang of a thread that holds a device above the
 *                                  gang's lowest, or some but not all of the gang's devices;
 *                                  an oversubscribed device.
 *   VRAMSWAP_ERR_BUSY, VRAMSWAP_ERR_TIMEOUT  the message names each device's holder and the
 *                                  waiters ahead of the gang there. */
VRAMSWAP_C_API int vramswap_lock_devices(const int* devices, size_t count, int priority, int64_t timeout_ns);
/* vramswap_unlock of each of devices[0..count), highest first. Every device is checked first:
 * VRAMSWAP_ERR_NOT_OWNER (nothing released) when this thread does not hold one of them (or
 * one is listed twice). Otherwise each is unlocked and the first error is returned. */
VRAMSWAP_C_API int vramswap_unlock_devices(const int* devices, size_t count);
/* A gang of processes (docs/lock.md, "Gangs of processes"): the ranks of one job, one process
 * per device, take their turns together. From this call on, this process's locks of `device`
 * (vramswap_lock, the C++ guard, Python's gpu_lock, vramswap.torch) are the turns of rank
 * `rank` of `world_size` in the gang of `job` (a node-wide name: letters, digits, '-', '_',
 * '.'; every rank gives the same job and world size). Each lock is granted when every rank
 * has asked and the gang is next on every rank's device (FIFO there, like a gang of devices);
 * each rank then has its own device's memory resident, and each unlock releases its own
 * device. job NULL: leave the gang (plain locks again). Call it while no thread of this
 * process holds or waits for the device.
 * Errors:
 *   VRAMSWAP_ERR_INVALID_ARGUMENT  a bad job, rank or world size (1 to 64); the gang's ranks
 *                                  gave another world size; this thread holds the device; the
 *                                  device is oversubscribed or a rank of another gang here.
 *   VRAMSWAP_ERR_BUSY              a live process is that rank of the job already.
 *   VRAMSWAP_ERR_OWNER_DIED        the gang is broken: one of its ranks died; the message
 *                                  names it and the ranks still in it (restart the whole job).
 *   and the errors of opening a session (above).
 * A lock of a joined device fails, besides its usual errors, with VRAMSWAP_ERR_OWNER_DIED when
 * a rank died (the message names it and its pid: restart the job), and VRAMSWAP_ERR_TIMEOUT
 * naming the ranks that never asked, or the rank that left the turn. */
VRAMSWAP_C_API int vramswap_join_gang(const char* job, int rank, int world_size, int device);
/* 1 when an operator asked this process to release `device`'s lock during its current hold
 * (`vramswap release-request`), else 0: this process does not hold the lock, nobody asked, or
 * the device was not used yet (this never opens a session). Cheap enough to poll between
 * steps. A request takes nothing from the holder: releasing is up to the program. Never fails. */
VRAMSWAP_C_API int vramswap_release_requested(int device);

/* Device memory, cudaMalloc-like (256-byte aligned); *out is set only on success. The address
 * never changes, whatever is swapped. Without the lock: see Caveats.
 * Errors:
 *   VRAMSWAP_ERR_INVALID_ARGUMENT  out is NULL; size is 0.
 *   VRAMSWAP_ERR_OUT_OF_MEMORY     the arena or the pool cannot hold it (an oversubscribed
 *                                  process: VRAMSWAP_OVERSUBSCRIBE_LIMIT reached).
 *   VRAMSWAP_ERR_CUDA              the driver failed mapping its pages.
 *   and the errors of opening a session. */
VRAMSWAP_C_API int vramswap_malloc(void** out, size_t size, int device);
/* Free what vramswap_malloc returned; NULL is ignored (VRAMSWAP_OK).
 * Errors:
 *   VRAMSWAP_ERR_INVALID_ARGUMENT  ptr is not what vramswap_malloc returned on this device (an
 *                                  interior pointer, freed already, or a vramswap_malloc_async
 *                                  block: those go back through vramswap_free_async); nothing
 *                                  was freed.
 *   VRAMSWAP_ERR_CUDA              the driver failed unmapping its pages.
 *   and the errors of opening a session. */
VRAMSWAP_C_API int vramswap_free(void* ptr, int device);
/* Stream-ordered allocation, cudaMallocAsync-like, for frameworks that allocate and free at a
 * high rate (vramswap.torch uses it). `stream` is a CUstream / cudaStream_t (NULL: the legacy
 * default stream). vramswap_free_async(ptr, stream) is ordered on `stream`: the block is kept
 * and reused by later allocations on that same stream at once (stream order makes it safe);
 * other streams get it only after vramswap_release_cached() or after an allocation that
 * found no room synchronized the device and gave the caches back. Kept blocks cost no
 * transfer time: evictions drop them. Memory allocated for, or freed on, a stream that is
 * being captured into a CUDA graph belongs to the graph and is held until the process exits.
 * Blocks from vramswap_malloc_async go back only through vramswap_free_async.
 *
 * vramswap_malloc_async errors:
 *   VRAMSWAP_ERR_INVALID_ARGUMENT  out is NULL; size is 0.
 *   VRAMSWAP_ERR_OUT_OF_MEMORY     no room; or no thread of this process holds the lock and the
 *                                  pool has no free frames to back it now (allocate inside the
 *                                  lock); nothing changed.
 *   VRAMSWAP_ERR_CUDA              asking the driver whether `stream` is being captured failed
 *                                  (not a valid stream?), or mapping the block's pages failed.
 *   and the errors of opening a session.
 * vramswap_free_async: NULL is ignored (VRAMSWAP_OK). Errors:
 *   VRAMSWAP_ERR_INVALID_ARGUMENT  ptr is not what vramswap_malloc_async returned on this device,
 *                                  or it was given back already; nothing was freed.
 *   VRAMSWAP_ERR_CUDA              as for vramswap_malloc_async.
 *   and the errors of opening a session. */
VRAMSWAP_C_API int vramswap_malloc_async(void** out, size_t size, int device, void* stream);
VRAMSWAP_C_API int vramswap_free_async(void* ptr, int device, void* stream);
/* Synchronize the device and give every wholly free segment of the stream-ordered allocator
 * back to the pager (vramswap_stats' cached_bytes keeps only the free bytes of segments that
 * still hold a live block).
 * Errors:
 *   VRAMSWAP_ERR_CUDA              synchronizing the device, or unmapping, failed.
 *   and the errors of opening a session. */
VRAMSWAP_C_API int vramswap_release_cached(int device);

/* Memory classes, sleep and wake (docs/sleep.md)
 * ===============================================
 * An allocation may carry a tag, the name of its memory class ("weights", "kv_cache": 1 to 63
 * of the characters letters, digits and _ - . : /; at most 64 tags a process and device). A
 * tag's allocations share pages with nothing else, so that vramswap_sleep can take a tag's
 * pages off the device while the rest stays: each of them leaves its frame, which goes back to
 * the pool for whoever needs it next (another process's wake, or the lock's next holder), and
 * stays out until vramswap_wake, whatever the lock does meanwhile. The addresses stay valid.
 * While a tag sleeps the device must not touch its memory (an illegal address on CUDA), and
 * allocating in it fails.
 * A process that shares the device by sleeping and waking (a rollout engine and a trainer
 * taking turns by their own schedule, as with torch_memory_saver or vLLM's sleep mode) does
 * not take part in the lock: it calls vramswap_keep_resident first, and its memory then stays
 * on the device until it sleeps it. A process that takes turns under the lock may sleep tags
 * too: they stay out of its turns until woken. */
#define VRAMSWAP_SLEEP_OFFLOAD 0 /* the bytes go to host memory (disk past its limit); wake brings them back */
#define VRAMSWAP_SLEEP_DISCARD 1 /* the bytes are dropped; wake gives the pages back zero-filled */

/* Device memory of tag `tag` (vramswap_malloc otherwise). vramswap_free takes it back, and
 * vramswap_free_async too (it then synchronizes the device first).
 * Errors: those of vramswap_malloc, and VRAMSWAP_ERR_INVALID_ARGUMENT: tag is NULL or not a
 * valid name, the process has 64 tags already, the tag is asleep. */
VRAMSWAP_C_API int vramswap_malloc_tagged(void** out, size_t size, int device, const char* tag);
/* This thread's allocation tag: while one is set, vramswap_malloc and vramswap_malloc_async of
 * this thread (and so PyTorch's allocations through vramswap.torch) allocate memory of that tag
 * (vramswap_malloc_async then as vramswap_malloc_tagged, backed at once or out of memory, not
 * from the stream-ordered cache). NULL or "" clears it. vramswap_thread_tag: the tag set, ""
 * when none (never NULL).
 * Errors: VRAMSWAP_ERR_INVALID_ARGUMENT (not a valid tag name; nothing changed). */
VRAMSWAP_C_API int vramswap_set_thread_tag(const char* tag);
VRAMSWAP_C_API const char* vramswap_thread_tag(void);
/* Put tags[i] to sleep as modes[i] (VRAMSWAP_SLEEP_*), for i < count, in one pass: the discarded
 * ones first, then the offloaded ones' bytes copied out at the link rate. Synchronizes the
 * device first. A tag asleep already is left so (but a discard drops what an offload kept).
 * count 0 does nothing.
 * On failure the tags whose pages were put back are awake and whole, the others asleep with
 * their bytes saved; the message says which (offloaded bytes are never lost).
 * Errors:
 *   VRAMSWAP_ERR_INVALID_ARGUMENT  a NULL pointer; a tag that is no tag of this process, or
 *                                  named twice; a mode that is no VRAMSWAP_SLEEP_*; an
 *                                  oversubscribed process.
 *   VRAMSWAP_ERR_OUT_OF_MEMORY, VRAMSWAP_ERR_IO, VRAMSWAP_ERR_NO_SPACE  saving the bytes
 *                                  (host memory, the swap file) failed.
 *   VRAMSWAP_ERR_CUDA              the device failed (synchronizing, copying, unmapping).
 *   and the errors of opening a session. */
VRAMSWAP_C_API int vramswap_sleep(int device, const char* const* tags, const int* modes, size_t count);
/* Wake the named tags (count 0: every sleeping tag). Their pages come back now when this
 * process's memory is resident (it holds the lock, or keeps its memory resident): frames are
 * taken free, or asked of processes between turns, as an acquire takes them; else at the next
 * acquire. A tag awake already is left as it is. On failure the pages not brought back stay
 * asleep with their bytes where they were; call it again.
 * Errors:
 *   VRAMSWAP_ERR_INVALID_ARGUMENT  a NULL pointer; a tag that is no tag of this process; an
 *                                  oversubscribed process.
 *   VRAMSWAP_ERR_TIMEOUT           no frames came within VRAMSWAP_EVICT_TIMEOUT (the message
 *                                  says who holds them: a process awake, not sleeping).
 *   VRAMSWAP_ERR_CUDA, VRAMSWAP_ERR_IO  bringing the bytes in failed.
 *   and the errors of opening a session. */
VRAMSWAP_C_API int vramswap_wake(int device, const char* const* tags, size_t count);
/* From now on this process's memory on `device` stays resident without the lock (brought in
 * now, as an acquire brings it), and leaves only by vramswap_sleep; vramswap_lock of the
 * device is refused from then on. Calling it again does nothing.
 * Errors:
 *   VRAMSWAP_ERR_INVALID_ARGUMENT  this process holds the device's lock, is a rank of a gang
 *                                  on it, or is oversubscribed.
 *   and those of bringing memory in at an acquire, and of opening a session. */
VRAMSWAP_C_API int vramswap_keep_resident(int device);
/* One tag of this process (vramswap_tags). */
typedef struct vramswap_tag_info {
  char name[64];
  uint64_t allocated_bytes; /* live allocations (rounded to 256 bytes) */
  uint64_t allocations;
  uint64_t reserved_bytes;  /* addresses its regions hold */
  int asleep;               /* 1 while asleep */
  int sleep_mode;           /* VRAMSWAP_SLEEP_*: how it sleeps, while asleep */
} vramswap_tag_info_t;
/* This process's tags on `device`, in the order they were made: up to `capacity` of them into
 * out (NULL when capacity is 0), and how many there are into *count.
 * Errors: VRAMSWAP_ERR_INVALID_ARGUMENT (count NULL, out NULL with capacity > 0), and the
 * errors of opening a session. */
VRAMSWAP_C_API int vramswap_tags(int device, vramswap_tag_info_t* out, size_t capacity, size_t* count);

/* Attach advice (VRAMSWAP_ADVICE_*) to [ptr, ptr + size), a range inside one allocation.
 * Errors:
 *   VRAMSWAP_ERR_INVALID_ARGUMENT  advice is not a VRAMSWAP_ADVICE_* value; the range is not
 *                                  inside one live allocation of this device.
 *   and the errors of opening a session. */
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
  uint64_t cached_bytes;       /* free bytes in the allocator's segments, kept for reuse (of allocated_bytes) */
  uint64_t graph_bytes;        /* malloc_async memory held for CUDA graphs (of allocated_bytes) */
  /* Oversubscribed processes (VRAMSWAP_OVERSUBSCRIBE=1); 0 otherwise: */
  uint64_t host_frame_bytes;   /* pages in host memory mapped at their addresses (of resident_bytes) */
  uint64_t pages_demoted;      /* moved from pool frames to host frames for lock holders */
  uint64_t pages_promoted;     /* moved back into free pool frames */
  double reclaim_seconds;      /* total time demoting (the launch gate closed) */
  /* The stream-ordered allocator (vramswap_malloc_async; vramswap.torch): */
  uint64_t cache_hits;         /* allocations served from a free block of a segment */
  uint64_t cache_misses;       /* allocations that took a new segment from the pager */
  uint64_t cache_trims;        /* times the device was synchronized and free segments given back */
  double allocator_seconds;    /* total time inside malloc_async, free_async and trims */
  /* Oversubscribed processes: device work held back for lock holders (VRAMSWAP_OVERSUBSCRIBE_COMPUTE;
   * the process's, all devices): */
  uint64_t yield_waits;        /* launches that waited for a lock holder */
  double yield_seconds;        /* total time they waited (summed over threads) */
  /* Time-sharing: frames other processes were asked to evict for this one's acquires */
  uint64_t frames_asked_ahead;      /* before the acquire, between turns (VRAMSWAP_EVICT_AHEAD) */
  uint64_t frames_asked_at_acquire; /* during the acquire, after the lock was granted */
  /* The stream-ordered allocator, again: */
  uint64_t cache_miss_bytes;   /* bytes of the segments its misses took from the pager, total */
  /* Oversubscribed processes: placement by use (VRAMSWAP_OVERSUBSCRIBE_PLACEMENT): */
  uint64_t placement_rounds;         /* rounds that moved pages */
  uint64_t placement_rounds_skipped; /* rounds whose gain was below their cost, not run */
  uint64_t pages_placed_in;          /* moved from host frames into pool frames */
  uint64_t pages_placed_out;         /* moved from pool frames into host frames */
  /* Host memory this process pinned of its own for its pages, used or not: its host tier's
   * slots (those pinned ahead of need included; 0 with the shared host pool, which vramswapd
   * owns), and an oversubscribed process's host frames (in use and spare). */
  uint64_t host_pinned_bytes;
  /* Memory classes (vramswap_sleep): bytes of the allocations of the tags asleep now. */
  uint64_t asleep_bytes;
} vramswap_stats_t;
/* Errors:
 *   VRAMSWAP_ERR_INVALID_ARGUMENT  out is NULL, or out->size is smaller than 16 bytes.
 *   VRAMSWAP_ERR_OUT_OF_MEMORY     out of host memory.
 *   and the errors of opening a session (so the first vramswap_stats may start vramswapd). */
VRAMSWAP_C_API int vramswap_stats(int device, vramswap_stats_t* out);

/* The message of the last failure on this thread ("" if none). Valid until the thread's
 * next vramswap call. Never fails. */
VRAMSWAP_C_API const char* vramswap_last_error(void);
/* The short, stable name of a code ("timeout"); "unknown" for anything else. Never fails. */
VRAMSWAP_C_API const char* vramswap_status_name(int code);

#ifdef __cplusplus
}
#endif

#endif /* VRAMSWAP_VRAMSWAP_H */
