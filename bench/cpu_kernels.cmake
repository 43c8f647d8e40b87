# cpu_kernels_bench: ceilings (triad, read-only sum, FMA peak) and the CPU kernels as a
# fraction of them. Included from bench/CMakeLists.txt.
add_executable(cpu_kernels_bench ${CMAKE_CURRENT_LIST_DIR}/cpu_kernels_bench.cpp)
target_link_libraries(cpu_kernels_bench PRIVATE kiln_cpu_kernels)
