// FaultyEngine: fault injection around a real IoEngine. Thread-safety: see faulty_engine.h.
#include "tests/testing/faulty_engine.h"

#include <fmt/core.h>

#include <cerrno>
#include <optional>

namespace zinf {

FaultyEngine::FaultyEngine(std::unique_ptr<IoEngine> base)
    : base_(std::move(base)), name_(fmt::format("faulty({})", base_->name())) {}

FaultyEngine::~FaultyEngine() { base_->Drain(); }

void FaultyEngine::Arm(IoOp op, int skip, Fault fault) {
  std::lock_guard<std::mutex> lock(mu_);
  armed_.push_back(Armed{op, skip, fault});
}

int FaultyEngine::injected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_;
}

StatusOr<int> FaultyEngine::AddFile(const IoFile& file) {
  ZINF_ASSIGN_OR_RETURN(int id, base_->AddFile(file));
  std::lock_guard<std::mutex> lock(mu_);
  if (paths_.size() <= static_cast<size_t>(id)) paths_.resize(static_cast<size_t>(id) + 1);
  paths_[static_cast<size_t>(id)] = file.path();
  return id;
}

void FaultyEngine::Submit(const IoRequest& request, IoCallback done) {
  std::optional<Fault> fault;
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = armed_.begin(); it != armed_.end(); ++it) {
      if (it->op != request.op) continue;
      if (it->skip-- == 0) {
        fault = it->fault;
        armed_.erase(it);
        ++injected_;
        break;
      }
    }
    if (request.file >= 0 && static_cast<size_t>(request.file) < paths_.size()) {
      path = paths_[static_cast<size_t>(request.file)];
    }
  }
  if (!fault) {
    base_->Submit(request, std::move(done));
    return;
  }
  const std::string where = fmt::format("{} {} at offset {} ({} bytes)", IoOpName(request.op), path,
                                        request.offset, request.length);
  switch (*fault) {
    case Fault::kEio:
      done(ErrnoStatus(EIO, where + " [injected]"));
      return;
    case Fault::kEnospc:
      done(ErrnoStatus(ENOSPC, where + " [injected]"));
      return;
    case Fault::kShortWrite:
    case Fault::kTornWrite: {
      // Half of the data, kept aligned so that O_DIRECT files take it.
      uint64_t half = (request.length / 2) & ~(kDirectIoAlignment - 1);
      if (half == 0) half = request.length / 2;
      if (half == 0) {
        done(
            *fault == Fault::kTornWrite
                ? OkStatus()
                : ErrnoStatus(ENOSPC, fmt::format("{}: short write of 0 bytes [injected]", where)));
        return;
      }
      IoRequest part = request;
      part.length = half;
      const bool torn = *fault == Fault::kTornWrite;
      base_->Submit(part, [done = std::move(done), torn, half, where](Status s) {
        if (!s.ok() || torn) {
          done(std::move(s));
          return;
        }
        done(ErrnoStatus(ENOSPC, fmt::format("{}: short write, {} bytes written, the rest "
                                             "failed [injected]",
                                             where, half)));
      });
      return;
    }
    case Fault::kCorruptRead: {
      char* byte = static_cast<char*>(request.buffer) + request.length / 2;
      base_->Submit(request, [done = std::move(done), byte](Status s) {
        if (s.ok()) *byte = static_cast<char>(*byte ^ 0x40);
        done(std::move(s));
      });
      return;
    }
  }
}

}  // namespace zinf
