// The contract every graph pass shares (ONNX Runtime's GraphTransformer is the model):
// a name, run(Graph&) -> changed, and a one-line stats() summary of what it changed.
// Each pass lives in its own file and is created through the factories below; the
// ordered lists per optimization level live in pass_manager.cpp. Tested in tests/passes/.
#pragma once

#include <memory>
#include <string>

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
std::unique_ptr<Pass> make_fuse_qkv_attention_pass();      // "fuse_qkv_attention"
std::unique_ptr<Pass> make_fuse_swiglu_pass();             // "fuse_swiglu"
std::unique_ptr<Pass> make_fuse_add_norm_pass();           // "fuse_add_norm"
std::unique_ptr<Pass> make_fuse_linear_activation_pass();  // "fuse_linear_activation"

}  // namespace kiln::passes
