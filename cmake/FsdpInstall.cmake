# `cmake --install <build> --prefix P` installs the public headers (include/fsdp), the layer
# libraries, the SentencePiece module and the CMake package fsdp_cpp, so that another project needs
#   find_package(fsdp_cpp CONFIG REQUIRED)   # -DCMAKE_PREFIX_PATH=P
#   target_link_libraries(app PRIVATE fsdp::fsdp)
# (docs/library.md). The package finds LibTorch again where it is used (cmake/FsdpTorch.cmake).
include(CMakePackageConfigHelpers)

# Call after every fsdp_add_library: fsdp::fsdp links the libraries that were configured.
function(fsdp_install)
  set(package_dir ${CMAKE_INSTALL_LIBDIR}/cmake/fsdp_cpp)
  get_property(libraries GLOBAL PROPERTY FSDP_LIBRARIES)
  add_library(fsdp_all INTERFACE)
  target_link_libraries(fsdp_all INTERFACE ${libraries})
  set_target_properties(fsdp_all PROPERTIES EXPORT_NAME fsdp)
  add_library(fsdp::fsdp ALIAS fsdp_all)

  install(TARGETS ${libraries} fsdp_all EXPORT fsdp_cppTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  # The whole tree: a header moved or added under include/fsdp installs without a change here.
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/fsdp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          FILES_MATCHING PATTERN "*.h")
  if(TARGET fsdp_spm_shim)
    # Loaded at run time by name (src/data/tokenizer_spm.cpp); the package puts this directory on
    # the run path of the programs that link fsdp::data.
    install(TARGETS fsdp_spm_shim LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  endif()
  install(EXPORT fsdp_cppTargets NAMESPACE fsdp:: DESTINATION ${package_dir})

  # What the package must know of this build: how LibTorch was found and which one.
  set(FSDP_CPP_WITH_CUDA ${FSDP_WITH_CUDA})
  set(FSDP_CPP_WITH_NCCL ${FSDP_WITH_NCCL})
  set(FSDP_CPP_TORCH_DIR "${FSDP_TORCH_DIR_FOUND}")
  set(FSDP_CPP_TORCH_VERSION "${FSDP_TORCH_VERSION}")
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/fsdp_cppConfig.cmake.in
                                ${PROJECT_BINARY_DIR}/package/fsdp_cppConfig.cmake
                                INSTALL_DESTINATION ${package_dir})
  # 0.x: a minor version may change the API.
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/fsdp_cppConfigVersion.cmake
                                   VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/package/fsdp_cppConfig.cmake
                ${PROJECT_BINARY_DIR}/package/fsdp_cppConfigVersion.cmake
                ${PROJECT_SOURCE_DIR}/cmake/FsdpTorch.cmake
          DESTINATION ${package_dir})
endfunction()
