// Model loading: picks the frontend by path, builds the family's graph, compiles it
// for the backend (see model.h).
#include "runtime/model.h"

#include <filesystem>

#include "core/log.h"
#include "core/status.h"
#include "frontends/hf_dir.h"

namespace kiln {

std::unique_ptr<Model> Model::from_built(BuiltModel built, const ModelOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->built_ = std::move(built);
  m->backend_ = create_backend(options.backend);
  CompileOptions co;
  co.weight_dtype = options.weight_dtype;
  m->compiled_ = m->backend_->compile(m->built_.graph, co);
  return m;
}

std::unique_ptr<Model> Model::load(const std::string& path, const ModelOptions& options) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) throw_error(ErrorCode::kNotFound, "model path '", path, "' does not exist");
  BuiltModel built;
  if (fs::is_directory(path)) {
    HfModelDir dir = HfModelDir::open(path);
    built = build_model(dir.config, *dir.weights);
  } else {
    throw_error(ErrorCode::kUnsupported, "'", path,
                "' is not a model directory (config.json + *.safetensors) or a .gguf file");
  }
  log_info("loaded ", built.info.family, " model from ", path, ": ", built.graph.nodes().size(),
           " nodes, ", built.graph.weight_bytes() >> 20, " MiB of weights");
  auto m = from_built(std::move(built), options);
  m->path_ = path;
  return m;
}

}  // namespace kiln
