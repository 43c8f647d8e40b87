// What a model family provides (one file per family, registered in registry.cpp): read
// its config, declare its weights, build its faithful IR graph. The shared helpers here
// keep families short: declared weights are loaded and checked in one place (gemma.cpp's
// ForEachTensor), and every error names the tensor, expected and found shapes.
// Tested by tests/models/*_test.cpp against HuggingFace fixtures.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "frontends/weight_source.h"
#include "ir/graph.h"

namespace kiln {

// What the runtime needs to know about a built model.
struct ModelInfo {
  std::string family;      // "gpt2", "llama", "bert"
  std::string model_type;  // config.json's model_type
  bool is_decoder = true;  // decoders have a KV cache and "logits" per requested row
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_positions = 0;
  int64_t num_labels = 0;  // encoders with a classification head
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  std::vector<std::string> labels;  // id2label, when the config has one
  // How a sentence embedding pools the token rows: a sentence-transformers directory's
  // Pooling module, a GGUF's pooling_type. Encoders: "mean" or "cls" (the [CLS] row's
  // hidden state); "mean" when neither says. Decoders: "last" (the last token's final
  // hidden state, e.g. Qwen3-Embedding) when the checkpoint declares it - the model is
  // then an embedding model (kiln serve offers /v1/embeddings, not completions) -, else
  // "" (encode() still pools the last token).
  std::string pooling = "mean";
};

struct BuiltModel {
  ir::Graph graph;
  ModelInfo info;
  // "bf16" / "f16" when every matrix of the checkpoint is stored in it (a 16-bit
  // checkpoint), else "": what --weight-dtype auto keeps GEMM weights in on the CPU.
  std::string stored_dtype;
  // LongRoPE: the graph's inverse frequencies (`inv_freq`, weights) hold the short factors,
  // good up to info.max_positions (original_max_position_embeddings); a context past it
  // (ModelOptions::max_context, up to `max_positions`) swaps in `long_inv_freq` for every
  // position, as llama.cpp does for such a context. Empty for every other model.
  struct LongContext {
    std::vector<ir::ValueId> inv_freq;
    Tensor long_inv_freq;
    int64_t max_positions = 0;
  };
  std::optional<LongContext> long_context;
};

// A weight a family expects. `shape` is what the graph needs; `transpose` marks
// GPT-2's Conv1D weights stored [in, out]. An optional weight may be absent; a tied
// weight falls back to another tensor when absent (GPT-2/Llama LM heads).
struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool required = true;
  std::string tied_to;
  bool transpose = false;
  // A Linear weight [out, in]: loaded as a quantized image (WeightSource::load_quantized)
  // when the source keeps quantized weights and has this one in that format.
  bool linear = false;
  // A lookup table [rows, dim] (a token embedding): like `linear`, loaded as a quantized
  // image (rows of dim values) when the source keeps its format, so a GGUF's quantized
  // embedding is not expanded to f32 (an 8B Llama's: 2.1 GB f32, 0.3 GB as q4). The
  // builder marks its Embedding node (weight_quant, weight_k); a Linear tied to it shares
  // the image.
  bool table = false;
};

// Loads every declared weight as f32 (Linear weights and tables: as the source keeps
// them, quantized images or 16-bit, see WeightSource), checks shapes, and returns them by
// name (absent optional weights are missing from the map). Errors name the tensor, the expected and
// found shape, and the source file. Shows a progress line for slow loads.
std::map<std::string, Tensor> load_declared_weights(const std::vector<WeightSpec>& specs,
                                                    const WeightSource& source);

// A weight loaded as a quantized row image (WeightSource::load_quantized; u8 rows whose
// byte count tells q8 from q4) of rows of k values: a Linear's attributes for it
// (weight_quant, precision - its own format whatever the global weight dtype - and
// weight_k), empty for any other weight.
std::map<std::string, ir::Attr> kept_quant_linear_attrs(const Tensor& w, int64_t k);
// The same for an Embedding over a kept table (WeightSpec::table) of rows of dim values:
// weight_quant and weight_k, empty for a table of floats.
std::map<std::string, ir::Attr> kept_quant_table_attrs(const Tensor& table, int64_t dim);

// Typed config access with errors naming the key.
int64_t config_int(const nlohmann::json& c, const std::string& key);
int64_t config_int(const nlohmann::json& c, const std::string& key, int64_t fallback);
double config_float(const nlohmann::json& c, const std::string& key);
double config_float(const nlohmann::json& c, const std::string& key, double fallback);
std::string config_str(const nlohmann::json& c, const std::string& key, const std::string& fallback);

// One entry of the family registry.
struct ModelFamily {
  const char* name;
  std::vector<std::string> model_types;
  BuiltModel (*build)(const nlohmann::json& config, const WeightSource& weights);
};

const std::vector<ModelFamily>& model_families();
// Picks the family by config["model_type"]; throws kUnsupported naming it and listing
// the supported ones.
BuiltModel build_model(const nlohmann::json& config, const WeightSource& weights);

// Families (each in its own file).
BuiltModel build_gpt2(const nlohmann::json& config, const WeightSource& weights);
BuiltModel build_llama(const nlohmann::json& config, const WeightSource& weights);
BuiltModel build_gemma1(const nlohmann::json& config, const WeightSource& weights);
BuiltModel build_gemma2(const nlohmann::json& config, const WeightSource& weights);
BuiltModel build_gemma3(const nlohmann::json& config, const WeightSource& weights);
// model_type gemma3 (Gemma3ForConditionalGeneration): the language model of a multimodal
// Gemma 3 checkpoint (text_config; the vision tower is not read).
BuiltModel build_gemma3_multimodal(const nlohmann::json& config, const WeightSource& weights);
// A decoder config's shape and token ids into `info` (head_dim defaults to hidden /
// heads, max_position_embeddings to default_max_positions); kInvalidFile when the heads
// do not group over the KV heads.
void read_decoder_info(const nlohmann::json& config, int64_t default_max_positions, ModelInfo& info);
// Sliding-window attention, each layer's Attention `window` attribute: config.json's
// sliding_window (each query sees its last `window` keys, itself included) in the layers
// where slides[l], else 0 (full attention); 0 too where the window is not shorter than
// max_positions (it cuts nothing). kInvalidFile for a window below 1.
std::vector<int64_t> sliding_windows(const nlohmann::json& config, const std::vector<bool>& slides,
                                     const ModelInfo& info);
// Which of info.num_layers layers slide: config.json's layer_types where given (one
// "sliding_attention" or "full_attention" per layer, else kInvalidFile naming what it
// found), else `fallback` (the family's rule when a config has no layer_types).
std::vector<bool> sliding_layers(const nlohmann::json& config, const ModelInfo& info, std::vector<bool> fallback);
// What rope_inv_freq found besides the frequencies, for the scaling types that have more:
// LongRoPE (Phi-3.5, Phi-4-mini) and YaRN (Qwen2.5 / Qwen3 long context).
struct RopeExtras {
  double attention_factor = 1.0;       // cos and sin are multiplied by it (LongRoPE, YaRN)
  int64_t original_max_positions = 0;  // LongRoPE: past it transformers switches to long_factor
  Tensor long_inv_freq;                // LongRoPE: [rotary_dim / 2], the inverse frequencies with long_factor
};
// RoPE inverse frequencies [rotary_dim / 2] as transformers computes them (f32
// arithmetic) from a config's rope_theta, partial_rotary_factor and rope_scaling or
// rope_parameters: default, linear, llama3, and where `extras` is given to take the rest,
// longrope (its short factors) and yarn; others kUnsupported. A GGUF's frequency divisors
// (kRopeFreqFactorsConfigKey) divide the result.
Tensor rope_inv_freq(const nlohmann::json& config, int64_t head_dim, RopeExtras* extras = nullptr);
BuiltModel build_bert(const nlohmann::json& config, const WeightSource& weights);

}  // namespace kiln
