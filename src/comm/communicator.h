// Communicator: the collectives the ZeRO engine needs (all-gather, reduce-scatter,
// all-reduce, broadcast, barrier) over one process group, with backends Local (one rank),
// Gloo (CPU buffers over TCP) and, where built, NCCL (device buffers). zinf never implements a
// collective itself: each backend calls its library's.
//
// Every collective runs on the communicator's own thread, in submission order, so that the
// asynchronous forms (which return a CommWork to wait on) and the blocking ones never race on
// the backend's connections. All ranks of the group must submit the same collectives in the
// same order with the same sizes, as with every collective library.
//
// Failure: a collective that fails (a peer rank died, a timeout, a size mismatch) makes the
// communicator's error sticky: every later call returns it, naming this rank and what was
// being done. Timeouts come from CommOptions::timeout, so a dead peer ends in an error,
// never a hang.
//
// Thread-safety: all methods may be called from any thread.
#ifndef ZINF_COMM_COMMUNICATOR_H_
#define ZINF_COMM_COMMUNICATOR_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf {

class Event;
class TcpStore;

// Collectives take ElementType (zinf/dtype.h). bf16 and fp16 move parameters in their
// compute precision; Gloo gathers and broadcasts them but does not reduce them (NCCL does).

enum class ReduceOp { kSum, kMax, kMin };

// Completion of one asynchronous collective.
class CommWork {
 public:
  // Blocks until the collective has run; returns its status.
  Status Wait();
  bool Done() const;

 private:
  friend class Communicator;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  virtual std::string_view backend() const = 0;

  // In place: every rank's `data` becomes the reduction over all ranks.
  Status AllReduce(void* data, size_t count, ElementType type, ReduceOp op);
  // `recv` (world_size * count elements) gets every rank's `send` (count elements) in rank
  // order.
  Status AllGather(const void* send, void* recv, size_t count, ElementType type);
  // Every rank passes `send` of world_size * count elements; `recv` (count elements) gets
  // this rank's slice of the reduction. `send` may be modified (Gloo reduces in place).
  Status ReduceScatter(void* send, void* recv, size_t count, ElementType type, ReduceOp op);
  // Every rank's `data` becomes root's.
  Status Broadcast(void* data, size_t count, ElementType type, int root);
  Status Barrier();

  // Asynchronous forms: the buffers must stay valid and untouched until Wait() returns.
  // ReduceScatterAsync's `after`, when set, is device work that writes `send` (recorded on
  // one of the device's streams): the collective waits for it on the communicator's thread,
  // so the caller does not. It must stay valid until Wait() returns.
  std::shared_ptr<CommWork> AllReduceAsync(void* data, size_t count, ElementType type, ReduceOp op);
  std::shared_ptr<CommWork> AllGatherAsync(const void* send, void* recv, size_t count,
                                           ElementType type);
  std::shared_ptr<CommWork> ReduceScatterAsync(void* send, void* recv, size_t count,
                                               ElementType type, ReduceOp op,
                                               Event* after = nullptr);

  // The sticky error, or OK.
  Status status() const;

 protected:
  Communicator(int rank, int world_size);
  // Starts the worker; derived constructors call it last. Derived destructors call
  // StopWorker() first, so that no collective runs on a half-destroyed object.
  void StartWorker();
  void StopWorker();

  // The backend's blocking collectives, run only on the worker thread. Arguments are
  // already checked.
  virtual Status DoAllReduce(void* data, size_t count, ElementType type, ReduceOp op) = 0;
  virtual Status DoAllGather(const void* send, void* recv, size_t count, ElementType type) = 0;
  virtual Status DoReduceScatter(void* send, void* recv, size_t count, ElementType type,
                                 ReduceOp op) = 0;
  virtual Status DoBroadcast(void* data, size_t count, ElementType type, int root) = 0;
  virtual Status DoBarrier() = 0;

 private:
  std::shared_ptr<CommWork> Submit(std::string what, std::function<Status()> fn);
  void Serve();

  const int rank_;
  const int world_size_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<CommWork>, std::function<Status()>>> queue_;
  bool stopping_ = false;
  Status sticky_;
  std::thread worker_;
};

// One rank: every collective is a copy (or nothing).
StatusOr<std::unique_ptr<Communicator>> CreateLocalCommunicator();

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  // Where this rank's Gloo pairs listen, which is also the address its peers are told to
  // connect to. A network interface's name (`iface`, from GLOO_SOCKET_IFNAME) comes first;
  // else `host`, an address of this machine; else, empty, the local address of this rank's
  // connection to the store, which is on the interface that reaches the master. Binding
  // loopback would tell peers on other hosts to connect to themselves.
  std::string iface;
  std::string host;
  // Per-collective and connection timeout: a rank that died is reported after this long.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Names the group in the store, so several groups (e.g. a subset of ranks for data
  // parallelism beside tensor parallelism) can rendezvous through one store.
  std::string group_name = "world";
};

// Connects `options.world_size` ranks through `store` (which must outlive the call only).
// Errors: InvalidArgument for bad options; DeadlineExceeded/Unavailable when peers do not
// arrive; Internal for other Gloo failures.
StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(TcpStore& store,
                                                               const GlooOptions& options);

struct NcclOptions {
  int rank = 0;
  int world_size = 1;
  int device = 0;  // CUDA ordinal whose memory the collectives' buffers are in
  // Initialisation and each collective: past this, the communicator is aborted and the call
  // fails with DeadlineExceeded (a dead or stuck peer never hangs the caller).
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  std::string group_name = "world";  // names the unique id in the store

  // InvalidArgument for a rank outside [0, world_size) or a timeout <= 0.
  [[nodiscard]] Status Validate() const;
};

// NCCL over GPU buffers, its unique id exchanged through `store`. Unavailable when zinf was
// built without NCCL or no GPU is usable; InvalidArgument for bad options.
StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(TcpStore& store,
                                                               const NcclOptions& options);

}  // namespace zinf

#endif  // ZINF_COMM_COMMUNICATOR_H_
