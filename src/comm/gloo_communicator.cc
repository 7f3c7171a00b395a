// The Gloo backend: CPU buffers over TCP, bootstrapped through TcpStore. Every transfer is
// one of Gloo's collectives (ring all-reduce, ring all-gather, all-to-all, one-to-all
// broadcast); reduce-scatter is Gloo's all-to-all plus a local reduction (Note [Gloo
// reduce-scatter]). Gloo's exceptions stop at this file and become Status values.
//
// Note [Gloo reduce-scatter]
// Gloo's ReduceScatterHalvingDoubling is unsafe: at its end every rank but 0 copies its
// reduced slice to the front of the buffer while its first step's send from that region may
// still be in flight (tcp::Pair finishes a send in the background once the socket buffer is
// full), so a peer can receive a partly overwritten gradient. That was a silent, load-
// dependent corruption of gradients with buckets larger than the socket buffer. Instead,
// each rank sends slice r of its buffer to rank r with Gloo's all-to-all, which never writes
// its input and waits for its sends, and adds the world_size slices it receives locally in
// rank order. It moves the same bytes as a reduce-scatter, in one round (fine for the few
// ranks of a node), and its fixed order ((s0 + s1) + s2) + ... gives the same bits as one
// rank accumulating the same gradients, whatever the load or the bucket size.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <algorithm>
#include <csignal>
#include <cstring>

#include "comm/communicator.h"
#include "comm/tcp_store.h"

namespace zinf {
namespace {

// Carries a Status through Gloo, which expects stores to throw.
struct StoreFailure : std::runtime_error {
  explicit StoreFailure(Status s) : std::runtime_error(s.ToString()), status(std::move(s)) {}
  Status status;
};

class TcpStoreAdapter final : public gloo::rendezvous::Store {
 public:
  TcpStoreAdapter(TcpStore& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Status s = store_.Set(prefix_ + key, std::vector<uint8_t>(data.begin(), data.end()));
    if (!s.ok()) throw StoreFailure(std::move(s));
  }

  std::vector<char> get(const std::string& key) override {
    StatusOr<std::vector<uint8_t>> v = store_.Get(prefix_ + key);
    if (!v.ok()) throw StoreFailure(v.status());
    return std::vector<char>(v->begin(), v->end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    Status s = store_.Wait(full, timeout);
    if (!s.ok()) throw StoreFailure(std::move(s));
  }

 private:
  TcpStore& store_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
};

// The ranks a collective of this rank waits on, for its error messages: Gloo's own say only
// that an operation timed out. Ring algorithms (all-gather, all-reduce) exchange with the two
// neighbours; the others (all-to-all, barrier, broadcast) with every rank.
std::string PeersText(int rank, int world, bool ring) {
  std::vector<int> peers;
  if (ring) {
    for (int p : {(rank + world - 1) % world, (rank + 1) % world}) {
      if (p != rank && std::find(peers.begin(), peers.end(), p) == peers.end()) peers.push_back(p);
    }
  } else {
    for (int p = 0; p < world; ++p) {
      if (p != rank) peers.push_back(p);
    }
  }
  if (peers.size() == 1) return fmt::format("rank {}", peers[0]);
  if (peers.size() > 8) return fmt::format("{} peer ranks", peers.size());
  return fmt::format("one of ranks {}", fmt::join(peers, ", "));
}

// Runs a Gloo call, turning its exceptions into a Status that names `peers` (PeersText).
template <typename Fn>
Status GlooCall(Fn&& fn, std::chrono::milliseconds timeout, const std::string& peers = "") {
  try {
    fn();
    return OkStatus();
  } catch (const StoreFailure& e) {
    return e.status;
  } catch (const gloo::IoException& e) {
    const std::string what = e.what();
    if (what.find("imed out") != std::string::npos) {
      return DeadlineExceeded(fmt::format(
          "no progress within {} ms waiting on {}: a peer rank may have died, stalled or become "
          "unreachable: {}",
          timeout.count(), peers.empty() ? "the peer ranks" : peers, what));
    }
    return Unavailable(fmt::format("a peer rank ({}) died or is unreachable: {}",
                                   peers.empty() ? "the peer ranks" : peers, what));
  } catch (const gloo::EnforceNotMet& e) {
    return InvalidArgument(fmt::format("Gloo rejected the call: {}", e.what()));
  } catch (const std::exception& e) {
    return Internal(fmt::format("Gloo: {}", e.what()));
  }
}

// Calls fn with a value of the C++ type a reduction over `type` adds in.
template <typename Fn>
Status WithType(ElementType type, Fn&& fn) {
  switch (type) {
    case ElementType::kFp32:
      return fn(float{});
    case ElementType::kFp64:
      return fn(double{});
    case ElementType::kInt64:
      return fn(int64_t{});
    case ElementType::kBf16:
    case ElementType::kFp16:
      return InvalidArgument(fmt::format("the Gloo backend does not reduce {}; reduce in float32",
                                         ElementTypeName(type)));
  }
  return InvalidArgument("unknown ElementType");
}

template <typename T>
gloo::AllreduceOptions::Func ReduceFunc(ReduceOp op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  switch (op) {
    case ReduceOp::kSum:
      return static_cast<Fn>(&gloo::sum<T>);
    case ReduceOp::kMax:
      return static_cast<Fn>(&gloo::max<T>);
    case ReduceOp::kMin:
      return static_cast<Fn>(&gloo::min<T>);
  }
  return static_cast<Fn>(&gloo::sum<T>);
}

// out[i] = slices[0][i] op slices[1][i] op ... in rank order, each slice n elements long.
template <typename T>
void ReduceInRankOrder(const T* slices, size_t world, size_t n, ReduceOp op, T* out) {
  std::memcpy(out, slices, n * sizeof(T));
  for (size_t r = 1; r < world; ++r) {
    const T* s = slices + r * n;
    switch (op) {
      case ReduceOp::kSum:
        for (size_t i = 0; i < n; ++i) out[i] += s[i];
        break;
      case ReduceOp::kMax:
        for (size_t i = 0; i < n; ++i) out[i] = std::max(out[i], s[i]);
        break;
      case ReduceOp::kMin:
        for (size_t i = 0; i < n; ++i) out[i] = std::min(out[i], s[i]);
        break;
    }
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const GlooOptions& options, std::shared_ptr<gloo::Context> context)
      : Communicator(options.rank, options.world_size),
        timeout_(options.timeout),
        context_(std::move(context)) {
    StartWorker();
  }
  ~GlooCommunicator() override { StopWorker(); }

  std::string_view backend() const override { return "gloo"; }

 protected:
  Status DoAllReduce(void* data, size_t count, ElementType type, ReduceOp op) override {
    return WithType(type, [&](auto zero) {
      using T = decltype(zero);
      return GlooCall(
          [&] {
            gloo::AllreduceOptions opts(context_);
            opts.setOutput(static_cast<T*>(data), count);
            opts.setReduceFunction(ReduceFunc<T>(op));
            opts.setTag(NextTag());
            opts.setTimeout(timeout_);
            gloo::allreduce(opts);
          },
          timeout_, PeersText(rank(), world_size(), /*ring=*/true));
    });
  }

  // Gathers and broadcasts move bytes: any element type.
  Status DoAllGather(const void* send, void* recv, size_t count, ElementType type) override {
    const size_t bytes = count * ElementSize(type);
    return GlooCall(
        [&] {
          gloo::AllgatherOptions opts(context_);
          opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(send)), bytes);
          opts.setOutput(static_cast<uint8_t*>(recv), bytes * world_size());
          opts.setTag(NextTag());
          opts.setTimeout(timeout_);
          gloo::allgather(opts);
        },
        timeout_, PeersText(rank(), world_size(), /*ring=*/true));
  }

  Status DoReduceScatter(void* send, void* recv, size_t count, ElementType type,
                         ReduceOp op) override {
    return WithType(type, [&](auto zero) {
      using T = decltype(zero);
      const size_t world = static_cast<size_t>(world_size());
      // The all-to-all's output holds world pieces; pieces bound that scratch memory.
      const size_t piece = std::clamp<size_t>(kMaxAllToAllBytes / (world * sizeof(T)), 1, count);
      const T* in = static_cast<const T*>(send);
      T* out = static_cast<T*>(recv);
      gathered_.resize(world * piece * sizeof(T));
      if (piece < count) packed_.resize(world * piece * sizeof(T));
      for (size_t at = 0; at < count; at += piece) {
        const size_t n = std::min(piece, count - at);
        // Rank r's share of this piece must sit at r * n of the all-to-all's input.
        const T* input = in;
        if (n < count) {
          T* packed = reinterpret_cast<T*>(packed_.data());
          for (size_t r = 0; r < world; ++r) {
            std::memcpy(packed + r * n, in + r * count + at, n * sizeof(T));
          }
          input = packed;
        }
        T* gathered = reinterpret_cast<T*>(gathered_.data());
        Status s = GlooCall(
            [&] {
              gloo::AlltoallOptions opts(context_);
              opts.setInput(const_cast<T*>(input), world * n);
              opts.setOutput(gathered, world * n);
              opts.setTag(NextTag());
              opts.setTimeout(timeout_);
              gloo::alltoall(opts);
            },
            timeout_, PeersText(rank(), world_size(), /*ring=*/false));
        if (!s.ok()) return s;
        ReduceInRankOrder(gathered, world, n, op, out + at);
      }
      return OkStatus();
    });
  }

  Status DoBroadcast(void* data, size_t count, ElementType type, int root) override {
    return GlooCall(
        [&] {
          gloo::BroadcastOptions opts(context_);
          opts.setOutput(static_cast<uint8_t*>(data), count * ElementSize(type));
          opts.setRoot(root);
          opts.setTag(NextTag());
          opts.setTimeout(timeout_);
          gloo::broadcast(opts);
        },
        timeout_, PeersText(rank(), world_size(), /*ring=*/false));
  }

  Status DoBarrier() override {
    return GlooCall(
        [&] {
          gloo::BarrierOptions opts(context_);
          opts.setTag(NextTag());
          opts.setTimeout(timeout_);
          gloo::barrier(opts);
        },
        timeout_, PeersText(rank(), world_size(), /*ring=*/false));
  }

 private:
  // Every rank runs the same collectives in the same order, so the counters agree.
  uint32_t NextTag() { return next_tag_++; }

  // Bounds a reduce-scatter's scratch memory: larger reductions run in pieces.
  static constexpr size_t kMaxAllToAllBytes = 32ull << 20;

  const std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t next_tag_ = 1;
  // Reduce-scatter scratch, reused (only the worker thread runs collectives).
  std::vector<uint8_t> packed_;
  std::vector<uint8_t> gathered_;
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(TcpStore& store,
                                                               const GlooOptions& options) {
  if (options.world_size < 1) {
    return InvalidArgument(fmt::format("world_size must be >= 1, got {}", options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgument(
        fmt::format("rank must be in [0, {}), got {}", options.world_size, options.rank));
  }
  if (options.timeout.count() <= 0) {
    return InvalidArgument(fmt::format("timeout must be > 0 ms, got {}", options.timeout.count()));
  }
  // Gloo writes to sockets without MSG_NOSIGNAL: when a peer dies, SIGPIPE would kill this
  // rank instead of failing the collective with a clear error. A handler the program
  // installed itself is left alone.
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }
  std::shared_ptr<gloo::rendezvous::Context> context;
  Status status = GlooCall(
      [&] {
        gloo::transport::tcp::attr attr;
        if (!options.iface.empty()) {
          attr.iface = options.iface;
        } else {
          attr.hostname = options.host.empty() ? store.local_address() : options.host;
        }
        auto device = gloo::transport::tcp::CreateDevice(attr);
        context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
        context->setTimeout(options.timeout);
        TcpStoreAdapter adapter(store, fmt::format("gloo/{}/", options.group_name),
                                options.timeout);
        context->connectFullMesh(adapter, device);
      },
      options.timeout);
  if (!status.ok()) {
    return std::move(status).WithContext(fmt::format("rank {} of {} connecting Gloo group '{}'",
                                                     options.rank, options.world_size,
                                                     options.group_name));
  }
  return std::unique_ptr<Communicator>(std::make_unique<GlooCommunicator>(options, context));
}

}  // namespace zinf
