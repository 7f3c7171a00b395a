// ParamTier (src/zero/param_tier.h): writing the parameter tier, a shard at a time or from the
// optimizer step's chunks (ChunkWriter), and reading a shard back.
#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "core/log.h"
#include "zero/param_tier.h"
#include "zero/param_tier_internal.h"
#include "zinf/dtype.h"

namespace zinf {

StatusOr<void*> ParamTier::BeginWrite(const Param& p) {
  const int index = static_cast<int>(&p - params_->data());
  Drop(index);
  return store_->Acquire(state_[index].shard, WriteTier(), Access::kOverwrite);
}

void WriteBacks::Send(TieredStore& store) {
  if (unsent_.empty()) return;
  sent_.push_back(keep_ ? store.WriteBackAsync(unsent_, Tier::kHost)
                        : store.EvictAsync(unsent_, Tier::kHost));
  unsent_.clear();
  unsent_bytes_ = 0;
}

Status WriteBacks::Wait(TieredStore& store) {
  Send(store);
  Status first;
  for (auto& f : sent_) {
    store.transfer_counters().CountWait();  // for the store's transfer threads
    Status s = f.get();
    if (first.ok() && !s.ok()) first = std::move(s);
  }
  sent_.clear();
  return first;
}

// Shards written but not yet sent home go out together, at the latest once they hold this
// much host memory.
constexpr uint64_t kWriteBackBatchBytes = 32ull << 20;

Status ParamTier::EndWrite(const Param& p) {
  const State& s = state_[&p - params_->data()];
  ZINF_RETURN_IF_ERROR(store_->Release(s.shard, WriteTier()));
  if (WriteTier() != options_.shard_home) {
    write_backs_.Add(s.shard, TierBytes(p));
    if (write_backs_.unsent_bytes() >= kWriteBackBatchBytes) write_backs_.Send(*store_);
  }
  return OkStatus();
}

Status ParamTier::WriteFp32(const Param& p, const float* values) {
  ZINF_ASSIGN_OR_RETURN(void* tier, BeginWrite(p));
  ConvertFromFp32(values, options_.param_type, tier, p.shard_size);
  store_->transfer_counters().CountHostCopy(TierBytes(p));  // a copy, converting
  return EndWrite(p);
}

Status ParamTier::FinishWrites() { return write_backs_.Wait(*store_); }

Status ParamTier::ReadShard(const Param& p, void* out) {
  const State& s = state_[&p - params_->data()];
  ZINF_ASSIGN_OR_RETURN(void* tier, store_->Acquire(s.shard, Tier::kHost, Access::kRead));
  std::memcpy(out, tier, TierBytes(p));
  ZINF_RETURN_IF_ERROR(store_->Release(s.shard, Tier::kHost));
  // A read for a checkpoint or a gather of the master: no reason to keep the host copy.
  if (options_.shard_home != Tier::kHost) return store_->Evict(s.shard, Tier::kHost);
  return OkStatus();
}

Status ParamTier::ReadFp32(const Param& p, float* out) {
  if (options_.param_type == ElementType::kFp32) return ReadShard(p, out);
  std::vector<char> tier(TierBytes(p));
  ZINF_RETURN_IF_ERROR(ReadShard(p, tier.data()));
  ConvertToFp32(tier.data(), options_.param_type, out, p.shard_size);
  return OkStatus();
}

TensorId ParamTier::shard(int param) const { return state_[param].shard; }

ParamTier::ChunkWriter::ChunkWriter(ParamTier* tier, bool in_place)
    : tier_(tier),
      in_place_(in_place),
      open_(tier->params_->size()),
      persistent_(tier->params_->size()) {}

ParamTier::ChunkWriter::~ChunkWriter() { (void)Finish(); }

ParamHandoff ParamTier::ChunkWriter::handoff() const {
  if (in_place_) return ParamHandoff::kInPlace;
  return param_type() == ElementType::kFp32 ? ParamHandoff::kNewValues : ParamHandoff::kCopy;
}

ElementType ParamTier::ChunkWriter::param_type() const { return tier_->options_.param_type; }

void ParamTier::ChunkWriter::Begin() {
  const std::vector<Param>& params = *tier_->params_;
  for (size_t i = 0; i < params.size(); ++i) {
    open_[i] = {.remaining = params[i].shard_size};
  }
}

Status ParamTier::ChunkWriter::Restart() {
  Status first;
  for (size_t i = 0; i < open_.size(); ++i) {
    if (open_[i].data == nullptr) continue;
    Status s = tier_->store_->Release(tier_->state_[i].shard, tier_->WriteTier());
    if (first.ok()) first = std::move(s);
    open_[i].data = nullptr;
  }
  Begin();
  return first;
}

StatusOr<void*> ParamTier::ChunkWriter::OpenParam(size_t pi) {
  Open& o = open_[pi];
  if (o.data == nullptr) {
    // The first opening overwrites; a later one (a chunk written again) keeps the rest, and
    // so does every opening in place, where the update reads what it writes.
    const Access access = o.written || in_place_ ? Access::kWrite : Access::kOverwrite;
    ZINF_ASSIGN_OR_RETURN(
        o.data, tier_->store_->Acquire(tier_->state_[pi].shard, tier_->WriteTier(), access));
    o.written = true;
  }
  return o.data;
}

StatusOr<float*> ParamTier::ChunkWriter::OpenPersistent(size_t pi) {
  const Param& p = (*tier_->params_)[pi];
  if (persistent_[pi].empty()) {  // kept for the writer's life: the next steps reuse it
    ZINF_ASSIGN_OR_RETURN(persistent_[pi],
                          StoreArray::Create(tier_->store_, p.spec.name + " (next values)",
                                             p.shard_size * 4, Tier::kHost, Access::kOverwrite));
  }
  if (in_place_ && !std::exchange(open_[pi].written, true)) {
    ZINF_RETURN_IF_ERROR(tier_->ReadShard(p, persistent_[pi].data()));
  }
  return persistent_[pi].as<float>();
}

void ParamTier::ChunkWriter::PlaceChunk(const ChunkView& c) {
  if (in_place_ || tier_->WriteTier() == tier_->options_.shard_home) return;
  std::vector<TensorId> ids;
  (void)ForEachOverlap(c.offset, c.count, [&](size_t pi, uint64_t, uint64_t) {
    if (!(*tier_->params_)[pi].persistent && !open_[pi].written) {
      ids.push_back(tier_->state_[pi].shard);
    }
    return OkStatus();
  });
  // Best effort: a shard left out gets its memory when opened.
  if (ids.size() > 1) tier_->store_->Place(ids, tier_->WriteTier()).IgnoreError();
}

template <typename F>
Status ParamTier::ChunkWriter::ForEachOverlap(uint64_t offset, uint64_t count, F&& f) {
  const std::vector<Param>& params = *tier_->params_;
  auto it = std::upper_bound(params.begin(), params.end(), offset,
                             [](uint64_t b, const Param& p) { return b < p.flat_offset; });
  for (--it; it != params.end() && it->flat_offset < offset + count; ++it) {
    const auto [first, last] = Overlap(offset, count, *it);
    if (first < last)
      ZINF_RETURN_IF_ERROR(f(static_cast<size_t>(it - params.begin()), first, last));
  }
  return OkStatus();
}

void ParamTier::ChunkWriter::Prefetch(const ChunkInfo& c) {
  std::vector<TensorId> ids;
  (void)ForEachOverlap(c.offset, c.count, [&](size_t pi, uint64_t, uint64_t) {
    // Not one already open: it is in memory, and a prefetch would wait for its writer.
    if (!(*tier_->params_)[pi].persistent && !open_[pi].written) {
      ids.push_back(tier_->state_[pi].shard);
    }
    return OkStatus();
  });
  if (!ids.empty()) (void)tier_->store_->Prefetch(ids, tier_->WriteTier());
}

Status ParamTier::ChunkWriter::Read(const ChunkView& c) {
  std::fill(c.params, c.params + c.count, 0.0f);  // the padding
  TieredStore& store = *tier_->store_;
  return ForEachOverlap(c.offset, c.count, [&](size_t pi, uint64_t first, uint64_t last) {
    const Param& p = (*tier_->params_)[pi];
    const TensorId shard = tier_->state_[pi].shard;
    float* dst = c.params + (first - c.offset);
    if (open_[pi].data != nullptr) {  // open for writing: acquiring it again would wait forever
      std::memcpy(dst, static_cast<const float*>(open_[pi].data) + (first - p.flat_offset),
                  (last - first) * 4);
      return OkStatus();
    }
    ZINF_ASSIGN_OR_RETURN(void* tier, store.Acquire(shard, Tier::kHost, Access::kRead));
    std::memcpy(dst, static_cast<const float*>(tier) + (first - p.flat_offset), (last - first) * 4);
    return store.Release(shard, Tier::kHost);
  });
}

Status ParamTier::ChunkWriter::Store(const ChunkView& c) {
  TieredStore& store = *tier_->store_;
  Status stored = ForEachOverlap(c.offset, c.count, [&](size_t pi, uint64_t first, uint64_t last) {
    const Param& p = (*tier_->params_)[pi];
    const TensorId shard = tier_->state_[pi].shard;
    if (p.persistent) {  // small; its next values are loaded from here at the step's first touch
      ZINF_ASSIGN_OR_RETURN(void* tier, store.Acquire(shard, tier_->WriteTier(), Access::kWrite));
      std::memcpy(static_cast<float*>(tier) + (first - p.flat_offset),
                  c.params + (first - c.offset), (last - first) * 4);
      return store.Release(shard, tier_->WriteTier());
    }
    ZINF_ASSIGN_OR_RETURN(void* tier, OpenParam(pi));
    std::memcpy(static_cast<float*>(tier) + (first - p.flat_offset), c.params + (first - c.offset),
                (last - first) * 4);
    // A parameter that goes on past the chunk stays open for the next chunk (chunks come in
    // order), for the step that writes it next, or until Finish; one that ends here goes home.
    if (last < p.flat_offset + p.shard_size) return OkStatus();
    open_[pi].data = nullptr;
    ZINF_RETURN_IF_ERROR(store.Release(shard, tier_->WriteTier()));
    if (tier_->WriteTier() != tier_->options_.shard_home) {
      write_backs_.Add(shard, tier_->TierBytes(p));
    }
    return OkStatus();
  });
  write_backs_.Send(store);
  return stored;
}

StatusOr<std::vector<CopyTarget>> ParamTier::ChunkWriter::Targets(const ChunkView& c) {
  PlaceChunk(c);
  const std::vector<Param>& params = *tier_->params_;
  const size_t element = in_place_ ? 4 : ElementSize(tier_->options_.param_type);
  std::vector<CopyTarget> targets;
  auto it = std::upper_bound(params.begin(), params.end(), c.offset,
                             [](uint64_t b, const Param& p) { return b < p.flat_offset; });
  uint64_t covered = c.offset;  // padding between parameters gets no copy
  for (--it; it != params.end() && it->flat_offset < c.offset + c.count; ++it) {
    const Param& p = *it;
    const auto [first, last] = Overlap(c.offset, c.count, p);
    if (first >= last) continue;
    if (first > covered) targets.push_back({covered - c.offset, first - covered, nullptr});
    void* dst = nullptr;
    if (!p.persistent) {  // persistent parameters are written whole by Finish, from fp32
      ZINF_ASSIGN_OR_RETURN(void* tier, OpenParam(&p - params.data()));
      dst = static_cast<char*>(tier) + (first - p.flat_offset) * element;
    } else if (in_place_) {  // ... from their next values, updated in place
      ZINF_ASSIGN_OR_RETURN(float* next, OpenPersistent(&p - params.data()));
      dst = next + (first - p.flat_offset);
    }
    targets.push_back({first - c.offset, last - first, dst});
    covered = last;
  }
  if (covered < c.offset + c.count) {
    targets.push_back({covered - c.offset, c.offset + c.count - covered, nullptr});
  }
  return targets;
}

Status ParamTier::ChunkWriter::Updated(const ChunkView& c) {
  if (!c.copy_written && !c.params_in_place) PlaceChunk(c);  // else Targets opened them
  const std::vector<Param>& params = *tier_->params_;
  TieredStore* store = tier_->store_;
  const ElementType type = tier_->options_.param_type;
  auto it = std::upper_bound(params.begin(), params.end(), c.offset,
                             [](uint64_t b, const Param& p) { return b < p.flat_offset; });
  for (--it; it != params.end() && it->flat_offset < c.offset + c.count; ++it) {
    const Param& p = *it;
    const auto [first, last] = Overlap(c.offset, c.count, p);
    if (first >= last) continue;
    const size_t pi = &p - params.data();
    const float* values = c.params + (first - c.offset);
    Open& o = open_[pi];
    if (p.persistent) {
      ZINF_ASSIGN_OR_RETURN(float* next, OpenPersistent(pi));
      if (!c.params_in_place) {
        std::copy(values, values + (last - first), next + (first - p.flat_offset));
        store->transfer_counters().CountHostCopy((last - first) * 4);
      }
      o.remaining -= std::min(o.remaining, last - first);
      continue;
    }
    ZINF_ASSIGN_OR_RETURN(void* tier, OpenParam(pi));
    if (!c.copy_written && !c.params_in_place) {  // else the update wrote it there (Targets)
      ConvertFromFp32(values, type,
                      static_cast<char*>(tier) + (first - p.flat_offset) * ElementSize(type),
                      last - first);
      store->transfer_counters().CountHostCopy((last - first) * ElementSize(type));
    }
    o.remaining -= std::min(o.remaining, last - first);
    if (o.remaining == 0) {  // (a chunk written again may end it early: it reopens with kWrite)
      o.data = nullptr;
      ZINF_RETURN_IF_ERROR(store->Release(tier_->state_[pi].shard, tier_->WriteTier()));
      if (tier_->WriteTier() != tier_->options_.shard_home) {
        write_backs_.Add(tier_->state_[pi].shard, tier_->TierBytes(p));
      }
    }
  }
  write_backs_.Send(*store);  // the parameters this chunk ended, as one batch
  return OkStatus();
}

Status ParamTier::ChunkWriter::WritePersistent(const std::vector<int>& params) {
  for (int pi : params) {
    if (persistent_[pi].empty() || open_[pi].remaining != 0) continue;
    ZINF_RETURN_IF_ERROR(tier_->WriteFp32((*tier_->params_)[pi], persistent_[pi].as<float>()));
    open_[pi].remaining = (*tier_->params_)[pi].shard_size;  // written: not again this step
  }
  return OkStatus();
}

Status ParamTier::ChunkWriter::Finish() {
  const std::vector<Param>& params = *tier_->params_;
  TieredStore& store = *tier_->store_;
  Status first;
  auto keep = [&](Status s) {
    if (first.ok() && !s.ok()) first = std::move(s);
  };
  for (size_t i = 0; i < open_.size(); ++i) {
    if (open_[i].data != nullptr) {
      keep(store.Release(tier_->state_[i].shard, tier_->WriteTier()));
      open_[i].data = nullptr;
    }
    // Only a persistent parameter written whole: chunks visited for a skipped step may
    // cover part of one, whose tier then still holds the same old values.
    if (!persistent_[i].empty() && open_[i].remaining == 0) {
      keep(tier_->WriteFp32(params[i], persistent_[i].as<float>()));
      open_[i].remaining = params[i].shard_size;  // written: not again before the next step
    }
  }
  keep(write_backs_.Wait(store));  // with those a failed Write left unsent
  keep(tier_->FinishWrites());
  return first;
}

}  // namespace zinf
