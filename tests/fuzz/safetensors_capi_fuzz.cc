// libFuzzer target: a whole safetensors file, hostile or damaged, loaded through the C ABI
// (zinf_engine_load_safetensors) into an engine of two parameters, as a trainer calling zinf
// from C or Python does with a downloaded weights file. The input is the file's bytes. Any
// input must load or give an error code with a message; a crash, an abort, a leak or undefined
// behaviour is a bug, and so is a load that "succeeds" without the file naming both tensors.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "zinf/c_api.h"

namespace {

zinf_engine_t* MakeEngine() {
  zinf_engine_options_t options;
  zinf_engine_options_init(&options);
  options.rank = 0;
  options.world_size = 1;
  options.optimizer_threads = 1;
  zinf_engine_t* engine = nullptr;
  char* err = nullptr;
  const char* config =
      R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})";
  if (zinf_engine_create(config, &options, &engine, &err) != ZINF_OK) {
    std::fprintf(stderr, "engine: %s\n", err);
    std::abort();
  }
  const int64_t w_shape[2] = {4, 3}, b_shape[1] = {4};
  zinf_param_spec_t specs[2];
  for (zinf_param_spec_t& s : specs) zinf_param_spec_init(&s);
  specs[0].name = "fc.weight";
  specs[0].shape = w_shape;
  specs[0].ndim = 2;
  specs[1].name = "fc.bias";
  specs[1].shape = b_shape;
  specs[1].ndim = 1;
  int module = 0;
  if (zinf_engine_register_module(engine, "fc", specs, 2, &module, &err) != ZINF_OK ||
      zinf_engine_initialize(engine, &err) != ZINF_OK) {
    std::fprintf(stderr, "engine: %s\n", err);
    std::abort();
  }
  return engine;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static zinf_engine_t* engine = MakeEngine();
  static const int fd = memfd_create("safetensors", 0);
  if (fd < 0 || ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) {
    std::abort();
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  char* err = nullptr;
  const zinf_code_t code = zinf_engine_load_safetensors(engine, path.c_str(), &err);
  if (code == ZINF_OK) {
    const std::string bytes(reinterpret_cast<const char*>(data), size);
    if (bytes.find("fc.weight") == std::string::npos || bytes.find("fc.bias") == std::string::npos)
      std::abort();
  } else if (err == nullptr || code == ZINF_INTERNAL) {
    std::abort();
  }
  zinf_free(err);
  return 0;
}
