#include "cuda/nccl.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "cuda/errors.h"
#include "cuda/on_device.h"

#if __has_include(<nccl.h>)
#include <nccl.h>
#define LODE_HAVE_NCCL_HEADER 1
#endif

namespace lode::cuda {

#ifdef LODE_HAVE_NCCL_HEADER

namespace {

// The functions lode calls, from the library loaded once per process.
struct NcclLibrary {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
};

template <class F>
void resolve(void* handle, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(handle, name));
  if (!out) fail("NCCL: libnccl.so.2 has no {} (an NCCL older than 2.7?); install CUDA 13's NCCL", name);
}

const NcclLibrary& library() {
  static const NcclLibrary loaded = [] {
    void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!handle)
      fail("NCCL: cannot load libnccl.so.2 ({}): install NVIDIA's NCCL (the libnccl2 package, or pip's "
           "nvidia-nccl-cu13) or put its folder on LD_LIBRARY_PATH; peer copies need no NCCL",
           dlerror());
    NcclLibrary l;
    resolve(handle, "ncclGetVersion", l.get_version);
    resolve(handle, "ncclCommInitAll", l.comm_init_all);
    resolve(handle, "ncclCommDestroy", l.comm_destroy);
    resolve(handle, "ncclGetErrorString", l.error_string);
    resolve(handle, "ncclSend", l.send);
    resolve(handle, "ncclRecv", l.recv);
    resolve(handle, "ncclGroupStart", l.group_start);
    resolve(handle, "ncclGroupEnd", l.group_end);
    return l;  // (the handle stays open for the process)
  }();
  return loaded;
}

void check(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) fail("NCCL: {}: {}", what, library().error_string(result));
}

}  // namespace

struct NcclGroup::Impl {
  std::vector<ncclComm_t> comms;
};

NcclGroup::NcclGroup(const std::vector<int>& devices) : impl_(std::make_unique<Impl>()) {
  std::vector<int> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    fail("NCCL takes one rank a GPU, and a GPU was named twice; hand rows between shares on one GPU by peer copies");
  // NVLink multicast (NVLS) can put a host's shared GPUs out of service; lode uses none of it.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  const NcclLibrary& l = library();
  impl_->comms.resize(devices.size());
  check(l.comm_init_all(impl_->comms.data(), int(devices.size()), devices.data()), "creating the communicators");
  try {
    connect_neighbours(devices);
  } catch (...) {
    for (ncclComm_t comm : impl_->comms) l.comm_destroy(comm);
    throw;
  }
}

// NCCL connects a pair of ranks at their first send, taking buffers on both GPUs: one send of a few
// bytes between each neighbour pair now takes them before the GPUs' free memory is read for the
// budgets (cuda/pipeline.h), not out of what the budgets left.
void NcclGroup::connect_neighbours(const std::vector<int>& devices) {
  std::vector<void*> bytes(devices.size(), nullptr);
  for (size_t r = 0; r < devices.size(); ++r) {
    const OnDevice on(devices[r]);
    check_cuda(cudaMalloc(&bytes[r], 16), "NCCL's first send");
  }
  try {
    for (size_t r = 0; r + 1 < devices.size(); ++r)
      copy(int(r), nullptr, int(r + 1), nullptr, {{bytes[r], bytes[r + 1]}}, 16);
    for (size_t r = 0; r < devices.size(); ++r) {
      const OnDevice on(devices[r]);
      check_cuda(cudaDeviceSynchronize(), "NCCL's first send");
    }
  } catch (...) {
    for (size_t r = 0; r < devices.size(); ++r) {
      const OnDevice on(devices[r]);
      cudaFree(bytes[r]);
    }
    throw;
  }
  for (size_t r = 0; r < devices.size(); ++r) {
    const OnDevice on(devices[r]);
    check_cuda(cudaFree(bytes[r]), "NCCL's first send");
  }
}

NcclGroup::~NcclGroup() {
  for (ncclComm_t comm : impl_->comms)
    if (comm) library().comm_destroy(comm);
}

void NcclGroup::copy(int a, void* a_stream, int b, void* b_stream, const std::vector<Copy>& copies, size_t bytes) {
  const NcclLibrary& l = library();
  check(l.group_start(), "starting a group");
  ncclResult_t queued = ncclSuccess;  // (the group is ended whatever happens)
  for (const Copy& c : copies) {
    if (queued == ncclSuccess)
      queued = l.send(c.from, bytes, ncclChar, b, impl_->comms[size_t(a)], static_cast<cudaStream_t>(a_stream));
    if (queued == ncclSuccess)
      queued = l.recv(c.to, bytes, ncclChar, a, impl_->comms[size_t(b)], static_cast<cudaStream_t>(b_stream));
  }
  const ncclResult_t ended = l.group_end();
  check(queued, "queueing rows for the next GPU");
  check(ended, "sending rows to the next GPU");
}

std::string NcclGroup::version() const {
  int v = 0;
  check(library().get_version(&v), "reading its version");
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

#else

struct NcclGroup::Impl {};

NcclGroup::NcclGroup(const std::vector<int>&) {
  fail("this lode was built without NCCL's header (nccl.h, CUDA 13's); hand rows between GPUs by peer copies");
}
NcclGroup::~NcclGroup() = default;
void NcclGroup::connect_neighbours(const std::vector<int>&) {}
void NcclGroup::copy(int, void*, int, void*, const std::vector<Copy>&, size_t) {}
std::string NcclGroup::version() const { return {}; }

#endif

}  // namespace lode::cuda
