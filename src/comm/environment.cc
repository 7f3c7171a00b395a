#include "comm/environment.h"

#include <fmt/core.h>

#include <charconv>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "comm/tcp_store.h"

namespace zinf {
namespace {

std::optional<std::string> Env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

Status ParseInt(const char* name, const std::string& text, int64_t min, int64_t max, int64_t* out) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || v < min || v > max) {
    return InvalidArgument(
        fmt::format("environment variable {} must be an integer in [{}, {}], "
                    "got '{}'",
                    name, min, max, text));
  }
  *out = v;
  return OkStatus();
}

}  // namespace

StatusOr<DistEnvironment> ReadDistEnvironment() {
  DistEnvironment env;
  const auto rank = Env("RANK");
  const auto world = Env("WORLD_SIZE");
  if (rank.has_value() != world.has_value()) {
    return InvalidArgument(
        fmt::format("environment variable {} is set but {} is not; a "
                    "launcher (zinf run, torchrun) sets both",
                    rank ? "RANK" : "WORLD_SIZE", rank ? "WORLD_SIZE" : "RANK"));
  }
  int64_t v = 0;
  if (world) {
    ZINF_RETURN_IF_ERROR(ParseInt("WORLD_SIZE", *world, 1, 1 << 20, &v));
    env.world_size = static_cast<int>(v);
    ZINF_RETURN_IF_ERROR(ParseInt("RANK", *rank, 0, env.world_size - 1, &v));
    env.rank = static_cast<int>(v);
    env.launched = true;
  }
  env.local_world_size = env.world_size;
  if (auto lws = Env("LOCAL_WORLD_SIZE")) {
    ZINF_RETURN_IF_ERROR(ParseInt("LOCAL_WORLD_SIZE", *lws, 1, env.world_size, &v));
    env.local_world_size = static_cast<int>(v);
  }
  env.local_rank = env.rank % env.local_world_size;
  if (auto lr = Env("LOCAL_RANK")) {
    ZINF_RETURN_IF_ERROR(ParseInt("LOCAL_RANK", *lr, 0, env.local_world_size - 1, &v));
    env.local_rank = static_cast<int>(v);
  }
  if (auto addr = Env("MASTER_ADDR")) env.master_addr = *addr;
  if (auto port = Env("MASTER_PORT")) {
    ZINF_RETURN_IF_ERROR(ParseInt("MASTER_PORT", *port, 1, 65535, &v));
    env.master_port = static_cast<uint16_t>(v);
  }
  // Note [Beside torch.distributed]: MASTER_PORT is torch's; zinf's store takes the next.
  if (auto port = Env("ZINF_MASTER_PORT")) {
    ZINF_RETURN_IF_ERROR(ParseInt("ZINF_MASTER_PORT", *port, 1, 65535, &v));
    env.store_port = static_cast<uint16_t>(v);
  } else if (env.master_port == 65535) {
    return InvalidArgument(
        "environment variable MASTER_PORT is 65535, which leaves no port after it for zinf's "
        "rendezvous store; set ZINF_MASTER_PORT, or a lower MASTER_PORT");
  } else {
    env.store_port = static_cast<uint16_t>(env.master_port + 1);
  }
  if (auto secret = Env(kStoreSecretEnv)) env.store_secret = *secret;
  for (const char* name : {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"}) {
    std::optional<std::string> ifname = Env(name);
    if (!ifname || ifname->empty() || (*ifname)[0] == '^') continue;
    std::string first = ifname->substr(0, ifname->find(','));
    if (!first.empty() && first[0] == '=') first.erase(0, 1);  // NCCL's "exact name" prefix
    env.socket_ifname = first;
    break;
  }
  return env;
}

}  // namespace zinf
