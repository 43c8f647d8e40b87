// The CPU backend: always built, the reference every other backend is checked against.
// Kernels live in kernels/ (AVX2/FMA with a scalar fallback); this layer maps IR nodes
// onto them and plans activation memory. Tested in tests/backends/cpu/cpu_backend_test.cpp
// and end to end by the model golden tests.
#pragma once

#include <memory>
#include <string>

#include "backends/backend.h"

namespace kiln {

std::unique_ptr<Backend> create_cpu_backend();

// The CPU backend's memory_info() from the text of /proc/meminfo: MemAvailable (the
// kernel's estimate of what can be allocated without swapping) and MemTotal, in kB
// there. Both are 0 when the text lacks them.
DeviceMemory cpu_meminfo_parse(const std::string& text);

}  // namespace kiln
