// See src/zero/param_tier.h, Note [Parameter tier] and Note [Prefetch]: fetching, gathering and
// prefetching the parameters. Writing the tier is in param_tier_writes.cc.
#include "zero/param_tier.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <utility>

#include "comm/communicator.h"
#include "core/elapsed.h"
#include "core/log.h"
#include "offload/device_ops.h"
#include "zero/param_tier_internal.h"

namespace zinf {
namespace {

using Clock = SteadyClock;

}  // namespace

ParamTier::ParamTier(TieredStore* store, Communicator* comm, const std::vector<Param>* params,
                     std::vector<Module>* modules, const ParamTierOptions& options)
    : store_(store),
      comm_(comm),
      params_(params),
      modules_(modules),
      options_(options),
      state_(params->size()) {}

ParamTier::~ParamTier() {
  DropAll();
  (void)FinishWrites();
  for (State& s : state_) {
    if (s.shard != 0) store_->Free(s.shard).IgnoreError();
  }
}

Status ParamTier::Create(Device* device) {
  device_ = device;
  if (device_ == nullptr) return FailedPrecondition("the parameter tier needs a device tier");
  ZINF_ASSIGN_OR_RETURN(stream_, device_->CreateStream());
  ZINF_ASSIGN_OR_RETURN(release_stream_, device_->CreateStream());
  ready_.resize(modules_->size());
  for (auto& event : ready_) {
    ZINF_ASSIGN_OR_RETURN(event, device_->CreateEvent());
  }
  for (size_t i = 0; i < params_->size(); ++i) {
    const Param& p = (*params_)[i];
    ZINF_ASSIGN_OR_RETURN(state_[i].shard,
                          store_->Create(p.spec.name, TierBytes(p), options_.shard_home));
  }
  return OkStatus();
}

Tier ParamTier::WriteTier() const {
  // NVMe is not addressable, nor is a GPU's memory from the host: a host copy is written and
  // then written back.
  if (options_.shard_home == Tier::kDevice && options_.device_host_addressable)
    return Tier::kDevice;
  return Tier::kHost;
}

bool ParamTier::NeedsGather(int param) const {
  const State& s = state_[param];
  return !s.current && s.full == nullptr;
}

Status ParamTier::PrepareGather(int param) {
  const Param& p = (*params_)[param];
  State& s = state_[param];
  const int world = comm_->world_size();
  const uint64_t full_size = p.shard_size * world;
  const size_t element = ElementSize(options_.param_type);
  if (s.shard_data == nullptr) {
    ZINF_ASSIGN_OR_RETURN(s.shard_data, store_->Acquire(s.shard, Tier::kDevice, Access::kRead));
  }
  s.prefetched = false;
  counters_.bytes_gathered += full_size * element;
  if (world == 1) {
    s.full = s.shard_data;  // one rank's shard is the whole parameter
    return OkStatus();
  }
  if (s.gathered == 0) {
    ZINF_ASSIGN_OR_RETURN(s.gathered, store_->CreateScratch(p.spec.name + " (gathered)",
                                                            full_size * element, Tier::kDevice));
  }
  ZINF_ASSIGN_OR_RETURN(s.full, store_->Acquire(s.gathered, Tier::kDevice, Access::kOverwrite));
  return OkStatus();
}

Status ParamTier::StartGather(int param) {
  if (!NeedsGather(param)) return OkStatus();
  const auto t0 = Clock::now();
  ZINF_RETURN_IF_ERROR(PrepareGather(param));
  State& s = state_[param];
  if (comm_->world_size() > 1) {
    s.gathering = comm_->AllGatherAsync(s.shard_data, s.full, (*params_)[param].shard_size,
                                        options_.param_type);
    ++counters_.collectives;
  }
  counters_.seconds_gather += SecondsSince(t0);
  return OkStatus();
}

Status ParamTier::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  if (options_.device_host_addressable) {
    std::memcpy(dst, src, bytes);
    // The stream's copy, made by the CPU (Note [Transfer counters] in offload/tiered_store.cc).
    store_->transfer_counters().CountCopy(CopyKind::kDeviceToDevice, bytes);
    return OkStatus();
  }
  return stream_->Copy(dst, src, bytes, CopyKind::kDeviceToDevice);
}

void ParamTier::BringShards(const std::vector<int>& todo) {
  if (options_.shard_home == Tier::kDevice || options_.device_host_addressable) return;
  std::vector<TensorId> ids;
  for (int pi : todo) {
    const State& s = state_[pi];
    if (s.shard_data == nullptr && !s.prefetched) ids.push_back(s.shard);
  }
  if (ids.size() < 2) return;
  // Errors reach the Acquire that pins the shard, which moves it alone.
  std::shared_future<Status> moved = store_->Prefetch(ids, Tier::kDevice);
  if (moved.wait_for(std::chrono::seconds(0)) == std::future_status::ready) return;  // cached
  store_->transfer_counters().CountWait();  // for the store's transfer thread
  moved.wait();
}

// Note [Coalesced gathers].
Status ParamTier::StartGathers(const std::vector<int>& params) {
  std::vector<int> todo;
  for (int pi : params) {
    if (NeedsGather(pi)) todo.push_back(pi);
  }
  BringShards(todo);
  if (comm_->world_size() == 1 || todo.size() < 2) {
    for (int pi : todo) {
      Status s = StartGather(pi);
      if (!s.ok()) return s.WithContext(fmt::format("gathering '{}'", (*params_)[pi].spec.name));
    }
    return OkStatus();
  }
  const auto t0 = Clock::now();
  const size_t element = ElementSize(options_.param_type);
  auto c = std::make_shared<Coalesced>();
  c->store = store_;
  c->params = todo;
  for (int pi : todo) {
    c->at.push_back(c->slice);
    c->slice += (*params_)[pi].shard_size;
  }
  const uint64_t world = comm_->world_size();
  ZINF_ASSIGN_OR_RETURN(
      c->send, store_->CreateScratch("coalesced gather (send)", c->slice * element, Tier::kDevice));
  ZINF_ASSIGN_OR_RETURN(c->send_data, store_->Acquire(c->send, Tier::kDevice, Access::kOverwrite));
  ZINF_ASSIGN_OR_RETURN(
      c->receive, store_->CreateScratch("coalesced gather (receive)", world * c->slice * element,
                                        Tier::kDevice));
  ZINF_ASSIGN_OR_RETURN(c->receive_data,
                        store_->Acquire(c->receive, Tier::kDevice, Access::kOverwrite));
  // Until the collective has started, a failure drops what was prepared: a parameter is
  // marked as gathering (and to be unpacked) only with the collective that fills it.
  size_t prepared = 0;
  Status packed;
  for (; prepared < todo.size() && packed.ok(); ++prepared) {
    const int pi = todo[prepared];
    packed = PrepareGather(pi);
    if (packed.ok()) {
      packed = CopyOnDevice(static_cast<char*>(c->send_data) + c->at[prepared] * element,
                            state_[pi].shard_data, (*params_)[pi].shard_size * element);
    }
    if (!packed.ok()) {
      packed =
          std::move(packed).WithContext(fmt::format("gathering '{}'", (*params_)[pi].spec.name));
    }
  }
  // The collective reads the send tensor on the communicator's thread.
  if (packed.ok() && !options_.device_host_addressable) packed = stream_->Synchronize();
  if (!packed.ok()) {
    for (size_t i = 0; i < prepared; ++i) Drop(todo[i]);
    return packed;
  }
  c->work = comm_->AllGatherAsync(c->send_data, c->receive_data, c->slice, options_.param_type);
  ++counters_.collectives;
  for (int pi : todo) {
    state_[pi].gathering = c->work;
    state_[pi].coalesced = c;
  }
  counters_.seconds_gather += SecondsSince(t0);
  return OkStatus();
}

Status ParamTier::Unpack(Coalesced& c) {
  if (c.receive_data == nullptr) return OkStatus();  // another parameter's Gather did it
  const size_t element = ElementSize(options_.param_type);
  const char* received = static_cast<const char*>(c.receive_data);
  for (size_t i = 0; i < c.params.size(); ++i) {
    const State& t = state_[c.params[i]];
    if (t.full == nullptr) continue;  // dropped meanwhile
    const uint64_t shard = (*params_)[c.params[i]].shard_size;
    for (int r = 0; r < comm_->world_size(); ++r) {
      ZINF_RETURN_IF_ERROR(CopyOnDevice(static_cast<char*>(t.full) + r * shard * element,
                                        received + (r * c.slice + c.at[i]) * element,
                                        shard * element));
    }
  }
  // The copies read the receive tensor: it is freed once they have run.
  if (!options_.device_host_addressable) ZINF_RETURN_IF_ERROR(stream_->Synchronize());
  c.FreeBuffers();
  return OkStatus();
}

Status ParamTier::Gather(int param) {
  State& s = state_[param];
  if (s.current) return OkStatus();
  ZINF_RETURN_IF_ERROR(StartGather(param));
  const auto t0 = Clock::now();
  if (s.gathering != nullptr) {
    Status gathered = std::exchange(s.gathering, nullptr)->Wait();
    // The shard stays pinned only while it is the gathered parameter itself.
    ZINF_RETURN_IF_ERROR(store_->Release(s.shard, Tier::kDevice));
    s.shard_data = nullptr;
    ZINF_RETURN_IF_ERROR(gathered);
  }
  if (s.coalesced != nullptr) ZINF_RETURN_IF_ERROR(Unpack(*std::exchange(s.coalesced, nullptr)));
  const uint64_t full_size = (*params_)[param].shard_size * comm_->world_size();
  if (options_.param_type == ElementType::kFp32) {
    s.fp32 = static_cast<float*>(s.full);
  } else if (options_.fp32_view) {
    if (s.widened == 0) {
      ZINF_ASSIGN_OR_RETURN(
          s.widened, store_->CreateScratch((*params_)[param].spec.name + " (fp32)", full_size * 4,
                                           Tier::kDevice));
    }
    ZINF_ASSIGN_OR_RETURN(void* fp32,
                          store_->Acquire(s.widened, Tier::kDevice, Access::kOverwrite));
    s.fp32 = static_cast<float*>(fp32);
    ZINF_RETURN_IF_ERROR(EnqueueConvert(*device_, *stream_, s.full, options_.param_type, s.fp32,
                                        ElementType::kFp32, full_size));
  }
  s.current = true;
  counters_.seconds_gather += SecondsSince(t0);
  return OkStatus();
}

void ParamTier::Drop(int param) {
  State& s = state_[param];
  if (s.gathering != nullptr) (void)std::exchange(s.gathering, nullptr)->Wait();
  s.coalesced = nullptr;
  auto unpin_and_free = [&](TensorId& id, bool pinned) {
    if (id == 0) return;
    if (pinned) store_->Release(id, Tier::kDevice).IgnoreError();
    store_->Free(id).IgnoreError();
    id = 0;
  };
  if (s.shard_data != nullptr) store_->Release(s.shard, Tier::kDevice).IgnoreError();
  s.shard_data = nullptr;
  unpin_and_free(s.gathered, s.full != nullptr && comm_->world_size() > 1);
  unpin_and_free(s.widened, s.fp32 != nullptr && options_.param_type != ElementType::kFp32);
  s.full = nullptr;
  s.fp32 = nullptr;
  s.current = false;
  s.prefetched = false;
}

void ParamTier::DropAll() {
  ReapReleases(0);
  // The widening enqueued by gathers nobody fetched (persistent parameters) may still run.
  if (stream_ != nullptr) (void)stream_->Synchronize();
  for (size_t i = 0; i < state_.size(); ++i) Drop(static_cast<int>(i));
}

Status ParamTier::Fetch(int module, std::vector<ParamTensor>* out, std::vector<float*>* fp32,
                        Event** ready) {
  Module& m = (*modules_)[module];
  // Note [Fetch and release events]: a module fetched again keeps copies not yet dropped.
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->module != module) {
      ++it;
      continue;
    }
    spare_events_.push_back(std::move(it->done));
    it = pending_.erase(it);
  }
  ReapReleases(2);
  TraceFetch(module);
  counters_.peak_live_parameters = std::max(counters_.peak_live_parameters, LiveElements(module));
  // The module's gathers in flight at once (one collective: Note [Coalesced gathers]), then
  // each waited for.
  ZINF_RETURN_IF_ERROR(StartGathers(m.params));
  for (int pi : m.params) {
    Status s = Gather(pi);
    if (!s.ok()) return s.WithContext(fmt::format("gathering '{}'", (*params_)[pi].spec.name));
    const State& st = state_[pi];
    out->push_back({st.full, options_.param_type, (*params_)[pi].numel});
    if (fp32 != nullptr && options_.fp32_view) fp32->push_back(st.fp32);
  }
  Event& done = *ready_[module];
  ZINF_RETURN_IF_ERROR(stream_->Record(done));
  if (device_->kind() == DeviceKind::kHost) {  // the caller's thread computes next
    const auto t0 = Clock::now();
    ZINF_RETURN_IF_ERROR(done.Synchronize());
    counters_.seconds_gather += SecondsSince(t0);
  }
  if (ready != nullptr) *ready = &done;
  m.fetched = true;
  PrefetchGathers();
  // A step beside the forward keeps what it writes only until the fetch has taken it.
  if (step_writes_ != nullptr) DropHostCopies(module);
  return OkStatus();
}

Status ParamTier::Release(int module, Event* done) {
  if (done == nullptr && device_->kind() == DeviceKind::kHost) {
    for (int pi : (*modules_)[module].params) {
      if (!(*params_)[pi].persistent) Drop(pi);
    }
    return OkStatus();
  }
  std::unique_ptr<Event> mine;
  if (!spare_events_.empty()) {
    mine = std::move(spare_events_.back());
    spare_events_.pop_back();
  } else {
    ZINF_ASSIGN_OR_RETURN(mine, device_->CreateEvent());
  }
  // On a stream of its own: on the widening stream the next fetch's work would wait for the
  // trainer's compute of this module.
  ZINF_RETURN_IF_ERROR(stream_->Record(*mine));
  if (done != nullptr) ZINF_RETURN_IF_ERROR(release_stream_->Wait(*done));
  ZINF_RETURN_IF_ERROR(release_stream_->Wait(*mine));
  ZINF_RETURN_IF_ERROR(release_stream_->Record(*mine));
  pending_.push_back({module, std::move(mine)});
  return OkStatus();
}

void ParamTier::ReapReleases(size_t keep) {
  while (!pending_.empty()) {
    PendingRelease& oldest = pending_.front();
    if (pending_.size() > keep) {
      Status waited = oldest.done->Synchronize();
      // The stream's error is sticky and reaches the next Fetch; the memory is ours again.
      if (!waited.ok()) log::Warn("rank {}: waiting to release: {}", comm_->rank(), waited);
    } else {
      // Note [Fetch and release events]: ranks drop alike, whatever their timing.
      if (comm_->world_size() > 1) break;
      StatusOr<bool> done = oldest.done->Query();
      if (done.ok() && !*done) break;
    }
    for (int pi : (*modules_)[oldest.module].params) {
      if (!(*params_)[pi].persistent) Drop(pi);
    }
    spare_events_.push_back(std::move(oldest.done));
    pending_.pop_front();
  }
}

Status ParamTier::GatherPersistent() {
  // Note [Coalesced gathers]: in groups of at most stage3_prefetch_bucket_size elements (the
  // device tier's room for what is brought in ahead), one collective each, in parameter order
  // on every rank.
  std::vector<int> group;
  uint64_t elements = 0;
  auto gather_group = [&]() -> Status {
    ZINF_RETURN_IF_ERROR(StartGathers(group));
    for (int pi : group) ZINF_RETURN_IF_ERROR(Gather(pi));
    group.clear();
    elements = 0;
    return OkStatus();
  };
  for (size_t i = 0; i < params_->size(); ++i) {
    const Param& p = (*params_)[i];
    if (!p.persistent) continue;
    const uint64_t full = p.shard_size * comm_->world_size();
    if (!group.empty() && elements + full > options_.prefetch_bucket_elements) {
      ZINF_RETURN_IF_ERROR(gather_group());
    }
    group.push_back(static_cast<int>(i));
    elements += full;
  }
  ZINF_RETURN_IF_ERROR(gather_group());
  return stream_->Synchronize();
}

uint64_t ParamTier::LiveElements(int fetching) const {
  uint64_t live = 0;
  for (size_t i = 0; i < params_->size(); ++i) {
    const Param& p = (*params_)[i];
    const State& s = state_[i];
    if (!p.persistent && ((*modules_)[p.module].fetched || p.module == fetching || s.prefetched ||
                          s.gathering != nullptr)) {
      live += p.numel;
    }
  }
  return live;
}

void ParamTier::EndBatch() {
  if (recording_) FinishRecording(/*cyclic=*/false);
  fetch_cursor_ = 0;
  ReadAhead(LiveElements(-1));  // the next batch's first modules, while the trainer loads data
}

void ParamTier::FinishRecording(bool cyclic) {
  recording_ = false;
  cyclic_ = cyclic;
  fetch_cursor_ = 0;
  // Prefetching pays where a shard must come from another tier or from other ranks.
  prefetching_ = options_.shard_home != Tier::kDevice || comm_->world_size() > 1;
}

void ParamTier::Record(int module) {
  const size_t i = fetch_order_.size();
  fetch_order_.push_back(module);
  if (backward_seen_) return;  // a training batch: its order ends at the step
  // A forward-only loop (evaluation, inference) never steps: its order is the period of the
  // fetches, found when the recorded sequence is one period repeated twice.
  if (period_ > 0 && fetch_order_[i - period_] != module) period_ = 0;
  if (period_ == 0 && i > 0 && module == fetch_order_[0]) period_ = i;
  if (period_ > 0 && i + 1 == 2 * period_) {
    fetch_order_.resize(period_);
    FinishRecording(/*cyclic=*/true);
  }
}

void ParamTier::NoteBackward() { backward_seen_ = true; }

// Note [Prefetch]: follows the recorded order from the module just fetched.
void ParamTier::TraceFetch(int module) {
  if (recording_) {
    Record(module);
    return;
  }
  if (cyclic_ && fetch_cursor_ == fetch_order_.size()) fetch_cursor_ = 0;
  if (fetch_cursor_ >= fetch_order_.size() || fetch_order_[fetch_cursor_] != module) {
    if (!warned_) {
      log::Warn(
          "rank {}: module '{}' was fetched out of the recorded order; the order is recorded "
          "again from here, and parameters are read and gathered when fetched meanwhile (said "
          "once)",
          comm_->rank(), (*modules_)[module].name);
      warned_ = true;
    }
    fetch_order_.clear();
    recording_ = true;
    prefetching_ = false;
    cyclic_ = false;
    backward_seen_ = false;
    period_ = 0;
    Record(module);
    return;
  }
  ++fetch_cursor_;
  HintNextUse(module);
  ReadAhead(LiveElements(module));
}

// The eviction hint of the module's shards (Note [TieredStore eviction order]): where the
// recorded order needs them next, or none (first to go) when it does not this batch. Hints
// left at a use already past would make spent copies look needed soonest.
void ParamTier::HintNextUse(int module) {
  int64_t next = -1;
  for (size_t i = fetch_cursor_; i < fetch_order_.size(); ++i) {
    if (fetch_order_[i] == module) {
      next = static_cast<int64_t>(i);
      break;
    }
  }
  for (int pi : (*modules_)[module].params)
    store_->SetNextUse(state_[pi].shard, next).IgnoreError();
}

void ParamTier::ReadAhead(uint64_t live) {
  if (!prefetching_ || options_.shard_home == Tier::kDevice) return;  // nothing to bring in
  uint64_t ahead = 0;
  std::vector<TensorId> reads;  // in one batch (Note [Batched write-backs])
  const size_t n = fetch_order_.size();
  for (size_t k = 0; k < n; ++k) {
    size_t i = fetch_cursor_ + k;
    if (i >= n && !cyclic_) break;
    if (step_writes_ != nullptr && !step_writes_->Written(fetch_order_[i % n])) break;
    const Module& next = (*modules_)[fetch_order_[i % n]];
    if (k > 0 && ahead >= options_.prefetch_bucket_elements) break;
    uint64_t needed = 0;
    for (int pi : next.params) {
      const Param& p = (*params_)[pi];
      if (!state_[pi].current && !state_[pi].prefetched && !p.persistent) needed += p.numel;
    }
    if (live + needed > options_.max_live_elements) break;
    live += needed;
    for (int pi : next.params) {
      State& s = state_[pi];
      if (s.current) continue;
      ahead += (*params_)[pi].numel;  // reads already in flight count towards the window too
      if (s.prefetched || s.gathering != nullptr) continue;
      // Errors reach the fetch that acquires the shard.
      store_->SetNextUse(s.shard, static_cast<int64_t>(i)).IgnoreError();
      reads.push_back(s.shard);
      s.prefetched = true;
    }
  }
  if (!reads.empty()) (void)store_->Prefetch(reads, Tier::kDevice);
}

// Note [Prefetch]: starts the all-gathers of the next module in the recorded order, so that
// they run on the communicator's thread while the module just fetched computes. Every rank
// makes the same decision, so the collectives stay in step.
void ParamTier::PrefetchGathers() {
  if (!prefetching_ || comm_->world_size() == 1 || step_writes_ != nullptr) return;
  size_t cursor = fetch_cursor_;
  if (cyclic_ && cursor == fetch_order_.size()) cursor = 0;
  if (cursor >= fetch_order_.size()) return;
  const Module& next = (*modules_)[fetch_order_[cursor]];
  uint64_t needed = 0;
  for (int pi : next.params) {
    const State& s = state_[pi];
    if (!s.current && s.gathering == nullptr && !(*params_)[pi].persistent) {
      needed += (*params_)[pi].numel;
    }
  }
  if (LiveElements(-1) + needed > options_.max_live_elements) return;
  (void)StartGathers(next.params);  // its Fetch gathers what is left and reports the error
}

void ParamTier::DropHostCopies(int module) {
  if (options_.shard_home != Tier::kNvme) return;
  std::vector<TensorId> ids;
  for (int pi : (*modules_)[module].params) {
    if (!(*params_)[pi].persistent) ids.push_back(state_[pi].shard);
  }
  // Errors would be a write-back's, which the step's own wait reports.
  if (!ids.empty()) (void)store_->EvictAsync(ids, Tier::kHost);
}

ParamTierCounters ParamTier::TakeCounters() { return std::exchange(counters_, {}); }

}  // namespace zinf
