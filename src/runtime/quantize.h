// Loading a model in a post-training quantized mode (W8A8 INT8, FP8 E4M3, AWQ-scaled
// weight-only q4/q8): calibration of the f32 model on real text (W8A8/FP8: two passes,
// channel maxima for SmoothQuant, then histograms of the smoothed activations; AWQ: one
// pass of channel means and sampled rows, then the scale search), the calibration cache,
// and the graph rewrite applied before compiling. Also a per-layer error collector (which Linear loses most to int8). Used by
// `kiln build/generate/eval --quant`; tested in tests/quant/ and tests/models/.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "quant/awq.h"
#include "quant/calibration.h"
#include "quant/fp8.h"
#include "quant/gptq.h"
#include "quant/w8a8.h"
#include "runtime/model.h"

namespace kiln {

struct QuantOptions {
  std::string mode;               // "" (none) | "w8a8" | "fp8" | "awq" | "gptq" | "awq-gptq"
  // "default" (the built-in set: the project's docs), text files (comma-separated), or
  // a calibration cache (.json) written earlier.
  std::string calib = "default";
  std::string method = "kl";      // kl | mse | max | percentile
  std::vector<std::string> keep;  // Linears (node or weight name substrings) kept f32
  // w8a8: Linears (node name substrings) whose inputs are rotated by a Walsh-Hadamard
  // transform before int8 rounding (quant::W8A8Options::hadamard), e.g. "down_proj".
  std::vector<std::string> hadamard;
  double smooth_alpha = 0.5;      // SmoothQuant migration strength; < 0: none
  std::string act_scale = "static";  // static (calibrated, per tensor) | per-token (dynamic)
  // fp8: the merged gate|up Linear's output rounded to E4M3 with its calibrated max
  // (quant::Fp8Options::gate_up_out), so a GPU can write it as E4M3.
  bool fp8_gate_up_out = false;
  std::string cache;              // calibration cache: read when it exists, else written
  int32_t seq_len = 256;          // tokens per calibration sequence (encoders: 128)
  int32_t max_sequences = 64;     // calibration sequences at most
  // AWQ: alpha grid steps, and calibration rows per Linear input the output error is
  // measured on (evenly spread over the calibration tokens).
  int32_t awq_grid = 20;
  int64_t awq_rows = 256;
  // GPTQ: added to the input Hessian's diagonal, as a fraction of its mean.
  double gptq_damp = 0.01;
  // GPTQ: quantize columns by decreasing input energy (act order) instead of in order
  // (measured better on SmolLM2's head and MiniLM: bench/RESULTS.md).
  bool gptq_act_order = true;
  // GPTQ: calibrate layer by layer, each layer's Hessians from the activations of the
  // model whose earlier layers are already quantized (GPTQ's sequential mode; one
  // calibration pass per layer).
  bool gptq_sequential = false;
  // Weight-only q4 modes (awq, gptq, awq-gptq): > 0 promotes the Linears whose q4 error
  // costs the model's output most to q8 until the quantized Linears average this many
  // stored bits per weight (q4 = 5, q8 = 8.5 with their scales; 0: every Linear q4).
  double effective_bits = 0;
  // Decoders: calibration tokens the sensitivity of each Linear is measured on (the f32
  // model's log-probabilities of these tokens are held in memory: tokens x vocab floats).
  int64_t mix_tokens = 512;
};

// The non-empty comma-separated items of `s` (--calib, --kv-calib: text files).
std::vector<std::string> split_commas(const std::string& s);

// Calibrates the f32 model at `path` (never an engine) on `q.calib`. Throws
// kInvalidArgument naming the problem for an empty set, a text that tokenizes to nothing,
// or non-finite activations.
// `sequences`, when given, replaces the tokenized q.calib (models without a tokenizer).
quant::CalibrationTable calibrate_model(const std::string& path, const ModelOptions& base, const QuantOptions& q,
                                        const std::vector<std::vector<int32_t>>* sequences = nullptr);

// AWQ calibration of the f32 model at `path` for weights stored as `format`: channel
// means and sampled rows of every Linear input, then the scale search per group
// (quant::awq_search). Errors as calibrate_model.
quant::CalibrationTable calibrate_awq(const std::string& path, const ModelOptions& base, const QuantOptions& q,
                                      kiln::QuantFormat format,
                                      const std::vector<std::vector<int32_t>>* sequences = nullptr);
// Whether mode is gptq or awq-gptq.
bool gptq_mode(const std::string& mode);

// GPTQ calibration of the f32 model at `path`: the input Hessian of every Linear group
// (quant::GptqCollector), and for awq-gptq first the AWQ scales (calibrate_awq on the same
// sequences). The Hessians stay in memory (never cached). Errors as calibrate_model.
quant::CalibrationTable calibrate_gptq(const std::string& path, const ModelOptions& base, const QuantOptions& q,
                                       kiln::QuantFormat format,
                                       const std::vector<std::vector<int32_t>>* sequences = nullptr);

// The weight format of --quant awq under --weight-dtype: q8 -> q8, q4 or f32 (the
// default) -> q4; others throw kInvalidArgument.
kiln::QuantFormat awq_weight_format(const std::string& weight_dtype);

// Stored bits per weight of the q4 and q8 formats, their f16 scales (q4: and mins) per
// group of 32 included (core/weight_quant.h).
constexpr double kQ4BitsPerWeight = 5.0, kQ8BitsPerWeight = 8.5;

// One Linear's row of a mixed-precision plan.
struct PrecisionPlanRow {
  std::string node;
  int64_t weights = 0;     // elements of its weight
  double distortion = 0;   // the model's output distortion with only this Linear q4
  bool promoted = false;   // q8 in the plan
};
struct PrecisionPlanReport {
  std::vector<PrecisionPlanRow> rows;  // by decreasing distortion per promoted bit
  std::string measure;                 // "1 - cosine of the sentence embedding" | "KL (nats/token)"
  double effective_bits = 0;           // of the plan
  double distortion_q4 = 0, distortion_plan = 0;  // sums over the rows (the additive estimate)
};

// --effective-bits: measures, on the calibration text, how far the model's output moves
// when only one Linear is quantized (q4, by q's mode: AWQ scales / GPTQ of `table`) while
// every other stays f32 - encoders: 1 - cosine of the sentence embedding, decoders: the
// mean KL divergence of the next-token distributions - then promotes Linears to q8 by
// decreasing distortion per extra bit while the average stays within q.effective_bits,
// and stores the choice in table.precision_plan (read by awq/gptq_model_options, which
// with q.effective_bits > 0 also run the precision pass: the logits GEMM stays f32). GGUF
// Linears that keep their file's codes and Linears pinned to another precision are not
// candidates. Throws kInvalidArgument for a mode other than awq/gptq/awq-gptq, q8 weights,
// or a budget outside [5, 8.5].
// `sequences`, when given, replaces the tokenized q.calib (as in calibrate_model).
PrecisionPlanReport plan_effective_bits(const std::string& path, const ModelOptions& base,
                                        quant::CalibrationTable& table, const QuantOptions& q,
                                        const std::vector<std::vector<int32_t>>* sequences = nullptr);

// The calibration table for q: the cache or a .json --calib when given, else calibrates
// (and writes q.cache when set); with q.effective_bits, then plans the mixed precision.
quant::CalibrationTable calibration_for(const std::string& path, const ModelOptions& base, const QuantOptions& q);

// `base` with the W8A8 rewrite of `table` installed (weight dtype w8a8); `report`, when
// given, receives what the rewrite did once the model is loaded.
ModelOptions w8a8_model_options(ModelOptions base, const quant::CalibrationTable& table, const QuantOptions& q,
                                std::shared_ptr<quant::W8A8Report> report = nullptr);

// `base` with the FP8 E4M3 rewrite of `table` installed (weight dtype fp8).
ModelOptions fp8_model_options(ModelOptions base, const quant::CalibrationTable& table, const QuantOptions& q,
                               std::shared_ptr<quant::Fp8Report> report = nullptr);

// `base` with the AWQ rewrite of `table` installed (weight dtype q4 or q8).
ModelOptions awq_model_options(ModelOptions base, const quant::CalibrationTable& table, const QuantOptions& q,
                               std::shared_ptr<quant::AwqReport> report = nullptr);

// `base` with the GPTQ rewrite of `table` installed (weight dtype q4 or q8; awq-gptq: the
// AWQ rewrite first, then GPTQ of the scaled weights).
ModelOptions gptq_model_options(ModelOptions base, const quant::CalibrationTable& table, const QuantOptions& q,
                                std::shared_ptr<quant::GptqReport> report = nullptr);

// Throws kInvalidArgument naming what is wrong with q (mode, method, activation scale).
void quant_mode_check(const QuantOptions& q);
// The mode's *_model_options.
ModelOptions quant_model_options(const ModelOptions& base, const quant::CalibrationTable& table, const QuantOptions& q);

// Throws kInvalidArgument naming the problem when q's --effective-bits is set without a
// weight-only --quant mode (awq, gptq, awq-gptq), outside [5, 8.5], or with --mix-tokens < 1.
void check_effective_bits(const QuantOptions& q);
// --hadamard names Linears of --quant w8a8: without a --quant it is an error, not ignored
// (quant_mode_check refuses it beside the other modes).
void check_hadamard_has_quant(const QuantOptions& q);

// Model::load, quantized as q says (q.mode empty: plain load).
std::unique_ptr<Model> load_model(const std::string& path, const ModelOptions& base, const QuantOptions& q);
// Model::load_random quantized as q says, for speed measurements only: there is no text
// to calibrate on, so every Linear's activation clip is a placeholder (synthetic_calibration)
// and SmoothQuant is off. Accuracy claims come from real models (kiln eval --compare-quant).
std::unique_ptr<Model> load_random_model(const std::string& config, const ModelOptions& base, const QuantOptions& q);
// A table giving every Linear of g the activation clip `amax` (all methods, all channels);
// a Linear that `hadamard` names (W8A8Options::hadamard) gets its rotated input's entry
// instead (quant::hadamard_calib_name), with the clip amax * sqrt(b): a rotated row of b
// values grows by about that much.
quant::CalibrationTable synthetic_calibration(const ir::Graph& g, double amax,
                                              const std::vector<std::string>& hadamard = {});

// Per quantized Linear, the error of its int8 output against the f32 GEMM of the same
// input (install observer() in ModelOptions::linear_observer, run text, read rows()).
class LayerErrorCollector {
 public:
  struct Row {
    std::string node;
    double rel_rmse = 0;   // ||y - y_f32|| / ||y_f32|| over every output seen
    double max_abs = 0;    // max |y - y_f32|
    int64_t rows = 0;
  };
  std::shared_ptr<const LinearObserver> observer();
  std::vector<Row> rows_by_error() const;  // worst first

 private:
  struct Acc {
    double err2 = 0, ref2 = 0, max_abs = 0;
    int64_t rows = 0;
  };
  std::shared_ptr<std::map<std::string, Acc>> acc_ = std::make_shared<std::map<std::string, Acc>>();
};

}  // namespace kiln
