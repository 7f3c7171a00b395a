// FaultyEngine: an IoEngine wrapper that fails on command, to prove that I/O errors surface
// with context and that no acknowledged write is lost (STYLE.md: fault injection).
//
// Arm a fault for the k-th next request of a kind; other requests pass through unchanged:
//   kEio, kEnospc  the request is not performed and fails with that errno
//   kShortWrite    the first half reaches the disk, then the rest fails (ENOSPC): a device
//                  that filled up in the middle of a write
//   kTornWrite     the first half reaches the disk and the write reports success: a lying
//                  device or a torn write; only a checksum can catch it on read
//   kCorruptRead   the read succeeds and one byte of the buffer is flipped
//
// Thread-safety: as IoEngine; Arm may be called concurrently with I/O.
#ifndef ZINF_TESTS_TESTING_FAULTY_ENGINE_H_
#define ZINF_TESTS_TESTING_FAULTY_ENGINE_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "nvme/io_engine.h"

namespace zinf {

enum class Fault { kEio, kEnospc, kShortWrite, kTornWrite, kCorruptRead };

class FaultyEngine final : public IoEngine {
 public:
  explicit FaultyEngine(std::unique_ptr<IoEngine> base);
  ~FaultyEngine() override;

  // Fails the request that is the `skip`-th (0: the next) of kind `op` from now on.
  void Arm(IoOp op, int skip, Fault fault);
  int injected() const;  // faults fired so far

  std::string_view name() const override { return name_; }
  const AioOptions& options() const override { return base_->options(); }
  StatusOr<int> AddFile(const IoFile& file) override;
  [[nodiscard]] Status RegisterBuffer(void* data, uint64_t size_bytes) override {
    return base_->RegisterBuffer(data, size_bytes);
  }
  void Submit(const IoRequest& request, IoCallback done) override;
  using IoEngine::Submit;
  void Drain() override { base_->Drain(); }

 private:
  struct Armed {
    IoOp op;
    int skip;
    Fault fault;
  };

  std::unique_ptr<IoEngine> base_;
  std::string name_;
  mutable std::mutex mu_;
  std::vector<Armed> armed_;
  std::vector<std::string> paths_;  // by file id
  int injected_ = 0;
};

}  // namespace zinf

#endif  // ZINF_TESTS_TESTING_FAULTY_ENGINE_H_
