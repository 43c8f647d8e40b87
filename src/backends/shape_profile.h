// Choosing an engine's optimization profile for one step's inputs, shared by every
// backend: the named one, or the first whose ranges hold every symbolic dim of every
// input; outside all of them, a kOutOfRange error naming the input, its shape and the
// allowed ranges. Tested in tests/engine/profile_test.cpp (EngineProfiles) and by
// tests/tools/cli_test.sh.
#pragma once

#include <string>
#include <vector>

#include "backends/backend.h"

namespace kiln {

// Index into `profiles` of the profile these inputs run under; -1 when there are no
// profiles (any shape). `wanted` empty: the first that fits. Throws kInvalidArgument
// for an unknown `wanted`, kOutOfRange when the inputs fit no (or not the wanted) profile.
int shape_profile_select(const std::vector<ShapeProfile>& profiles, const std::string& wanted,
                         const ir::Graph& graph, const TensorMap& inputs);

// Throws kInvalidArgument unless `wanted` is empty or names one of `profiles`.
void shape_profile_check_name(const std::vector<ShapeProfile>& profiles, const std::string& wanted);

// "'small': T in [1, 64]; 'large': T in [65, 2048]"
std::string shape_profiles_str(const std::vector<ShapeProfile>& profiles);

}  // namespace kiln
