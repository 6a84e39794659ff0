# The API reference (docs/library.md): `cmake --build build --target docs` runs Doxygen on the
# public headers into build/docs/html. The test suite runs the same generation (Docs.Doxygen) and
# fails on any warning.
find_program(FSDP_DOXYGEN doxygen)
find_program(FSDP_DOCS_PYTHON NAMES python3 python)
set(FSDP_DOCS_DIR ${PROJECT_BINARY_DIR}/docs)
configure_file(${PROJECT_SOURCE_DIR}/cmake/doxygen/Doxyfile.in ${FSDP_DOCS_DIR}/Doxyfile @ONLY)
if(FSDP_DOXYGEN)
  add_custom_target(docs
    COMMAND ${FSDP_DOXYGEN} ${FSDP_DOCS_DIR}/Doxyfile
    COMMAND ${CMAKE_COMMAND} -E echo "API reference: ${FSDP_DOCS_DIR}/html/index.html"
    WORKING_DIRECTORY ${FSDP_DOCS_DIR}
    COMMENT "Doxygen: the public headers -> ${FSDP_DOCS_DIR}/html"
    VERBATIM)
else()
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E echo "docs: doxygen not found (Debian: apt-get install doxygen; scripts/deps.sh installs it)"
    COMMAND ${CMAKE_COMMAND} -E false
    VERBATIM)
endif()
