// libFuzzer target: the bytes any local process can send to the rendezvous store, through the
// frame parser the server runs (src/comm/tcp_store_wire.h). The first input byte says whether
// the connection has authenticated; the rest is fed as the server would, growing the buffer to
// the size the parser asks for. Every frame must be parsed within its limits or refused with a
// Status; a crash, a read past the bytes, a size beyond the limits or a frame that does not
// survive re-encoding is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "comm/tcp_store_wire.h"

namespace wire = zinf::store_wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  bool authenticated = data[0] & 1;
  std::span<const uint8_t> rest(data + 1, size - 1);
  while (!rest.empty()) {
    size_t have = std::min<size_t>(wire::kHeaderBytes, rest.size());
    for (;;) {
      auto parsed = wire::ParseStoreRequest(rest.first(have), authenticated);
      if (!parsed.ok()) return 0;  // the server closes the connection
      const size_t limit = wire::kHeaderBytes + 2 * 4 + wire::kMaxKeyBytes + wire::kMaxValueBytes;
      if (parsed->frame_bytes > limit) std::abort();
      if (!parsed->request.has_value()) {
        if (parsed->frame_bytes <= have || parsed->frame_bytes > rest.size()) return 0;
        have = parsed->frame_bytes;  // read more, as the server does
        continue;
      }
      const wire::Request& r = *parsed->request;
      if (r.key.size() > wire::kMaxKeyBytes || r.value.size() > wire::kMaxValueBytes) std::abort();
      // What the client library encodes, the parser reads back whole.
      const std::vector<uint8_t> again = wire::EncodeRequest(r.op, r.key, r.value);
      auto reparsed = wire::ParseStoreRequest(again, authenticated);
      if (!reparsed.ok() || !reparsed->request.has_value() || reparsed->request->key != r.key ||
          reparsed->request->value != r.value) {
        std::abort();
      }
      if (r.op == wire::Op::kAuth) authenticated = true;
      rest = rest.subspan(std::min(parsed->frame_bytes, rest.size()));
      break;
    }
  }
  return 0;
}
