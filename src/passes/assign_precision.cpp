// Precision assignment: writes a `precision` attribute on every node whose numerics a
// backend may lower. GEMMs (Linear) get the requested precision for their weights
// (accumulation stays f32 on every backend); the final logits GEMM (a Linear writing
// the graph output "logits") stays f32, since small errors there flip sampled tokens
// and classes; nodes whose statistics are numerically sensitive (norms' mean/variance,
// attention's softmax, pooling) are marked f32 whatever was asked. Pins
// ("lm_head=f32", "layers.0.*=f32", globs over node names) override the choice for
// GEMMs. Runs only when a precision is requested (`kiln build --precision`), after the
// fusions, so pins name the fused nodes. Tested in tests/passes/precision_test.cpp.
#include <set>

#include "core/log.h"
#include "core/status.h"
#include "passes/pass.h"
#include "passes/pass_manager.h"

namespace kiln::passes {
namespace {

constexpr const char* kName = "assign_precision";

bool sensitive(const std::string& op) {
  static const std::set<std::string> ops = {"LayerNorm",    "RMSNorm",   "HeadRMSNorm", "AddLayerNorm", "AddRMSNorm",
                                            "EmbeddingLayerNorm", "Attention", "SeqMeanPool"};
  return ops.count(op) != 0;
}

bool is_logits_gemm(const ir::Graph& g, const ir::Node& n) {
  for (auto& [name, v] : g.outputs())
    if (name == "logits" && v == n.outputs[0]) return true;
  return false;
}

class AssignPrecision final : public Pass {
 public:
  AssignPrecision(std::string precision, std::vector<PrecisionPin> pins)
      : precision_(std::move(precision)), pins_(std::move(pins)) {}
  const char* name() const override { return kName; }

  bool run(ir::Graph& g) override {
    stats_.clear();
    if (precision_.empty()) return false;
    check_precision(precision_, "--precision");
    std::vector<size_t> pin_hits(pins_.size(), 0);
    std::map<std::string, size_t> gemms;
    size_t kept_f32 = 0, pinned = 0;
    bool changed = false;
    auto set = [&](ir::Node& n, const std::string& p) {
      auto it = n.attrs.find("precision");
      if (it == n.attrs.end() || std::get_if<std::string>(&it->second) == nullptr ||
          std::get<std::string>(it->second) != p) {
        n.attrs["precision"] = p;
        changed = true;
      }
    };
    for (ir::Node& n : g.nodes()) {
      if (sensitive(n.op)) {
        set(n, "f32");
        ++kept_f32;
        continue;
      }
      if (n.op != "Linear") continue;
      std::string p = is_logits_gemm(g, n) ? "f32" : precision_;
      std::string why = p == precision_ ? "" : " (logits)";
      // The last matching pin wins, so a broad pin can be refined by a later one.
      for (size_t i = 0; i < pins_.size(); ++i)
        if (glob_match(pins_[i].pattern, n.name)) {
          p = pins_[i].precision;
          why = " (pinned by '" + pins_[i].pattern + "')";
          ++pin_hits[i];
        }
      pinned += why.rfind(" (pinned", 0) == 0;
      log_debug(kName, ": ", n.name, " -> ", p, why);
      set(n, p);
      ++gemms[p];
    }
    for (size_t i = 0; i < pins_.size(); ++i)
      if (!pin_hits[i]) {
        std::string names;
        size_t shown = 0;
        for (const ir::Node& n : g.nodes())
          if (n.op == "Linear" && shown++ < 6) names += (names.empty() ? "" : ", ") + n.name;
        throw_error(ErrorCode::kInvalidArgument, "--pin-precision '", pins_[i].pattern, "=", pins_[i].precision,
                    "' matches no GEMM (Linear) node; GEMMs are named like: ", names,
                    " (see `kiln inspect --graph`)");
      }
    std::string counts;
    for (auto& [p, c] : gemms) counts += str_cat(counts.empty() ? "" : ", ", c, " ", p);
    stats_ = str_cat("GEMM weights ", counts.empty() ? std::string("none") : counts, pinned ? str_cat(" (", pinned, " pinned)") : "",
                     "; ", kept_f32, " norm/softmax/pool nodes kept f32");
    return changed;
  }

 private:
  std::string precision_;
  std::vector<PrecisionPin> pins_;
};

}  // namespace

void check_precision(const std::string& p, const std::string& where) {
  if (p != "f32" && p != "bf16" && p != "f16" && p != "q8" && p != "q4")
    throw_error(ErrorCode::kInvalidArgument, where, ": precision '", p, "' (expected f32, bf16, f16, q8 or q4)");
}

bool glob_match(const std::string& pattern, const std::string& s) {
  // Iterative '*' / '?' matching with one backtrack point (no recursion blow-up).
  size_t p = 0, i = 0, star = std::string::npos, mark = 0;
  while (i < s.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == s[i])) {
      ++p, ++i;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = i;
    } else if (star != std::string::npos) {
      p = star + 1;
      i = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::vector<PrecisionPin> parse_precision_pins(const std::string& spec) {
  std::vector<PrecisionPin> pins;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(pos, end - pos);
    size_t eq = item.rfind('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      throw_error(ErrorCode::kInvalidArgument, "--pin-precision '", spec, "': '", item,
                  "' is not NODE_GLOB=PRECISION (e.g. lm_head=f32,layers.0.*=f32)");
    PrecisionPin pin{item.substr(0, eq), item.substr(eq + 1)};
    check_precision(pin.precision, "--pin-precision '" + item + "'");
    pins.push_back(std::move(pin));
    pos = end + 1;
  }
  return pins;
}

std::unique_ptr<Pass> make_assign_precision_pass(std::string precision, std::vector<PrecisionPin> pins) {
  return std::make_unique<AssignPrecision>(std::move(precision), std::move(pins));
}

}  // namespace kiln::passes
