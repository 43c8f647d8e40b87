// The models a server serves, by name: decoders each with their tokenizer and an
// Executor; encoders with their tokenizer and an EncoderBatcher (concurrent requests
// share forwards). Built from explicit
// paths or from a repository folder (every *.gguf file and every directory holding a
// config.json is one model, named after the entry). Tested in tests/server/.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/encoder_batcher.h"
#include "runtime/executor.h"
#include "runtime/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server {

struct ServedModel {
  std::string name;
  std::string path;
  int64_t created = 0;  // unix seconds
  std::unique_ptr<Model> model;
  std::optional<tok::Tokenizer> tokenizer;
  std::unique_ptr<tok::ChatTemplate> chat_template;  // parsed once; null without one
  std::unique_ptr<Executor> executor;                // decoders that generate
  std::unique_ptr<EncoderBatcher> batcher;           // encoders and decoder embedding models (declared
                                                     // after model: stops first)
  bool is_decoder() const { return executor != nullptr; }
};

class ModelRepository {
 public:
  ModelRepository(ModelOptions model_options, ExecutorOptions executor_options,
                  EncoderBatcherOptions encoder_options = {})
      : model_opt_(std::move(model_options)), exec_opt_(executor_options), enc_opt_(encoder_options) {}
  // Loads `path` as `name` (empty: the file or directory name without .gguf);
  // "random:CONFIG.json" builds that architecture with random weights.
  ServedModel& add(const std::string& path, std::string name = {});
  // Wraps an already loaded model (tests).
  ServedModel& add_loaded(std::unique_ptr<Model> model, std::string name,
                          std::optional<tok::Tokenizer> tokenizer = std::nullopt);
  // Loads every model in `dir`; returns how many.
  int add_directory(const std::string& dir);

  ServedModel* find(const std::string& name);
  const std::vector<std::unique_ptr<ServedModel>>& models() const { return models_; }
  // Stops new generation requests and waits for the in-flight ones, cancelling what is
  // still running after `timeout`. Returns false when it had to cancel.
  bool drain(std::chrono::milliseconds timeout);

 private:
  ServedModel& finish_add(std::unique_ptr<ServedModel> m);
  ModelOptions model_opt_;
  ExecutorOptions exec_opt_;
  EncoderBatcherOptions enc_opt_;
  std::vector<std::unique_ptr<ServedModel>> models_;
};

}  // namespace kiln::server
