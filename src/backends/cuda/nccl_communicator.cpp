// NCCL communicators for the CUDA backend (see nccl_communicator.h). The few NCCL entry
// points used are declared here (their C ABI has been stable since NCCL 2.10, the first
// with bf16) and resolved with dlsym, so neither nccl.h nor libnccl is needed to build.
#include "backends/cuda/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/ops/allreduce.h"
#include "core/log.h"
#include "core/status.h"

namespace kiln::cuda {
namespace {

// From nccl.h: an opaque communicator, ncclResult_t (0 = ncclSuccess), ncclDataType_t
// and ncclRedOp_t values.
struct NcclCommTag;
using NcclComm = NcclCommTag*;
constexpr int kNcclSuccess = 0;
constexpr int kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclBfloat16 = 9;
constexpr int kNcclSum = 0;

struct NcclLib {
  void* handle = nullptr;
  std::string path, error;  // the library loaded, or why none was
  int (*get_version)(int*) = nullptr;
  int (*comm_init_all)(NcclComm*, int, const int*) = nullptr;
  int (*comm_destroy)(NcclComm) = nullptr;
  int (*all_reduce)(const void*, void*, size_t, int, int, NcclComm, cudaStream_t) = nullptr;
  const char* (*error_string)(int) = nullptr;

  const char* describe(int r) const { return error_string ? error_string(r) : "unknown NCCL error"; }
};

template <typename F>
bool resolve(NcclLib& lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(lib.handle, name));
  if (!fn) lib.error = str_cat(lib.path, " has no symbol ", name);
  return fn != nullptr;
}

NcclLib load_nccl() {
  NcclLib lib;
  std::vector<std::string> candidates;
  if (const char* e = std::getenv("KILN_NCCL_LIBRARY"); e && *e)
    candidates.push_back(e);
  else
    candidates = {"libnccl.so.2", "libnccl.so"};
  std::string tried;
  for (const std::string& c : candidates) {
    lib.handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib.handle) {
      lib.path = c;
      break;
    }
    const char* why = dlerror();
    tried += str_cat(tried.empty() ? "" : "; ", c, ": ", why ? why : "not found");
  }
  if (!lib.handle) {
    lib.error = str_cat("cannot load NCCL (", tried,
                        "); install it (it ships with the CUDA toolkit or the nvidia-nccl wheel), put its "
                        "folder on LD_LIBRARY_PATH, or name the file in KILN_NCCL_LIBRARY");
    return lib;
  }
  if (!resolve(lib, lib.get_version, "ncclGetVersion") || !resolve(lib, lib.comm_init_all, "ncclCommInitAll") ||
      !resolve(lib, lib.comm_destroy, "ncclCommDestroy") || !resolve(lib, lib.all_reduce, "ncclAllReduce") ||
      !resolve(lib, lib.error_string, "ncclGetErrorString")) {
    dlclose(lib.handle);
    lib.handle = nullptr;
    return lib;
  }
  int v = 0;
  if (lib.get_version(&v) == kNcclSuccess && v < 21000) {
    lib.error = str_cat(lib.path, " is NCCL ", v, "; kiln needs 2.10 or newer (bf16 reductions)");
    dlclose(lib.handle);
    lib.handle = nullptr;
  }
  return lib;
}

const NcclLib& nccl() {
  static const NcclLib lib = load_nccl();
  return lib;
}

// The peer-to-peer all-reduce's buffers (ops/allreduce.h) on every rank's device, when
// every pair of the group's devices can access each other's memory and
// KILN_CUDA_P2P_ALLREDUCE is not 0. Sums up to kP2pAllReduceMaxBytes go through it.
class P2pBuffers {
 public:
  // Null when peer access is missing between some pair or turned off.
  static std::unique_ptr<P2pBuffers> make(const std::vector<int>& devices) {
    const int world = int(devices.size());
    if (const char* e = std::getenv("KILN_CUDA_P2P_ALLREDUCE"); e && std::string(e) == "0") return nullptr;
    if (world < 2 || world > kP2pMaxRanks) return nullptr;
    for (int a : devices)
      for (int b : devices) {
        int ok = 0;
        if (a != b && (cudaDeviceCanAccessPeer(&ok, a, b) != cudaSuccess || !ok)) {
          log_info("tensor parallel: devices ", a, " and ", b, " have no peer access: all-reduces through NCCL only");
          return nullptr;
        }
      }
    std::unique_ptr<P2pBuffers> p(new P2pBuffers());
    const size_t stage_bytes = size_t(2 * world) * size_t(kP2pAllReduceMaxBytes);
    const size_t flag_bytes = sizeof(uint32_t) * size_t(kP2pMaxBlocks) * size_t(world);
    std::vector<void*> stages;
    std::vector<uint32_t*> flag_areas;
    for (int r = 0; r < world; ++r) {
      KILN_CUDA_CHECK(cudaSetDevice(devices[size_t(r)]));
      for (int peer : devices)
        if (peer != devices[size_t(r)]) {
          const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
          if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
          else KILN_CUDA_CHECK(e);
        }
      void *stage = nullptr, *flags = nullptr, *epochs = nullptr;
      KILN_CUDA_CHECK(cudaMalloc(&stage, stage_bytes));
      p->allocs_.push_back({devices[size_t(r)], stage});
      KILN_CUDA_CHECK(cudaMalloc(&flags, flag_bytes));
      p->allocs_.push_back({devices[size_t(r)], flags});
      KILN_CUDA_CHECK(cudaMalloc(&epochs, sizeof(uint32_t) * kP2pMaxBlocks));
      p->allocs_.push_back({devices[size_t(r)], epochs});
      KILN_CUDA_CHECK(cudaMemset(flags, 0, flag_bytes));
      KILN_CUDA_CHECK(cudaMemset(epochs, 0, sizeof(uint32_t) * kP2pMaxBlocks));
      P2pRankBuffers rb;  // the stage and flag pointers are filled in once every rank has them
      rb.rank = r;
      rb.world = world;
      rb.epochs = static_cast<uint32_t*>(epochs);
      p->ranks_.push_back(rb);
      stages.push_back(stage);
      flag_areas.push_back(static_cast<uint32_t*>(flags));
    }
    for (int r = 0; r < world; ++r)
      for (int q = 0; q < world; ++q) {
        p->ranks_[size_t(r)].stage[q] = stages[size_t(q)];
        p->ranks_[size_t(r)].flags[q] = flag_areas[size_t(q)];
      }
    for (int d : devices) {
      KILN_CUDA_CHECK(cudaSetDevice(d));
      KILN_CUDA_CHECK(cudaDeviceSynchronize());  // the zeroed flags are in place before any rank runs
    }
    return p;
  }
  ~P2pBuffers() {
    for (auto& [dev, ptr] : allocs_) {
      (void)cudaSetDevice(dev);
      (void)cudaFree(ptr);
    }
  }
  const P2pRankBuffers& rank(int r) const { return ranks_[size_t(r)]; }

 private:
  P2pBuffers() = default;
  std::vector<std::pair<int, void*>> allocs_;  // (device, pointer), freed on that device
  std::vector<P2pRankBuffers> ranks_;
};

// Every rank's communicator, destroyed together when the last rank lets go.
class NcclGroup {
 public:
  NcclGroup(std::vector<NcclComm> comms, std::vector<int> devices, std::unique_ptr<P2pBuffers> p2p)
      : comms_(std::move(comms)), devices_(std::move(devices)), p2p_(std::move(p2p)) {}
  ~NcclGroup() {
    int prev = 0;
    (void)cudaGetDevice(&prev);
    for (size_t r = 0; r < comms_.size(); ++r) {
      (void)cudaSetDevice(devices_[r]);
      (void)cudaDeviceSynchronize();  // no queued all-reduce may outlive its communicator
      nccl().comm_destroy(comms_[r]);
    }
    p2p_.reset();
    (void)cudaSetDevice(prev);
  }
  NcclComm comm(int rank) const { return comms_[size_t(rank)]; }
  const P2pBuffers* p2p() const { return p2p_.get(); }

 private:
  std::vector<NcclComm> comms_;
  std::vector<int> devices_;
  std::unique_ptr<P2pBuffers> p2p_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclGroup> group, int rank, int world)
      : group_(std::move(group)), rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  void all_reduce_sum(float*, int64_t) override {
    throw_error(ErrorCode::kUnsupported, "the NCCL communicator reduces device memory only (CUDA ranks)");
  }
  void all_reduce_sum_device(const void* send, void* recv, int64_t n, DType dtype, void* stream) override {
    int type = 0;
    switch (dtype) {
      case DType::kF32: type = kNcclFloat32; break;
      case DType::kBF16: type = kNcclBfloat16; break;
      case DType::kF16: type = kNcclFloat16; break;
      default:
        throw_error(ErrorCode::kUnsupported, "NCCL all-reduce of ", dtype_name(dtype), " (expected f32, bf16 or f16)");
    }
    KILN_CHECK(n >= 0, "NCCL all-reduce of ", n, " elements");
    if (const P2pBuffers* p2p = group_->p2p(); p2p && n * int64_t(dtype_size(dtype)) <= kP2pAllReduceMaxBytes) {
      launch_p2p_all_reduce(dtype, send, recv, n, p2p->rank(rank_), static_cast<cudaStream_t>(stream));
      return;
    }
    const int r = nccl().all_reduce(send, recv, size_t(n), type, kNcclSum, group_->comm(rank_),
                                    static_cast<cudaStream_t>(stream));
    if (r != kNcclSuccess)
      throw_error(ErrorCode::kInternal, "ncclAllReduce of ", n, " ", dtype_name(dtype), " on rank ", rank_, " of ",
                  world_, " failed: ", nccl().describe(r), " (", r, ")");
  }

 private:
  std::shared_ptr<NcclGroup> group_;
  int rank_, world_;
};

}  // namespace

std::string nccl_version() {
  const NcclLib& lib = nccl();
  int v = 0;
  if (!lib.handle || lib.get_version(&v) != kNcclSuccess) return "";
  return str_cat(v / 10000, ".", v / 100 % 100, ".", v % 100);
}

std::vector<std::shared_ptr<Communicator>> make_nccl_communicators(int world_size, int first_device) {
  KILN_THROW_IF(world_size < 1 || first_device < 0, kInvalidArgument, "NCCL communicators for ", world_size,
                " ranks from device ", first_device);
  const int count = cuda_device_count();
  if (first_device + world_size > count)
    throw_error(ErrorCode::kUnsupported, "tensor parallelism over ", world_size, " ranks needs CUDA devices ",
                first_device, "..", first_device + world_size - 1, " (one GPU per rank), but ", count,
                count == 1 ? " is" : " are", " visible");
  const NcclLib& lib = nccl();
  if (!lib.handle) throw_error(ErrorCode::kUnsupported, "tensor parallelism on CUDA: ", lib.error);
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // no NVLink multicast unless the user asks for it
  std::vector<int> devices;
  for (int r = 0; r < world_size; ++r) devices.push_back(first_device + r);
  std::vector<NcclComm> comms(size_t(world_size), nullptr);
  int prev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&prev));
  const int r = lib.comm_init_all(comms.data(), world_size, devices.data());
  KILN_CUDA_CHECK(cudaSetDevice(prev));
  if (r != kNcclSuccess)
    throw_error(ErrorCode::kInternal, "ncclCommInitAll over ", world_size, " devices failed: ", lib.describe(r), " (", r,
                ")");
  log_info("tensor parallel: NCCL ", nccl_version(), " (", lib.path, ") over CUDA devices ", first_device, "..",
           first_device + world_size - 1);
  std::unique_ptr<P2pBuffers> p2p;
  try {
    p2p = P2pBuffers::make(devices);
  } catch (const Error& e) {
    log_warn("tensor parallel: no peer-to-peer all-reduce (", e.what(), "): all-reduces through NCCL only");
  }
  KILN_CUDA_CHECK(cudaSetDevice(prev));
  if (p2p)
    log_info("tensor parallel: sums up to ", kP2pAllReduceMaxBytes >> 10,
             " KiB through the one-shot peer-to-peer all-reduce (KILN_CUDA_P2P_ALLREDUCE=0: NCCL only)");
  auto group = std::make_shared<NcclGroup>(std::move(comms), devices, std::move(p2p));
  std::vector<std::shared_ptr<Communicator>> out;
  for (int rank = 0; rank < world_size; ++rank) out.push_back(std::make_shared<NcclCommunicator>(group, rank, world_size));
  return out;
}

}  // namespace kiln::cuda
