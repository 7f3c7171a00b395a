// libFuzzer target: the safetensors export's inputs. A real two-rank checkpoint is written
// once; each input replaces its manifest.json, and `ExportSafetensors` must either write a
// file consistent with the shards or refuse with a Status (and leave no file behind). A
// crash, an exception, a huge allocation or undefined behaviour is a bug.
//
// ZINF_FUZZ_WRITE_SEED=FILE writes the checkpoint's own manifest to FILE (the seed corpus).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "tests/testing/temp_dir.h"

namespace {

std::string g_root;  // the checkpoint directory; its tag is "step-1"

zinf::ckpt::Manifest Reference() {
  zinf::ckpt::Manifest m;
  m.tag = "step-1";
  m.world_size = 2;
  m.step = 1;
  m.shard_elements = 12;
  m.params = {{"a", {3, 5}, 15, 8, 0}, {"b", {7}, 7, 4, 8}};
  m.engine_state =
      R"({"steps": 1, "loss_scale": 1.0, "hysteresis_left": 1, "iteration": 1,
          "last_overflow_iteration": -1, "optimizer": "adamw", "state_count": 2})";
  return m;
}

void Die(const zinf::Status& s) {
  std::fprintf(stderr, "export_fuzz setup: %s\n", s.ToString().c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Removed at exit, with the static objects.
  static const zinf::testing::TempDir root("zinf-export-fuzz");
  g_root = root.path();
  std::filesystem::create_directories(g_root + "/step-1");
  const zinf::ckpt::Manifest m = Reference();
  for (int rank = 0; rank < m.world_size; ++rank) {
    auto w = zinf::ckpt::ShardWriter::Create(g_root + "/step-1/" + zinf::ckpt::ShardFileName(rank),
                                             m.tag, rank);
    if (!w.ok()) Die(w.status());
    std::vector<float> params(m.shard_elements);
    for (size_t i = 0; i < params.size(); ++i) params[i] = rank * 100.0f + i;
    zinf::Status s = w->Append("params", params.data(), params.size() * 4);
    if (s.ok()) s = w->Commit();
    if (!s.ok()) Die(s);
  }
  auto text = zinf::ckpt::SerializeManifest(m);
  if (!text.ok()) Die(text.status());
  if (zinf::Status s = zinf::ckpt::WriteManifest(g_root + "/step-1", m); !s.ok()) Die(s);
  if (zinf::Status s = zinf::ckpt::CommitLatest(g_root, m.tag); !s.ok()) Die(s);
  if (const char* seed = std::getenv("ZINF_FUZZ_WRITE_SEED")) std::ofstream(seed) << *text;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::ofstream(g_root + "/step-1/manifest.json", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  const std::string out = g_root + "/out.safetensors";
  const zinf::Status s = zinf::ckpt::ExportSafetensors(g_root, out, zinf::ElementType::kFp32);
  std::error_code ec;
  if (!s.ok() && std::filesystem::exists(out, ec)) std::abort();  // a refusal leaves nothing
  std::filesystem::remove(out, ec);
  return 0;
}
