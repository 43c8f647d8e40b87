// Encoder batches in one ragged step (see encoder_runner.h).
#include "runtime/encoder_runner.h"

#include <algorithm>
#include <cmath>

#include "core/status.h"
#include "runtime/llm_runner.h"

namespace kiln {

namespace {

// A decoder's sentence embeddings: each input prefilled (causal attention over its own
// tokens, in ragged steps of whole inputs or chunks of a long one) through a KV pool of
// the batch's size. The embedding is the last token's final hidden state (the final
// norm's output), as sentence-transformers' lasttoken pooling and vLLM's embed task pool a
// decoder; mean_pooled and cls_hidden (the first token's row) are there too.
std::vector<EncoderOutput> encode_decoder(Model& model, const std::vector<EncoderInput>& batch,
                                          const EncodeOptions& opt) {
  const int64_t h = model.info().hidden_size, step_max = opt.decoder_step_tokens;
  KILN_THROW_IF(step_max < 1, kInvalidArgument, "decoder_step_tokens ", step_max, " must be positive");
  int64_t total = 0, longest = 0;
  for (const auto& in : batch) {
    total += int64_t(in.tokens.size());
    longest = std::max<int64_t>(longest, int64_t(in.tokens.size()));
  }
  // A step's inputs (each rounded up to whole blocks), or a long input's whole cache.
  LlmRunnerOptions ro;
  ro.block_size = 16;
  ro.max_step_tokens = step_max;
  ro.max_total_tokens =
      std::max(std::min<int64_t>(total, step_max), longest) + ro.block_size * int64_t(batch.size() + 1);
  LlmRunner runner(model, ro);
  std::vector<EncoderOutput> result(batch.size());
  std::vector<std::vector<double>> sums(batch.size(), std::vector<double>(size_t(h), 0.0));
  size_t next = 0;       // the first input not yet (wholly) fed
  int64_t fed = 0;       // tokens of batch[next] fed in earlier steps (a long input)
  KvSequence long_kv;    // batch[next]'s cache while it prefills in chunks
  while (next < batch.size()) {
    // One step: whole inputs while they fit, or the next chunk of one long input.
    std::vector<StepChunk> chunks;
    std::vector<KvSequence> kvs;
    std::vector<std::pair<size_t, int64_t>> parts;  // (input, first token of the chunk)
    kvs.reserve(batch.size());
    int64_t step_tokens = 0;
    if (fed > 0 || int64_t(batch[next].tokens.size()) > step_max) {
      const auto& toks = batch[next].tokens;
      const int64_t n = std::min<int64_t>(step_max, int64_t(toks.size()) - fed);
      chunks.push_back({&long_kv, std::span<const int32_t>(toks.data() + fed, size_t(n)), true});
      parts.emplace_back(next, fed);
    } else {
      while (next + parts.size() < batch.size()) {
        const auto& toks = batch[next + parts.size()].tokens;
        if (!parts.empty() && step_tokens + int64_t(toks.size()) > step_max) break;
        if (int64_t(toks.size()) > step_max) break;
        kvs.emplace_back();
        // One logit row a step (the LM head's GEMM needs a row; embeddings use none).
        chunks.push_back({&kvs.back(), std::span<const int32_t>(toks), parts.empty()});
        parts.emplace_back(next + parts.size(), 0);
        step_tokens += int64_t(toks.size());
      }
    }
    const Tensor hidden = runner.run_chunks_hidden(chunks);
    int64_t row = 0;
    for (size_t c = 0; c < chunks.size(); ++c) {
      const auto [i, first] = parts[c];
      const int64_t n = int64_t(chunks[c].tokens.size());
      const float* rows = hidden.data_as<float>() + row * h;
      EncoderOutput& r = result[i];
      if (opt.hidden) r.hidden.insert(r.hidden.end(), rows, rows + n * h);
      if (first == 0) r.cls_hidden.assign(rows, rows + h);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < h; ++j) sums[i][size_t(j)] += rows[t * h + j];
      const int64_t len = int64_t(batch[i].tokens.size());
      if (first + n == len) {  // the input's last token
        r.embedding.assign(rows + (n - 1) * h, rows + n * h);
        r.mean_pooled.resize(size_t(h));
        for (int64_t j = 0; j < h; ++j) r.mean_pooled[size_t(j)] = float(sums[i][size_t(j)] / double(len));
      }
      row += n;
    }
    if (chunks[0].kv == &long_kv) {
      fed += int64_t(chunks[0].tokens.size());
      if (fed == int64_t(batch[next].tokens.size())) {
        runner.kv_manager().free(long_kv);
        long_kv = {};
        fed = 0;
        ++next;
      }
    } else {
      for (auto& kv : kvs) runner.kv_manager().free(kv);
      next += parts.size();
    }
  }
  return result;
}

}  // namespace

std::vector<EncoderOutput> encode(Model& model, const std::vector<EncoderInput>& batch, const EncodeOptions& opt) {
  const ModelInfo& info = model.info();
  if (info.is_decoder) {
    if (batch.empty()) return {};
    check_encoder_inputs(info, batch);
    return encode_decoder(model, batch, opt);
  }
  if (info.family == "onnx")
    throw_error(ErrorCode::kUnsupported, "'", model.path(), "' is an ONNX graph imported op by op: it runs with its own "
                "inputs (Model::compiled().run with ", model.graph().inputs().size(), " named tensors), not through "
                "encode(); for kiln's encoder path load the HuggingFace directory (config.json + safetensors)");
  if (batch.empty()) return {};
  check_encoder_inputs(info, batch);
  int64_t total = 0;
  for (const auto& in : batch) total += int64_t(in.tokens.size());
  Tensor tokens(DType::kI32, {total}), positions(DType::kI32, {total}), types(DType::kI32, {total});
  Tensor cls(DType::kI32, {int64_t(batch.size())});
  StepInfo step;
  step.slot_mapping.assign(size_t(total), -1);
  int32_t t = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& in = batch[i];
    int32_t n = int32_t(in.tokens.size());
    for (int32_t j = 0; j < n; ++j) {
      tokens.data_as<int32_t>()[t + j] = in.tokens[size_t(j)];
      positions.data_as<int32_t>()[t + j] = j;
      types.data_as<int32_t>()[t + j] = in.token_types.empty() ? 0 : in.token_types[size_t(j)];
    }
    cls.data_as<int32_t>()[i] = t;
    step.seqs.push_back({t, n, n, {}});
    t += n;
  }
  std::vector<std::string> wanted;  // empty: every output
  if (!opt.hidden)
    for (const auto& [name, id] : model.graph().outputs())
      if (name != "hidden") wanted.push_back(name);
  const auto& outputs = model.graph().outputs();
  if (info.pooling == "cls" &&
      std::none_of(outputs.begin(), outputs.end(), [](const auto& o) { return o.first == "cls_hidden"; }))
    throw_error(ErrorCode::kInvalidFile, "'", model.path(), "' pools by [CLS] but its graph has no cls_hidden output");
  TensorMap out = model.compiled().run(
      {{"tokens", tokens}, {"positions", positions}, {"token_types", types}, {"cls_rows", cls}},
      step, nullptr, wanted);
  const int64_t h = info.hidden_size;
  std::vector<EncoderOutput> result(batch.size());
  auto row = [](const Tensor& x, int64_t r) {
    int64_t d = x.dim(1);
    return std::vector<float>(x.data_as<float>() + r * d, x.data_as<float>() + (r + 1) * d);
  };
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& s = step.seqs[i];
    if (opt.hidden) {
      const Tensor& hidden = out.at("hidden");
      result[i].hidden.assign(hidden.data_as<float>() + s.q_start * h,
                              hidden.data_as<float>() + (s.q_start + s.q_len) * h);
    }
    result[i].mean_pooled = row(out.at("mean_pooled"), int64_t(i));
    if (out.count("cls_hidden")) result[i].cls_hidden = row(out.at("cls_hidden"), int64_t(i));
    result[i].embedding = info.pooling == "cls" ? result[i].cls_hidden : result[i].mean_pooled;
    if (out.count("pooled")) result[i].pooled = row(out.at("pooled"), int64_t(i));
    if (out.count("logits")) result[i].logits = row(out.at("logits"), int64_t(i));
  }
  return result;
}

void check_encoder_inputs(const ModelInfo& info, const std::vector<EncoderInput>& batch) {
  for (size_t i = 0; i < batch.size(); ++i) {
    const EncoderInput& in = batch[i];
    if (in.tokens.empty()) throw_error(ErrorCode::kInvalidArgument, "input ", i, " is empty");
    if (int64_t(in.tokens.size()) > info.max_positions)
      throw_error(ErrorCode::kOutOfRange, "input ", i, " has ", in.tokens.size(), " tokens; the model takes at most ",
                  info.max_positions);
    if (!in.token_types.empty() && in.token_types.size() != in.tokens.size())
      throw_error(ErrorCode::kInvalidArgument, "input ", i, ": ", in.token_types.size(), " token types for ",
                  in.tokens.size(), " tokens");
    for (int32_t t : in.tokens)
      if (t < 0 || t >= info.vocab_size)
        throw_error(ErrorCode::kOutOfRange, "input ", i, ": token id ", t, " is outside the vocabulary [0, ",
                    info.vocab_size, ")");
    for (int32_t t : in.token_types)
      if (t < 0) throw_error(ErrorCode::kOutOfRange, "input ", i, ": token type ", t, " is negative");
  }
}

bool is_cross_encoder(const ModelInfo& info) { return !info.is_decoder && info.num_labels == 1; }

void check_rerank_model(const ModelInfo& info, const std::string& model) {
  if (info.is_decoder && info.pooling.empty())
    throw_error(ErrorCode::kInvalidArgument, "'", model, "' is a decoder; reranking needs an encoder or an embedding "
                "model");
  if (info.num_labels > 1)
    throw_error(ErrorCode::kInvalidArgument, "'", model, "' is a classifier with ", info.num_labels,
                " labels; reranking needs a cross-encoder (one label) or an embedding model");
}

std::vector<EncoderInput> rerank_inputs(const tok::Tokenizer& tokenizer, const ModelInfo& info,
                                        const std::string& query, const std::vector<std::string>& documents) {
  tok::EncodeOptions eo;
  eo.max_length = size_t(info.max_positions);
  std::vector<EncoderInput> inputs;
  if (!is_cross_encoder(info)) {
    const tok::Encoding q = tokenizer.encode_full(query, eo);
    inputs.push_back({q.ids, q.type_ids});
  }
  for (const std::string& d : documents) {
    const tok::Encoding e = is_cross_encoder(info) ? tokenizer.encode_pair(query, d, eo) : tokenizer.encode_full(d, eo);
    inputs.push_back({e.ids, e.type_ids});
  }
  return inputs;
}

std::vector<float> rerank_scores(const ModelInfo& info, const std::vector<EncoderOutput>& outputs) {
  std::vector<float> scores;
  if (is_cross_encoder(info)) {
    for (const EncoderOutput& o : outputs) {
      if (o.logits.size() != 1)
        throw_error(ErrorCode::kInternal, "rerank_scores: a cross-encoder output has ", o.logits.size(), " logits");
      scores.push_back(float(1.0 / (1.0 + std::exp(-double(o.logits[0])))));
    }
    return scores;
  }
  if (outputs.empty()) throw_error(ErrorCode::kInternal, "rerank_scores: no query output");
  const std::vector<float>& q = outputs[0].embedding;
  for (size_t i = 1; i < outputs.size(); ++i) {
    const std::vector<float>& d = outputs[i].embedding;
    double qd = 0, qq = 0, dd = 0;
    for (size_t k = 0; k < q.size() && k < d.size(); ++k) {
      qd += double(q[k]) * d[k];
      qq += double(q[k]) * q[k];
      dd += double(d[k]) * d[k];
    }
    scores.push_back(qq > 0 && dd > 0 ? float(qd / std::sqrt(qq * dd)) : 0.0f);
  }
  return scores;
}

std::vector<size_t> rerank_order(const std::vector<float>& scores, int64_t top_n) {
  std::vector<size_t> order(scores.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  if (top_n > 0 && size_t(top_n) < order.size()) order.resize(size_t(top_n));
  return order;
}

std::vector<EncoderInput> encoder_inputs_from_padded(const std::vector<int32_t>& ids,
                                                     const std::vector<int32_t>& token_types,
                                                     const std::vector<int32_t>& attention_mask,
                                                     int64_t rows, int64_t cols) {
  const size_t n = size_t(rows * cols);
  if (rows < 0 || cols < 0 || ids.size() != n || attention_mask.size() != n ||
      (!token_types.empty() && token_types.size() != n))
    throw_error(ErrorCode::kInvalidArgument, "padded batch [", rows, ", ", cols, "] needs ", n,
                " ids, mask entries and token types; got ", ids.size(), ", ", attention_mask.size(),
                " and ", token_types.size());
  std::vector<EncoderInput> batch(static_cast<size_t>(rows));
  for (int64_t b = 0; b < rows; ++b)
    for (int64_t s = 0; s < cols; ++s) {
      const size_t i = size_t(b * cols + s);
      if (!attention_mask[i]) continue;
      batch[size_t(b)].tokens.push_back(ids[i]);
      batch[size_t(b)].token_types.push_back(token_types.empty() ? 0 : token_types[i]);
    }
  return batch;
}

}  // namespace kiln
