# What `cmake --install` puts under the prefix: libzinf.so, include/zinf/, the CMake package
# (find_package(zinf CONFIG) gives the imported target zinf::zinf), zinf.pc for pkg-config and
# the `zinf` command line in bin/, and the node descriptions and model shapes `zinf plan` ships in
# share/zinf/. tests/install builds programs against exactly this.
# A wheel (`pip install .`, SKBUILD) takes only the library and the command line, into the
# package directory (Note [Wheel layout] in python/CMakeLists.txt).
include(CMakePackageConfigHelpers)

# C++ consumers of zinf::zinf compile as C++20 (include/zinf/ needs it), whatever their own
# default: the requirement travels with the exported target.
target_compile_features(zinf_shared INTERFACE cxx_std_20)

# No build machine's directory in any installed RUNPATH: libzinf.so needs nothing beside it,
# and its dependencies (NCCL in a CUDA build, in the toolkit's lib/) are the loader's to find
# (ld.so.conf, LD_LIBRARY_PATH, or a torch that loaded them first). The build tree keeps
# CMake's BUILD_RPATH, so its tests run as before.
set_target_properties(zinf_shared zinf PROPERTIES INSTALL_RPATH "")

if(SKBUILD)
  # A wheel is a zip and keeps no symlinks: one unversioned file, libzinf.so.
  set_property(TARGET zinf_shared PROPERTY VERSION)
  set_property(TARGET zinf_shared PROPERTY SOVERSION)
  install(TARGETS zinf_shared LIBRARY DESTINATION zinf)
  install(TARGETS zinf RUNTIME DESTINATION zinf/bin)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/tools/hardware ${PROJECT_SOURCE_DIR}/tools/models
          DESTINATION zinf/share/zinf FILES_MATCHING PATTERN "*.json")
  return()
endif()

set(ZINF_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/zinf)

install(TARGETS zinf_shared EXPORT zinfTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS zinf RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# `zinf plan --hardware NAME` and `--model NAME` read these, found beside bin/.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/tools/hardware ${PROJECT_SOURCE_DIR}/tools/models
        DESTINATION ${CMAKE_INSTALL_DATADIR}/zinf FILES_MATCHING PATTERN "*.json")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/zinf
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(EXPORT zinfTargets
  NAMESPACE zinf::
  DESTINATION ${ZINF_INSTALL_CMAKEDIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/zinfConfig.cmake.in
  ${PROJECT_BINARY_DIR}/zinfConfig.cmake
  INSTALL_DESTINATION ${ZINF_INSTALL_CMAKEDIR})
# 0.x: a minor release may change the C++ API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/zinfConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/zinfConfig.cmake ${PROJECT_BINARY_DIR}/zinfConfigVersion.cmake
  DESTINATION ${ZINF_INSTALL_CMAKEDIR})

# zinf.pc finds the prefix from its own location (${pcfiledir}), so that the files work
# wherever `cmake --install --prefix` or DESTDIR put them.
file(RELATIVE_PATH ZINF_PC_TO_PREFIX
  /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" ZINF_PC_TO_PREFIX "${ZINF_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/zinf.pc.in ${PROJECT_BINARY_DIR}/zinf.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/zinf.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
