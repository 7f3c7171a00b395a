# What `cmake --install` puts under the prefix: libzinf.so, include/zinf/, the CMake package
# (find_package(zinf CONFIG) gives the imported target zinf::zinf) and zinf.pc for pkg-config.
# tests/install builds programs against exactly this.
include(CMakePackageConfigHelpers)

set(ZINF_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/zinf)

install(TARGETS zinf_shared EXPORT zinfTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
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
