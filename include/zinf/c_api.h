/* zinf's C ABI: the tiered store, a pinned host pool, the NVMe swap store, the CPU optimizers
 * and the ZeRO engine, for programs (and language bindings) that cannot use the C++ API.
 *
 * Conventions (LevelDB's c.h is the model):
 *
 * - Handles are opaque pointers made by a *_create (or *_open) function and released by the
 *   matching *_destroy. A handle is never reused: a call on a destroyed handle fails with
 *   ZINF_FAILED_PRECONDITION, a call on a pointer that is no zinf handle (or the wrong kind of
 *   handle) with ZINF_INVALID_ARGUMENT; neither crashes. *_destroy(NULL) does nothing, and
 *   destroying a destroyed handle is ignored. A handle may be destroyed while another thread is
 *   still inside a call on it: the object goes away when that call returns.
 *
 * - Fallible functions return a zinf_code_t (ZINF_OK is 0) and take `char** errptr` last. On
 *   failure, when errptr is not NULL, the old value of *errptr is released with free() and
 *   replaced by a malloc()ed message ("zinf_swap_store_open: InvalidArgument: nvme path
 *   /mnt/x does not exist"), which the caller frees with zinf_free(). On success *errptr is
 *   left alone. errptr may be NULL when only the code is wanted. Out-parameters are written
 *   only on success, except handles, which are set to NULL on failure.
 *
 * - Every pointer argument is checked: a NULL where an object is needed is
 *   ZINF_INVALID_ARGUMENT naming the argument. No C++ exception leaves a zinf function; one
 *   from a dependency becomes ZINF_INTERNAL (ZINF_RESOURCE_EXHAUSTED for out of memory).
 *
 * - Structs that a function reads or fills and that may grow (options, statistics) start with
 *   `size_t struct_size`. Fill options with the matching *_init function, which sets
 *   struct_size to sizeof the struct this header declares and every field to its default; set
 *   it by hand to sizeof(...) for output structs. A program built against this header keeps
 *   working with a later library: the library reads only struct_size bytes, and gives fields
 *   past them their defaults. A struct_size smaller than this version's struct, or one larger
 *   whose extra bytes are not zero, is ZINF_INVALID_ARGUMENT naming the struct. Fixed structs
 *   (zinf_tensor_t, zinf_swap_extent_t, the stats members) never change size; they have
 *   reserved fields instead.
 *
 * - Enumerations are plain ints with the values below; the numbers never change.
 *
 * Thread-safety: as the C++ object behind each handle (see its header). The tiered store,
 * the pinned pool, the swap store and completions may be used from any thread (a swap extent
 * must not be written while it is read, written or freed elsewhere); on a CPU optimizer,
 * update, init_state and grad_stats may run concurrently on disjoint spans, and the calls that
 * change groups (add_param_group, set_hyper_params, set_step, begin_step, step, load_state)
 * must not race with any other; one thread drives an engine. Creating and destroying handles
 * is thread-safe. */
#ifndef ZINF_C_API_H_
#define ZINF_C_API_H_

#include <stddef.h>
#include <stdint.h>

#include "zinf/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this ABI; a later library accepts callers built against any earlier one. */
#define ZINF_C_API_VERSION 1

/* In C++ the enumerations below have int32_t as their underlying type, so that every value a C
 * caller may pass (say 7 for a zinf_tier_t) is a value of the type: without one, C++ holds only
 * the values of the enumerators' bit width, and reading any other is undefined behaviour. In C
 * they are 32-bit integers as well. */
#ifdef __cplusplus
#define ZINF_ENUM_BASE : int32_t
#else
#define ZINF_ENUM_BASE
#endif

/* ------------------------------------------------------------------------------------------
 * Codes, errors, memory. */

/* The codes of zinf::StatusCode, with the same numbers. */
typedef enum zinf_code_t ZINF_ENUM_BASE {
  ZINF_OK = 0,
  ZINF_INVALID_ARGUMENT = 1,    /* the caller passed something wrong */
  ZINF_FAILED_PRECONDITION = 2, /* wrong in the current state (destroyed handle, freed tensor) */
  ZINF_RESOURCE_EXHAUSTED = 3,  /* a budget, a pool, memory or disk space ran out */
  ZINF_UNAVAILABLE = 4,         /* a feature or peer is not there (no GPU, dead rank) */
  ZINF_IO_ERROR = 5,            /* the operating system failed a read, write or open */
  ZINF_DATA_LOSS = 6,           /* stored data is corrupt or truncated */
  ZINF_CANCELLED = 7,
  ZINF_DEADLINE_EXCEEDED = 8,
  ZINF_INTERNAL = 9 /* a bug in zinf */
} zinf_code_t;

/* "OK", "InvalidArgument", ...; "Unknown" for other values. A static string. */
ZINF_EXPORT const char* zinf_code_name(int code);
/* The library's version, "MAJOR.MINOR.PATCH" (a static string), and its ZINF_C_API_VERSION. */
ZINF_EXPORT const char* zinf_version(void);
ZINF_EXPORT int zinf_c_api_version(void);
/* Frees what zinf returned with malloc(): error messages, strings, optimizer state blobs. */
ZINF_EXPORT void zinf_free(void* ptr);

/* Element formats: the values of zinf::ElementType that buffers handed to C use. */
typedef enum zinf_dtype_t ZINF_ENUM_BASE {
  ZINF_DTYPE_FP32 = 0,
  ZINF_DTYPE_BF16 = 1,
  ZINF_DTYPE_FP16 = 2
} zinf_dtype_t;

/* Where a zinf_tensor_t's memory is. */
typedef enum zinf_device_kind_t ZINF_ENUM_BASE {
  ZINF_DEVICE_KIND_HOST = 0, /* ordinary host memory */
  ZINF_DEVICE_KIND_CUDA = 1  /* memory of GPU device_index */
} zinf_device_kind_t;

/* A view of memory zinf owns: `numel` elements of `dtype` at `data`, in `device_kind` memory.
 * Fixed layout; reserved fields are zero. */
typedef struct zinf_tensor_t {
  void* data;
  int32_t dtype;       /* zinf_dtype_t */
  int32_t device_kind; /* zinf_device_kind_t */
  int32_t device_index;
  int32_t reserved0;
  uint64_t numel;
  uint64_t reserved[2];
} zinf_tensor_t;

/* ------------------------------------------------------------------------------------------
 * Completions: the outcome of an asynchronous operation (a tiered-store prefetch, a swap-store
 * read or write). */

typedef struct zinf_completion_t zinf_completion_t;

/* Blocks until the operation has finished and returns its code (its message in *errptr). May be
 * called again: it returns the same outcome. */
ZINF_EXPORT zinf_code_t zinf_completion_wait(zinf_completion_t* completion, char** errptr);
/* Does not block. While the operation runs: *done = 0 and ZINF_OK. After: *done = 1 and the
 * operation's code, as zinf_completion_wait. */
ZINF_EXPORT zinf_code_t zinf_completion_poll(zinf_completion_t* completion, int* done,
                                             char** errptr);
/* Waits for the operation to finish (so that its buffers may be reused on return), then
 * releases the handle. */
ZINF_EXPORT void zinf_completion_destroy(zinf_completion_t* completion);

/* ------------------------------------------------------------------------------------------
 * Tiered store (zinf/tiered_store.h): tensors, byte ranges with a home tier, cached in faster
 * tiers and moved ahead of use under a byte budget per tier. */

typedef enum zinf_tier_t ZINF_ENUM_BASE {
  ZINF_TIER_DEVICE = 0,
  ZINF_TIER_HOST = 1,
  ZINF_TIER_NVME = 2
} zinf_tier_t;
typedef enum zinf_access_t ZINF_ENUM_BASE {
  ZINF_ACCESS_READ = 0,
  ZINF_ACCESS_WRITE = 1,
  /* Write access for a caller that overwrites every byte: the current bytes are not read in. */
  ZINF_ACCESS_OVERWRITE = 2
} zinf_access_t;

typedef struct zinf_tiered_store_t zinf_tiered_store_t;

typedef struct zinf_tiered_store_options_t {
  size_t struct_size;
  /* "host" (the CPU as a device, the default), "cuda:N", or NULL or "" for no device tier. */
  const char* device;
  uint64_t device_budget_bytes; /* > 0 with a device; default 0 */
  uint64_t host_budget_bytes;   /* > 0; default 0 */
  /* NVMe tier: swap directories (none by default); the strings are copied. */
  const char* const* nvme_paths;
  size_t nvme_path_count;
  uint64_t nvme_capacity_bytes; /* > 0 with paths */
  uint64_t piece_bytes;         /* largest NVMe I/O piece, a multiple of 4096; default 64 MiB */
  int32_t pin_host;             /* page-lock the host tier; default 1 */
  int32_t numa_node;            /* default -1 (first touch) */
  int32_t nvme_checksum;        /* CRC32C on write, verified on read; default 1 */
  int32_t staging_buffers;      /* default 2 */
  int32_t transfer_threads;     /* default 2 */
  int32_t reserved0;
} zinf_tiered_store_options_t;

ZINF_EXPORT void zinf_tiered_store_options_init(zinf_tiered_store_options_t* options);

typedef struct zinf_link_stats_t {
  uint64_t bytes;
  double busy_seconds; /* wall time with at least one transfer on the link */
} zinf_link_stats_t;

typedef struct zinf_tier_stats_t {
  uint64_t budget_bytes;
  uint64_t in_use_bytes;
  uint64_t peak_bytes;
} zinf_tier_stats_t;

typedef struct zinf_tiered_store_stats_t {
  size_t struct_size; /* set by the caller */
  zinf_link_stats_t host_to_device, device_to_host, host_to_nvme, nvme_to_host;
  zinf_tier_stats_t tiers[3]; /* indexed by zinf_tier_t */
  uint64_t evictions;
  uint64_t write_backs;
} zinf_tiered_store_stats_t;

/* Opens the device, the pools and the swap files. Errors: INVALID_ARGUMENT (options, a
 * missing NVMe path), UNAVAILABLE (no such device), the swap store's errors. */
ZINF_EXPORT zinf_code_t zinf_tiered_store_create(const zinf_tiered_store_options_t* options,
                                                 zinf_tiered_store_t** store, char** errptr);
/* Waits for transfers and frees everything; dirty cached copies are not written back (flush
 * first). Pointers from zinf_tiered_store_acquire are invalid afterwards. */
ZINF_EXPORT void zinf_tiered_store_destroy(zinf_tiered_store_t* store);

/* A tensor of size_bytes (> 0) reading as zeros, whose home is `home`. `name` (copied) appears
 * in error messages. Errors: INVALID_ARGUMENT (size 0, a tier the store lacks),
 * RESOURCE_EXHAUSTED (home tier full). */
ZINF_EXPORT zinf_code_t zinf_tiered_store_create_tensor(zinf_tiered_store_t* store,
                                                        const char* name, uint64_t size_bytes,
                                                        zinf_tier_t home, uint64_t* tensor,
                                                        char** errptr);
/* Frees every copy. FAILED_PRECONDITION while the tensor is acquired or when already freed. */
ZINF_EXPORT zinf_code_t zinf_tiered_store_free_tensor(zinf_tiered_store_t* store, uint64_t tensor,
                                                      char** errptr);
/* Starts making a current copy resident in `tier` (asynchronous). `completion` may be NULL;
 * otherwise it receives a handle whose outcome is the prefetch's (errors as for acquire). */
ZINF_EXPORT zinf_code_t zinf_tiered_store_prefetch(zinf_tiered_store_t* store, uint64_t tensor,
                                                   zinf_tier_t tier, zinf_completion_t** completion,
                                                   char** errptr);
/* Blocks until a current copy is resident in `tier`, pins it there and returns its address in
 * *data (a device pointer for ZINF_TIER_DEVICE; host memory for ZINF_TIER_HOST and for the
 * "host" device), valid until the matching release. Write access is exclusive, read access
 * shared; a thread must not acquire a tensor it holds for writing. Errors: INVALID_ARGUMENT
 * (ZINF_TIER_NVME is not addressable), FAILED_PRECONDITION (freed tensor),
 * RESOURCE_EXHAUSTED (tier full of pinned copies), the I/O error of the transfer. */
ZINF_EXPORT zinf_code_t zinf_tiered_store_acquire(zinf_tiered_store_t* store, uint64_t tensor,
                                                  zinf_tier_t tier, zinf_access_t access,
                                                  void** data, char** errptr);
/* Unpins one acquire of `tier`. FAILED_PRECONDITION when it was not acquired there. */
ZINF_EXPORT zinf_code_t zinf_tiered_store_release(zinf_tiered_store_t* store, uint64_t tensor,
                                                  zinf_tier_t tier, char** errptr);
/* Drops the cached copy in `tier`, writing it home first when it is the only current one.
 * INVALID_ARGUMENT for the home tier; FAILED_PRECONDITION while acquired there. */
ZINF_EXPORT zinf_code_t zinf_tiered_store_evict(zinf_tiered_store_t* store, uint64_t tensor,
                                                zinf_tier_t tier, char** errptr);
/* Evict on a transfer thread: the caller goes on while a write-back runs. `completion` (may
 * be NULL) receives the outcome; a failed write-back leaves the copy in place, as with evict.
 * A copy acquired when the job runs is left to its holders (written home first if only read). */
ZINF_EXPORT zinf_code_t zinf_tiered_store_evict_async(zinf_tiered_store_t* store, uint64_t tensor,
                                                      zinf_tier_t tier,
                                                      zinf_completion_t** completion,
                                                      char** errptr);
/* Writes every cached copy newer than its home back, and waits for prefetches in flight. */
ZINF_EXPORT zinf_code_t zinf_tiered_store_flush(zinf_tiered_store_t* store, char** errptr);
/* Eviction hint: the tensor's next use in the caller's units, smaller is sooner; negative
 * clears it. */
ZINF_EXPORT zinf_code_t zinf_tiered_store_set_next_use(zinf_tiered_store_t* store, uint64_t tensor,
                                                       int64_t next_use, char** errptr);
/* Tiers holding a current copy, as a bit mask: bit (1 << tier). */
ZINF_EXPORT zinf_code_t zinf_tiered_store_resident_tiers(zinf_tiered_store_t* store,
                                                         uint64_t tensor, uint32_t* tier_mask,
                                                         char** errptr);
/* Fills *stats (stats->struct_size set by the caller). */
ZINF_EXPORT zinf_code_t zinf_tiered_store_stats(zinf_tiered_store_t* store,
                                                zinf_tiered_store_stats_t* stats, char** errptr);

/* ------------------------------------------------------------------------------------------
 * Pinned host pool (offload/memory_pool.h): page-locked arenas under a byte budget, carved into
 * blocks rounded only to the alignment. */

typedef struct zinf_pinned_pool_t zinf_pinned_pool_t;

typedef struct zinf_pinned_pool_options_t {
  size_t struct_size;
  uint64_t budget_bytes; /* bytes the pool may hand out (and pin); > 0; default 0 */
  uint64_t arena_bytes;  /* size of each arena; 0 (default): one arena of the budget */
  uint64_t alignment;    /* block alignment, a power of two >= 64; default 4096 */
  const char* name;      /* for messages (copied); NULL: "pinned pool" */
  int32_t preallocate;   /* make every arena at create; default 0 */
  int32_t pinned;        /* page-lock the arenas (0: pageable memory); default 1 */
  int32_t numa_node;     /* default -1 (first touch) */
  int32_t reserved0;
} zinf_pinned_pool_options_t;

ZINF_EXPORT void zinf_pinned_pool_options_init(zinf_pinned_pool_options_t* options);

typedef struct zinf_pool_stats_t {
  size_t struct_size; /* set by the caller */
  uint64_t budget_bytes;
  uint64_t arena_bytes;       /* memory held by arenas */
  uint64_t in_use_bytes;      /* bytes in live blocks */
  uint64_t peak_in_use_bytes; /* since create or zinf_pinned_pool_reset_peak */
  uint64_t free_bytes;
  uint64_t largest_free_bytes;
  uint64_t arenas;
  uint64_t blocks;
  double fragmentation; /* 1 - largest_free / free */
} zinf_pool_stats_t;

/* Errors: INVALID_ARGUMENT for bad options; with preallocate, RESOURCE_EXHAUSTED when memory
 * or pinning (RLIMIT_MEMLOCK) is refused. */
ZINF_EXPORT zinf_code_t zinf_pinned_pool_create(const zinf_pinned_pool_options_t* options,
                                                zinf_pinned_pool_t** pool, char** errptr);
/* Frees the pool and every block still allocated from it. */
ZINF_EXPORT void zinf_pinned_pool_destroy(zinf_pinned_pool_t* pool);
/* A block of size_bytes (> 0), aligned to the pool's alignment, in *data. Errors:
 * INVALID_ARGUMENT for 0, RESOURCE_EXHAUSTED over the budget or when pinning is refused. */
ZINF_EXPORT zinf_code_t zinf_pinned_pool_alloc(zinf_pinned_pool_t* pool, uint64_t size_bytes,
                                               void** data, char** errptr);
/* Returns a block. NULL does nothing; any other pointer that is not a live block of this pool
 * is INVALID_ARGUMENT. */
ZINF_EXPORT zinf_code_t zinf_pinned_pool_free(zinf_pinned_pool_t* pool, void* data, char** errptr);
/* Frees arenas that hold no block; *released_bytes (may be NULL) gets how much. */
ZINF_EXPORT zinf_code_t zinf_pinned_pool_trim(zinf_pinned_pool_t* pool, uint64_t* released_bytes,
                                              char** errptr);
ZINF_EXPORT zinf_code_t zinf_pinned_pool_stats(zinf_pinned_pool_t* pool, zinf_pool_stats_t* stats,
                                               char** errptr);
ZINF_EXPORT zinf_code_t zinf_pinned_pool_reset_peak(zinf_pinned_pool_t* pool, char** errptr);

/* ------------------------------------------------------------------------------------------
 * NVMe swap store (nvme/swap_store.h): preallocated swap files striped over directories;
 * extents written from and read into caller buffers asynchronously, CRC32C-checked. */

typedef struct zinf_swap_store_t zinf_swap_store_t;

typedef struct zinf_swap_store_options_t {
  size_t struct_size;
  const char* const* paths; /* swap directories, each once (copied); at least one */
  size_t path_count;
  uint64_t capacity_bytes; /* swap space across all paths; > 0 */
  uint64_t stripe_bytes;   /* striping unit, a multiple of 4096; 0 (default): aio block_size */
  /* A DeepSpeed "aio" JSON object ({"block_size": 1048576, "queue_depth": 8, ...}, or zinf's
   * keys backend, direct_io, register_buffers); NULL (default): the defaults. */
  const char* aio_json;
  int32_t rank;         /* names the files so that ranks sharing a path do not clash; default 0 */
  int32_t checksum;     /* CRC32C per piece; default 1 */
  int32_t lock_wait_ms; /* how long to wait for a file another store holds; default 5000 */
  int32_t reserved0;
} zinf_swap_store_options_t;

ZINF_EXPORT void zinf_swap_store_options_init(zinf_swap_store_options_t* options);

/* An allocated extent; a plain value. id 0 is "none". */
typedef struct zinf_swap_extent_t {
  uint64_t id;
  uint64_t size_bytes;
} zinf_swap_extent_t;

typedef struct zinf_swap_store_info_t {
  size_t struct_size; /* set by the caller */
  uint64_t capacity_bytes;
  uint64_t free_bytes;
  uint64_t file_bytes; /* each swap file's size */
  uint64_t stripe_bytes;
  uint64_t file_count;
  int32_t direct_io; /* 1: O_DIRECT, 0: through the page cache */
  int32_t reserved0;
} zinf_swap_store_info_t;

/* Checks each path (exists, is a writable directory, has room) and creates the swap files,
 * unlinked at once so that none outlives the process. Errors: INVALID_ARGUMENT (bad options, a
 * missing path, a path that is not a directory), FAILED_PRECONDITION (read-only path),
 * RESOURCE_EXHAUSTED (too little space: the message says how much is needed), UNAVAILABLE,
 * IO_ERROR. */
ZINF_EXPORT zinf_code_t zinf_swap_store_open(const zinf_swap_store_options_t* options,
                                             zinf_swap_store_t** store, char** errptr);
/* Waits for outstanding I/O and closes the swap files. */
ZINF_EXPORT void zinf_swap_store_destroy(zinf_swap_store_t* store);
/* Reserves an extent of size_bytes (> 0) for the tensor `name` (for messages; may be NULL).
 * Errors: the sticky write error, INVALID_ARGUMENT, RESOURCE_EXHAUSTED (no free range). */
ZINF_EXPORT zinf_code_t zinf_swap_store_allocate(zinf_swap_store_t* store, uint64_t size_bytes,
                                                 const char* name, zinf_swap_extent_t* extent,
                                                 char** errptr);
/* Returns an extent's space. INVALID_ARGUMENT for an unknown extent. */
ZINF_EXPORT zinf_code_t zinf_swap_store_free(zinf_swap_store_t* store, zinf_swap_extent_t extent,
                                             char** errptr);
/* Starts writing extent.size_bytes from `src`, which must stay valid and unchanged until the
 * completion is done. The write is done only when every byte is on the device. A page-aligned
 * `src` (e.g. from the pinned pool) goes to disk without a copy. */
ZINF_EXPORT zinf_code_t zinf_swap_store_write_async(zinf_swap_store_t* store,
                                                    zinf_swap_extent_t extent, const void* src,
                                                    zinf_completion_t** completion, char** errptr);
/* Starts reading the extent into `dst` (extent.size_bytes), valid until the completion is
 * done. The outcome is FAILED_PRECONDITION for an extent never written, DATA_LOSS for a failed
 * write or a checksum mismatch. */
ZINF_EXPORT zinf_code_t zinf_swap_store_read_async(zinf_swap_store_t* store,
                                                   zinf_swap_extent_t extent, void* dst,
                                                   zinf_completion_t** completion, char** errptr);
/* Blocking forms. */
ZINF_EXPORT zinf_code_t zinf_swap_store_write(zinf_swap_store_t* store, zinf_swap_extent_t extent,
                                              const void* src, char** errptr);
ZINF_EXPORT zinf_code_t zinf_swap_store_read(zinf_swap_store_t* store, zinf_swap_extent_t extent,
                                             void* dst, char** errptr);
/* Registers a buffer (e.g. a pinned pool block) for fixed-buffer I/O; must not race with I/O. */
ZINF_EXPORT zinf_code_t zinf_swap_store_register_buffer(zinf_swap_store_t* store, void* data,
                                                        uint64_t size_bytes, char** errptr);
/* The sticky write error, or ZINF_OK. */
ZINF_EXPORT zinf_code_t zinf_swap_store_status(zinf_swap_store_t* store, char** errptr);
ZINF_EXPORT zinf_code_t zinf_swap_store_info(zinf_swap_store_t* store, zinf_swap_store_info_t* info,
                                             char** errptr);

/* ------------------------------------------------------------------------------------------
 * CPU optimizers (zinf/cpu_optimizer.h): AdamW, Adam, Adagrad and Lion over flat fp32 buffers,
 * vectorized and threaded, optionally writing a bf16 or fp16 copy of the new parameters.
 * PyTorch's formulas; results are bitwise the same for any thread count. */

typedef enum zinf_optimizer_type_t ZINF_ENUM_BASE {
  ZINF_OPTIMIZER_ADAMW = 0,
  ZINF_OPTIMIZER_ADAM = 1,
  ZINF_OPTIMIZER_ADAGRAD = 2,
  ZINF_OPTIMIZER_LION = 3
} zinf_optimizer_type_t;

typedef enum zinf_cpu_isa_t ZINF_ENUM_BASE {
  ZINF_CPU_ISA_AUTO = 0,
  ZINF_CPU_ISA_SCALAR = 1,
  ZINF_CPU_ISA_AVX2 = 2,
  ZINF_CPU_ISA_AVX512 = 3
} zinf_cpu_isa_t;

typedef enum zinf_store_mode_t ZINF_ENUM_BASE {
  ZINF_STORE_MODE_AUTO = 0,
  ZINF_STORE_MODE_CACHED = 1,
  ZINF_STORE_MODE_NON_TEMPORAL = 2
} zinf_store_mode_t;

/* Whose threads run the kernels: a oneTBB pool of the optimizer's own, or the OpenMP runtime
 * already loaded in the process (the calling thread's team, as the trainer's own OpenMP loops
 * use; oneTBB where the process has none, and for a second after the team held up a call).
 * Notes [Whose threads] and [Held up by the team] in cpu_optim/parallel.h. */
typedef enum zinf_cpu_workers_t ZINF_ENUM_BASE {
  ZINF_CPU_WORKERS_ONETBB = 0,
  ZINF_CPU_WORKERS_PROCESS_OPENMP = 1
} zinf_cpu_workers_t;

typedef struct zinf_cpu_optimizer_t zinf_cpu_optimizer_t;

typedef struct zinf_cpu_optimizer_options_t {
  size_t struct_size;
  int32_t threads;             /* worker threads, the caller included; 0 (default): all CPUs */
  int32_t isa;                 /* zinf_cpu_isa_t; default auto (the best this CPU has) */
  int32_t store_mode;          /* zinf_store_mode_t; default auto */
  int32_t workers;             /* zinf_cpu_workers_t; default onetbb */
  uint64_t nt_store_min_bytes; /* auto's threshold; 0 (default): the L3 size */
  uint64_t prefetch_bytes;     /* software prefetch distance; default 1024; 0 disables */
} zinf_cpu_optimizer_options_t;

ZINF_EXPORT void zinf_cpu_optimizer_options_init(zinf_cpu_optimizer_options_t* options);

/* Hyper-parameters of a parameter group. zinf_hyper_params_init gives torch's defaults for the
 * type (Lion: lr 1e-4, betas 0.9 and 0.99). */
typedef struct zinf_hyper_params_t {
  size_t struct_size;
  int32_t type;            /* zinf_optimizer_type_t */
  int32_t bias_correction; /* Adam, AdamW; default 1 */
  double lr;
  double beta1, beta2;              /* Adam, AdamW, Lion */
  double eps;                       /* Adam, AdamW, Adagrad */
  double weight_decay;              /* decoupled for AdamW and Lion, L2 for Adam and Adagrad */
  double lr_decay;                  /* Adagrad */
  double initial_accumulator_value; /* Adagrad */
} zinf_hyper_params_t;

ZINF_EXPORT void zinf_hyper_params_init(zinf_hyper_params_t* params, zinf_optimizer_type_t type);

/* One shard, or a contiguous chunk of one; the arrays are the caller's. */
typedef struct zinf_optimizer_span_t {
  size_t struct_size;
  float* params;     /* fp32 master parameters, updated in place */
  const void* grads; /* `count` elements of grad_type; only read */
  float* state0;     /* exp_avg (Adam, AdamW, Lion) or sum (Adagrad) */
  float* state1;     /* exp_avg_sq (Adam, AdamW); must be NULL otherwise */
  void* param_copy;  /* optional: receives the new parameters in param_copy_type */
  uint64_t count;
  int32_t grad_type;       /* zinf_dtype_t; default fp32 */
  int32_t param_copy_type; /* ZINF_DTYPE_BF16 (default) or ZINF_DTYPE_FP16 */
} zinf_optimizer_span_t;

ZINF_EXPORT void zinf_optimizer_span_init(zinf_optimizer_span_t* span);

typedef struct zinf_optimizer_step_result_t {
  size_t struct_size; /* set by the caller */
  int64_t step;       /* the group's step count after the call */
  int32_t skipped;    /* 1 when check_finite found a non-finite gradient: nothing changed */
  int32_t finite;     /* with check_finite: whether every gradient was finite */
  double sum_squares; /* with check_finite: the gradients' sum of squares */
} zinf_optimizer_step_result_t;

/* Errors: INVALID_ARGUMENT for bad options, UNAVAILABLE for a forced ISA this CPU lacks. */
ZINF_EXPORT zinf_code_t zinf_cpu_optimizer_create(const zinf_cpu_optimizer_options_t* options,
                                                  zinf_cpu_optimizer_t** optimizer, char** errptr);
ZINF_EXPORT void zinf_cpu_optimizer_destroy(zinf_cpu_optimizer_t* optimizer);
/* The kernel in use ("scalar", "avx2", "avx512"; a static string) and the thread count. */
ZINF_EXPORT zinf_code_t zinf_cpu_optimizer_info(zinf_cpu_optimizer_t* optimizer, const char** isa,
                                                int* threads, char** errptr);
/* Adds a group with step 0; its index in *group. INVALID_ARGUMENT for bad hyper-parameters. */
ZINF_EXPORT zinf_code_t zinf_cpu_optimizer_add_param_group(zinf_cpu_optimizer_t* optimizer,
                                                           const zinf_hyper_params_t* params,
                                                           int* group, char** errptr);
/* Changes a group's hyper-parameters (a learning-rate schedule); the type must stay. */
ZINF_EXPORT zinf_code_t zinf_cpu_optimizer_set_hyper_params(zinf_cpu_optimizer_t* optimizer,
                                                            int group,
                                                            const zinf_hyper_params_t* params,
                                                            char** errptr);
/* A group's hyper-parameters (params->struct_size set by the caller; may be NULL) and step
 * count (may be NULL). */
ZINF_EXPORT zinf_code_t zinf_cpu_optimizer_get_group(zinf_cpu_optimizer_t* optimizer, int group,
                                                     zinf_hyper_params_t* params, int64_t* step,
                                                     char** errptr);
ZINF_EXPORT zinf_code_t zinf_cpu_optimizer_set_step(zinf_cpu_optimizer_t* optimizer, int group,
                                                    int64_t step, char** errptr);
/* Fills the span's state arrays with their initial values, on the optimizer's threads. */
ZINF_EXPORT zinf_code_t zinf_cpu_optimizer_init_state(zinf_cpu_optimizer_t* optimizer, int group,
                                                      const zinf_optimizer_span_t* span,
                                                      char** errptr);
/* Advances the group's step and updates the span, gradients multiplied by grad_scale
 * (1/loss_scale times the clip coefficient). With check_finite, a non-finite gradient leaves
 * everything untouched and result->skipped = 1. `result` may be NULL. Synchronous. */
ZINF_EXPORT zinf_code_t zinf_cpu_optimizer_step(zinf_cpu_optimizer_t* optimizer, int group,
                                                const zinf_optimizer_span_t* span, float grad_scale,
                                                int check_finite,
                                                zinf_optimizer_step_result_t* result,
                                                char** errptr);
/* Chunked stepping (state streamed from disk): begin_step once per step (the new step number
 * in *step, may be NULL), then update each chunk, from any one thread at a time or
 * concurrently on disjoint chunks. */
ZINF_EXPORT zinf_code_t zinf_cpu_optimizer_begin_step(zinf_cpu_optimizer_t* optimizer, int group,
                                                      int64_t* step, char** errptr);
ZINF_EXPORT zinf_code_t zinf_cpu_optimizer_update(zinf_cpu_optimizer_t* optimizer, int group,
                                                  const zinf_optimizer_span_t* chunk,
                                                  float grad_scale, char** errptr);
/* Sum of squares and finiteness of `count` gradients of `dtype`; deterministic. */
ZINF_EXPORT zinf_code_t zinf_cpu_optimizer_grad_stats(zinf_cpu_optimizer_t* optimizer,
                                                      const void* grads, zinf_dtype_t dtype,
                                                      uint64_t count, double* sum_squares,
                                                      int* finite, char** errptr);
/* The groups' hyper-parameters and step counts in a versioned binary form: *data is
 * malloc()ed (free with zinf_free), *size its length. The state arrays are the caller's. */
ZINF_EXPORT zinf_code_t zinf_cpu_optimizer_save_state(zinf_cpu_optimizer_t* optimizer, char** data,
                                                      size_t* size, char** errptr);
/* Replaces all groups. DATA_LOSS for a truncated or corrupt blob. */
ZINF_EXPORT zinf_code_t zinf_cpu_optimizer_load_state(zinf_cpu_optimizer_t* optimizer,
                                                      const char* data, size_t size, char** errptr);
/* `count` fp32 values into dtype (round to nearest even) and back; fp32 copies. */
ZINF_EXPORT zinf_code_t zinf_convert_from_fp32(const float* src, zinf_dtype_t dtype, void* dst,
                                               uint64_t count, char** errptr);
ZINF_EXPORT zinf_code_t zinf_convert_to_fp32(const void* src, zinf_dtype_t dtype, float* dst,
                                             uint64_t count, char** errptr);

/* ------------------------------------------------------------------------------------------
 * ZeRO engine (zinf/engine.h): parameters, gradients and optimizer state sharded over the
 * data-parallel ranks and placed in memory or on NVMe as a DeepSpeed config says. Every rank
 * makes the same calls in the same order. A trainer's loop:
 *
 *   zinf_engine_create(config_json, NULL, &engine, &err);
 *   zinf_engine_register_module(engine, "fc1", specs, 2, &fc1, &err);  ... for each module
 *   zinf_engine_initialize(engine, &err);
 *   for each step, for each micro-batch:
 *     forward:  zinf_engine_fetch(engine, fc1, params, 2, &n, &err); ... use params[i].data ...
 *               zinf_engine_release(engine, fc1, &err);
 *     backward: zinf_engine_fetch(...); zinf_engine_gradients(engine, fc1, grads, 2, &n, &err);
 *               write grads[i] (of the loss times the loss scale);
 *               zinf_engine_reduce_gradients(engine, fc1, &err); zinf_engine_release(...);
 *   zinf_engine_step(engine, &summary, &err); */

typedef struct zinf_engine_t zinf_engine_t;

typedef enum zinf_param_init_t ZINF_ENUM_BASE {
  ZINF_PARAM_INIT_NORMAL = 0, /* N(0, init_std^2), a function of (seed, name, index) */
  ZINF_PARAM_INIT_ZEROS = 1,
  ZINF_PARAM_INIT_ONES = 2
} zinf_param_init_t;

/* What the trainer knows for the keys a config leaves as "auto" (zinf::TrainerValues, as
 * Hugging Face's Trainer fills them): a value here fills an "auto" key, and one that differs
 * from a number the config spells out is INVALID_ARGUMENT naming both (total_num_steps only
 * fills "auto"). Fields left at zinf_trainer_values_init's "not given" (-1, NaN) do nothing;
 * an "auto" without a value keeps its key's default, with a warning naming it. */
typedef struct zinf_trainer_values_t {
  size_t struct_size;
  int32_t micro_batch_size;            /* train_micro_batch_size_per_gpu; -1: not given */
  int32_t gradient_accumulation_steps; /* -1: not given */
  int64_t total_num_steps;             /* scheduler.params.total_num_steps; -1: not given */
  int64_t warmup_num_steps;            /* scheduler.params.warmup_num_steps; -1: not given */
  int64_t hidden_size;                 /* the model's, for the "auto" bucket sizes; -1 */
  double gradient_clipping;            /* NaN: not given (also for the doubles below) */
  double lr;                           /* optimizer.params.lr, scheduler warmup_max_lr */
  double beta1, beta2, eps, weight_decay;
  int32_t fp16, bf16; /* fp16.enabled, bf16.enabled: 0 or 1; -1: not given */
} zinf_trainer_values_t;

ZINF_EXPORT void zinf_trainer_values_init(zinf_trainer_values_t* values);

typedef struct zinf_engine_options_t {
  size_t struct_size;
  int32_t rank;       /* -1 (default): from RANK */
  int32_t world_size; /* -1 (default): from WORLD_SIZE; a single process when both are unset */
  /* NULL or "" (default): MASTER_ADDR, else 127.0.0.1. A non-loopback address needs the
   * secret in ZINF_STORE_SECRET (`zinf run` sets it). */
  const char* master_addr;
  int32_t master_port;       /* 0 (default): ZINF_MASTER_PORT, else MASTER_PORT + 1 (MASTER_PORT is
                              * torch.distributed's), else 29501 */
  int32_t optimizer_threads; /* CPU optimizer threads; 0 (default): all CPUs */
  int64_t timeout_ms;        /* a collective without progress this long fails; default 300000 */
  /* The global ranks of this rank's data-parallel group (NULL, default: all ranks). */
  const int32_t* data_parallel_ranks;
  size_t data_parallel_rank_count;
  /* Added after the first version: the trainer's values for "auto" (NULL, default: none). */
  const zinf_trainer_values_t* trainer;
} zinf_engine_options_t;

ZINF_EXPORT void zinf_engine_options_init(zinf_engine_options_t* options);

/* One parameter of a module. An array of them is read with the stride of its first element's
 * struct_size, which every element must share. */
typedef struct zinf_param_spec_t {
  size_t struct_size;
  const char* name;     /* unique over the engine (copied) */
  const int64_t* shape; /* ndim positive dimensions */
  size_t ndim;
  int32_t init;   /* zinf_param_init_t; default normal */
  float init_std; /* default 0.02 */
  /* Added after the first version: the optimizer parameter group the parameter steps in; 0
   * (default) is the config's "optimizer", others come from zinf_engine_add_param_group. */
  int32_t optimizer_group;
  /* Added after optimizer_group: 0 for a frozen parameter, sharded and fetched as the others
   * but with no master, gradient or optimizer state (zinf_engine_gradients gives it a NULL
   * buffer); default 1. */
  int32_t trainable;
} zinf_param_spec_t;

ZINF_EXPORT void zinf_param_spec_init(zinf_param_spec_t* spec);

typedef struct zinf_engine_info_t {
  size_t struct_size; /* set by the caller */
  int32_t rank;       /* within the data-parallel group */
  int32_t world_size;
  int32_t local_rank; /* LOCAL_RANK: e.g. the GPU this rank should use */
  int32_t zero_stage;
  int32_t micro_batch_size;
  int32_t gradient_accumulation_steps;
  double loss_scale;    /* what the trainer multiplies its loss by before backward */
  double learning_rate; /* what the next step applies */
  /* Added after the first version: micro_batch_size x gradient_accumulation_steps x
   * world_size, as the engine resolved the config's batch keys. */
  int64_t train_batch_size;
  /* Added after train_batch_size: 1 where a module's fetched tensors are its parameters' own
   * memory for the engine's life (Engine::parameters_resident in zinf/engine.h): a trainer
   * may fetch each module once and keep its tensors. */
  int32_t parameters_resident;
  int32_t reserved1;
} zinf_engine_info_t;

typedef struct zinf_step_summary_t {
  size_t struct_size; /* set by the caller */
  int64_t step;       /* optimizer steps taken (skipped ones not counted) */
  int32_t skipped;    /* fp16 overflow: nothing was updated */
  int32_t reserved0;
  double grad_norm; /* global L2 norm of the mean gradient, before clipping */
  double loss_scale;
  double clip_coefficient;
  uint64_t bytes_gathered;
  uint64_t bytes_reduce_scattered;
  uint64_t bytes_nvme_read;
  uint64_t bytes_nvme_written;
  uint64_t peak_live_parameters;
  double seconds_gather, seconds_reduce, seconds_optimizer, seconds_optimizer_compute;
  uint64_t host_bytes;
  uint64_t nvme_bytes;
  /* Added after the first version: the learning rate this step applied, and when it finished
   * (seconds since the Unix epoch). */
  double learning_rate;
  double unix_time_s;
  /* Added later still (a struct_size ending at unix_time_s is still taken): the host's work
   * around the compute device since the last step, counted per call, as StepSummary's fields
   * of the same names in zinf/engine.h: blocking waits on the threads that call the engine
   * and on zinf's own; copies device to host (down), host to device (up), device to device
   * and host to host through the device, with their bytes; device memory zeroed; host memory
   * the CPU zeroed and copied in the engine's passes. */
  uint64_t host_waits, worker_waits;
  uint64_t copies_down, bytes_down, copies_up, bytes_up;
  uint64_t copies_on_device, bytes_on_device, copies_host, bytes_host;
  uint64_t device_bytes_set, host_bytes_set, host_bytes_copied;
  /* Added later again: the device tier's budget, and the most it held at once since the
   * engine started (StepSummary's fields of the same names). */
  uint64_t device_budget_bytes, device_peak_bytes;
} zinf_step_summary_t;

/* An engine from a DeepSpeed JSON config (the text; "auto" values from options->trainer, else
 * their defaults) and
 * where this process sits (`options` may be NULL: the environment decides). Joins the other
 * ranks. Errors: INVALID_ARGUMENT naming the config key, DEADLINE_EXCEEDED or UNAVAILABLE for
 * a rendezvous that fails. */
ZINF_EXPORT zinf_code_t zinf_engine_create(const char* config_json,
                                           const zinf_engine_options_t* options,
                                           zinf_engine_t** engine, char** errptr);
ZINF_EXPORT void zinf_engine_destroy(zinf_engine_t* engine);
/* Registers a module before initialize; its id in *module. INVALID_ARGUMENT for empty or
 * duplicate names and non-positive dimensions. */
ZINF_EXPORT zinf_code_t zinf_engine_register_module(zinf_engine_t* engine, const char* name,
                                                    const zinf_param_spec_t* params,
                                                    size_t param_count, int* module, char** errptr);
/* Partitions every parameter and creates this rank's shards and optimizer state; checks that
 * all ranks registered the same modules (FAILED_PRECONDITION naming the difference). */
ZINF_EXPORT zinf_code_t zinf_engine_initialize(zinf_engine_t* engine, char** errptr);
/* The number of parameters of a module (what fetch and gradients fill). */
ZINF_EXPORT zinf_code_t zinf_engine_module_param_count(zinf_engine_t* engine, int module,
                                                       size_t* count, char** errptr);
/* Gathers a module's full parameters into params[0 .. *count) (capacity entries available;
 * fewer than the module has is INVALID_ARGUMENT saying how many). Each is a tensor in the
 * engine's memory, valid until release: today fp32 host memory (compute-precision values
 * widened to fp32); a later release may hand out 16-bit device tensors, which dtype and
 * device_kind then say. */
ZINF_EXPORT zinf_code_t zinf_engine_fetch(zinf_engine_t* engine, int module, zinf_tensor_t* params,
                                          size_t capacity, size_t* count, char** errptr);
ZINF_EXPORT zinf_code_t zinf_engine_release(zinf_engine_t* engine, int module, char** errptr);
/* Zeroed full-size gradient buffers of a fetched module, to be written by backward (fp32 host
 * memory, of the loss times the loss scale), valid until reduce_gradients. A frozen
 * parameter's (zinf_param_spec_t.trainable 0) has data NULL. */
ZINF_EXPORT zinf_code_t zinf_engine_gradients(zinf_engine_t* engine, int module,
                                              zinf_tensor_t* grads, size_t capacity, size_t* count,
                                              char** errptr);
/* Queues the module's gradients for reduce-scattering into this rank's accumulators and frees
 * the buffers: once per micro-batch, or once per batch with every micro-batch's gradients
 * summed in the buffers when the config sets "zinf": {"layer_major": true} (Note [Layer-major
 * micro-batches] in src/zero/engine.cc). FAILED_PRECONDITION without zinf_engine_gradients
 * first. */
ZINF_EXPORT zinf_code_t zinf_engine_reduce_gradients(zinf_engine_t* engine, int module,
                                                     char** errptr);
/* Ends a global batch: after gradient_accumulation_steps micro-batches, updates the
 * parameters. `summary` may be NULL. */
ZINF_EXPORT zinf_code_t zinf_engine_step(zinf_engine_t* engine, zinf_step_summary_t* summary,
                                         char** errptr);
ZINF_EXPORT zinf_code_t zinf_engine_info(zinf_engine_t* engine, zinf_engine_info_t* info,
                                         char** errptr);
/* Sets the learning rate of the following steps. INVALID_ARGUMENT for a negative or
 * non-finite lr; FAILED_PRECONDITION when the config has a scheduler. */
ZINF_EXPORT zinf_code_t zinf_engine_set_learning_rate(zinf_engine_t* engine, double lr,
                                                      char** errptr);
/* Optimizer parameter groups (torch's param_groups; zinf::Engine::AddParamGroup). add: before
 * initialize, a group with its own hyper-parameters (lr, weight_decay, betas, eps...; type the
 * config's optimizer's, else INVALID_ARGUMENT); its index in *group (1, 2, ...; group 0 is the
 * config's "optimizer"), which zinf_param_spec_t.optimizer_group names. The config's scheduler
 * sets every group's lr; zinf_engine_set_learning_rate sets every group's, set_group_learning_rate
 * one group's (INVALID_ARGUMENT for a bad index, FAILED_PRECONDITION with a scheduler).
 * get_param_group: a group's hyper-parameters as the next step applies them (params->struct_size
 * set by the caller). */
ZINF_EXPORT zinf_code_t zinf_engine_add_param_group(zinf_engine_t* engine,
                                                    const zinf_hyper_params_t* params, int* group,
                                                    char** errptr);
ZINF_EXPORT zinf_code_t zinf_engine_param_group_count(zinf_engine_t* engine, int* count,
                                                      char** errptr);
ZINF_EXPORT zinf_code_t zinf_engine_get_param_group(zinf_engine_t* engine, int group,
                                                    zinf_hyper_params_t* params, char** errptr);
ZINF_EXPORT zinf_code_t zinf_engine_set_group_learning_rate(zinf_engine_t* engine, int group,
                                                            double lr, char** errptr);
/* The mean of `value` over all ranks (a collective). */
ZINF_EXPORT zinf_code_t zinf_engine_mean_over_ranks(zinf_engine_t* engine, double value,
                                                    double* mean, char** errptr);
/* The element count of a registered parameter. INVALID_ARGUMENT for an unknown name. */
ZINF_EXPORT zinf_code_t zinf_engine_param_numel(zinf_engine_t* engine, const char* name,
                                                uint64_t* numel, char** errptr);
/* The full fp32 master value of a parameter into out[0 .. numel) (a collective; capacity must
 * hold numel elements). */
ZINF_EXPORT zinf_code_t zinf_engine_gather_parameter(zinf_engine_t* engine, const char* name,
                                                     float* out, uint64_t capacity, char** errptr);
/* Replaces a parameter's value (`count` = its numel elements, the same on every rank). */
ZINF_EXPORT zinf_code_t zinf_engine_set_parameter(zinf_engine_t* engine, const char* name,
                                                  const float* values, uint64_t count,
                                                  char** errptr);
/* Replaces every parameter's value with the tensor of its name in the safetensors file `path`
 * (F32, BF16 or F16; a collective: every rank reads the file). Checked before anything is
 * replaced: INVALID_ARGUMENT naming the tensor for a parameter without one, a shape that
 * differs, a tensor that is not a parameter or a dtype zinf does not read; DATA_LOSS for a
 * truncated or corrupt file. Optimizer state and step counts are kept. */
ZINF_EXPORT zinf_code_t zinf_engine_load_safetensors(zinf_engine_t* engine, const char* path,
                                                     char** errptr);
/* The gradient the next step would apply (mean over ranks and micro-batches, loss scale
 * removed) into out[0 .. numel) (a collective, after the batch's last reduce_gradients). */
ZINF_EXPORT zinf_code_t zinf_engine_gather_gradient(zinf_engine_t* engine, const char* name,
                                                    float* out, uint64_t capacity, char** errptr);
/* This rank's shard of a parameter: elements [*offset, *offset + *size) of the flattened
 * parameter. */
ZINF_EXPORT zinf_code_t zinf_engine_shard(zinf_engine_t* engine, const char* name, uint64_t* offset,
                                          uint64_t* size, char** errptr);
/* Module buffers (BatchNorm's running statistics...): replicated, each rank its own values
 * (zinf::Engine::SetBuffer). set_buffer records this rank's current value of `name` (copied;
 * dtype a safetensors name: "F32", "F64", "F16", "BF16", "I64", "I32", "I16", "I8", "U8",
 * "BOOL"; shape of ndim dimensions; bytes its size); checkpoints carry rank 0's, load restores
 * them on every rank and `zinf ckpt export` writes them. get_buffer copies the value back into
 * out (bytes must be its size). INVALID_ARGUMENT naming the buffer for a bad dtype, shape or
 * size, or an unknown name. */
ZINF_EXPORT zinf_code_t zinf_engine_set_buffer(zinf_engine_t* engine, const char* name,
                                               const char* dtype, const int64_t* shape, size_t ndim,
                                               const void* data, uint64_t bytes, char** errptr);
ZINF_EXPORT zinf_code_t zinf_engine_get_buffer(zinf_engine_t* engine, const char* name, void* out,
                                               uint64_t bytes, char** errptr);
/* A JSON object describing the model that later checkpoints carry and `zinf ckpt export --hf`
 * reads ("hf_config": a Hugging Face config.json's object); load_checkpoint replaces it with
 * the checkpoint's (zinf::Engine::SetCheckpointMetadata). INVALID_ARGUMENT for text that is
 * not a JSON object. */
ZINF_EXPORT zinf_code_t zinf_engine_set_checkpoint_metadata(zinf_engine_t* engine,
                                                            const char* json_object, char** errptr);
/* Saves what resuming needs into dir/tag/ and points dir/latest at it (a collective, between
 * steps). client_state: a JSON object of the trainer's, or NULL for {}. A crash at any moment
 * leaves the previous checkpoint loadable. */
ZINF_EXPORT zinf_code_t zinf_engine_save_checkpoint(zinf_engine_t* engine, const char* dir,
                                                    const char* tag, const char* client_state,
                                                    char** errptr);
/* Restores dir/latest (or dir, a tag directory); *client_state (may be NULL) receives the
 * saved client state, malloc()ed. DATA_LOSS for a missing or corrupt file, FAILED_PRECONDITION
 * for a different model, world size or optimizer; the engine is then unchanged. */
ZINF_EXPORT zinf_code_t zinf_engine_load_checkpoint(zinf_engine_t* engine, const char* dir,
                                                    char** client_state, char** errptr);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZINF_C_API_H_ */
