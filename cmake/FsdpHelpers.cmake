# Build helpers shared by every directory.

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
  # An empty LABELS value would vanish from the list and shift every later property. So would a
  # list value: gtest_discover_tests passes each element on as its own word, so ENVIRONMENT holds
  # one variable here (the temp area is found from the executable's place: tests/support).
  set(labels)
  if(T_LABELS)
    set(labels LABELS "${T_LABELS}")
  endif()
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT ${T_TIMEOUT} ${labels}
               ENVIRONMENT "FSDP_PYTHON=${FSDP_PYTHON}"
               ENVIRONMENT_MODIFICATION "PATH=path_list_prepend:${FSDP_VENV_BIN}")
endfunction()

# The project's Python environment (scripts/venv.sh) for tests: the reference systems
# (transformers, PyTorch FSDP2, tokenizers...) and torchrun. Every test gets its bin/ first
# on PATH and FSDP_PYTHON naming its interpreter.
function(fsdp_test_python)
  if(NOT FSDP_PYTHON)
    message(FATAL_ERROR "fsdp: the tests need the project's Python environment: configure with "
                        "-DFSDP_PYTHON=<venv>/bin/python (scripts/build.sh does), or -DFSDP_BUILD_TESTS=OFF")
  endif()
  get_filename_component(bin "${FSDP_PYTHON}" DIRECTORY)
  set(FSDP_VENV_BIN "${bin}" PARENT_SCOPE)
endfunction()

# fsdp_add_python_test(NAME SCRIPT file.py [ARGS ...] [TIMEOUT s] [LABELS ...] [PROCESSORS n])
# A test script run by the environment's Python; exit 0 passes. Under CI=true nothing may skip:
# a script has no skip code (SKIP_RETURN_CODE is not set), so a missing prerequisite fails.
function(fsdp_add_python_test name)
  cmake_parse_arguments(T "" "SCRIPT;TIMEOUT;PROCESSORS" "ARGS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(NOT T_PROCESSORS)
    set(T_PROCESSORS 1)
  endif()
  add_test(NAME ${name} COMMAND ${FSDP_PYTHON} ${T_SCRIPT} ${T_ARGS})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}" PROCESSORS ${T_PROCESSORS}
                       ENVIRONMENT "FSDP_PYTHON=${FSDP_PYTHON};PYTHONDONTWRITEBYTECODE=1"
                       ENVIRONMENT_MODIFICATION "PATH=path_list_prepend:${FSDP_VENV_BIN}")
endfunction()

# fsdp_add_library(NAME SOURCES a.cpp ... [DEPS other_fsdp_libs...])
# One static library per layer (see docs/design.md); DEPS may only name lower layers. Each is
# installed and exported (cmake/FsdpInstall.cmake) as fsdp::<NAME without "fsdp_">, e.g.
# fsdp_engine -> fsdp::engine; fsdp::fsdp is all of them.
function(fsdp_add_library name)
  cmake_parse_arguments(L "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${L_SOURCES})
  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                            $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
                                     PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PUBLIC ${L_DEPS} fsdp::torch Threads::Threads)
  target_precompile_headers(${name} REUSE_FROM fsdp_pch)
  string(REGEX REPLACE "^fsdp_" "" export_name "${name}")
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${export_name})
  set_property(GLOBAL APPEND PROPERTY FSDP_LIBRARIES ${name})
endfunction()

# Development aid: -DFSDP_AREAS="common;comm;fsdp" configures only those
# layers (src/ and tests/). Empty (the default): everything.
set(FSDP_AREAS "" CACHE STRING "Configure only these layers (development); empty: all")
function(fsdp_area dir)
  if(NOT FSDP_AREAS OR dir IN_LIST FSDP_AREAS)
    add_subdirectory(${dir})
  endif()
endfunction()

# fsdp_add_build_tree_paths(DIR): every executable defined in DIR and below gets the generated
# source that tells it where this build tree keeps what libraries load at run time (the
# SentencePiece module: src/data/CMakeLists.txt). Only programs built here carry a build-tree
# path; the libraries `cmake --install` ships reference it weakly and carry none.
function(fsdp_add_build_tree_paths dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "EXECUTABLE")
      set(generated ${PROJECT_BINARY_DIR}/generated/spm_build_path.cpp)
      target_sources(${t} PRIVATE ${generated})
      # One line of C: LibTorch's precompiled header would cost each program seconds.
      set_source_files_properties(${generated} TARGET_DIRECTORY ${t} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    fsdp_add_build_tree_paths(${sub})
  endforeach()
endfunction()
