# Install rules for the C++ library (component `dev`): the public headers
# (include/tensorhub/ and nothing else), the static libraries a user links,
# and a CMake package, so that a program outside the tree does
#   find_package(TensorHub CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE TensorHub::client)   # + TensorHub::hub
# tests/install/install_test.sh checks it. The Python wheel installs only
# the `python` component (pyproject.toml), so none of this goes into it.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# th_client and th_hub are what a user names; the rest are what they link.
set(TH_INSTALLED_LIBS th_client th_hub th_hub_service th_hub_state th_ha_etcd th_transport_tcp th_transport_ucx
    th_tls th_wire th_cuda th_proto th_etcd_proto th_metrics th_common)
foreach(lib ${TH_INSTALLED_LIBS})
  string(REGEX REPLACE "^th_" "" name ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${name})
endforeach()
install(TARGETS ${TH_INSTALLED_LIBS} EXPORT TensorHubTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tensorhub
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)

set(TH_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/TensorHub)
install(EXPORT TensorHubTargets NAMESPACE TensorHub:: DESTINATION ${TH_CMAKE_DIR}
        COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/TensorHubConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/TensorHubConfig.cmake
                              INSTALL_DESTINATION ${TH_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/TensorHubConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/TensorHubConfig.cmake
              ${PROJECT_BINARY_DIR}/TensorHubConfigVersion.cmake
        DESTINATION ${TH_CMAKE_DIR} COMPONENT dev)
