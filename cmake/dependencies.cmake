# Third-party packages, all from Debian (see README for the apt line).
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 QUIET)
if(KILN_TESTS)
  find_package(GTest REQUIRED)
endif()

# CUDA is optional: on when a toolkit is found, unless KILN_CUDA=OFF.
set(KILN_HAVE_CUDA OFF)
if(NOT KILN_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(KILN_HAVE_CUDA ON)
    # Hopper SASS (sm_90a: wgmma/setmaxnreg allowed) plus compute_80 PTX that any newer
    # GPU can JIT; two targets keep the CI compile time modest.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "90a-real;80-virtual")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    # CMake 3.25 knows no C++20 dialect flag for nvcc (12+ has one); targets inherit
    # CXX_STANDARD 20 for CUDA, so tell CMake the flag.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
    endif()
  elseif(KILN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KILN_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "kiln: CUDA backend ${KILN_HAVE_CUDA}")
