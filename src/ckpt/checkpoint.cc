// The checkpoint format's checks and names, shared by its reading (checkpoint_read.cc) and
// writing (checkpoint_write.cc) halves.
#include <fmt/core.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_internal.h"
#include "core/config_reader.h"
#include "core/crc32c.h"

namespace zinf::ckpt {
namespace internal {

std::string Dump(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string ManifestChecksum(const nlohmann::json& without_checksum) {
  const std::string canonical = Dump(without_checksum);
  return fmt::format("crc32c:{:08x}", Crc32c(canonical.data(), canonical.size()));
}

StatusOr<nlohmann::json> ParseObject(std::string_view text, std::string_view what) {
  ZINF_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, what));
  if (!j.is_object()) {
    return InvalidArgument(fmt::format("{} must be a JSON object, got {}", what, DescribeJson(j)));
  }
  return j;
}

}  // namespace internal

namespace {

using internal::Dump;
using internal::kMaxShardElements;
using internal::kMaxWorldSize;
using internal::ParseObject;

// The engine's scalars (ScalarState in src/zero/engine.cc) that loading reads, with their
// types: an edited engine_state is refused here rather than throwing in the engine.
Status CheckEngineState(const nlohmann::json& state) {
  auto field = [&](const char* key) -> const nlohmann::json* {
    auto it = state.find(key);
    return it == state.end() ? nullptr : &*it;
  };
  auto in_range = [](const nlohmann::json* v, int64_t lo, int64_t hi) {
    if (v == nullptr || !v->is_number_integer()) return false;
    if (v->is_number_unsigned()) return v->get<uint64_t>() <= static_cast<uint64_t>(hi);
    return v->get<int64_t>() >= lo && v->get<int64_t>() <= hi;
  };
  auto wrong = [&](const char* key, std::string_view expected) {
    return InvalidArgument(fmt::format("engine_state.{} must be {}, got {}", key, expected,
                                       field(key) ? DescribeJson(*field(key)) : "nothing"));
  };
  for (const char* key : {"steps", "iteration", "last_overflow_iteration"}) {
    if (!in_range(field(key), INT64_MIN, INT64_MAX)) return wrong(key, "an integer");
  }
  for (const char* key : {"hysteresis_left", "state_count"}) {
    if (!in_range(field(key), INT32_MIN, INT32_MAX)) return wrong(key, "a 32-bit integer");
  }
  if (field("loss_scale") == nullptr || !field("loss_scale")->is_number()) {
    return wrong("loss_scale", "a number");
  }
  if (field("optimizer") == nullptr || !field("optimizer")->is_string()) {
    return wrong("optimizer", "a string");
  }
  return OkStatus();
}

}  // namespace

std::string ShardFileName(int rank) { return fmt::format("rank-{:05d}.zshard", rank); }

Status CheckTag(std::string_view tag) {
  if (tag.empty() || tag.size() > 255 || tag[0] == '.' || tag.find('/') != tag.npos ||
      tag.find('\0') != tag.npos) {
    return InvalidArgument(fmt::format(
        "checkpoint tag '{}' must be a plain directory name (1 to 255 bytes, no '/', not "
        "starting with '.')",
        tag.substr(0, 300)));
  }
  // DIR/latest is the pointer file, and names ending in .tmp are files being written: a tag
  // of either name could never commit.
  if (tag == "latest" || tag.ends_with(".tmp")) {
    return InvalidArgument(fmt::format(
        "checkpoint tag '{}' is reserved: 'latest' is the pointer to the newest checkpoint and "
        "'.tmp' names files being written",
        tag));
  }
  return OkStatus();
}

uint64_t BufferDtypeBytes(std::string_view dtype) {
  for (auto [name, bytes] :
       {std::pair{"F32", 4}, std::pair{"F64", 8}, std::pair{"F16", 2}, std::pair{"BF16", 2},
        std::pair{"I64", 8}, std::pair{"I32", 4}, std::pair{"I16", 2}, std::pair{"I8", 1},
        std::pair{"U8", 1}, std::pair{"BOOL", 1}}) {
    if (dtype == name) return static_cast<uint64_t>(bytes);
  }
  return 0;
}

Status ValidateManifest(const Manifest& m) {
  ZINF_RETURN_IF_ERROR(CheckTag(m.tag));
  if (m.world_size < 1 || m.world_size > kMaxWorldSize) {
    return InvalidArgument(
        fmt::format("world_size must be in [1, {}], got {}", kMaxWorldSize, m.world_size));
  }
  if (m.step < 0) return InvalidArgument(fmt::format("step must be >= 0, got {}", m.step));
  if (m.shard_elements > kMaxShardElements || m.frozen_elements > kMaxShardElements) {
    return InvalidArgument(
        fmt::format("shard_elements and frozen_elements must be at most 2^60 each, got {} and {}",
                    m.shard_elements, m.frozen_elements));
  }
  if (m.params.empty()) return InvalidArgument("the parameter list is empty");
  const uint64_t world = static_cast<uint64_t>(m.world_size);
  std::set<std::string_view> names;
  // [flat_offset, flat_offset + shard_size) of each parameter that has elements, and its index.
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, size_t>> ranges;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const ManifestParam& p = m.params[i];
    auto bad = [&](const std::string& what) {
      return InvalidArgument(fmt::format("parameter {} '{}': {}", i, p.name, what));
    };
    if (p.name.empty()) return bad("the name is empty");
    if (!names.insert(p.name).second) return bad("the name appears twice");
    uint64_t product = 1;
    for (int64_t dim : p.shape) {
      if (dim < 0) {
        return bad(fmt::format("shape {} has a negative dimension", Dump(nlohmann::json(p.shape))));
      }
      if (__builtin_mul_overflow(product, static_cast<uint64_t>(dim), &product)) {
        return bad(
            fmt::format("shape {} has more than 2^64 elements", Dump(nlohmann::json(p.shape))));
      }
    }
    if (product != p.numel) {
      return bad(fmt::format("shape {} has {} elements, numel is {}", Dump(nlohmann::json(p.shape)),
                             product, p.numel));
    }
    const uint64_t shard = p.numel / world + (p.numel % world != 0 ? 1 : 0);
    if (p.shard_size != shard) {
      return bad(fmt::format("shard_size is {}, expected {} (numel {} over {} ranks)", p.shard_size,
                             shard, p.numel, world));
    }
    // A trainable parameter's elements lie in the state sections too; a frozen one's past
    // them, in "params" alone.
    const uint64_t begin = p.frozen ? m.shard_elements : 0;
    const uint64_t end = p.frozen ? m.params_elements() : m.shard_elements;
    if (p.flat_offset < begin || p.flat_offset > end || p.shard_size > end - p.flat_offset) {
      return bad(fmt::format("elements [{}, {} + {}) lie outside [{}, {}), a rank's {}",
                             p.flat_offset, p.flat_offset, p.shard_size, begin, end,
                             p.frozen ? "frozen elements" : "shard"));
    }
    if (p.shard_size > 0) ranges.push_back({{p.flat_offset, p.shard_size}, i});
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t k = 1; k < ranges.size(); ++k) {
    const auto& [prev, a] = ranges[k - 1];
    const auto& [next, b] = ranges[k];
    if (next.first < prev.first + prev.second) {
      return InvalidArgument(fmt::format(
          "parameter {} '{}' (elements [{}, {})) overlaps parameter {} '{}' (elements [{}, {}))", b,
          m.params[b].name, next.first, next.first + next.second, a, m.params[a].name, prev.first,
          prev.first + prev.second));
    }
  }
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const ManifestBuffer& b = m.buffers[i];
    auto bad = [&](const std::string& what) {
      return InvalidArgument(fmt::format("buffer {} '{}': {}", i, b.name, what));
    };
    if (b.name.empty()) return bad("the name is empty");
    if (!names.insert(b.name).second) return bad("the name appears twice (or is a parameter's)");
    const uint64_t element = BufferDtypeBytes(b.dtype);
    if (element == 0) {
      return bad(
          fmt::format("dtype \"{}\" is not one of F32, F64, F16, BF16, I64, I32, I16, "
                      "I8, U8, BOOL",
                      b.dtype.substr(0, 20)));
    }
    uint64_t product = element;
    for (int64_t dim : b.shape) {
      if (dim < 0 || __builtin_mul_overflow(product, static_cast<uint64_t>(dim), &product) ||
          product > kMaxShardElements) {
        return bad(fmt::format("shape {} is negative or too large", Dump(nlohmann::json(b.shape))));
      }
    }
    if (product != b.bytes) {
      return bad(fmt::format("shape {} of {} is {} bytes, the manifest says {}",
                             Dump(nlohmann::json(b.shape)), b.dtype, product, b.bytes));
    }
  }
  ZINF_ASSIGN_OR_RETURN(const nlohmann::json engine, ParseObject(m.engine_state, "engine_state"));
  ZINF_RETURN_IF_ERROR(CheckEngineState(engine));
  ZINF_RETURN_IF_ERROR(ParseObject(m.client_state, "client_state").status());
  ZINF_RETURN_IF_ERROR(ParseObject(m.metadata, "metadata").status());
  return OkStatus();
}

}  // namespace zinf::ckpt
