// Model loading: picks the frontend by path, builds the family's graph, compiles it
// for the backend (see model.h).
#include "runtime/model.h"

#include <filesystem>

#include "core/log.h"
#include "core/status.h"
#include "frontends/gguf_hf.h"
#include "frontends/hf_dir.h"
#include "models/random_weights.h"

namespace kiln {

std::unique_ptr<Model> Model::from_built(BuiltModel built, const ModelOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->built_ = std::move(built);
  m->backend_ = create_backend(options.backend);
  CompileOptions co;
  co.weight_dtype = options.weight_dtype;
  co.communicator = options.communicator;
  m->compiled_ = m->backend_->compile(m->built_.graph, co);
  return m;
}

std::unique_ptr<Model> Model::load(const std::string& path, const ModelOptions& options) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) throw_error(ErrorCode::kNotFound, "model path '", path, "' does not exist");
  BuiltModel built;
  nlohmann::json config;
  std::shared_ptr<const GgufFile> gguf;
  if (fs::is_directory(path)) {
    HfModelDir dir = HfModelDir::open(path);
    config = dir.config;
    built = build_model(config, *dir.weights);
  } else if (fs::path(path).extension() == ".gguf") {
    gguf = std::make_shared<const GgufFile>(GgufFile::open(path));
    config = gguf_to_hf_config(*gguf);
    GgufWeightSource weights(gguf);
    built = build_model(config, weights);
  } else {
    throw_error(ErrorCode::kUnsupported, "'", path,
                "' is not a model directory (config.json + *.safetensors) or a .gguf file");
  }
  log_info("loaded ", built.info.family, " model from ", path, ": ", built.graph.nodes().size(),
           " nodes, ", built.graph.weight_bytes() >> 20, " MiB of weights");
  auto m = from_built(std::move(built), options);
  m->path_ = path;
  m->config_ = std::move(config);
  m->gguf_ = std::move(gguf);
  return m;
}

std::unique_ptr<Model> Model::load_random(const std::string& config_path, const ModelOptions& options) {
  namespace fs = std::filesystem;
  std::string file = fs::is_directory(config_path) ? config_path + "/config.json" : config_path;
  nlohmann::json config = read_json_file(file);
  auto m = from_built(build_model(config, RandomWeightSource()), options);
  m->path_ = file + " (random weights)";
  m->config_ = std::move(config);
  return m;
}

}  // namespace kiln
