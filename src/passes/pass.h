// The contract every graph pass shares (ONNX Runtime's GraphTransformer is the model):
// a name, run(Graph&) -> changed, and a one-line stats() summary of what it changed.
// Each pass lives in its own file and is created through the factories below; the
// ordered lists per optimization level live in pass_manager.cpp. Tested in tests/passes/.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::passes {

class Pass {
 public:
  virtual ~Pass() = default;
  virtual const char* name() const = 0;
  // Rewrites `g` in place and returns whether anything changed. The graph must verify
  // before and after. stats() then says what it did ("fused 24 Add+RMSNorm").
  virtual bool run(ir::Graph& g) = 0;
  const std::string& stats() const { return stats_; }

 protected:
  std::string stats_;
};

// Cleanup.
std::unique_ptr<Pass> make_constant_folding_pass();        // "constant_folding"
std::unique_ptr<Pass> make_dce_pass();                     // "dce"
std::unique_ptr<Pass> make_cse_pass();                     // "cse"
// Fusions.
std::unique_ptr<Pass> make_fuse_layer_norm_pattern_pass(); // "fuse_layer_norm_pattern"
std::unique_ptr<Pass> make_fuse_gelu_pattern_pass();       // "fuse_gelu_pattern"
std::unique_ptr<Pass> make_fuse_attention_pattern_pass();  // "fuse_attention_pattern"
std::unique_ptr<Pass> make_fuse_qkv_attention_pass();      // "fuse_qkv_attention"
std::unique_ptr<Pass> make_fuse_swiglu_pass();             // "fuse_swiglu"
std::unique_ptr<Pass> make_fuse_add_norm_pass();           // "fuse_add_norm"
std::unique_ptr<Pass> make_fuse_linear_activation_pass();  // "fuse_linear_activation"
std::unique_ptr<Pass> make_fuse_embedding_norm_pass();     // "fuse_embedding_norm"
std::unique_ptr<Pass> make_fuse_norm_linear_pass();        // "fuse_norm_linear"

// Precision assignment ("assign_precision"): GEMM weights in `precision` (f32, bf16,
// f16, q8, q4) unless pinned; logits GEMM and norm/softmax/pool nodes kept f32. An
// empty `precision` makes it a no-op.
struct PrecisionPin {
  std::string pattern;    // glob over node names: '*' any run, '?' one character
  std::string precision;  // f32 | bf16 | f16 | q8 | q4
};
std::unique_ptr<Pass> make_assign_precision_pass(std::string precision, std::vector<PrecisionPin> pins);
// "lm_head=f32,layers.0.*=f32" -> pins; throws kInvalidArgument naming a bad item.
std::vector<PrecisionPin> parse_precision_pins(const std::string& spec);
// Throws kInvalidArgument unless `p` is a precision the pass assigns.
void check_precision(const std::string& p, const std::string& where);
bool glob_match(const std::string& pattern, const std::string& s);

}  // namespace kiln::passes
