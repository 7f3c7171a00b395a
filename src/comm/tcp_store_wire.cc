// The TcpStore wire format: see tcp_store_wire.h.
#include "comm/tcp_store_wire.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>

namespace zinf::store_wire {
namespace {

void PutU32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

const char* OpName(Op op) {
  switch (op) {
    case Op::kSet:
      return "set";
    case Op::kGet:
      return "get";
    case Op::kAdd:
      return "add";
    case Op::kCheck:
      return "check";
    case Op::kAuth:
      return "auth";
  }
  return "?";
}

// The largest key each op may announce.
uint32_t MaxKey(Op op) { return op == Op::kAuth ? kMaxSecretBytes : kMaxKeyBytes; }

// The value length each op allows: [min, max].
std::pair<uint32_t, uint32_t> ValueRange(Op op) {
  switch (op) {
    case Op::kSet:
      return {0, kMaxValueBytes};
    case Op::kGet:
    case Op::kAdd:
      return {kI64Bytes, kI64Bytes};
    case Op::kCheck:
    case Op::kAuth:
      return {0, 0};
  }
  return {0, 0};
}

}  // namespace

StatusOr<ParseResult> ParseStoreRequest(std::span<const uint8_t> bytes, bool authenticated) {
  ParseResult result;
  if (bytes.size() < kHeaderBytes) return result;  // frame_bytes: the header
  const uint8_t raw_op = bytes[0];
  if (raw_op < static_cast<uint8_t>(Op::kSet) || raw_op > static_cast<uint8_t>(Op::kAuth)) {
    return InvalidArgument(
        fmt::format("TcpStore request op must be in [1, 5], got {}", unsigned{raw_op}));
  }
  const auto op = static_cast<Op>(raw_op);
  if (!authenticated && op != Op::kAuth) {
    return InvalidArgument(
        fmt::format("TcpStore: the first request on a connection must be auth (the secret), got {}",
                    OpName(op)));
  }
  const uint32_t key_bytes = DecodeU32(bytes.data() + 1);
  if (key_bytes > MaxKey(op)) {
    return InvalidArgument(fmt::format("TcpStore {} request: key length must be at most {}, got {}",
                                       OpName(op), MaxKey(op), key_bytes));
  }
  const size_t value_header_end = kHeaderBytes + key_bytes + 4;
  result.frame_bytes = value_header_end;
  if (bytes.size() < value_header_end) return result;
  const uint32_t value_bytes = DecodeU32(bytes.data() + kHeaderBytes + key_bytes);
  const auto [min_value, max_value] = ValueRange(op);
  if (value_bytes < min_value || value_bytes > max_value) {
    return InvalidArgument(
        fmt::format("TcpStore {} request: value length must be in [{}, {}], got {}", OpName(op),
                    min_value, max_value, value_bytes));
  }
  result.frame_bytes = value_header_end + value_bytes;
  if (bytes.size() < result.frame_bytes) return result;
  Request& request = result.request.emplace();
  request.op = op;
  request.key.assign(reinterpret_cast<const char*>(bytes.data() + kHeaderBytes), key_bytes);
  request.value.assign(bytes.begin() + static_cast<ptrdiff_t>(value_header_end),
                       bytes.begin() + static_cast<ptrdiff_t>(result.frame_bytes));
  return result;
}

std::vector<uint8_t> EncodeRequest(Op op, std::string_view key, std::span<const uint8_t> value) {
  std::vector<uint8_t> out;
  out.reserve(kHeaderBytes + key.size() + 4 + value.size());
  out.push_back(static_cast<uint8_t>(op));
  PutU32(out, static_cast<uint32_t>(key.size()));
  out.insert(out.end(), key.begin(), key.end());
  PutU32(out, static_cast<uint32_t>(value.size()));
  out.insert(out.end(), value.begin(), value.end());
  return out;
}

std::vector<uint8_t> EncodeReply(Reply reply, std::span<const uint8_t> payload) {
  std::vector<uint8_t> out;
  out.reserve(kHeaderBytes + payload.size());
  out.push_back(static_cast<uint8_t>(reply));
  PutU32(out, static_cast<uint32_t>(payload.size()));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::vector<uint8_t> EncodeI64(int64_t v) {
  std::vector<uint8_t> out(kI64Bytes);
  for (uint32_t i = 0; i < kI64Bytes; ++i) out[i] = static_cast<uint8_t>(uint64_t(v) >> (8 * i));
  return out;
}

int64_t DecodeI64(std::span<const uint8_t> bytes) {
  if (bytes.size() != kI64Bytes) return 0;
  uint64_t v = 0;
  for (uint32_t i = 0; i < kI64Bytes; ++i) v |= uint64_t{bytes[i]} << (8 * i);
  return static_cast<int64_t>(v);
}

uint32_t DecodeU32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of the longer one is visited, without an early exit.
  unsigned diff = a.size() != b.size() ? 1u : 0u;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const auto x = static_cast<unsigned char>(i < a.size() ? a[i] : 0);
    const auto y = static_cast<unsigned char>(i < b.size() ? b[i] : 0);
    diff |= x ^ y;
  }
  return diff == 0;
}

}  // namespace zinf::store_wire
