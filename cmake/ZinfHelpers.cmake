# Shared CMake helpers for zinf targets.

# Warnings for every zinf target (not for dependencies). Clang also checks the thread-safety
# annotations (src/core/thread_annotations.h): what a mutex guards is read or written only
# with it held, and a function that needs a mutex is called with it; a breach fails the build.
function(zinf_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-missing-field-initializers>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:Clang>>:-Wthread-safety
      -Werror=thread-safety-analysis>)
endfunction()

# zinf_library(NAME SOURCES... [DEPS ...]) — a static library whose private headers are
# included by their layer's prefix: "nvme/io_engine.h" for nvme/, "core/log.h" for src/core/.
# Its objects are also bundled into libzinf.so (src/capi), so they are compiled with hidden
# visibility: only declarations marked ZINF_EXPORT (include/zinf/export.h) leave the library.
#
# Note [Layer include roots]
# The layer list (docs/ARCHITECTURE.md) is enforced by the compiler. No library has the
# repository root or src/ on its include path; each has a root of its own in the build tree
# that holds one link, named as its prefix, to its folder (build/layers/zinf_nvme/nvme ->
# nvme/), and exports it to what links it. A library so sees its own headers and those of the
# layers it links, and an include of a layer it does not link, one above it, does not compile
# (tests/layering/compile_probe.sh checks that).
function(zinf_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES} ${ARG_UNPARSED_ARGUMENTS})
  set_target_properties(${name} PROPERTIES
    C_VISIBILITY_PRESET hidden CXX_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  file(RELATIVE_PATH folder ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  string(REGEX REPLACE "^src/" "" prefix ${folder})
  set(root ${CMAKE_BINARY_DIR}/layers/${name})
  get_filename_component(parent ${root}/${prefix} DIRECTORY)
  file(MAKE_DIRECTORY ${parent})
  file(CREATE_LINK ${CMAKE_CURRENT_SOURCE_DIR} ${root}/${prefix} SYMBOLIC)
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include ${root})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  zinf_set_warnings(${name})
endfunction()

# zinf_test(NAME SOURCES... DEPS ... LABELS ...) — a GoogleTest binary registered with CTest.
function(zinf_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES} ${ARG_UNPARSED_ARGUMENTS})
  # Tests stand above every layer: their helpers ("tests/nvme/nvme_test_util.h") and any
  # layer's internals are theirs to include.
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  zinf_set_warnings(${name})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  # Sanitizer builds run several times slower: their presets scale every timeout, and tests
  # skip the checks of timing figures there (ZINF_SLOW_BUILD), which mean nothing at that speed.
  if(ZINF_TEST_TIMEOUT_SCALE)
    math(EXPR ARG_TIMEOUT "${ARG_TIMEOUT} * ${ZINF_TEST_TIMEOUT_SCALE}")
    target_compile_definitions(${name} PRIVATE ZINF_SLOW_BUILD=1)
  endif()
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  gtest_discover_tests(${name} TEST_LIST ${name}_tests DISCOVERY_TIMEOUT 60)
  # The labels and timeout are set by a file CTest reads after the discovered list: CMake
  # 3.25's PROPERTIES argument flattens a list of labels, so that a test kept only its first
  # label and lost its timeout.
  set(properties_file ${CMAKE_CURRENT_BINARY_DIR}/${name}_properties.cmake)
  file(WRITE ${properties_file}
    "if(${name}_tests)\n"
    "  set_tests_properties(\${${name}_tests} PROPERTIES LABELS \"${ARG_LABELS}\"\n"
    "    TIMEOUT ${ARG_TIMEOUT})\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${properties_file})
endfunction()

function(zinf_add_subdirectory_if_present dir)
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${dir}/CMakeLists.txt)
    add_subdirectory(${dir})
  endif()
endfunction()
