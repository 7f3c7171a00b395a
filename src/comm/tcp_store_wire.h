// The TcpStore wire format (private to src/comm): frame encoding and a parser that checks every
// length against its limit as soon as the length is known, before the caller reads or allocates
// what it announces. Pure functions over bytes, no sockets: the server, the tests and a fuzzer
// call the same code.
//
// A request is [u8 op][u32 key length][key][u32 value length][value]; a reply is
// [u8 status][u32 length][payload]. Integers are little-endian. The first request on every
// connection is kAuth carrying the job's secret as its key (empty when the job has none).
//
// Thread-safety: stateless; every function may be called from any thread.
#ifndef ZINF_COMM_TCP_STORE_WIRE_H_
#define ZINF_COMM_TCP_STORE_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf::store_wire {

enum class Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kAuth = 5 };
enum class Reply : uint8_t {
  kOk = 0,
  kTimeout = 1,     // Get: the key was not set in time
  kMissing = 2,     // Check: the key is not set
  kBadRequest = 3,  // the frame broke a rule; the server closes the connection
  kDenied = 4,      // wrong secret, or a request before kAuth; the server closes
  kBusy = 5,        // too many clients; the server closes, the client may retry
  kFull = 6,        // Set/Add: the store holds its byte limit already
};

// Rendezvous data is small (Gloo addresses: ~150 bytes per peer; the NCCL id: 128 bytes).
inline constexpr size_t kHeaderBytes = 5;  // op and key length
inline constexpr uint32_t kMaxKeyBytes = 4096;
inline constexpr uint32_t kMaxSecretBytes = 256;
inline constexpr uint32_t kMaxValueBytes = 4 << 20;
// The most the server holds: its keys and values together (kFull beyond).
inline constexpr uint64_t kMaxStoreBytes = uint64_t{256} << 20;
// Get carries its timeout in ms, Add its delta: one little-endian int64 each.
inline constexpr uint32_t kI64Bytes = 8;

struct Request {
  Op op = Op::kSet;
  std::string key;  // the secret for kAuth
  std::vector<uint8_t> value;
};

// What ParseStoreRequest made of the bytes received so far on a connection.
struct ParseResult {
  // The frame's size as far as it is known: while `request` is empty, the caller reads until it
  // holds this many bytes and calls again (it never exceeds what the limits allow). With a
  // request, the bytes the frame used.
  size_t frame_bytes = kHeaderBytes;
  std::optional<Request> request;
};

// Parses the frame at the start of `bytes` (which may hold only part of it). Until a
// connection is `authenticated`, kAuth is the only op allowed, so that an unauthenticated peer
// can make the server buffer at most a secret's worth. InvalidArgument names the unknown or
// unexpected op, or the field, its announced length and the limit for that op; the connection
// that sent it is to be refused. Reads nothing past bytes.data() + bytes.size().
StatusOr<ParseResult> ParseStoreRequest(std::span<const uint8_t> bytes, bool authenticated);

// The frames, as the client sends them and the server answers.
std::vector<uint8_t> EncodeRequest(Op op, std::string_view key, std::span<const uint8_t> value);
std::vector<uint8_t> EncodeReply(Reply reply, std::span<const uint8_t> payload);

std::vector<uint8_t> EncodeI64(int64_t v);
// 0 unless `bytes` holds exactly 8 bytes.
int64_t DecodeI64(std::span<const uint8_t> bytes);
uint32_t DecodeU32(const uint8_t* p);

// Equality whose running time depends on the lengths only, not on where the bytes differ, so
// that timing does not reveal how much of a guessed secret was right.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace zinf::store_wire

#endif  // ZINF_COMM_TCP_STORE_WIRE_H_
