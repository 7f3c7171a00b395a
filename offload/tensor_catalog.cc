// TensorCatalog: see offload/tensor_catalog.h.
#include "offload/tensor_catalog.h"

#include <fmt/core.h>

#include <iterator>

namespace zinf {

StatusOr<StoreTensor*> TensorCatalog::Find(TensorId id) {
  auto it = tensors_.find(id);
  if (it != tensors_.end()) return it->second.get();
  if (id == 0 || id >= next_id_) {
    return InvalidArgument(fmt::format("tiered store has no tensor with id {}", id));
  }
  for (const auto& [freed_id, name] : freed_names_) {
    if (freed_id == id)
      return FailedPrecondition(fmt::format("tensor {} ('{}') was freed", id, name));
  }
  return FailedPrecondition(fmt::format("tensor {} was freed", id));
}

StoreTensor* TensorCatalog::Lookup(TensorId id) {
  auto it = tensors_.find(id);
  return it == tensors_.end() ? nullptr : it->second.get();
}

StoreTensor& TensorCatalog::Add(std::string_view name, uint64_t size, Tier home, bool scratch) {
  auto owned = std::make_unique<StoreTensor>();
  owned->id = next_id_++;
  owned->name = name;
  owned->size = size;
  owned->home = home;
  owned->scratch = scratch;
  return *tensors_.emplace(owned->id, std::move(owned)).first->second;
}

void TensorCatalog::Remove(StoreTensor& t) {
  ReleaseMemory(t);
  tensors_.erase(t.id);
}

void TensorCatalog::Retire(StoreTensor& t) {
  std::pair<TensorId, std::string>& slot = freed_names_[freed_next_];
  freed_next_ = (freed_next_ + 1) % freed_names_.size();
  slot.first = t.id;
  slot.second.assign(t.name);
  auto node = tensors_.extract(t.id);
  std::unique_ptr<StoreTensor>& owned = node.mapped();
  for (int i = 0; i < kTiers; ++i) {
    if (!owned->scratch || i != Index(owned->home)) DropCopy(*owned, static_cast<Tier>(i));
  }
  if (!owned->scratch) return;
  owned->prefetch = {};
  idle_scratch_.push_back(std::move(owned));
  if (idle_scratch_.size() > kIdleScratchKept) {
    ReleaseMemory(*idle_scratch_.front());
    idle_scratch_.pop_front();
  }
}

StoreTensor* TensorCatalog::Revive(std::string_view name, uint64_t size, Tier home) {
  for (auto it = idle_scratch_.rbegin(); it != idle_scratch_.rend(); ++it) {
    StoreTensor& t = **it;
    if (t.home != home || t.size != size) continue;
    std::unique_ptr<StoreTensor> owned = std::move(*it);
    idle_scratch_.erase(std::next(it).base());
    owned->id = next_id_++;
    owned->name.assign(name);
    owned->next_use = -1;
    owned->last_use = Tick();
    TierCopy& c = owned->copies[Index(home)];
    c.valid = true;
    c.zero = true;
    return tensors_.emplace(owned->id, std::move(owned)).first->second.get();
  }
  return nullptr;
}

bool TensorCatalog::DropIdleScratch(Tier tier) {
  for (auto it = idle_scratch_.begin(); it != idle_scratch_.end(); ++it) {
    if ((*it)->home != tier) continue;
    ReleaseMemory(**it);
    idle_scratch_.erase(it);
    return true;
  }
  return false;
}

void TensorCatalog::ReleaseIdleScratch() {
  for (const auto& t : idle_scratch_) ReleaseMemory(*t);
  idle_scratch_.clear();
}

void TensorCatalog::DropCopy(StoreTensor& t, Tier tier) {
  TierCopy& c = t.copies[Index(tier)];
  c.block.Reset();
  if (!c.extents.empty()) nvme_->Free(t.name, c.extents);
  c.present = false;
  c.valid = false;
  c.zero = false;
}

void TensorCatalog::ReleaseMemory(StoreTensor& t) {
  for (int i = 0; i < kTiers; ++i) DropCopy(t, static_cast<Tier>(i));
}

void TensorCatalog::ReleaseAll() {
  for (auto& [id, t] : tensors_) ReleaseMemory(*t);
  tensors_.clear();
  ReleaseIdleScratch();
}

StoreTensor* TensorCatalog::PickVictim(Tier tier, const StoreTensor* requester) {
  StoreTensor* best = nullptr;
  for (auto& [id, p] : tensors_) {
    StoreTensor* x = p.get();
    const TierCopy& c = x->copies[Index(tier)];
    if (x == requester || !c.present || x->home == tier || c.pins > 0 || x->busy || x->writer)
      continue;
    if (best == nullptr) {
      best = x;
      continue;
    }
    const bool x_hint = x->next_use >= 0, b_hint = best->next_use >= 0;
    if (x_hint != b_hint) {
      if (!x_hint) best = x;
    } else if (!x_hint) {
      if (x->last_use < best->last_use) best = x;
    } else if (x->next_use > best->next_use) {
      best = x;
    }
  }
  return best;
}

bool TensorCatalog::MovingIn(Tier tier, const StoreTensor* requester) const {
  for (const auto& [id, x] : tensors_) {
    if (x.get() != requester && x->busy && x->home != tier && x->copies[Index(tier)].present)
      return true;
  }
  return false;
}

uint64_t TensorCatalog::HeldBytes(Tier tier) const {
  uint64_t held = 0;
  for (const auto& [id, x] : tensors_) {
    if (x->copies[Index(tier)].present && (x->pins() > 0 || x->busy || x->home == tier)) {
      held += x->size;
    }
  }
  return held;
}

bool TensorCatalog::AnyBusy() const {
  for (const auto& [id, t] : tensors_) {
    if (t->busy) return true;
  }
  return false;
}

std::vector<TensorId> TensorCatalog::Ids() const {
  std::vector<TensorId> ids;
  ids.reserve(tensors_.size());
  for (const auto& [id, t] : tensors_) ids.push_back(id);
  return ids;
}

std::vector<std::shared_future<Status>> TensorCatalog::Prefetches() const {
  std::vector<std::shared_future<Status>> inflight;
  for (const auto& [id, t] : tensors_) {
    for (const auto& f : t->prefetch) {
      if (f.valid()) inflight.push_back(f);
    }
  }
  return inflight;
}

uint64_t TensorCatalog::BookkeepingEntries() const {
  // The ring of freed names counts whole: its slots are there from the start.
  return tensors_.size() + idle_scratch_.size() + freed_names_.size();
}

}  // namespace zinf
