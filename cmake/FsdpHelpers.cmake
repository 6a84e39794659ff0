# Build helpers shared by every directory.

# Gloo: Debian ships libgloo with a CMake config; the LibTorch inside a PyTorch
# wheel carries Gloo's headers and symbols itself, so nothing extra is linked.
function(fsdp_find_gloo)
  find_package(Gloo CONFIG QUIET)
  if(TARGET gloo)
    set(FSDP_GLOO_LIBS gloo PARENT_SCOPE)
    message(STATUS "fsdp: Gloo from its CMake package")
  else()
    set(FSDP_GLOO_LIBS "" PARENT_SCOPE)
    message(STATUS "fsdp: Gloo expected inside LibTorch")
  endif()
endfunction()


# fsdp_add_test(NAME SOURCES a.cpp ... LIBS fsdp_libs... [TIMEOUT s] [LABELS l...])
# One gtest binary; each TEST becomes its own CTest test so `ctest -j` spreads them.
function(fsdp_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LABELS;LIBS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} fsdp_test_support GTest::gtest)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_precompile_headers(${name} REUSE_FROM fsdp_pch)
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
endfunction()

# fsdp_add_library(NAME SOURCES a.cpp ... [DEPS other_fsdp_libs...])
# One static library per layer (see DESIGN.md); DEPS may only name lower layers.
function(fsdp_add_library name)
  cmake_parse_arguments(L "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${L_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include
                                     PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PUBLIC ${L_DEPS} torch Threads::Threads)
  target_precompile_headers(${name} REUSE_FROM fsdp_pch)
endfunction()

# Development aid: -DFSDP_AREAS="common;comm;fsdp" configures only those
# layers (src/ and tests/). Empty (the default): everything.
set(FSDP_AREAS "" CACHE STRING "Configure only these layers (development); empty: all")
function(fsdp_area dir)
  if(NOT FSDP_AREAS OR dir IN_LIST FSDP_AREAS)
    add_subdirectory(${dir})
  endif()
endfunction()
