// Encoder routes: /v1/embeddings (L2-normalized sentence embeddings pooled as the model
// says - mean or [CLS], ModelInfo::pooling -, as sentence-transformers defines them; the
// same as `kiln embed`), /v1/rerank (a query's documents ranked by a cross-encoder's
// sigmoid(logit) or an embedding model's cosine; the same as `kiln rerank`) and KServe v2
// metadata + /infer (texts in; logits, probabilities and labels out for classifiers,
// embeddings otherwise). Requests go through the model's EncoderBatcher, so concurrent
// clients share forwards. A request still queued after a moment answers through a
// chunked response that sends a space (JSON whitespace) every 250 ms until its outputs
// are ready, so a client that hangs up is noticed and its request withdrawn from the
// queue, as the completion routes do.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>

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

// One encoder request from submission to its answer: shared by the handler, the chunked
// provider and its releaser.
struct EncoderCall {
  Server::Impl* srv = nullptr;
  ServedModel* model = nullptr;
  const char* endpoint = "";
  int64_t tokens = 0;
  EncoderJob job;
  std::function<Json(std::vector<EncoderOutput>&)> ok;       // the 200 body
  std::function<Json(int, const std::string&)> error_json;  // an error's body
  std::mutex mu;
  bool settled = false;

  // Once per request: metrics and the server's count of active responses.
  void settle(int status) {
    std::lock_guard lk(mu);
    if (settled) return;
    settled = true;
    srv->metrics.count_request(model->name, endpoint, status);
    if (status == 200) srv->metrics.add_tokens(model->name, tokens, 0);
    --srv->active;
  }
  void cancel() {
    model->batcher->cancel(job.id);
    settle(499);
  }
  // The finished job's (status, body).
  std::pair<int, Json> answer() {
    try {
      std::vector<EncoderOutput> out = job.result.get();
      return {200, ok(out)};
    } catch (const Error& e) {
      const int status = status_of(e);
      return {status, error_json(status, e.what())};
    }
  }
};

constexpr auto kInlineWait = std::chrono::milliseconds(50);
constexpr auto kProbeEvery = std::chrono::milliseconds(250);

}  // namespace

// Runs `batch` on model m and answers: at once when it is done within kInlineWait (any
// status), else through a chunked 200 response that probes the connection while the
// request waits (an error then arrives as the body) and withdraws it when the client is gone.
void Server::Impl::answer_encoder(ServedModel& m, std::vector<EncoderInput> batch, int64_t tokens,
                                  httplib::Response& res, const char* endpoint,
                                  std::function<Json(std::vector<EncoderOutput>&)> ok,
                                  std::function<Json(int, const std::string&)> error_json) {
  if (!m.batcher) {  // an ONNX graph: encode() says why it cannot run
    std::vector<EncoderOutput> out;
    {
      ActiveScope scope(active);
      out = encode(*m.model, batch, {.hidden = false});
    }
    metrics.count_request(m.name, endpoint, 200);
    metrics.add_tokens(m.name, tokens, 0);
    return send_json(res, 200, ok(out));
  }
  auto call = std::make_shared<EncoderCall>();
  call->srv = this;
  call->model = &m;
  call->endpoint = endpoint;
  call->tokens = tokens;
  call->ok = std::move(ok);
  call->error_json = std::move(error_json);
  ++active;
  try {
    call->job = m.batcher->submit_job(std::move(batch));
  } catch (...) {
    --active;
    throw;
  }
  if (call->job.result.wait_for(kInlineWait) == std::future_status::ready) {
    auto [status, body] = call->answer();
    call->settle(status);
    return send_json(res, status, body);
  }
  res.set_chunked_content_provider(
      "application/json",
      [call](size_t, httplib::DataSink& sink) {
        if (call->job.result.wait_for(kProbeEvery) != std::future_status::ready) {
          if (sink.write(" ", 1)) return true;
          call->cancel();
          return false;
        }
        auto [status, body] = call->answer();
        const std::string text = dump(body);
        if (!sink.write(text.data(), text.size())) {
          call->settle(499);
          return false;
        }
        call->settle(status);
        sink.done();
        return true;
      },
      [call](bool success) {
        if (!success) call->cancel();
      });
}

void Server::Impl::handle_embeddings(const httplib::Request& req, httplib::Response& res) {
  std::string model_name;
  try {
    if (draining) throw ApiError(503, "the server is shutting down", {}, "server_error");
    EmbeddingParams p = parse_embeddings(parse_json_body(req.body), opt.limits);
    model_name = p.model;
    ServedModel& m = find_encoder(repo, p.model);
    const int64_t hidden = m.model->info().hidden_size;
    if (p.dimensions > hidden)
      throw ApiError(400, "'dimensions' is " + std::to_string(p.dimensions) + " but model '" + m.name + "' embeds in " +
                              std::to_string(hidden), "dimensions");
    int64_t tokens = 0;
    std::vector<EncoderInput> batch = encoder_inputs(m, p.texts, p.ids, &tokens);
    const bool base64 = p.base64;
    const size_t dims = size_t(p.dimensions > 0 ? p.dimensions : hidden);
    auto ok = [&m, base64, tokens, dims](std::vector<EncoderOutput>& out) {
      Json data = Json::array();
      for (size_t i = 0; i < out.size(); ++i) {
        std::vector<float> e = out[i].embedding;
        e.resize(std::min(e.size(), dims));  // Matryoshka: the leading values, then normalized
        e = normalized(std::move(e));
        Json item = {{"object", "embedding"}, {"index", i}};
        if (base64) item["embedding"] = base64_floats(e);
        else item["embedding"] = e;
        data.push_back(item);
      }
      return Json{{"object", "list"}, {"data", data}, {"model", m.name},
                  {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
    };
    auto err = [](int status, const std::string& msg) { return error_body(ApiError(status, msg)); };
    answer_encoder(m, std::move(batch), tokens, res, "/v1/embeddings", ok, err);
  } catch (const ApiError& e) {
    reply_error(res, model_name, "/v1/embeddings", e);
  } catch (const Error& e) {
    reply_error(res, model_name, "/v1/embeddings", e);
  }
}

void Server::Impl::handle_rerank(const httplib::Request& req, httplib::Response& res, const char* endpoint) {
  std::string model_name;
  try {
    if (draining) throw ApiError(503, "the server is shutting down", {}, "server_error");
    RerankParams p = parse_rerank(parse_json_body(req.body), opt.limits);
    model_name = p.model;
    ServedModel& m = find_encoder(repo, p.model);
    if (!m.tokenizer) throw ApiError(400, "model '" + m.name + "' has no tokenizer to read the query and documents", "model");
    const ModelInfo& info = m.model->info();
    check_rerank_model(info, m.name);  // kInvalidArgument: a 400
    std::vector<EncoderInput> batch = rerank_inputs(*m.tokenizer, info, p.query, p.documents);
    int64_t tokens = 0;
    for (const EncoderInput& in : batch) tokens += int64_t(in.tokens.size());
    const uint64_t id = next_id++;
    auto ok = [&m, p = std::move(p), tokens, id](std::vector<EncoderOutput>& out) {
      const std::vector<float> scores = rerank_scores(m.model->info(), out);
      Json results = Json::array();
      for (size_t i : rerank_order(scores, p.top_n)) {
        Json r = {{"index", i}, {"relevance_score", scores[i]}};
        if (p.return_documents) r["document"] = {{"text", p.documents[i]}};
        results.push_back(std::move(r));
      }
      return Json{{"id", "rerank-" + std::to_string(id)}, {"object", "rerank"}, {"model", m.name},
                  {"results", results}, {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
    };
    auto err = [](int status, const std::string& msg) { return error_body(ApiError(status, msg)); };
    answer_encoder(m, std::move(batch), tokens, res, endpoint, ok, err);
  } catch (const ApiError& e) {
    reply_error(res, model_name, endpoint, e);
  } catch (const Error& e) {
    reply_error(res, model_name, endpoint, e);
  }
}

void Server::Impl::reply_error(httplib::Response& res, const std::string& model, const char* endpoint,
                               const ApiError& e) {
  metrics.count_request(model, endpoint, e.status);
  send_error(res, e);
}

void Server::Impl::reply_error(httplib::Response& res, const std::string& model, const char* endpoint, const Error& e) {
  const int status = status_of(e);
  reply_error(res, model, endpoint,
              ApiError(status, e.what(), {}, status >= 500 ? "server_error" : "invalid_request_error"));
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
    std::vector<EncoderInput> batch = encoder_inputs(m, p.texts, p.ids, &tokens);
    auto ok = [&m, p](std::vector<EncoderOutput>& out) {
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
          auto e = normalized(o.embedding);
          emb.insert(emb.end(), e.begin(), e.end());
        }
        outputs.push_back({{"name", "embedding"}, {"datatype", "FP32"}, {"shape", {n, info.hidden_size}}, {"data", emb}});
      }
      Json body = {{"model_name", m.name}, {"model_version", "1"}, {"outputs", outputs}};
      if (!p.id.empty()) body["id"] = p.id;
      return body;
    };
    auto err = [](int, const std::string& msg) { return Json{{"error", msg}}; };
    answer_encoder(m, std::move(batch), tokens, res, "/v2/infer", ok, err);
  } catch (const ApiError& e) {
    fail(e.status, e.what());
  } catch (const Error& e) {
    fail(status_of(e), e.what());
  }
}

}  // namespace kiln::server
