// TierMover: see offload/tier_mover.h.
#include "offload/tier_mover.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

namespace zinf {

StatusOr<std::unique_ptr<TierMover>> TierMover::Create(Device* device, NvmePieces* nvme,
                                                       LinkMeters* links,
                                                       TransferCounters* counters) {
  std::unique_ptr<TierMover> mover(new TierMover(device, nvme, links, counters));
  if (device != nullptr) {
    ZINF_ASSIGN_OR_RETURN(mover->up_stream_, device->CreateStream());
    ZINF_ASSIGN_OR_RETURN(mover->down_stream_, device->CreateStream());
  }
  return mover;
}

TierMover::TierMover(Device* device, NvmePieces* nvme, LinkMeters* links,
                     TransferCounters* counters)
    : device_(device),
      nvme_(nvme),
      links_(*links),
      counters_(*counters),
      direct_(device != nullptr && device->host_addressable()) {}

Status TierMover::Move(StoreTensor& t, Tier src, Tier dst) {
  TierCopy& from = t.copies[Index(src)];
  TierCopy& to = t.copies[Index(dst)];
  if (from.zero) return MoveZeros(t, dst);
  if (direct_ && src != Tier::kNvme && dst != Tier::kNvme) {
    LinkScope scope(src == Tier::kHost ? links_.h2d : links_.d2h, t.size);
    std::memcpy(to.block.data(), from.block.data(), t.size);
    // The copy a stream would make, made by the CPU (Note [Transfer counters]).
    counters_.CountCopy(src == Tier::kHost ? CopyKind::kHostToDevice : CopyKind::kDeviceToHost,
                        t.size);
    return OkStatus();
  }
  if (direct_ && src == Tier::kNvme) {  // NVMe straight into the device's (host) memory
    LinkScope scope(links_.n2h, t.size);
    return nvme_->Read(from.extents, to.block.as<char>());
  }
  if (direct_ && dst == Tier::kNvme) {
    LinkScope scope(links_.h2n, t.size);
    return nvme_->Write(to.extents, from.block.as<const char>());
  }
  if (src == Tier::kHost && dst == Tier::kDevice) {
    LinkScope scope(links_.h2d, t.size);
    return DeviceCopy(*up_stream_, to.block.data(), from.block.data(), t.size,
                      CopyKind::kHostToDevice);
  }
  if (src == Tier::kDevice && dst == Tier::kHost) {
    LinkScope scope(links_.d2h, t.size);
    return DeviceCopy(*down_stream_, to.block.data(), from.block.data(), t.size,
                      CopyKind::kDeviceToHost);
  }
  if (src == Tier::kNvme && dst == Tier::kHost) {
    LinkScope scope(links_.n2h, t.size);
    return nvme_->Read(from.extents, to.block.as<char>());
  }
  if (src == Tier::kHost && dst == Tier::kNvme) {
    LinkScope scope(links_.h2n, t.size);
    return nvme_->Write(to.extents, from.block.as<const char>());
  }
  if (src == Tier::kNvme && dst == Tier::kDevice) return ReadToDevice(from, to.block.as<char>());
  if (src == Tier::kDevice && dst == Tier::kNvme) {
    return WriteFromDevice(to, from.block.as<const char>());
  }
  return Internal(fmt::format("no transfer from {} to {}", TierName(src), TierName(dst)));
}

bool TierMover::ContinuesRun(const StoreTensor& last, const StoreTensor& next) {
  const PoolBlock& last_host = last.copies[Index(Tier::kHost)].block;
  const PoolBlock& last_device = last.copies[Index(Tier::kDevice)].block;
  const auto gap = [](const PoolBlock& a, const PoolBlock& b) {
    return static_cast<const char*>(b.data()) - static_cast<const char*>(a.data());
  };
  const ptrdiff_t host = gap(last_host, next.copies[Index(Tier::kHost)].block);
  const ptrdiff_t device = gap(last_device, next.copies[Index(Tier::kDevice)].block);
  return host == device && host >= static_cast<ptrdiff_t>(last.size) &&
         static_cast<uint64_t>(host) <=
             std::min(last_host.reserved_bytes(), last_device.reserved_bytes());
}

bool TierMover::HostOrder(const StoreTensor* a, const StoreTensor* b) {
  return std::less<>()(a->copies[Index(Tier::kHost)].block.data(),
                       b->copies[Index(Tier::kHost)].block.data());
}

Status TierMover::Upload(std::span<StoreTensor* const> batch) {
  // In the order of their host copies, so that neighbours there go as one copy: the batch has
  // one wait, and the order within it matters to nothing else.
  std::vector<const StoreTensor*> tensors(batch.begin(), batch.end());
  std::sort(tensors.begin(), tensors.end(), HostOrder);
  uint64_t bytes = 0;
  for (const StoreTensor* t : tensors) bytes += t->size;
  LinkScope scope(links_.h2d, bytes);
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Event> done, device_->CreateEvent());
  Status queued;
  for (size_t begin = 0, end; queued.ok() && begin < tensors.size(); begin = end) {
    const StoreTensor& first = *tensors[begin];
    const char* host = first.copies[Index(Tier::kHost)].block.as<const char>();
    end = begin + 1;
    while (end < tensors.size() && ContinuesRun(*tensors[end - 1], *tensors[end])) ++end;
    const StoreTensor& last = *tensors[end - 1];
    const uint64_t run = last.copies[Index(Tier::kHost)].block.as<const char>() + last.size - host;
    queued = up_stream_->Copy(first.copies[Index(Tier::kDevice)].block.data(), host, run,
                              CopyKind::kHostToDevice);
  }
  if (queued.ok()) queued = up_stream_->Record(*done);
  if (!queued.ok()) {
    (void)up_stream_->Synchronize();  // what was queued reads the host copies: let it finish
    return queued;
  }
  return done->Synchronize();
}

Status TierMover::CopyDown(const void* device_src, void* host_dst, uint64_t n) {
  LinkScope scope(links_.d2h, n);
  if (!direct_) return DeviceCopy(*down_stream_, host_dst, device_src, n, CopyKind::kDeviceToHost);
  std::memcpy(host_dst, device_src, n);
  counters_.CountCopy(CopyKind::kDeviceToHost, n);  // the stream's copy, made by the CPU
  return OkStatus();
}

Status TierMover::MoveZeros(StoreTensor& t, Tier dst) {
  TierCopy& to = t.copies[Index(dst)];
  if (dst == Tier::kHost || (direct_ && dst == Tier::kDevice)) {
    ZeroDirect(to.block.data(), t.size, dst);
    return OkStatus();
  }
  if (dst == Tier::kDevice) {
    ZINF_RETURN_IF_ERROR(up_stream_->Memset(to.block.data(), 0, t.size));
    return up_stream_->Synchronize();
  }
  // NVMe from zeros: through a zeroed staging buffer.
  return WriteFromDevice(to, nullptr);
}

Status TierMover::Clear(StoreTensor& t, Tier tier) {
  TierCopy& c = t.copies[Index(tier)];
  if (tier == Tier::kDevice && !direct_) {
    ZINF_RETURN_IF_ERROR(up_stream_->Memset(c.block.data(), 0, t.size));
    return up_stream_->Synchronize();
  }
  ZeroDirect(c.block.data(), t.size, tier);
  return OkStatus();
}

void TierMover::ZeroDirect(void* data, uint64_t size, Tier tier) {
  std::memset(data, 0, size);
  if (tier == Tier::kDevice) {
    counters_.CountDeviceSet(size);  // what a stream's memset would do
  } else {
    counters_.CountHostSet(size);
  }
}

Status TierMover::ReadToDevice(const TierCopy& from, char* device_dst) {
  PoolBlock staging = nvme_->TakeStaging();
  Status s;
  for (size_t k = 0; k < from.extents.size() && s.ok(); ++k) {
    const uint64_t n = from.extents[k].size_bytes;
    {
      LinkScope scope(links_.n2h, n);
      s = nvme_->ReadPiece(from.extents[k], staging.data());
    }
    if (s.ok()) {
      LinkScope scope(links_.h2d, n);
      s = DeviceCopy(*up_stream_, device_dst + k * nvme_->piece_bytes(), staging.data(), n,
                     CopyKind::kHostToDevice);
    }
  }
  nvme_->GiveStaging(std::move(staging));
  return s;
}

Status TierMover::WriteFromDevice(const TierCopy& to, const char* device_src) {
  PoolBlock staging = nvme_->TakeStaging();
  if (device_src == nullptr) ZeroDirect(staging.data(), staging.size_bytes(), Tier::kHost);
  Status s;
  for (size_t k = 0; k < to.extents.size() && s.ok(); ++k) {
    const uint64_t n = to.extents[k].size_bytes;
    if (device_src != nullptr) {
      LinkScope scope(links_.d2h, n);
      s = DeviceCopy(*down_stream_, staging.data(), device_src + k * nvme_->piece_bytes(), n,
                     CopyKind::kDeviceToHost);
    }
    if (s.ok()) {
      LinkScope scope(links_.h2n, n);
      s = nvme_->WritePiece(to.extents[k], staging.data());
    }
  }
  nvme_->GiveStaging(std::move(staging));
  return s;
}

Status TierMover::DeviceCopy(Stream& stream, void* dst, const void* src, uint64_t n,
                             CopyKind kind) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Event> done, device_->CreateEvent());
  ZINF_RETURN_IF_ERROR(stream.Copy(dst, src, n, kind));
  ZINF_RETURN_IF_ERROR(stream.Record(*done));
  return done->Synchronize();
}

}  // namespace zinf
