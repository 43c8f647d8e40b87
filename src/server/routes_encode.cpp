// Encoder routes: /v1/embeddings (mean-pooled, L2-normalized embeddings, as
// sentence-transformers models define them; the same as `kiln embed`) and KServe v2
// metadata + /infer (texts in; logits, probabilities and labels out for classifiers,
// embeddings otherwise). Requests go through the model's EncoderBatcher, so concurrent
// clients share forwards.
#include <cmath>

#include "core/status.h"
#include "runtime/encoder_runner.h"
#include "server/server_internal.h"

namespace kiln::server {

namespace {

ServedModel& find_encoder(ModelRepository& repo, const std::string& name) {
  ServedModel* m = repo.find(name);
  if (!m) throw ApiError(404, "model '" + name + "' does not exist", "model", "invalid_request_error", "model_not_found");
  if (m->is_decoder())
    throw ApiError(400, "model '" + name + "' is a decoder; use /v1/completions or /v1/chat/completions", "model");
  return *m;
}

std::vector<EncoderInput> encoder_inputs(ServedModel& m, const std::vector<std::string>& texts,
                                         const std::vector<std::vector<int32_t>>& ids, int64_t* tokens) {
  std::vector<EncoderInput> batch;
  const int64_t max_len = m.model->info().max_positions;
  const int64_t vocab = m.model->info().vocab_size;
  for (auto& t : texts) {
    if (!m.tokenizer) throw ApiError(400, "model '" + m.name + "' has no tokenizer; send token ids", "input");
    tok::EncodeOptions eo;
    eo.max_length = size_t(max_len);  // truncated, as sentence-transformers does
    tok::Encoding e = m.tokenizer->encode_full(t, eo);
    batch.push_back({e.ids, e.type_ids});
  }
  for (auto& v : ids) {
    if (int64_t(v.size()) > max_len)
      throw ApiError(400, "an input has " + std::to_string(v.size()) + " tokens, more than the model's " +
                              std::to_string(max_len), "input");
    for (int32_t x : v)
      if (x >= vocab) throw ApiError(400, "token id " + std::to_string(x) + " is outside the vocabulary", "input");
    batch.push_back({v, {}});
  }
  for (auto& b : batch) *tokens += int64_t(b.tokens.size());
  return batch;
}

std::vector<float> normalized(std::vector<float> v) {
  double n = 0;
  for (float x : v) n += double(x) * x;
  n = std::sqrt(n);
  if (n > 0)
    for (float& x : v) x = float(x / n);
  return v;
}

std::vector<EncoderOutput> run_encoder(ServedModel& m, std::vector<EncoderInput> batch) {
  if (!m.batcher) return encode(*m.model, batch, {.hidden = false});  // says why it cannot (an ONNX graph)
  return m.batcher->run(std::move(batch));
}

}  // namespace

void Server::Impl::handle_embeddings(const httplib::Request& req, httplib::Response& res) {
  std::string model_name;
  try {
    if (draining) throw ApiError(503, "the server is shutting down", {}, "server_error");
    EmbeddingParams p = parse_embeddings(parse_json_body(req.body), opt.limits);
    model_name = p.model;
    ServedModel& m = find_encoder(repo, p.model);
    int64_t tokens = 0;
    std::vector<EncoderOutput> out;
    {
      ActiveScope scope(active);
      out = run_encoder(m, encoder_inputs(m, p.texts, p.ids, &tokens));
    }
    Json data = Json::array();
    for (size_t i = 0; i < out.size(); ++i) {
      std::vector<float> e = normalized(out[i].mean_pooled);
      Json item = {{"object", "embedding"}, {"index", i}};
      if (p.base64) item["embedding"] = base64_floats(e);
      else item["embedding"] = e;
      data.push_back(item);
    }
    metrics.count_request(model_name, "/v1/embeddings", 200);
    metrics.add_tokens(model_name, tokens, 0);
    send_json(res, 200, Json{{"object", "list"}, {"data", data}, {"model", m.name},
                             {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}});
  } catch (const ApiError& e) {
    metrics.count_request(model_name, "/v1/embeddings", e.status);
    send_error(res, e);
  } catch (const Error& e) {
    int status = status_of(e);
    metrics.count_request(model_name, "/v1/embeddings", status);
    send_error(res, ApiError(status, e.what()));
  }
}

void Server::Impl::handle_kserve_model(const httplib::Request& req, httplib::Response& res) {
  ServedModel* m = repo.find(req.matches[1]);
  if (!m) return send_json(res, 404, Json{{"error", "model '" + std::string(req.matches[1]) + "' does not exist"}});
  const ModelInfo& info = m->model->info();
  Json outputs = Json::array();
  if (!m->is_decoder()) {
    if (info.num_labels > 0) {
      outputs.push_back({{"name", "logits"}, {"datatype", "FP32"}, {"shape", {-1, info.num_labels}}});
      outputs.push_back({{"name", "probabilities"}, {"datatype", "FP32"}, {"shape", {-1, info.num_labels}}});
      outputs.push_back({{"name", "label"}, {"datatype", "BYTES"}, {"shape", {-1}}});
    }
    outputs.push_back({{"name", "embedding"}, {"datatype", "FP32"}, {"shape", {-1, info.hidden_size}}});
  }
  send_json(res, 200, Json{{"name", m->name},
                           {"versions", {"1"}},
                           {"platform", std::string("kiln_") + info.family},
                           {"inputs", Json::array({{{"name", "text"}, {"datatype", "BYTES"}, {"shape", {-1}}}})},
                           {"outputs", outputs}});
}

void Server::Impl::handle_kserve_infer(const httplib::Request& req, httplib::Response& res) {
  // KServe v2 errors are {"error": "message"}.
  auto fail = [&](int status, const std::string& msg) {
    metrics.count_request(req.matches[1], "/v2/infer", status);
    send_json(res, status, Json{{"error", msg}});
  };
  try {
    if (draining) return fail(503, "the server is shutting down");
    KserveInferParams p = parse_kserve_infer(parse_json_body(req.body), opt.limits);
    ServedModel& m = find_encoder(repo, req.matches[1]);
    int64_t tokens = 0;
    std::vector<EncoderOutput> out;
    {
      ActiveScope scope(active);
      out = run_encoder(m, encoder_inputs(m, p.texts, p.ids, &tokens));
    }
    const ModelInfo& info = m.model->info();
    auto wanted = [&](const char* name) {
      return p.outputs.empty() || std::find(p.outputs.begin(), p.outputs.end(), name) != p.outputs.end();
    };
    const int64_t n = int64_t(out.size());
    Json outputs = Json::array();
    if (info.num_labels > 0) {
      std::vector<float> logits, probs;
      Json labels = Json::array();
      for (auto& o : out) {
        logits.insert(logits.end(), o.logits.begin(), o.logits.end());
        float mx = *std::max_element(o.logits.begin(), o.logits.end());
        double z = 0;
        for (float x : o.logits) z += std::exp(double(x - mx));
        size_t best = 0;
        for (size_t k = 0; k < o.logits.size(); ++k) {
          probs.push_back(float(std::exp(double(o.logits[k] - mx)) / z));
          if (o.logits[k] > o.logits[best]) best = k;
        }
        labels.push_back(best < info.labels.size() ? info.labels[best] : "LABEL_" + std::to_string(best));
      }
      if (wanted("logits"))
        outputs.push_back({{"name", "logits"}, {"datatype", "FP32"}, {"shape", {n, info.num_labels}}, {"data", logits}});
      if (wanted("probabilities"))
        outputs.push_back({{"name", "probabilities"}, {"datatype", "FP32"}, {"shape", {n, info.num_labels}}, {"data", probs}});
      if (wanted("label")) outputs.push_back({{"name", "label"}, {"datatype", "BYTES"}, {"shape", {n}}, {"data", labels}});
    }
    if (wanted("embedding")) {
      std::vector<float> emb;
      for (auto& o : out) {
        auto e = normalized(o.mean_pooled);
        emb.insert(emb.end(), e.begin(), e.end());
      }
      outputs.push_back({{"name", "embedding"}, {"datatype", "FP32"}, {"shape", {n, info.hidden_size}}, {"data", emb}});
    }
    metrics.count_request(m.name, "/v2/infer", 200);
    metrics.add_tokens(m.name, tokens, 0);
    Json body = {{"model_name", m.name}, {"model_version", "1"}, {"outputs", outputs}};
    if (!p.id.empty()) body["id"] = p.id;
    send_json(res, 200, body);
  } catch (const ApiError& e) {
    fail(e.status, e.what());
  } catch (const Error& e) {
    fail(status_of(e), e.what());
  }
}

}  // namespace kiln::server
