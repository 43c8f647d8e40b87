// Profile selection (see shape_profile.h).
#include "backends/shape_profile.h"

#include "core/status.h"

namespace kiln {

namespace {

std::string profile_str(const ShapeProfile& p) {
  std::string s = "'" + p.name + "':";
  bool first = true;
  for (auto& [dim, r] : p.dims) {
    s += str_cat(first ? " " : ", ", dim, " in [", r.min, ", ", r.max, "]");
    first = false;
  }
  return s;
}

// The first input dim outside `p`, as "input 'tokens' has shape [17]: T = 17"; "" if all fit.
std::string first_misfit(const ShapeProfile& p, const ir::Graph& g, const TensorMap& inputs) {
  for (ir::ValueId id : g.inputs()) {
    const ir::Value& v = g.value(id);
    auto it = inputs.find(v.name);
    if (it == inputs.end()) continue;  // the backend reports missing inputs
    const Tensor& t = it->second;
    for (size_t d = 0; d < v.shape.rank() && d < size_t(t.rank()); ++d) {
      if (v.shape[d].is_concrete()) continue;
      auto r = p.dims.find(v.shape[d].sym);
      const int64_t x = t.dim(int(d));
      if (r != p.dims.end() && (x < r->second.min || x > r->second.max))
        return str_cat("input '", v.name, "' has shape ", t.shape_str(), ": ", v.shape[d].sym, " = ", x);
    }
  }
  return "";
}

}  // namespace

std::string shape_profiles_str(const std::vector<ShapeProfile>& profiles) {
  std::string s;
  for (auto& p : profiles) s += (s.empty() ? "" : "; ") + profile_str(p);
  return s;
}

void shape_profile_check_name(const std::vector<ShapeProfile>& profiles, const std::string& wanted) {
  if (wanted.empty()) return;
  for (auto& p : profiles)
    if (p.name == wanted) return;
  std::string names;
  for (auto& p : profiles) names += (names.empty() ? "'" : ", '") + p.name + "'";
  throw_error(ErrorCode::kInvalidArgument, "no optimization profile named '", wanted, "' (the engine has ",
              names.empty() ? std::string("none") : names, ")");
}

int shape_profile_select(const std::vector<ShapeProfile>& profiles, const std::string& wanted,
                         const ir::Graph& graph, const TensorMap& inputs) {
  if (profiles.empty()) return -1;
  shape_profile_check_name(profiles, wanted);
  std::string why;
  for (size_t i = 0; i < profiles.size(); ++i) {
    if (!wanted.empty() && profiles[i].name != wanted) continue;
    std::string misfit = first_misfit(profiles[i], graph, inputs);
    if (misfit.empty()) return int(i);
    if (why.empty()) why = misfit;
  }
  if (!wanted.empty()) {
    for (auto& p : profiles)
      if (p.name == wanted)
        throw_error(ErrorCode::kOutOfRange, why, ", outside the selected engine profile ", profile_str(p),
                    " (pick another profile, or rebuild with a wider --profile)");
  }
  throw_error(ErrorCode::kOutOfRange, why, " is outside ",
              profiles.size() == 1 ? "the engine profile's range " : "every engine profile: ",
              shape_profiles_str(profiles), " (rebuild with a wider --profile)");
}

}  // namespace kiln
