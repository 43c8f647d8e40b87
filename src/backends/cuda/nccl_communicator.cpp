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

// Every rank's communicator, destroyed together when the last rank lets go.
class NcclGroup {
 public:
  NcclGroup(std::vector<NcclComm> comms, std::vector<int> devices) : comms_(std::move(comms)), devices_(std::move(devices)) {}
  ~NcclGroup() {
    int prev = 0;
    (void)cudaGetDevice(&prev);
    for (size_t r = 0; r < comms_.size(); ++r) {
      (void)cudaSetDevice(devices_[r]);
      (void)cudaDeviceSynchronize();  // no queued all-reduce may outlive its communicator
      nccl().comm_destroy(comms_[r]);
    }
    (void)cudaSetDevice(prev);
  }
  NcclComm comm(int rank) const { return comms_[size_t(rank)]; }

 private:
  std::vector<NcclComm> comms_;
  std::vector<int> devices_;
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
  auto group = std::make_shared<NcclGroup>(std::move(comms), devices);
  std::vector<std::shared_ptr<Communicator>> out;
  for (int rank = 0; rank < world_size; ++rank) out.push_back(std::make_shared<NcclCommunicator>(group, rank, world_size));
  return out;
}

}  // namespace kiln::cuda
