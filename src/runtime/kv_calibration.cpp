// The key-shift calibration of the int8/fp8 KV cache (see kv_calibration.h).
#include "runtime/kv_calibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "quant/calibration.h"
#include "runtime/llm_runner.h"
#include "runtime/model_tokenizer.h"
#include "runtime/quantize.h"

namespace kiln {
namespace {

constexpr size_t kMinSequence = 16;

// The layers whose scores are soft-capped (Gemma 2: s -> cap tanh(s / cap)). The cap acts
// before the softmax, which then no longer cancels a shift of the scores: such layers keep
// their keys unshifted (a zero shift).
std::vector<bool> soft_capped_layers(const Model& rank) {
  std::vector<bool> capped(size_t(rank.info().num_layers), false);
  for (const ir::Node& n : rank.graph().nodes())
    if (n.op == "Attention" && n.attr_float("softcap", 0.0) > 0.0) {
      const int64_t l = n.attr_int("layer", -1);
      if (l >= 0 && l < int64_t(capped.size())) capped[size_t(l)] = true;
    }
  return capped;
}

// The cache the shift is for: the model's quantized dtype, or (a build) both.
std::string quantized_cache(const Model& model) {
  return kv_dtype_quantized(model.kv_dtype()) ? kv_dtype_name(model.kv_dtype()) : "int8/fp8";
}

void store_none(Model& model, const std::string& source) {
  for (int r = 0; r < model.tp_world(); ++r) model.tp_rank(r).set_kv_key_shift(nullptr, source, 0);
}

}  // namespace

void calibrate_kv_key_shift(Model& model) {
  const std::string& calib = model.kv_calib();
  if (calib == "none") {
    store_none(model, "none");
    return;
  }
  const std::vector<std::string> sources = split_commas(calib);
  if (sources.empty()) throw_error(ErrorCode::kInvalidArgument, "--kv-calib names no text (give default, none or files)");
  for (const std::string& src : sources)
    if (src != "default" && !std::filesystem::is_regular_file(src))
      throw_error(ErrorCode::kInvalidArgument, "--kv-calib: no text file '", src,
                  "' (give default, none, or text files, comma-separated)");
  std::optional<tok::Tokenizer> tokenizer;
  try {
    tokenizer = load_model_tokenizer(model);
  } catch (const Error& e) {
    // The default is a refinement a model running on token ids does without; text the
    // user named needs the tokenizer.
    if (calib != "default") throw;
    log_info("KV cache: cannot read the tokenizer of '", model.path(), "' (", e.what(), "); the ",
             quantized_cache(model), " cache stores keys without a shift");
    store_none(model, "");
    return;
  }
  if (!tokenizer) {
    log_info("KV cache: '", model.path(), "' has no tokenizer to read calibration text; the ",
             quantized_cache(model), " cache stores keys without a shift");
    store_none(model, "");
    return;
  }
  std::vector<int32_t> tokens;
  for (const std::string& src : sources) {
    const std::string text = src == "default" ? quant::default_calibration_text() : read_text_file(src);
    std::vector<int32_t> t = tokenizer->encode(text, /*add_special=*/true);
    tokens.insert(tokens.end(), t.begin(), t.end());
  }
  // A tokenizer of another model gives ids the embedding cannot read: said here, and under
  // the default text (a refinement) the keys stay unshifted.
  const int64_t vocab = model.info().vocab_size;
  for (int32_t id : tokens)
    if (id < 0 || id >= vocab) {
      const std::string what = str_cat("KV key calibration: the tokenizer of '", model.path(), "' gave id ", id,
                                       " for the calibration text, outside the model's vocabulary of ", vocab,
                                       " (is it this model's tokenizer?)");
      if (calib != "default") throw_error(ErrorCode::kInvalidArgument, what, "; --kv-calib none skips the calibration");
      log_warn(what, "; the ", quantized_cache(model), " cache stores keys without a shift");
      store_none(model, "");
      return;
    }
  calibrate_kv_key_shift(model, tokens,
                         calib == "default" ? std::string("the built-in calibration set") : "'" + calib + "'");
}

void calibrate_kv_key_shift(Model& model, const std::vector<int32_t>& tokens, const std::string& what) {
  const auto t0 = std::chrono::steady_clock::now();
  if (tokens.size() < kMinSequence)
    throw_error(ErrorCode::kInvalidArgument, "--kv-calib: ", what, " has ", tokens.size(),
                " tokens; the key-shift calibration needs at least ", kMinSequence);

  std::vector<std::span<const int32_t>> seqs;
  size_t at = 0, longest = 0;
  for (int32_t len : kKvCalibLengths) {
    const size_t n = std::min({size_t(len), size_t(model.info().max_positions), tokens.size() - at});
    if (n < kMinSequence) break;
    seqs.emplace_back(tokens.data() + at, n);
    at += n;
    longest = std::max(longest, n);
  }

  log_info("KV cache: measuring the ", quantized_cache(model), " cache's key shift on ", at, " tokens of ",
           what, " (--kv-calib none skips it)");
  LlmRunnerOptions o;
  o.kv_dtype = KvDType::kAuto;
  o.max_total_tokens = int64_t(longest);
  o.max_step_tokens = int64_t(longest);
  LlmRunner runner(model, o);
  const int world = model.tp_world();
  std::vector<std::vector<double>> total(static_cast<size_t>(world));
  std::vector<std::vector<bool>> capped;
  for (int r = 0; r < world; ++r) capped.push_back(soft_capped_layers(model.tp_rank(r)));
  std::vector<float> keys;
  for (std::span<const int32_t> s : seqs) {
    KvSequence kv;
    StepChunk chunk{&kv, s, /*want_logits=*/true};
    runner.run_chunks_logits({&chunk, 1});
    std::vector<int64_t> slots(s.size());
    for (size_t p = 0; p < s.size(); ++p) slots[p] = runner.kv().slot(kv, int32_t(p));
    for (int r = 0; r < world; ++r) {
      const ModelInfo& info = model.tp_rank(r).info();
      const int64_t row = info.num_kv_heads * info.head_dim;
      std::vector<double>& sum = total[size_t(r)];
      sum.resize(size_t(info.num_layers * row), 0.0);
      keys.resize(s.size() * size_t(row));
      // Position p's key is read by the sequence's n - p queries at p and after.
      const double wsum = double(s.size()) * double(s.size() + 1) / 2;
      for (int64_t l = 0; l < info.num_layers; ++l) {
        if (capped[size_t(r)][size_t(l)]) continue;
        runner.rank_storage(r).read_keys(l, slots, keys.data());
        double* dst = sum.data() + l * row;
        for (size_t p = 0; p < s.size(); ++p) {
          const double w = double(s.size() - p) / wsum;
          for (int64_t c = 0; c < row; ++c) dst[c] += double(keys[p * size_t(row) + size_t(c)]) * w;
        }
      }
    }
    runner.kv_manager().free(kv);
  }

  double largest = 0;
  for (int r = 0; r < world; ++r) {
    const ModelInfo& info = model.tp_rank(r).info();
    const int64_t row = info.num_kv_heads * info.head_dim;
    auto shift = std::make_shared<std::vector<float>>(total[size_t(r)].size());
    for (size_t i = 0; i < shift->size(); ++i) {
      const double m = total[size_t(r)][i] / double(seqs.size());
      if (!std::isfinite(m))
        throw_error(ErrorCode::kInvalidArgument, "KV key calibration: layer ", int64_t(i) / row, "'s keys are not finite",
                    world > 1 ? str_cat(" (rank ", r, ")") : std::string());
      (*shift)[i] = float(m);
      largest = std::max(largest, std::fabs(m));
    }
    model.tp_rank(r).set_kv_key_shift(std::move(shift), what, uint32_t(at));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log_info("KV cache: ", quantized_cache(model), " keys stored less their mean over ", at, " tokens of ",
           what, " (", seqs.size(), " sequences; largest |shift| ", largest, ") in ", secs, " s",
           model.kv_rotate() ? ", through a Walsh-Hadamard transform (--kv-rotate)" : "");
}

void ensure_kv_key_shift(Model& model) {
  if (!kv_dtype_quantized(model.kv_dtype()) || model.kv_key_shift_measured()) return;
  calibrate_kv_key_shift(model);
}

}  // namespace kiln
