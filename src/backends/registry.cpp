// Backend lookup by name. New backends add one line here and their own folder.
#include <map>
#include <mutex>

#include "backends/backend.h"
#include "backends/communicator.h"
#include "backends/cpu/cpu_backend.h"
#include "core/status.h"
#ifdef KILN_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace kiln {

namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, BackendFactory>& registered() {
  static std::map<std::string, BackendFactory> r;
  return r;
}

}  // namespace

void register_backend(const std::string& name, BackendFactory make) {
  if (name.empty() || name == "cpu" || name == "cuda" || !make)
    throw_error(ErrorCode::kInvalidArgument, "register_backend: '", name,
                "' (a new, non-empty name other than cpu and cuda, with a factory)");
  std::lock_guard lock(registry_mutex());
  registered()[name] = std::move(make);
}

std::unique_ptr<Backend> create_backend(const std::string& name, int device) {
  if (device < 0) throw_error(ErrorCode::kInvalidArgument, "backend '", name, "': device index ", device, " < 0");
  if (name == "cpu") return create_cpu_backend();
#ifdef KILN_HAVE_CUDA
  if (name == "cuda") return create_cuda_backend(device);
#endif
  BackendFactory make;
  {
    std::lock_guard lock(registry_mutex());
    if (auto it = registered().find(name); it != registered().end()) make = it->second;
  }
  if (make) return make(device);
  std::string known;
  for (auto& b : available_backends()) known += (known.empty() ? "" : ", ") + b;
  throw_error(ErrorCode::kUnsupported, "unknown or unavailable backend '", name,
              "' (available: ", known, ")");
}

std::vector<std::shared_ptr<Communicator>> Backend::make_communicators(int world_size, int first_device) {
  throw_error(ErrorCode::kUnsupported, "tensor parallelism (--tp ", world_size, ") needs an all-reduce between ranks, and the ",
              name(), " backend has none; use --backend cpu (ranks as threads of one process) or cuda (NCCL)");
}

std::vector<std::string> available_backends() {
#ifdef KILN_HAVE_CUDA
  std::vector<std::string> names = {"cpu", "cuda"};
#else
  std::vector<std::string> names = {"cpu"};
#endif
  std::lock_guard lock(registry_mutex());
  for (const auto& [name, make] : registered()) names.push_back(name);
  return names;
}

}  // namespace kiln
