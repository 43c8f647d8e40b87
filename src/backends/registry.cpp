// Backend lookup by name. New backends add one line here and their own folder.
#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"
#include "core/status.h"

namespace kiln {

std::unique_ptr<Backend> create_backend(const std::string& name) {
  if (name == "cpu") return create_cpu_backend();
  std::string known;
  for (auto& b : available_backends()) known += (known.empty() ? "" : ", ") + b;
  throw_error(ErrorCode::kUnsupported, "unknown or unavailable backend '", name,
              "' (available: ", known, ")");
}

std::vector<std::string> available_backends() { return {"cpu"}; }

}  // namespace kiln
