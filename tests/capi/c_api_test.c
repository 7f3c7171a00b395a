/* The C ABI (include/zinf/c_api.h), compiled as C and linked against libzinf.so: each area
 * (pinned pool, swap store, tiered store, CPU optimizers, engine) used as a C program would,
 * and the conventions every function keeps: codes and messages through errptr, struct_size
 * checks, NULL arguments named, destroyed and foreign handles refused without a crash.
 *
 * A plain C program (no test framework: GoogleTest is C++); it prints each failed check and
 * exits non-zero when any failed. Scratch files go under $TMPDIR (default /tmp). */
#define _GNU_SOURCE /* mkdtemp, nftw */

#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zinf/c_api.h"

static int g_failures = 0;
static int g_checks = 0;
/* The error message of the last failed zinf call (zinf frees and replaces it on failure). */
static char* err = NULL;

static void ClearErr(void) {
  zinf_free(err);
  err = NULL;
}

#define CHECK(cond)                                                            \
  do {                                                                         \
    ++g_checks;                                                                \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                            \
    }                                                                          \
  } while (0)

/* Runs `call`, which passes &err, and checks its code. */
#define EXPECT_CODE(expected, call)                                                                \
  do {                                                                                             \
    zinf_code_t got_ = (call);                                                                     \
    ++g_checks;                                                                                    \
    if (got_ != (expected)) {                                                                      \
      fprintf(stderr, "%s:%d: %s\n  returned %s, expected %s (message: %s)\n", __FILE__, __LINE__, \
              #call, zinf_code_name(got_), zinf_code_name(expected), err != NULL ? err : "none");  \
      ++g_failures;                                                                                \
    }                                                                                              \
  } while (0)
#define EXPECT_OK(call) EXPECT_CODE(ZINF_OK, call)

/* Like EXPECT_OK, but leaves the current test function on failure (later steps need it). */
#define REQUIRE_OK(call)                                                                       \
  do {                                                                                         \
    zinf_code_t got_ = (call);                                                                 \
    ++g_checks;                                                                                \
    if (got_ != ZINF_OK) {                                                                     \
      fprintf(stderr, "%s:%d: %s\n  returned %s (message: %s); skipping the rest\n", __FILE__, \
              __LINE__, #call, zinf_code_name(got_), err != NULL ? err : "none");              \
      ++g_failures;                                                                            \
      return;                                                                                  \
    }                                                                                          \
  } while (0)

/* The last error message contains `text`. */
#define EXPECT_ERR_HAS(text)                                                                     \
  do {                                                                                           \
    ++g_checks;                                                                                  \
    if (err == NULL || strstr(err, (text)) == NULL) {                                            \
      fprintf(stderr, "%s:%d: expected an error message containing \"%s\", got: %s\n", __FILE__, \
              __LINE__, (text), err != NULL ? err : "none");                                     \
      ++g_failures;                                                                              \
    }                                                                                            \
  } while (0)

/* ---- Scratch directories ---- */

static int RemoveEntry(const char* path, const struct stat* st, int flag, struct FTW* ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void MakeScratchDir(char* out, size_t size) {
  const char* tmp = getenv("TMPDIR");
  snprintf(out, size, "%s/zinf-capi-test-XXXXXX", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
  if (mkdtemp(out) == NULL) {
    perror("mkdtemp");
    exit(2);
  }
}

static void RemoveScratchDir(const char* path) {
  nftw(path, RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- Common ---- */

static void TestCommon(void) {
  CHECK(strcmp(zinf_code_name(ZINF_OK), "OK") == 0);
  CHECK(strcmp(zinf_code_name(ZINF_DATA_LOSS), "DataLoss") == 0);
  CHECK(strcmp(zinf_code_name(1234), "Unknown") == 0);
  CHECK(zinf_c_api_version() == ZINF_C_API_VERSION);
  CHECK(zinf_version() != NULL && strchr(zinf_version(), '.') != NULL);
  zinf_free(NULL);

  /* errptr: the old message is freed and replaced (a leak checker sees it), NULL is allowed,
   * and a success leaves it alone. */
  zinf_pinned_pool_t* pool = NULL;
  err = malloc(8);
  strcpy(err, "stale");
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_pinned_pool_create(NULL, &pool, &err));
  EXPECT_ERR_HAS("zinf_pinned_pool_create: InvalidArgument: options is NULL");
  CHECK(pool == NULL);
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_pinned_pool_create(NULL, &pool, NULL));
  zinf_pinned_pool_options_t o;
  zinf_pinned_pool_options_init(&o);
  o.budget_bytes = 1 << 20;
  o.pinned = 0;
  EXPECT_OK(zinf_pinned_pool_create(&o, &pool, &err));
  EXPECT_ERR_HAS("options is NULL"); /* untouched by the success */
  zinf_pinned_pool_destroy(pool);
  ClearErr();
}

/* ---- Handles and versioned structs ---- */

static void TestHandlesAndStructs(void) {
  zinf_pinned_pool_options_t o;
  zinf_pinned_pool_options_init(&o);
  CHECK(o.struct_size == sizeof(o));
  CHECK(o.alignment == 4096 && o.pinned == 1 && o.numa_node == -1);
  o.budget_bytes = 1 << 20;
  o.pinned = 0;
  zinf_pinned_pool_t* pool = NULL;

  /* A struct_size that is not this struct's: zero, too small, garbage. */
  size_t sizes[] = {0, 4, sizeof(o) - 8, (size_t)1 << 40};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
    o.struct_size = sizes[i];
    EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_pinned_pool_create(&o, &pool, &err));
    EXPECT_ERR_HAS("options->struct_size");
    EXPECT_ERR_HAS("zinf_pinned_pool_options_init");
    CHECK(pool == NULL);
  }
  /* A larger struct from a newer header: fine while the fields this library lacks are zero. */
  struct {
    zinf_pinned_pool_options_t options;
    unsigned char newer_fields[24];
  } newer;
  memset(&newer, 0, sizeof(newer));
  zinf_pinned_pool_options_init(&newer.options);
  newer.options.struct_size = sizeof(newer);
  newer.options.budget_bytes = 1 << 20;
  newer.options.pinned = 0;
  EXPECT_OK(zinf_pinned_pool_create(&newer.options, &pool, &err));
  zinf_pinned_pool_destroy(pool);
  newer.newer_fields[5] = 1;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_pinned_pool_create(&newer.options, &pool, &err));
  EXPECT_ERR_HAS("does not know");

  /* Output structs: the caller's struct_size is checked too. */
  o.struct_size = sizeof(o);
  REQUIRE_OK(zinf_pinned_pool_create(&o, &pool, &err));
  zinf_pool_stats_t stats;
  memset(&stats, 0, sizeof(stats));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_pinned_pool_stats(pool, &stats, &err));
  EXPECT_ERR_HAS("stats->struct_size is 0");
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_pinned_pool_stats(pool, NULL, &err));
  EXPECT_ERR_HAS("stats is NULL");

  /* Handles: NULL, destroyed, of another kind, never a handle. None may crash. */
  void* block = NULL;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_pinned_pool_alloc(NULL, 64, &block, &err));
  EXPECT_ERR_HAS("zinf_pinned_pool_alloc: InvalidArgument: pool is NULL");
  zinf_pinned_pool_destroy(pool);
  EXPECT_CODE(ZINF_FAILED_PRECONDITION, zinf_pinned_pool_alloc(pool, 64, &block, &err));
  EXPECT_ERR_HAS("pool is a destroyed handle");
  EXPECT_CODE(ZINF_FAILED_PRECONDITION, zinf_pinned_pool_stats(pool, &stats, &err));
  zinf_pinned_pool_destroy(pool); /* twice: ignored */
  zinf_pinned_pool_destroy(NULL);
  /* A new pool does not revive the old handle, whatever its address. */
  zinf_pinned_pool_t* pool2 = NULL;
  REQUIRE_OK(zinf_pinned_pool_create(&o, &pool2, &err));
  CHECK(pool2 != pool);
  EXPECT_CODE(ZINF_FAILED_PRECONDITION, zinf_pinned_pool_alloc(pool, 64, &block, &err));

  zinf_cpu_optimizer_options_t oo;
  zinf_cpu_optimizer_options_init(&oo);
  oo.threads = 1;
  zinf_cpu_optimizer_t* optimizer = NULL;
  REQUIRE_OK(zinf_cpu_optimizer_create(&oo, &optimizer, &err));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT,
              zinf_pinned_pool_alloc((zinf_pinned_pool_t*)optimizer, 64, &block, &err));
  EXPECT_ERR_HAS("pool is a zinf_cpu_optimizer_t, expected a zinf_pinned_pool_t");
  int local = 0;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT,
              zinf_pinned_pool_alloc((zinf_pinned_pool_t*)&local, 64, &block, &err));
  EXPECT_ERR_HAS("pool is not a zinf handle");
  zinf_cpu_optimizer_destroy(optimizer);
  zinf_pinned_pool_destroy(pool2);
  ClearErr();
}

/* ---- Pinned pool ---- */

static void TestPinnedPool(void) {
  zinf_pinned_pool_options_t o;
  zinf_pinned_pool_options_init(&o);
  o.budget_bytes = 1 << 20;
  o.pinned = 0;
  o.name = "c test pool";
  zinf_pinned_pool_t* pool = NULL;
  REQUIRE_OK(zinf_pinned_pool_create(&o, &pool, &err));

  void* a = NULL;
  void* b = NULL;
  REQUIRE_OK(zinf_pinned_pool_alloc(pool, 100000, &a, &err));
  REQUIRE_OK(zinf_pinned_pool_alloc(pool, 5000, &b, &err));
  CHECK(a != NULL && b != NULL && a != b);
  CHECK((uintptr_t)a % 4096 == 0 && (uintptr_t)b % 4096 == 0);
  memset(a, 0xab, 100000);
  memset(b, 0xcd, 5000);
  CHECK(((unsigned char*)a)[99999] == 0xab);

  zinf_pool_stats_t stats;
  stats.struct_size = sizeof(stats);
  EXPECT_OK(zinf_pinned_pool_stats(pool, &stats, &err));
  CHECK(stats.budget_bytes == 1 << 20);
  CHECK(stats.blocks == 2);
  CHECK(stats.in_use_bytes == 102400 + 8192); /* rounded to the alignment */

  void* c = NULL;
  EXPECT_CODE(ZINF_RESOURCE_EXHAUSTED, zinf_pinned_pool_alloc(pool, 1 << 20, &c, &err));
  EXPECT_ERR_HAS("c test pool");
  CHECK(c == NULL);
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_pinned_pool_alloc(pool, 0, &c, &err));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_pinned_pool_alloc(pool, 64, NULL, &err));
  EXPECT_ERR_HAS("data is NULL");

  EXPECT_OK(zinf_pinned_pool_free(pool, a, &err));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_pinned_pool_free(pool, a, &err)); /* twice */
  EXPECT_ERR_HAS("is not a live block of c test pool");
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_pinned_pool_free(pool, (char*)b + 1, &err));
  EXPECT_OK(zinf_pinned_pool_free(pool, NULL, &err));
  EXPECT_OK(zinf_pinned_pool_free(pool, b, &err));
  EXPECT_OK(zinf_pinned_pool_stats(pool, &stats, &err));
  CHECK(stats.blocks == 0 && stats.in_use_bytes == 0);
  CHECK(stats.peak_in_use_bytes == 102400 + 8192);
  EXPECT_OK(zinf_pinned_pool_reset_peak(pool, &err));
  uint64_t released = 0;
  EXPECT_OK(zinf_pinned_pool_trim(pool, &released, &err));
  EXPECT_OK(zinf_pinned_pool_stats(pool, &stats, &err));
  CHECK(stats.arenas == 0 && stats.peak_in_use_bytes == 0);

  /* Destroying the pool frees what is still allocated. */
  REQUIRE_OK(zinf_pinned_pool_alloc(pool, 4096, &a, &err));
  zinf_pinned_pool_destroy(pool);

  /* Page-locked: RLIMIT_MEMLOCK may refuse, and must then say so, not crash. */
  o.pinned = 1;
  o.budget_bytes = 256 << 10;
  o.preallocate = 1;
  zinf_code_t code = zinf_pinned_pool_create(&o, &pool, &err);
  CHECK(code == ZINF_OK || code == ZINF_RESOURCE_EXHAUSTED);
  if (code == ZINF_OK) {
    EXPECT_OK(zinf_pinned_pool_alloc(pool, 4096, &a, &err));
    zinf_pinned_pool_destroy(pool);
  }

  o.pinned = 0;
  o.budget_bytes = 0;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_pinned_pool_create(&o, &pool, &err));
  EXPECT_ERR_HAS("budget_bytes");
  o.budget_bytes = 1 << 20;
  o.alignment = 3000;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_pinned_pool_create(&o, &pool, &err));
  EXPECT_ERR_HAS("alignment");
  ClearErr();
}

/* ---- Swap store ---- */

static void FillPattern(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i) p[i] = (unsigned char)((i * 131u + seed * 7u) ^ (i >> 9));
}

static void TestSwapStore(const char* dir) {
  zinf_swap_store_options_t o;
  zinf_swap_store_options_init(&o);
  CHECK(o.checksum == 1 && o.lock_wait_ms == 5000);
  const char* missing[] = {"/nonexistent/zinf-capi-test"};
  o.paths = missing;
  o.path_count = 1;
  o.capacity_bytes = 8 << 20;
  zinf_swap_store_t* store = NULL;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_swap_store_open(&o, &store, &err));
  EXPECT_ERR_HAS("/nonexistent/zinf-capi-test");
  CHECK(store == NULL);

  const char* paths[] = {dir};
  o.paths = paths;
  o.path_count = 0;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_swap_store_open(&o, &store, &err));
  o.path_count = 1;
  o.paths = NULL;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_swap_store_open(&o, &store, &err));
  EXPECT_ERR_HAS("options->paths is NULL");
  o.paths = paths;
  o.aio_json = "{\"queue_depth\": ";
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_swap_store_open(&o, &store, &err));
  EXPECT_ERR_HAS("aio_json is not valid JSON");
  o.aio_json = "{\"queue_depth\": 0}";
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_swap_store_open(&o, &store, &err));
  EXPECT_ERR_HAS("queue_depth");
  o.aio_json = "{\"block_size\": 262144, \"queue_depth\": 4}";
  REQUIRE_OK(zinf_swap_store_open(&o, &store, &err));

  zinf_swap_store_info_t info;
  info.struct_size = sizeof(info);
  EXPECT_OK(zinf_swap_store_info(store, &info, &err));
  CHECK(info.capacity_bytes >= (8u << 20));
  CHECK(info.file_count == 1);
  CHECK(info.free_bytes == info.capacity_bytes);

  /* Buffers: one page-aligned from a pool (no copy), one odd-sized from malloc (bounced). */
  zinf_pinned_pool_options_t po;
  zinf_pinned_pool_options_init(&po);
  po.budget_bytes = 4 << 20;
  po.pinned = 0;
  zinf_pinned_pool_t* pool = NULL;
  REQUIRE_OK(zinf_pinned_pool_create(&po, &pool, &err));
  const size_t big = 1 << 20;
  void* src = NULL;
  void* dst = NULL;
  REQUIRE_OK(zinf_pinned_pool_alloc(pool, big, &src, &err));
  REQUIRE_OK(zinf_pinned_pool_alloc(pool, big, &dst, &err));
  EXPECT_OK(zinf_swap_store_register_buffer(store, src, big, &err));
  FillPattern(src, big, 1);
  memset(dst, 0, big);

  zinf_swap_extent_t e1, e2;
  REQUIRE_OK(zinf_swap_store_allocate(store, big, "c.big", &e1, &err));
  REQUIRE_OK(zinf_swap_store_allocate(store, 12345, NULL, &e2, &err));
  CHECK(e1.id != 0 && e2.id != 0 && e1.id != e2.id && e2.size_bytes == 12345);

  /* Reading an extent never written is the completion's error, not the call's. */
  zinf_completion_t* done = NULL;
  REQUIRE_OK(zinf_swap_store_read_async(store, e1, dst, &done, &err));
  EXPECT_CODE(ZINF_FAILED_PRECONDITION, zinf_completion_wait(done, &err));
  zinf_completion_destroy(done);

  REQUIRE_OK(zinf_swap_store_write_async(store, e1, src, &done, &err));
  int finished = 0;
  zinf_code_t outcome = ZINF_OK;
  for (int i = 0; i < 10000 && !finished; ++i) {
    outcome = zinf_completion_poll(done, &finished, &err);
    if (!finished) usleep(1000);
  }
  CHECK(finished == 1);
  CHECK(outcome == ZINF_OK);
  EXPECT_OK(zinf_completion_wait(done, &err)); /* again: the same outcome */
  zinf_completion_destroy(done);
  EXPECT_CODE(ZINF_FAILED_PRECONDITION, zinf_completion_wait(done, &err));
  EXPECT_ERR_HAS("completion is a destroyed handle");
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_completion_poll(NULL, &finished, &err));

  REQUIRE_OK(zinf_swap_store_read_async(store, e1, dst, &done, &err));
  EXPECT_OK(zinf_completion_wait(done, &err));
  zinf_completion_destroy(done);
  CHECK(memcmp(src, dst, big) == 0);

  /* A completion destroyed before it finishes waits for it: dst may then be reused. */
  memset(dst, 0, big);
  REQUIRE_OK(zinf_swap_store_read_async(store, e1, dst, &done, &err));
  zinf_completion_destroy(done);
  CHECK(memcmp(src, dst, big) == 0);

  unsigned char* odd_src = malloc(12345);
  unsigned char* odd_dst = calloc(1, 12345);
  FillPattern(odd_src, 12345, 2);
  EXPECT_OK(zinf_swap_store_write(store, e2, odd_src, &err));
  EXPECT_OK(zinf_swap_store_read(store, e2, odd_dst, &err));
  CHECK(memcmp(odd_src, odd_dst, 12345) == 0);
  free(odd_src);
  free(odd_dst);

  /* Arguments. */
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_swap_store_write_async(store, e1, NULL, &done, &err));
  EXPECT_ERR_HAS("src is NULL");
  CHECK(done == NULL);
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_swap_store_read_async(store, e1, dst, NULL, &err));
  EXPECT_ERR_HAS("completion is NULL");
  zinf_swap_extent_t wrong = e1;
  wrong.size_bytes += 1;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_swap_store_read(store, wrong, dst, &err));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_swap_store_allocate(store, 0, "zero", &e2, &err));
  zinf_swap_extent_t huge;
  EXPECT_CODE(ZINF_RESOURCE_EXHAUSTED,
              zinf_swap_store_allocate(store, (uint64_t)1 << 40, "huge", &huge, &err));
  EXPECT_OK(zinf_swap_store_status(store, &err));

  EXPECT_OK(zinf_swap_store_free(store, e1, &err));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_swap_store_free(store, e1, &err));
  EXPECT_OK(zinf_swap_store_free(store, e2, &err));
  EXPECT_OK(zinf_swap_store_info(store, &info, &err));
  CHECK(info.free_bytes == info.capacity_bytes);

  zinf_swap_store_destroy(store);
  EXPECT_CODE(ZINF_FAILED_PRECONDITION, zinf_swap_store_status(store, &err));
  zinf_pinned_pool_destroy(pool);
  ClearErr();
}

/* ---- Tiered store ---- */

static void TestTieredStore(const char* dir) {
  zinf_tiered_store_options_t o;
  zinf_tiered_store_options_init(&o);
  CHECK(strcmp(o.device, "host") == 0);
  CHECK(o.piece_bytes == (64u << 20) && o.pin_host == 1 && o.staging_buffers == 2);
  zinf_tiered_store_t* store = NULL;
  /* host_budget_bytes left at 0. */
  o.device_budget_bytes = 4 << 20;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_tiered_store_create(&o, &store, &err));
  EXPECT_ERR_HAS("host_budget_bytes");
  CHECK(store == NULL);

  const char* paths[] = {dir};
  o.host_budget_bytes = 4 << 20;
  o.pin_host = 0;
  o.nvme_paths = paths;
  o.nvme_path_count = 1;
  o.nvme_capacity_bytes = 16 << 20;
  o.piece_bytes = 256 << 10;
  o.transfer_threads = 1;
  REQUIRE_OK(zinf_tiered_store_create(&o, &store, &err));

  const uint64_t size = 1 << 20; /* four pieces */
  uint64_t t = 0;
  REQUIRE_OK(zinf_tiered_store_create_tensor(store, "c.weight", size, ZINF_TIER_NVME, &t, &err));

  void* host = NULL;
  REQUIRE_OK(zinf_tiered_store_acquire(store, t, ZINF_TIER_HOST, ZINF_ACCESS_READ, &host, &err));
  int zeros = 1;
  for (uint64_t i = 0; i < size; ++i) zeros &= ((unsigned char*)host)[i] == 0;
  CHECK(zeros); /* a new tensor reads as zeros */
  EXPECT_OK(zinf_tiered_store_release(store, t, ZINF_TIER_HOST, &err));

  REQUIRE_OK(zinf_tiered_store_acquire(store, t, ZINF_TIER_HOST, ZINF_ACCESS_WRITE, &host, &err));
  FillPattern(host, size, 3);
  EXPECT_OK(zinf_tiered_store_release(store, t, ZINF_TIER_HOST, &err));
  /* The host copy is the only current one: evicting writes it home first. */
  EXPECT_OK(zinf_tiered_store_evict(store, t, ZINF_TIER_HOST, &err));
  uint32_t mask = 0;
  EXPECT_OK(zinf_tiered_store_resident_tiers(store, t, &mask, &err));
  CHECK(mask == (1u << ZINF_TIER_NVME));

  zinf_completion_t* done = NULL;
  EXPECT_OK(zinf_tiered_store_set_next_use(store, t, 1, &err));
  REQUIRE_OK(zinf_tiered_store_prefetch(store, t, ZINF_TIER_DEVICE, &done, &err));
  EXPECT_OK(zinf_completion_wait(done, &err));
  zinf_completion_destroy(done);
  EXPECT_OK(zinf_tiered_store_resident_tiers(store, t, &mask, &err));
  CHECK((mask & (1u << ZINF_TIER_DEVICE)) != 0);

  void* device = NULL;
  REQUIRE_OK(
      zinf_tiered_store_acquire(store, t, ZINF_TIER_DEVICE, ZINF_ACCESS_READ, &device, &err));
  unsigned char* expected = malloc(size);
  FillPattern(expected, size, 3);
  CHECK(memcmp(device, expected, size) == 0); /* the "host" device's memory is host memory */
  EXPECT_OK(zinf_tiered_store_release(store, t, ZINF_TIER_DEVICE, &err));
  free(expected);
  EXPECT_OK(zinf_tiered_store_prefetch(store, t, ZINF_TIER_HOST, NULL, &err));
  EXPECT_OK(zinf_tiered_store_flush(store, &err));

  /* Overwrite every byte without reading the old ones in, then evict in the background. */
  REQUIRE_OK(
      zinf_tiered_store_acquire(store, t, ZINF_TIER_HOST, ZINF_ACCESS_OVERWRITE, &host, &err));
  FillPattern(host, size, 4);
  EXPECT_OK(zinf_tiered_store_release(store, t, ZINF_TIER_HOST, &err));
  REQUIRE_OK(zinf_tiered_store_evict_async(store, t, ZINF_TIER_HOST, &done, &err));
  EXPECT_OK(zinf_completion_wait(done, &err));
  zinf_completion_destroy(done);
  EXPECT_OK(zinf_tiered_store_resident_tiers(store, t, &mask, &err));
  CHECK(mask == (1u << ZINF_TIER_NVME));
  REQUIRE_OK(zinf_tiered_store_acquire(store, t, ZINF_TIER_HOST, ZINF_ACCESS_READ, &host, &err));
  expected = malloc(size);
  FillPattern(expected, size, 4);
  CHECK(memcmp(host, expected, size) == 0);
  free(expected);
  EXPECT_OK(zinf_tiered_store_release(store, t, ZINF_TIER_HOST, &err));
  /* Evicting from the home tier: the completion's error. */
  REQUIRE_OK(zinf_tiered_store_evict_async(store, t, ZINF_TIER_NVME, &done, &err));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_completion_wait(done, &err));
  zinf_completion_destroy(done);

  zinf_tiered_store_stats_t stats;
  stats.struct_size = sizeof(stats);
  EXPECT_OK(zinf_tiered_store_stats(store, &stats, &err));
  CHECK(stats.host_to_nvme.bytes >= size);
  CHECK(stats.nvme_to_host.bytes >= size);
  CHECK(stats.tiers[ZINF_TIER_HOST].budget_bytes == (4u << 20));
  CHECK(stats.tiers[ZINF_TIER_NVME].in_use_bytes >= size);
  CHECK(stats.write_backs >= 1);

  /* Errors. */
  EXPECT_CODE(ZINF_INVALID_ARGUMENT,
              zinf_tiered_store_acquire(store, t, ZINF_TIER_NVME, ZINF_ACCESS_READ, &host, &err));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT,
              zinf_tiered_store_acquire(store, t, (zinf_tier_t)7, ZINF_ACCESS_READ, &host, &err));
  EXPECT_ERR_HAS("tier must be");
  EXPECT_CODE(ZINF_INVALID_ARGUMENT,
              zinf_tiered_store_acquire(store, t, ZINF_TIER_HOST, (zinf_access_t)3, &host, &err));
  EXPECT_ERR_HAS("access must be");
  EXPECT_CODE(ZINF_INVALID_ARGUMENT,
              zinf_tiered_store_acquire(store, t, ZINF_TIER_HOST, ZINF_ACCESS_READ, NULL, &err));
  EXPECT_ERR_HAS("data is NULL");
  EXPECT_CODE(ZINF_FAILED_PRECONDITION, zinf_tiered_store_release(store, t, ZINF_TIER_HOST, &err));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_tiered_store_evict(store, t, ZINF_TIER_NVME, &err));
  uint64_t t2 = 0;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT,
              zinf_tiered_store_create_tensor(store, "empty", 0, ZINF_TIER_HOST, &t2, &err));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT,
              zinf_tiered_store_create_tensor(store, NULL, 64, ZINF_TIER_HOST, &t2, &err));
  EXPECT_ERR_HAS("name is NULL");
  EXPECT_CODE(ZINF_RESOURCE_EXHAUSTED, zinf_tiered_store_create_tensor(store, "too.big", 64 << 20,
                                                                       ZINF_TIER_HOST, &t2, &err));

  EXPECT_OK(zinf_tiered_store_free_tensor(store, t, &err));
  EXPECT_CODE(ZINF_FAILED_PRECONDITION, zinf_tiered_store_free_tensor(store, t, &err));
  EXPECT_ERR_HAS("c.weight");
  /* A prefetch of a freed tensor fails in its completion (or at once). */
  zinf_code_t code = zinf_tiered_store_prefetch(store, t, ZINF_TIER_HOST, &done, &err);
  if (code == ZINF_OK) {
    EXPECT_CODE(ZINF_FAILED_PRECONDITION, zinf_completion_wait(done, &err));
    zinf_completion_destroy(done);
  } else {
    CHECK(code == ZINF_FAILED_PRECONDITION);
  }

  zinf_tiered_store_destroy(store);
  EXPECT_CODE(ZINF_FAILED_PRECONDITION, zinf_tiered_store_flush(store, &err));

  /* A missing NVMe path. */
  const char* missing[] = {"/nonexistent/zinf-capi-tiers"};
  o.nvme_paths = missing;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_tiered_store_create(&o, &store, &err));
  EXPECT_ERR_HAS("/nonexistent/zinf-capi-tiers");
  o.nvme_paths = NULL;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_tiered_store_create(&o, &store, &err));
  EXPECT_ERR_HAS("nvme_paths is NULL");
  ClearErr();
}

/* ---- CPU optimizers ---- */

enum { kN = 1000 };

static void TestCpuOptimizer(void) {
  zinf_cpu_optimizer_options_t oo;
  zinf_cpu_optimizer_options_init(&oo);
  CHECK(oo.threads == 0 && oo.isa == ZINF_CPU_ISA_AUTO && oo.prefetch_bytes == 1024);
  CHECK(oo.workers == ZINF_CPU_WORKERS_ONETBB);
  zinf_cpu_optimizer_t* opt = NULL;
  oo.isa = 9;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_cpu_optimizer_create(&oo, &opt, &err));
  EXPECT_ERR_HAS("isa");
  oo.isa = ZINF_CPU_ISA_AUTO;
  oo.workers = 2;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_cpu_optimizer_create(&oo, &opt, &err));
  EXPECT_ERR_HAS("workers must be onetbb or process_openmp, got 2");
  /* This test has no OpenMP runtime: the optimizer runs on oneTBB, the results are the same. */
  oo.workers = ZINF_CPU_WORKERS_PROCESS_OPENMP;
  oo.threads = 2;
  REQUIRE_OK(zinf_cpu_optimizer_create(&oo, &opt, &err));
  const char* isa = NULL;
  int threads = 0;
  EXPECT_OK(zinf_cpu_optimizer_info(opt, &isa, &threads, &err));
  CHECK(isa != NULL && strcmp(isa, "auto") != 0);
  CHECK(threads == 2);

  zinf_hyper_params_t hp;
  zinf_hyper_params_init(&hp, ZINF_OPTIMIZER_ADAMW);
  CHECK(hp.lr == 1e-3 && hp.weight_decay == 1e-2 && hp.bias_correction == 1);
  hp.lr = 0.01;
  int group = -1;
  REQUIRE_OK(zinf_cpu_optimizer_add_param_group(opt, &hp, &group, &err));
  CHECK(group == 0);

  static float params[kN], grads[kN], m[kN], v[kN], before[kN], back[kN];
  static uint16_t copy[kN], converted[kN];
  for (int i = 0; i < kN; ++i) {
    params[i] = before[i] = (float)sin(i * 0.1);
    grads[i] = (float)cos(i * 0.37) * 0.5f;
    m[i] = v[i] = 123.0f; /* init_state must overwrite */
  }
  zinf_optimizer_span_t span;
  zinf_optimizer_span_init(&span);
  CHECK(span.grad_type == ZINF_DTYPE_FP32 && span.param_copy_type == ZINF_DTYPE_BF16);
  span.params = params;
  span.grads = grads;
  span.state0 = m;
  span.state1 = v;
  span.param_copy = copy;
  span.count = kN;
  EXPECT_OK(zinf_cpu_optimizer_init_state(opt, group, &span, &err));
  CHECK(m[0] == 0.0f && v[kN - 1] == 0.0f);

  zinf_optimizer_step_result_t result;
  result.struct_size = sizeof(result);
  REQUIRE_OK(zinf_cpu_optimizer_step(opt, group, &span, 1.0f, 1, &result, &err));
  CHECK(result.step == 1 && result.skipped == 0 && result.finite == 1);
  double sum_squares = 0;
  for (int i = 0; i < kN; ++i) sum_squares += (double)grads[i] * grads[i];
  CHECK(fabs(result.sum_squares - sum_squares) < 1e-6 * sum_squares);

  /* torch.optim.AdamW's first step. */
  double worst = 0;
  for (int i = 0; i < kN; ++i) {
    const double lr = 0.01, wd = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    double p = before[i] * (1 - lr * wd);
    const double g = grads[i];
    const double mm = (1 - b1) * g, vv = (1 - b2) * g * g;
    p -= lr / (1 - b1) * mm / (sqrt(vv) / sqrt(1 - b2) + eps);
    const double d = fabs(p - params[i]);
    if (d > worst) worst = d;
  }
  CHECK(worst < 1e-6);
  /* The bf16 copy is the new parameters rounded as zinf_convert_from_fp32 rounds. */
  EXPECT_OK(zinf_convert_from_fp32(params, ZINF_DTYPE_BF16, converted, kN, &err));
  CHECK(memcmp(copy, converted, sizeof(copy)) == 0);
  EXPECT_OK(zinf_convert_to_fp32(copy, ZINF_DTYPE_BF16, back, kN, &err));
  CHECK(fabsf(back[10] - params[10]) <= fabsf(params[10]) / 128);

  /* A non-finite gradient with check_finite: skipped, nothing touched. */
  memcpy(before, params, sizeof(params));
  grads[17] = NAN;
  EXPECT_OK(zinf_cpu_optimizer_step(opt, group, &span, 1.0f, 1, &result, &err));
  CHECK(result.skipped == 1 && result.finite == 0 && result.step == 1);
  CHECK(memcmp(before, params, sizeof(params)) == 0);
  double ss = 0;
  int finite = 1;
  EXPECT_OK(zinf_cpu_optimizer_grad_stats(opt, grads, ZINF_DTYPE_FP32, kN, &ss, &finite, &err));
  CHECK(finite == 0);
  grads[17] = 0.25f;

  /* Chunked: begin_step once, then chunks. */
  int64_t step = 0;
  EXPECT_OK(zinf_cpu_optimizer_begin_step(opt, group, &step, &err));
  CHECK(step == 2);
  zinf_optimizer_span_t chunk = span;
  chunk.count = kN / 2;
  EXPECT_OK(zinf_cpu_optimizer_update(opt, group, &chunk, 0.5f, &err));
  chunk.params += kN / 2;
  chunk.grads = grads + kN / 2;
  chunk.state0 += kN / 2;
  chunk.state1 += kN / 2;
  chunk.param_copy = copy + kN / 2;
  EXPECT_OK(zinf_cpu_optimizer_update(opt, group, &chunk, 0.5f, &err));
  CHECK(memcmp(before, params, sizeof(params)) != 0);

  /* State round trip. */
  char* blob = NULL;
  size_t blob_size = 0;
  REQUIRE_OK(zinf_cpu_optimizer_save_state(opt, &blob, &blob_size, &err));
  CHECK(blob != NULL && blob_size > 0);
  EXPECT_OK(zinf_cpu_optimizer_set_step(opt, group, 40, &err));
  zinf_hyper_params_t got;
  got.struct_size = sizeof(got);
  EXPECT_OK(zinf_cpu_optimizer_get_group(opt, group, &got, &step, &err));
  CHECK(step == 40 && got.lr == 0.01 && got.type == ZINF_OPTIMIZER_ADAMW);
  EXPECT_OK(zinf_cpu_optimizer_load_state(opt, blob, blob_size, &err));
  EXPECT_OK(zinf_cpu_optimizer_get_group(opt, group, NULL, &step, &err));
  CHECK(step == 2);
  EXPECT_CODE(ZINF_DATA_LOSS, zinf_cpu_optimizer_load_state(opt, blob, blob_size / 2, &err));
  zinf_free(blob);

  /* Every other optimizer: one step that moves each parameter against its gradient. */
  const zinf_optimizer_type_t types[] = {ZINF_OPTIMIZER_ADAM, ZINF_OPTIMIZER_ADAGRAD,
                                         ZINF_OPTIMIZER_LION};
  for (int k = 0; k < 3; ++k) {
    zinf_hyper_params_init(&hp, types[k]);
    hp.weight_decay = 0;
    int g = -1;
    REQUIRE_OK(zinf_cpu_optimizer_add_param_group(opt, &hp, &g, &err));
    CHECK(g == k + 1);
    for (int i = 0; i < kN; ++i) params[i] = before[i] = 1.0f;
    zinf_optimizer_span_t s = span;
    s.state1 = types[k] == ZINF_OPTIMIZER_ADAM ? v : NULL;
    s.param_copy = copy;
    s.param_copy_type = ZINF_DTYPE_FP16;
    EXPECT_OK(zinf_cpu_optimizer_init_state(opt, g, &s, &err));
    EXPECT_OK(zinf_cpu_optimizer_step(opt, g, &s, 1.0f, 0, NULL, &err));
    int moved_right = 1;
    for (int i = 0; i < kN; ++i) {
      if (grads[i] > 0) moved_right &= params[i] < 1.0f;
      if (grads[i] < 0) moved_right &= params[i] > 1.0f;
    }
    CHECK(moved_right);
    EXPECT_OK(zinf_convert_to_fp32(copy, ZINF_DTYPE_FP16, back, kN, &err));
    CHECK(fabsf(back[3] - params[3]) < 1e-3f);
  }

  /* Bad input names what is wrong. */
  zinf_hyper_params_init(&hp, ZINF_OPTIMIZER_ADAMW);
  hp.lr = -1;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_cpu_optimizer_add_param_group(opt, &hp, &group, &err));
  EXPECT_ERR_HAS("lr");
  zinf_hyper_params_init(&hp, (zinf_optimizer_type_t)11);
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_cpu_optimizer_add_param_group(opt, &hp, &group, &err));
  EXPECT_ERR_HAS("params->type");
  zinf_optimizer_span_t bad = span;
  bad.state1 = NULL;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_cpu_optimizer_step(opt, 0, &bad, 1.0f, 0, NULL, &err));
  EXPECT_ERR_HAS("state1");
  bad = span;
  bad.params = NULL;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_cpu_optimizer_step(opt, 0, &bad, 1.0f, 0, NULL, &err));
  EXPECT_ERR_HAS("params");
  bad = span;
  bad.grad_type = 5;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_cpu_optimizer_step(opt, 0, &bad, 1.0f, 0, NULL, &err));
  EXPECT_ERR_HAS("span->grad_type");
  bad.struct_size = 8;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_cpu_optimizer_step(opt, 0, &bad, 1.0f, 0, NULL, &err));
  EXPECT_ERR_HAS("span->struct_size is 8");
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_cpu_optimizer_step(opt, 0, NULL, 1.0f, 0, NULL, &err));
  EXPECT_ERR_HAS("span is NULL");
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_cpu_optimizer_step(opt, 9, &span, 1.0f, 0, NULL, &err));
  EXPECT_ERR_HAS("group 9");
  EXPECT_CODE(ZINF_INVALID_ARGUMENT,
              zinf_convert_from_fp32(params, (zinf_dtype_t)3, copy, kN, &err));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_convert_to_fp32(NULL, ZINF_DTYPE_BF16, back, kN, &err));
  EXPECT_ERR_HAS("src is NULL");

  zinf_cpu_optimizer_destroy(opt);
  EXPECT_CODE(ZINF_FAILED_PRECONDITION, zinf_cpu_optimizer_begin_step(opt, 0, &step, &err));
  ClearErr();
}

/* ---- Engine ---- */

/* One micro-batch of a module: forward, then backward with gradient `g` everywhere. */
static void MicroBatch(zinf_engine_t* engine, int module, float g) {
  zinf_tensor_t params[2], grads[2];
  size_t n = 0;
  REQUIRE_OK(zinf_engine_fetch(engine, module, params, 2, &n, &err));
  EXPECT_OK(zinf_engine_release(engine, module, &err));
  REQUIRE_OK(zinf_engine_fetch(engine, module, params, 2, &n, &err));
  REQUIRE_OK(zinf_engine_gradients(engine, module, grads, 2, &n, &err));
  for (size_t i = 0; i < n; ++i) {
    CHECK(grads[i].dtype == ZINF_DTYPE_FP32 && grads[i].device_kind == ZINF_DEVICE_KIND_HOST);
    for (uint64_t j = 0; j < grads[i].numel; ++j) ((float*)grads[i].data)[j] = g;
  }
  EXPECT_OK(zinf_engine_reduce_gradients(engine, module, &err));
  EXPECT_OK(zinf_engine_release(engine, module, &err));
}

static void TestEngine(const char* dir) {
  const char* config =
      "{\"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 0,"
      " \"offload_optimizer\": {\"device\": \"cpu\"}},"
      " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.1, \"weight_decay\": 0}}}";
  zinf_engine_options_t o;
  zinf_engine_options_init(&o);
  CHECK(o.rank == -1 && o.world_size == -1 && o.timeout_ms == 300000);
  o.rank = 0;
  o.world_size = 1;
  o.optimizer_threads = 1;
  zinf_engine_t* engine = NULL;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT,
              zinf_engine_create("{\"zero_optimization\": {\"stages\": 3}}", &o, &engine, &err));
  EXPECT_ERR_HAS("stages");
  CHECK(engine == NULL);
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_create("{not json", &o, &engine, &err));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_create(NULL, &o, &engine, &err));
  EXPECT_ERR_HAS("config_json is NULL");
  o.timeout_ms = 0;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_create(config, &o, &engine, &err));
  EXPECT_ERR_HAS("timeout_ms");
  o.timeout_ms = 60000;
  REQUIRE_OK(zinf_engine_create(config, &o, &engine, &err));

  const int64_t w_shape[] = {4, 3};
  const int64_t b_shape[] = {4};
  zinf_param_spec_t specs[2];
  zinf_param_spec_init(&specs[0]);
  zinf_param_spec_init(&specs[1]);
  CHECK(specs[0].init == ZINF_PARAM_INIT_NORMAL && specs[0].init_std == 0.02f);
  specs[0].name = "fc.w";
  specs[0].shape = w_shape;
  specs[0].ndim = 2;
  specs[1].name = "fc.b";
  specs[1].shape = b_shape;
  specs[1].ndim = 1;
  specs[1].init = ZINF_PARAM_INIT_ONES;
  int fc = -1;
  specs[1].struct_size = 16;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT,
              zinf_engine_register_module(engine, "fc", specs, 2, &fc, &err));
  EXPECT_ERR_HAS("params[1].struct_size is 16");
  specs[1].struct_size = sizeof(specs[1]);
  specs[0].struct_size = 8;
  specs[1].struct_size = 8;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT,
              zinf_engine_register_module(engine, "fc", specs, 2, &fc, &err));
  EXPECT_ERR_HAS("params[0].struct_size is 8");
  specs[0].struct_size = sizeof(specs[0]);
  specs[1].struct_size = sizeof(specs[1]);
  specs[1].name = NULL;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT,
              zinf_engine_register_module(engine, "fc", specs, 2, &fc, &err));
  EXPECT_ERR_HAS("params[1].name is NULL");
  specs[1].name = "fc.b";
  REQUIRE_OK(zinf_engine_register_module(engine, "fc", specs, 2, &fc, &err));
  const int64_t h_shape[] = {5};
  zinf_param_spec_t head;
  zinf_param_spec_init(&head);
  head.name = "head.w";
  head.shape = h_shape;
  head.ndim = 1;
  head.init = ZINF_PARAM_INIT_ZEROS;
  int hd = -1;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT,
              zinf_engine_register_module(engine, "fc", &head, 1, &hd, &err)); /* duplicate */
  REQUIRE_OK(zinf_engine_register_module(engine, "head", &head, 1, &hd, &err));
  CHECK(fc != hd);
  REQUIRE_OK(zinf_engine_initialize(engine, &err));

  size_t count = 0;
  EXPECT_OK(zinf_engine_module_param_count(engine, fc, &count, &err));
  CHECK(count == 2);
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_module_param_count(engine, 42, &count, &err));
  uint64_t numel = 0;
  EXPECT_OK(zinf_engine_param_numel(engine, "fc.w", &numel, &err));
  CHECK(numel == 12);
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_param_numel(engine, "nope", &numel, &err));
  EXPECT_ERR_HAS("'nope'");

  zinf_tensor_t params[2];
  memset(params, 0xff, sizeof(params));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_fetch(engine, fc, params, 1, &count, &err));
  EXPECT_ERR_HAS("has room for 1 tensors; module");
  REQUIRE_OK(zinf_engine_fetch(engine, fc, params, 2, &count, &err));
  CHECK(count == 2);
  CHECK(params[0].dtype == ZINF_DTYPE_FP32 && params[0].device_kind == ZINF_DEVICE_KIND_HOST);
  CHECK(params[0].numel == 12 && params[1].numel == 4);
  CHECK(params[0].reserved[0] == 0 && params[0].reserved0 == 0);
  CHECK(((float*)params[1].data)[3] == 1.0f);
  EXPECT_OK(zinf_engine_release(engine, fc, &err));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_fetch(engine, 42, params, 2, &count, &err));
  EXPECT_CODE(ZINF_FAILED_PRECONDITION, zinf_engine_reduce_gradients(engine, fc, &err));

  zinf_engine_info_t info;
  info.struct_size = sizeof(info);
  EXPECT_OK(zinf_engine_info(engine, &info, &err));
  CHECK(info.rank == 0 && info.world_size == 1 && info.zero_stage == 3);
  CHECK(info.loss_scale == 1.0 && info.learning_rate == 0.1);
  CHECK(info.gradient_accumulation_steps == 1 && info.train_batch_size == 1);
  CHECK(info.parameters_resident == 1); /* one rank, parameters in the host device's memory */
  {
    /* The trainer's values for "auto" keys: "not given" is -1 or NaN; a value fills "auto". */
    zinf_trainer_values_t tv;
    zinf_trainer_values_init(&tv);
    CHECK(tv.micro_batch_size == -1 && tv.total_num_steps == -1 && isnan(tv.lr) && tv.fp16 == -1);
    tv.lr = 0.25;
    zinf_engine_options_t to = o;
    to.trainer = &tv;
    zinf_engine_t* auto_engine = NULL;
    REQUIRE_OK(
        zinf_engine_create("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\"}}}",
                           &to, &auto_engine, &err));
    zinf_engine_info_t auto_info;
    auto_info.struct_size = sizeof(auto_info);
    EXPECT_OK(zinf_engine_info(auto_engine, &auto_info, &err));
    CHECK(auto_info.learning_rate == 0.25);
    zinf_engine_destroy(auto_engine);
    tv.fp16 = 2;
    EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_create("{}", &to, &auto_engine, &err));
    EXPECT_ERR_HAS("options->trainer->fp16");
  }

  MicroBatch(engine, hd, 1.0f);
  MicroBatch(engine, fc, 1.0f);
  float grad[12];
  EXPECT_OK(zinf_engine_gather_gradient(engine, "fc.b", grad, 4, &err));
  CHECK(grad[0] == 1.0f && grad[3] == 1.0f);
  zinf_step_summary_t summary;
  summary.struct_size = sizeof(summary);
  REQUIRE_OK(zinf_engine_step(engine, &summary, &err));
  CHECK(summary.step == 1 && summary.skipped == 0);
  CHECK(fabs(summary.grad_norm - sqrt(21.0)) < 1e-5); /* 12 + 4 + 5 ones */
  CHECK(fabs(summary.learning_rate - 0.1) < 1e-12);
  CHECK(fabs(summary.unix_time_s - (double)time(NULL)) < 60.0);
  /* The host's work is counted (tests/zero/transfer_counters_test.cc pins it): the engine
   * zeroed the gradient buffers (the accumulators themselves here: one rank, host memory), which
   * zinf_engine_gradients hands out as zeros, and wrote the parameter tier from the master. */
  CHECK(summary.host_bytes_set > 0 && summary.host_bytes_copied > 0);
  /* The device tier held the fetched modules, within its budget. */
  CHECK(summary.device_peak_bytes > 0 && summary.device_peak_bytes <= summary.device_budget_bytes);

  /* AdamW's first step with lr 0.1 moves every element by about lr against the gradient. */
  float b[4], w[12];
  EXPECT_OK(zinf_engine_gather_parameter(engine, "fc.b", b, 4, &err));
  CHECK(fabsf(b[0] - 0.9f) < 1e-4f && fabsf(b[3] - 0.9f) < 1e-4f);
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_gather_parameter(engine, "fc.w", w, 11, &err));
  EXPECT_ERR_HAS("has room for 11 elements");
  uint64_t offset = 0, size = 0;
  EXPECT_OK(zinf_engine_shard(engine, "fc.w", &offset, &size, &err));
  CHECK(offset == 0 && size == 12);
  double mean = 0;
  EXPECT_OK(zinf_engine_mean_over_ranks(engine, 2.5, &mean, &err));
  CHECK(mean == 2.5);

  /* Checkpoints: save, change, load; the saved values, buffers and client state come back. */
  const int64_t stats_shape[] = {2};
  const float stats[2] = {0.5f, -2.0f}, moved[2] = {9.0f, 9.0f};
  const int64_t tracked = 4;
  EXPECT_OK(zinf_engine_set_buffer(engine, "bn.running_mean", "F32", stats_shape, 1, stats,
                                   sizeof(stats), &err));
  EXPECT_OK(zinf_engine_set_buffer(engine, "bn.num_batches_tracked", "I64", NULL, 0, &tracked,
                                   sizeof(tracked), &err));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_set_buffer(engine, "bn.x", "F33", stats_shape, 1,
                                                            stats, sizeof(stats), &err));
  EXPECT_ERR_HAS("F33");
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_set_buffer(engine, "bn.x", "F32", stats_shape, 1,
                                                            NULL, sizeof(stats), &err));
  EXPECT_ERR_HAS("data is NULL");
  EXPECT_OK(zinf_engine_set_checkpoint_metadata(
      engine, "{\"hf_config\": {\"model_type\": \"mlp\"}}", &err));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_set_checkpoint_metadata(engine, "[1]", &err));
  EXPECT_ERR_HAS("must be a JSON object");
  char ckpt[300];
  snprintf(ckpt, sizeof(ckpt), "%s/ckpt", dir);
  REQUIRE_OK(zinf_engine_save_checkpoint(engine, ckpt, "step1", "{\"epoch\": 3}", &err));
  char manifest_path[400];
  snprintf(manifest_path, sizeof(manifest_path), "%s/step1/manifest.json", ckpt);
  FILE* manifest = fopen(manifest_path, "r");
  char manifest_text[8192] = {0};
  CHECK(manifest != NULL && fread(manifest_text, 1, sizeof(manifest_text) - 1, manifest) > 0);
  if (manifest != NULL) fclose(manifest);
  CHECK(strstr(manifest_text, "\"model_type\": \"mlp\"") != NULL);
  EXPECT_OK(zinf_engine_set_buffer(engine, "bn.running_mean", "F32", stats_shape, 1, moved,
                                   sizeof(moved), &err));
  const float set[4] = {5, 6, 7, 8};
  EXPECT_OK(zinf_engine_set_parameter(engine, "fc.b", set, 4, &err));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_set_parameter(engine, "fc.b", set, 3, &err));
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_set_parameter(engine, "fc.b", NULL, 4, &err));
  EXPECT_ERR_HAS("values is NULL");
  float after[4];
  EXPECT_OK(zinf_engine_gather_parameter(engine, "fc.b", after, 4, &err));
  CHECK(after[2] == 7.0f);
  char* client_state = NULL;
  REQUIRE_OK(zinf_engine_load_checkpoint(engine, ckpt, &client_state, &err));
  CHECK(client_state != NULL && strstr(client_state, "\"epoch\"") != NULL);
  zinf_free(client_state);
  float stats_back[2];
  EXPECT_OK(
      zinf_engine_get_buffer(engine, "bn.running_mean", stats_back, sizeof(stats_back), &err));
  CHECK(stats_back[0] == 0.5f && stats_back[1] == -2.0f);
  EXPECT_CODE(ZINF_INVALID_ARGUMENT,
              zinf_engine_get_buffer(engine, "bn.nope", stats_back, sizeof(stats_back), &err));
  EXPECT_ERR_HAS("bn.nope");
  EXPECT_OK(zinf_engine_gather_parameter(engine, "fc.b", after, 4, &err));
  CHECK(memcmp(after, b, sizeof(b)) == 0);
  char missing[300];
  snprintf(missing, sizeof(missing), "%s/no-such-checkpoint", dir);
  zinf_code_t code = zinf_engine_load_checkpoint(engine, missing, NULL, &err);
  CHECK(code != ZINF_OK);

  /* Weights from a safetensors file: fc.w in F32, fc.b in BF16, head.w in F32. */
  char weights[300];
  snprintf(weights, sizeof(weights), "%s/w.safetensors", dir);
  const char header[] =
      "{\"fc.w\":{\"dtype\":\"F32\",\"shape\":[4,3],\"data_offsets\":[0,48]},"
      "\"fc.b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[48,56]},"
      "\"head.w\":{\"dtype\":\"F32\",\"shape\":[5],\"data_offsets\":[56,76]}}";
  float w_values[12], h_values[5];
  for (int i = 0; i < 12; ++i) w_values[i] = 0.25f * (float)i;
  for (int i = 0; i < 5; ++i) h_values[i] = -1.0f - (float)i;
  const uint16_t b_bf16[4] = {0x3f80, 0x4000, 0x4040, 0xbf80}; /* 1, 2, 3, -1 */
  const uint64_t header_len = sizeof(header) - 1;
  FILE* f = fopen(weights, "wb");
  CHECK(f != NULL);
  if (f == NULL) return;
  fwrite(&header_len, 8, 1, f); /* little endian, as on every machine zinf runs on */
  fwrite(header, 1, header_len, f);
  fwrite(w_values, 4, 12, f);
  fwrite(b_bf16, 2, 4, f);
  fwrite(h_values, 4, 5, f);
  fclose(f);
  REQUIRE_OK(zinf_engine_load_safetensors(engine, weights, &err));
  EXPECT_OK(zinf_engine_gather_parameter(engine, "fc.w", w, 12, &err));
  CHECK(memcmp(w, w_values, sizeof(w)) == 0);
  EXPECT_OK(zinf_engine_gather_parameter(engine, "fc.b", after, 4, &err));
  CHECK(after[0] == 1.0f && after[1] == 2.0f && after[2] == 3.0f && after[3] == -1.0f);
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_load_safetensors(engine, NULL, &err));
  EXPECT_ERR_HAS("path is NULL");
  f = fopen(weights, "r+b");
  CHECK(f != NULL);
  if (f == NULL) return;
  fseek(f, 8 + (long)(strstr(header, "head.w") - header), SEEK_SET);
  fputc('X', f); /* "head.w" becomes "Xead.w" */
  fclose(f);
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_load_safetensors(engine, weights, &err));
  EXPECT_ERR_HAS("has no tensor 'head.w'");
  /* A hostile header, 50,000 nested brackets: an error, not a crash of the caller. */
  f = fopen(weights, "wb");
  CHECK(f != NULL);
  if (f == NULL) return;
  const uint64_t deep_len = 6 + 2 * 50000 + 1;
  fwrite(&deep_len, 8, 1, f);
  fputs("{\"a\": ", f);
  for (int i = 0; i < 50000; ++i) fputc('[', f);
  for (int i = 0; i < 50000; ++i) fputc(']', f);
  fputc('}', f);
  fclose(f);
  EXPECT_CODE(ZINF_DATA_LOSS, zinf_engine_load_safetensors(engine, weights, &err));
  EXPECT_ERR_HAS("more than 128 levels deep");

  EXPECT_OK(zinf_engine_set_learning_rate(engine, 0.05, &err));
  EXPECT_OK(zinf_engine_info(engine, &info, &err));
  CHECK(info.learning_rate == 0.05);
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_set_learning_rate(engine, -1, &err));

  zinf_engine_destroy(engine);
  EXPECT_CODE(ZINF_FAILED_PRECONDITION, zinf_engine_step(engine, NULL, &err));
  ClearErr();
}

/* Optimizer parameter groups: a parameter in a group of its own, whose lr is set on its own. */
static void TestEngineParamGroups(void) {
  zinf_engine_options_t o;
  zinf_engine_options_init(&o);
  o.rank = 0;
  o.world_size = 1;
  o.optimizer_threads = 1;
  zinf_engine_t* engine = NULL;
  REQUIRE_OK(zinf_engine_create(
      "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.1}}}", &o, &engine, &err));
  zinf_hyper_params_t hp;
  zinf_hyper_params_init(&hp, ZINF_OPTIMIZER_ADAGRAD);
  int group = -1;
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_add_param_group(engine, &hp, &group, &err));
  EXPECT_ERR_HAS("adagrad");
  zinf_hyper_params_init(&hp, ZINF_OPTIMIZER_ADAMW);
  hp.lr = 0.01;
  hp.weight_decay = 0.5;
  REQUIRE_OK(zinf_engine_add_param_group(engine, &hp, &group, &err));
  CHECK(group == 1);
  int count = 0;
  EXPECT_OK(zinf_engine_param_group_count(engine, &count, &err));
  CHECK(count == 2);
  const int64_t shape[] = {6};
  zinf_param_spec_t specs[2];
  zinf_param_spec_init(&specs[0]);
  zinf_param_spec_init(&specs[1]);
  CHECK(specs[0].optimizer_group == 0);
  specs[0].name = "w";
  specs[1].name = "b";
  specs[0].shape = specs[1].shape = shape;
  specs[0].ndim = specs[1].ndim = 1;
  specs[1].optimizer_group = 1;
  int m = -1;
  REQUIRE_OK(zinf_engine_register_module(engine, "m", specs, 2, &m, &err));
  /* A caller built before optimizer_group: its parameters are in group 0. */
  zinf_param_spec_t old;
  zinf_param_spec_init(&old);
  old.struct_size = offsetof(zinf_param_spec_t, optimizer_group);
  old.name = "old";
  old.shape = shape;
  old.ndim = 1;
  REQUIRE_OK(zinf_engine_register_module(engine, "old", &old, 1, &m, &err));
  REQUIRE_OK(zinf_engine_initialize(engine, &err));
  EXPECT_CODE(ZINF_FAILED_PRECONDITION, zinf_engine_add_param_group(engine, &hp, &group, &err));
  EXPECT_OK(zinf_engine_set_group_learning_rate(engine, 1, 0.02, &err));
  zinf_hyper_params_t got;
  got.struct_size = sizeof(got);
  EXPECT_OK(zinf_engine_get_param_group(engine, 1, &got, &err));
  CHECK(got.lr == 0.02 && got.weight_decay == 0.5);
  EXPECT_OK(zinf_engine_get_param_group(engine, 0, &got, &err));
  CHECK(got.lr == 0.1 && got.weight_decay == 0);
  EXPECT_OK(zinf_engine_set_learning_rate(engine, 0.3, &err));
  EXPECT_OK(zinf_engine_get_param_group(engine, 1, &got, &err));
  CHECK(got.lr == 0.3);
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_set_group_learning_rate(engine, 2, 0.1, &err));
  EXPECT_ERR_HAS("no optimizer group 2");
  EXPECT_CODE(ZINF_INVALID_ARGUMENT, zinf_engine_get_param_group(engine, 2, &got, &err));
  zinf_engine_destroy(engine);
  ClearErr();
}

/* A frozen parameter (trainable 0) is fetched with its values, gets no gradient buffer and
 * keeps its values through a step; a caller built before `trainable` trains every parameter. */
static void TestEngineFrozenParams(void) {
  zinf_engine_options_t o;
  zinf_engine_options_init(&o);
  o.rank = 0;
  o.world_size = 1;
  o.optimizer_threads = 1;
  zinf_engine_t* engine = NULL;
  REQUIRE_OK(zinf_engine_create(
      "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.1}}}", &o, &engine, &err));
  const int64_t shape[] = {6};
  zinf_param_spec_t specs[2];
  zinf_param_spec_init(&specs[0]);
  zinf_param_spec_init(&specs[1]);
  CHECK(specs[0].trainable == 1);
  specs[0].name = "w";
  specs[1].name = "base";
  specs[0].shape = specs[1].shape = shape;
  specs[0].ndim = specs[1].ndim = 1;
  specs[1].init = ZINF_PARAM_INIT_ONES;
  specs[1].trainable = 0;
  int m = -1;
  REQUIRE_OK(zinf_engine_register_module(engine, "m", specs, 2, &m, &err));
  zinf_param_spec_t old;
  zinf_param_spec_init(&old);
  old.struct_size = offsetof(zinf_param_spec_t, trainable);
  old.trainable = 0; /* past struct_size: not read */
  old.name = "old";
  old.shape = shape;
  old.ndim = 1;
  int m_old = -1;
  REQUIRE_OK(zinf_engine_register_module(engine, "old", &old, 1, &m_old, &err));
  REQUIRE_OK(zinf_engine_initialize(engine, &err));
  zinf_tensor_t t[2];
  size_t n = 0;
  for (int mod = 0; mod < 2; ++mod) {
    const int id = mod == 0 ? m : m_old;
    REQUIRE_OK(zinf_engine_fetch(engine, id, t, 2, &n, &err));
    REQUIRE_OK(zinf_engine_gradients(engine, id, t, 2, &n, &err));
    CHECK(t[0].data != NULL);
    if (mod == 0) CHECK(n == 2 && t[1].data == NULL && t[1].numel == 6);
    for (int i = 0; i < 6; ++i) ((float*)t[0].data)[i] = 1.0f;
    EXPECT_OK(zinf_engine_reduce_gradients(engine, id, &err));
    EXPECT_OK(zinf_engine_release(engine, id, &err));
  }
  EXPECT_OK(zinf_engine_step(engine, NULL, &err));
  float v[6];
  EXPECT_OK(zinf_engine_gather_parameter(engine, "base", v, 6, &err));
  for (int i = 0; i < 6; ++i) CHECK(v[i] == 1.0f);
  EXPECT_OK(zinf_engine_gather_parameter(engine, "old", v, 6, &err));
  CHECK(v[0] != 0.0f); /* trained: the step moved it from its initial value */
  zinf_engine_destroy(engine);
  ClearErr();
}

int main(void) {
  char dir[256];
  MakeScratchDir(dir, sizeof(dir));
  TestCommon();
  TestHandlesAndStructs();
  TestPinnedPool();
  TestSwapStore(dir);
  TestTieredStore(dir);
  TestCpuOptimizer();
  TestEngine(dir);
  TestEngineParamGroups();
  TestEngineFrozenParams();
  RemoveScratchDir(dir);
  ClearErr();
  if (g_failures > 0) {
    fprintf(stderr, "c_api_test: %d of %d checks failed\n", g_failures, g_checks);
    return 1;
  }
  printf("c_api_test: all %d checks passed\n", g_checks);
  return 0;
}
