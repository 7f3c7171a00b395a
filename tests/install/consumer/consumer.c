/* A C program using an installed zinf through its C ABI: a pinned pool block written to and
 * read back from a swap file, and one AdamW step. Prints "consumer_c: ok" on success.
 * Usage: consumer_c SCRATCH_DIR */
#include <stdio.h>
#include <string.h>

#include <zinf/c_api.h>

static int Fail(const char* what, char* err) {
  fprintf(stderr, "consumer_c: %s: %s\n", what, err != NULL ? err : "(no message)");
  zinf_free(err);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: consumer_c SCRATCH_DIR\n");
    return 2;
  }
  char* err = NULL;
  zinf_pinned_pool_options_t po;
  zinf_pinned_pool_options_init(&po);
  po.budget_bytes = 1 << 20;
  po.pinned = 0;
  zinf_pinned_pool_t* pool = NULL;
  if (zinf_pinned_pool_create(&po, &pool, &err) != ZINF_OK) return Fail("pool", err);
  void* src = NULL;
  void* dst = NULL;
  if (zinf_pinned_pool_alloc(pool, 65536, &src, &err) != ZINF_OK ||
      zinf_pinned_pool_alloc(pool, 65536, &dst, &err) != ZINF_OK) {
    return Fail("alloc", err);
  }
  memset(src, 0x5a, 65536);

  zinf_swap_store_options_t so;
  zinf_swap_store_options_init(&so);
  const char* paths[] = {argv[1]};
  so.paths = paths;
  so.path_count = 1;
  so.capacity_bytes = 1 << 20;
  zinf_swap_store_t* swap = NULL;
  if (zinf_swap_store_open(&so, &swap, &err) != ZINF_OK) return Fail("swap store", err);
  zinf_swap_extent_t extent;
  zinf_completion_t* done = NULL;
  if (zinf_swap_store_allocate(swap, 65536, "x", &extent, &err) != ZINF_OK ||
      zinf_swap_store_write_async(swap, extent, src, &done, &err) != ZINF_OK ||
      zinf_completion_wait(done, &err) != ZINF_OK) {
    return Fail("write", err);
  }
  zinf_completion_destroy(done);
  if (zinf_swap_store_read(swap, extent, dst, &err) != ZINF_OK) return Fail("read", err);
  if (memcmp(src, dst, 65536) != 0) return Fail("read back", NULL);

  zinf_cpu_optimizer_t* opt = NULL;
  if (zinf_cpu_optimizer_create(NULL, &opt, &err) == ZINF_OK) return Fail("NULL options", NULL);
  zinf_cpu_optimizer_options_t oo;
  zinf_cpu_optimizer_options_init(&oo);
  oo.threads = 1;
  zinf_hyper_params_t hp;
  zinf_hyper_params_init(&hp, ZINF_OPTIMIZER_ADAMW);
  int group = 0;
  if (zinf_cpu_optimizer_create(&oo, &opt, &err) != ZINF_OK ||
      zinf_cpu_optimizer_add_param_group(opt, &hp, &group, &err) != ZINF_OK) {
    return Fail("optimizer", err);
  }
  float p[4] = {1, 1, 1, 1}, g[4] = {1, -1, 1, -1}, m[4] = {0}, v[4] = {0};
  zinf_optimizer_span_t span;
  zinf_optimizer_span_init(&span);
  span.params = p;
  span.grads = g;
  span.state0 = m;
  span.state1 = v;
  span.count = 4;
  if (zinf_cpu_optimizer_step(opt, group, &span, 1.0f, 0, NULL, &err) != ZINF_OK) {
    return Fail("step", err);
  }
  if (!(p[0] < 1.0f && p[1] > 1.0f)) return Fail("step direction", NULL);

  zinf_cpu_optimizer_destroy(opt);
  zinf_swap_store_destroy(swap);
  zinf_pinned_pool_destroy(pool);
  zinf_free(err);
  printf("consumer_c: ok (zinf %s)\n", zinf_version());
  return 0;
}
