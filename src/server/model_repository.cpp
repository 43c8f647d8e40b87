// ModelRepository (see model_repository.h).
#include "server/model_repository.h"

#include <chrono>
#include <filesystem>

#include "core/status.h"
#include "runtime/model_tokenizer.h"

namespace kiln::server {

namespace fs = std::filesystem;

ServedModel& ModelRepository::add(const std::string& path, std::string name) {
  // "random:CONFIG": the architecture of a config.json with random weights (benchmarks
  // of real shapes without a checkpoint; no tokenizer, token ids in and out).
  if (path.rfind("random:", 0) == 0) {
    std::string config = path.substr(7);
    if (name.empty()) name = fs::path(config).stem().string();
    ServedModel& m = add_loaded(Model::load_random(config, model_opt_), name);
    m.path = path;
    return m;
  }
  if (name.empty()) {
    fs::path p = fs::path(path).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    name = p.extension() == ".gguf" ? p.stem().string() : p.filename().string();
  }
  auto model = Model::load(path, model_opt_);
  auto tokenizer = load_model_tokenizer(*model);
  ServedModel& m = add_loaded(std::move(model), name, std::move(tokenizer));
  m.path = path;
  return m;
}

ServedModel& ModelRepository::add_loaded(std::unique_ptr<Model> model, std::string name,
                                         std::optional<tok::Tokenizer> tokenizer) {
  if (find(name)) throw_error(ErrorCode::kInvalidArgument, "two models are named '", name, "'");
  auto m = std::make_unique<ServedModel>();
  m->name = std::move(name);
  m->model = std::move(model);
  m->tokenizer = std::move(tokenizer);
  m->path = m->model->path();
  m->created = std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch()).count();
  if (m->tokenizer && !m->tokenizer->chat_template().empty()) {
    try {
      m->chat_template = std::make_unique<tok::ChatTemplate>(m->tokenizer->chat_template());
    } catch (const Error& e) {
      // Served without chat: /v1/chat/completions then says why.
      std::fprintf(stderr, "kiln serve: %s: chat template unusable: %s\n", m->name.c_str(), e.what());
    }
  }
  // A decoder whose checkpoint declares sentence-embedding pooling (Qwen3-Embedding) is
  // served as an embedding model, as vLLM's embed task serves it.
  if (m->model->info().is_decoder && m->model->info().pooling.empty())
    m->executor = std::make_unique<Executor>(*m->model, m->tokenizer ? &*m->tokenizer : nullptr, exec_opt_);
  else if (m->model->info().family != "onnx") {  // ONNX graphs run op by op, not through encode()
    EncoderBatcherOptions eo = enc_opt_;
    eo.encode.hidden = false;  // the routes return pooled embeddings and logits
    m->batcher = std::make_unique<EncoderBatcher>(*m->model, eo);
  }
  models_.push_back(std::move(m));
  return *models_.back();
}

int ModelRepository::add_directory(const std::string& dir) {
  if (!fs::is_directory(dir)) throw_error(ErrorCode::kNotFound, "model repository '", dir, "' is not a directory");
  std::vector<fs::path> entries;
  for (auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".gguf") entries.push_back(e.path());
    else if (e.is_directory() && fs::exists(e.path() / "config.json")) entries.push_back(e.path());
  }
  std::sort(entries.begin(), entries.end());
  for (auto& p : entries) add(p.string());
  if (entries.empty())
    throw_error(ErrorCode::kNotFound, "model repository '", dir,
                "' holds no models (expected *.gguf files or directories with config.json)");
  return int(entries.size());
}

ServedModel* ModelRepository::find(const std::string& name) {
  for (auto& m : models_)
    if (m->name == name) return m.get();
  return nullptr;
}

bool ModelRepository::drain(std::chrono::milliseconds timeout) {
  // One deadline for all executors: each waits for what is left of it.
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool clean = true;
  for (auto& m : models_)
    if (m->executor) clean &= m->executor->drain(std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::max(deadline - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration(0))));
  return clean;
}

}  // namespace kiln::server
