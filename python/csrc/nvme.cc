// zinf._zinf.SwapStore and Completion: the NVMe swap store (preallocated, striped swap files,
// io_uring, CRC32C per piece) through the C ABI, for zinf.nvme.SwapHandle.
//
// Buffers: the caller's memory, given as a pointer; zinf.nvme keeps the tensor alive until the
// completion is done. Completion.wait releases the GIL. A Completion that is dropped waits for
// its I/O first (zinf_completion_destroy), so memory is never written after it is freed.
//
// Thread-safety: as zinf_swap_store_t: any thread; an extent must not be written while it is
// read, written or freed elsewhere.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "python/csrc/binding.h"
#include "zinf/c_api.h"

namespace zinf::python {
namespace {

class Completion {
 public:
  explicit Completion(zinf_completion_t* handle) : handle_(handle) {}
  ~Completion() {
    py::gil_scoped_release release;  // destroy waits for the I/O
    zinf_completion_destroy(handle_);
  }
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;

  void Wait() {
    CheckC([&](char** err) {
      py::gil_scoped_release release;
      return zinf_completion_wait(handle_, err);
    });
  }
  // True when finished; raises the operation's error when it failed.
  bool Done() {
    int done = 0;
    CheckC([&](char** err) { return zinf_completion_poll(handle_, &done, err); });
    return done != 0;
  }

 private:
  zinf_completion_t* handle_;
};

class SwapStore {
 public:
  SwapStore(const std::vector<std::string>& paths, uint64_t capacity_bytes, uint64_t stripe_bytes,
            const std::optional<std::string>& aio_json, int rank, bool checksum, int lock_wait_ms) {
    std::vector<const char*> c_paths;
    for (const std::string& p : paths) c_paths.push_back(p.c_str());
    zinf_swap_store_options_t options;
    zinf_swap_store_options_init(&options);
    options.paths = c_paths.data();
    options.path_count = c_paths.size();
    options.capacity_bytes = capacity_bytes;
    options.stripe_bytes = stripe_bytes;
    options.aio_json = aio_json ? aio_json->c_str() : nullptr;
    options.rank = rank;
    options.checksum = checksum ? 1 : 0;
    options.lock_wait_ms = lock_wait_ms;
    CheckC([&](char** err) {
      py::gil_scoped_release release;  // preallocating the files can take a while
      return zinf_swap_store_open(&options, &store_, err);
    });
  }
  ~SwapStore() { Close(); }
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  void Close() {
    if (store_ == nullptr) return;
    py::gil_scoped_release release;
    zinf_swap_store_destroy(store_);
    store_ = nullptr;
  }

  std::pair<uint64_t, uint64_t> Allocate(uint64_t size_bytes, const std::string& name) {
    zinf_swap_extent_t extent;
    CheckC([&](char** err) {
      return zinf_swap_store_allocate(Open(), size_bytes, name.c_str(), &extent, err);
    });
    return {extent.id, extent.size_bytes};
  }
  void Free(uint64_t id, uint64_t size_bytes) {
    CheckC([&](char** err) { return zinf_swap_store_free(Open(), {id, size_bytes}, err); });
  }
  std::unique_ptr<Completion> WriteAsync(uint64_t id, uint64_t size_bytes, uintptr_t src) {
    zinf_completion_t* completion = nullptr;
    CheckC([&](char** err) {
      return zinf_swap_store_write_async(Open(), {id, size_bytes}, Pointer(src, "source"),
                                         &completion, err);
    });
    return std::make_unique<Completion>(completion);
  }
  std::unique_ptr<Completion> ReadAsync(uint64_t id, uint64_t size_bytes, uintptr_t dst) {
    zinf_completion_t* completion = nullptr;
    CheckC([&](char** err) {
      return zinf_swap_store_read_async(Open(), {id, size_bytes}, Pointer(dst, "destination"),
                                        &completion, err);
    });
    return std::make_unique<Completion>(completion);
  }
  void CheckStatus() {
    CheckC([&](char** err) { return zinf_swap_store_status(Open(), err); });
  }
  py::dict Info() {
    zinf_swap_store_info_t info;
    info.struct_size = sizeof(info);
    CheckC([&](char** err) { return zinf_swap_store_info(Open(), &info, err); });
    py::dict d;
    d["capacity_bytes"] = info.capacity_bytes;
    d["free_bytes"] = info.free_bytes;
    d["file_bytes"] = info.file_bytes;
    d["stripe_bytes"] = info.stripe_bytes;
    d["file_count"] = info.file_count;
    d["direct_io"] = info.direct_io != 0;
    return d;
  }

 private:
  zinf_swap_store_t* Open() const {
    if (store_ == nullptr) throw StatusError(FailedPrecondition("the swap store is closed"));
    return store_;
  }
  zinf_swap_store_t* store_ = nullptr;
};

}  // namespace

void BindNvme(py::module_& m) {
  py::class_<Completion>(m, "Completion", "The outcome of one asynchronous swap read or write")
      .def("wait", &Completion::Wait)
      .def("done", &Completion::Done);
  py::class_<SwapStore>(m, "SwapStore", "zinf's NVMe swap store (zinf.nvme.SwapHandle uses it)")
      .def(py::init<const std::vector<std::string>&, uint64_t, uint64_t,
                    const std::optional<std::string>&, int, bool, int>(),
           py::arg("paths"), py::arg("capacity_bytes"), py::arg("stripe_bytes") = 0,
           py::arg("aio_json") = std::nullopt, py::arg("rank") = 0, py::arg("checksum") = true,
           py::arg("lock_wait_ms") = 5000)
      .def("close", &SwapStore::Close)
      .def("allocate", &SwapStore::Allocate, py::arg("size_bytes"), py::arg("name"))
      .def("free", &SwapStore::Free, py::arg("id"), py::arg("size_bytes"))
      .def("write_async", &SwapStore::WriteAsync, py::arg("id"), py::arg("size_bytes"),
           py::arg("src"))
      .def("read_async", &SwapStore::ReadAsync, py::arg("id"), py::arg("size_bytes"),
           py::arg("dst"))
      .def("check_status", &SwapStore::CheckStatus)
      .def("info", &SwapStore::Info);
}

}  // namespace zinf::python
