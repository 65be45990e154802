# Installs the producer library upstream C++ code links, and nothing else of
# the project: sagapool::producer and the sagapool::request and
# sagapool::kafka_base it needs, their
# headers, a CMake package (find_package(sagapool CONFIG)) and a pkg-config
# file (sagapool-producer). Both need only librdkafka besides
# (producer/README.md). The programs are not installed: the image copies
# them from the build tree.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(SAGAPOOL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/sagapool)

install(TARGETS sagapool_producer sagapool_request sagapool_kafka_base EXPORT sagapoolTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT sagapoolTargets NAMESPACE sagapool:: DESTINATION ${SAGAPOOL_CMAKE_DIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/sagapoolConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/sagapoolConfig.cmake INSTALL_DESTINATION ${SAGAPOOL_CMAKE_DIR})
# 0.x: a minor release may change the API.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/sagapoolConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/sagapoolConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/sagapoolConfigVersion.cmake DESTINATION ${SAGAPOOL_CMAKE_DIR})

# The .pc finds its prefix from its own place (${pcfiledir}), so the tree
# can be installed with `cmake --install --prefix` anywhere or moved.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  message(FATAL_ERROR "the pkg-config file needs CMAKE_INSTALL_LIBDIR and "
    "CMAKE_INSTALL_INCLUDEDIR relative to the prefix")
endif()
file(RELATIVE_PATH SAGAPOOL_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" SAGAPOOL_PC_TO_PREFIX "${SAGAPOOL_PC_TO_PREFIX}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/sagapool-producer.pc.in
  ${CMAKE_CURRENT_BINARY_DIR}/sagapool-producer.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/sagapool-producer.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
