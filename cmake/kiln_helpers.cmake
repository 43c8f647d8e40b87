# kiln_add_library(name SOURCES ... DEPS ...): one static library per layer/module.
function(kiln_add_library name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${A_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PUBLIC ${A_DEPS})
endfunction()

# kiln_add_test(name SOURCES ... DEPS ...): a GoogleTest binary registered with CTest.
# Tests find fixtures through the KILN_FIXTURES environment variable.
function(kiln_add_test name)
  if(NOT KILN_TESTS)
    return()
  endif()
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE ${A_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    KILN_FIXTURES_DIR="${PROJECT_SOURCE_DIR}/tests/fixtures"
    KILN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  include(GoogleTest)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
endfunction()
