// The CPU backend: always built, the reference every other backend is checked against.
// Kernels live in kernels/ (AVX2/FMA with a scalar fallback); this layer maps IR nodes
// onto them and plans activation memory. Tested in tests/backends/cpu/cpu_backend_test.cpp
// and end to end by the model golden tests.
#pragma once

#include <memory>

#include "backends/backend.h"

namespace kiln {

std::unique_ptr<Backend> create_cpu_backend();

}  // namespace kiln
