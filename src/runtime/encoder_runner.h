// Runs an encoder (BERT family) over a batch of sequences in one ragged step, with no
// padding: per sequence its hidden states, mean-pooled and [CLS] rows, its sentence
// embedding (the model's pooling, not normalized) and, when the model has them, the
// [CLS] pooler output and classification logits; and reranking on top of it. A decoder
// (a decoder embedding model such as Qwen3-Embedding, or any decoder) embeds too: its
// inputs are prefilled through a KV pool of the batch's size and the embedding is the
// last token's final hidden state (sentence-transformers' lasttoken pooling). Tested in
// tests/models/bert_golden_test.cpp, bert_gguf_test.cpp and rerank_test.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct EncoderInput {
  std::vector<int32_t> tokens;
  std::vector<int32_t> token_types;  // empty: all zeros
};

struct EncoderOutput {
  std::vector<float> hidden;       // [len * hidden_size]
  std::vector<float> mean_pooled;  // [hidden_size]
  std::vector<float> cls_hidden;   // [hidden_size]: the [CLS] (first) row of `hidden`
  std::vector<float> embedding;    // the sentence embedding: mean_pooled or cls_hidden by ModelInfo::pooling
  std::vector<float> pooled;       // [hidden_size] (pooler), empty without one
  std::vector<float> logits;       // [num_labels], empty without a classifier
};

struct EncodeOptions {
  // Per-token hidden states ([tokens, hidden] from the device, the bulk of a large
  // batch's output); false fetches only the pooled rows and logits, leaving `hidden` empty.
  bool hidden = true;
  // Decoders: the token rows of one prefill step (whole inputs while they fit; a longer
  // input prefills in chunks of it).
  int64_t decoder_step_tokens = 2048;
};

std::vector<EncoderOutput> encode(Model& model, const std::vector<EncoderInput>& batch, const EncodeOptions& opt = {});

// What encode() checks before it runs (and EncoderBatcher when a request is submitted):
// each input non-empty, within the model's positions, token ids inside the vocabulary,
// token types (when given) one per token and not negative. Throws kInvalidArgument /
// kOutOfRange naming the input.
void check_encoder_inputs(const ModelInfo& info, const std::vector<EncoderInput>& batch);

// Reranking a query's documents. A cross-encoder - an encoder whose classification head
// has one label, such as ms-marco-MiniLM - reads each (query, document) pair as one
// sequence ([CLS] query [SEP] document [SEP], token types 0 then 1, longest-first
// truncation to the model's positions) and scores it sigmoid(logit), as
// sentence-transformers' CrossEncoder and vLLM's /rerank do. Any other encoder scores a
// document by the cosine of its sentence embedding and the query's (a bi-encoder).
bool is_cross_encoder(const ModelInfo& info);
// Throws kInvalidArgument naming `model` unless it can rerank: an encoder that is a
// cross-encoder or has no classification head (a classifier of several labels cannot),
// or a decoder embedding model (ModelInfo::pooling "last").
void check_rerank_model(const ModelInfo& info, const std::string& model);
// The encoder inputs that score `documents` against `query`: a pair a document for a
// cross-encoder; the query, then each document, for a bi-encoder.
std::vector<EncoderInput> rerank_inputs(const tok::Tokenizer& tokenizer, const ModelInfo& info,
                                        const std::string& query, const std::vector<std::string>& documents);
// The documents' scores from the outputs of rerank_inputs' inputs.
std::vector<float> rerank_scores(const ModelInfo& info, const std::vector<EncoderOutput>& outputs);
// The documents' indices, best score first (ties in document order), the best `top_n`
// only when top_n > 0.
std::vector<size_t> rerank_order(const std::vector<float>& scores, int64_t top_n);

// HuggingFace's padded layout ([rows, cols] ids, token types and attention mask, row
// major) to ragged inputs: each row keeps the tokens its mask marks. `token_types` may
// be empty (all zeros). Throws kInvalidArgument when the sizes disagree.
std::vector<EncoderInput> encoder_inputs_from_padded(const std::vector<int32_t>& ids,
                                                     const std::vector<int32_t>& token_types,
                                                     const std::vector<int32_t>& attention_mask,
                                                     int64_t rows, int64_t cols);

}  // namespace kiln
