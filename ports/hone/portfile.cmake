# Overlay port for hone, built from this checkout:
#   vcpkg install hone[xtensor,mpi] --overlay-ports=<hone>/ports
# or, in manifest mode, "vcpkg-configuration.json": {"overlay-ports": ["<hone>/ports"]}.
# A registry port would use vcpkg_from_github(OUT_SOURCE_PATH SOURCE_PATH REPO <owner>/hone
# REF "v${VERSION}" SHA512 <...> HEAD_REF main) instead of the line below.
set(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../..")

# The library is header-only; the tools (hone-ckpt, hone-info) and, with the feature "compiled",
# the static library hone::compiled are built once, in release.
set(VCPKG_BUILD_TYPE release)

vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
    FEATURES
        xtensor HONE_ENABLE_XTENSOR
        cuda    HONE_ENABLE_CUDA
        mpi     HONE_ENABLE_MPI
        nccl    HONE_ENABLE_NCCL
        compiled HONE_ENABLE_COMPILED
)

vcpkg_cmake_configure(
    SOURCE_PATH "${SOURCE_PATH}"
    OPTIONS
        ${FEATURE_OPTIONS}
        -DHONE_INSTALL=ON
        -DHONE_BUILD_TESTS=OFF
        -DHONE_BUILD_EXAMPLES=OFF
        -DHONE_BUILD_TOOLS=ON
        -DHONE_BUILD_BENCH=OFF
        -DHONE_BUILD_FUZZERS=OFF
        -DHONE_INSTALL_CMAKEDIR=share/cmake/hone
)

vcpkg_cmake_install()
vcpkg_cmake_config_fixup(PACKAGE_NAME hone CONFIG_PATH share/cmake/hone)
# bin/hone-ckpt, bin/hone-info -> tools/hone/
vcpkg_copy_tools(TOOL_NAMES hone-ckpt hone-info AUTO_CLEAN)

# No debug tree; lib/ holds libhone_compiled.a with the feature "compiled", nothing otherwise.
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/debug")
if(NOT "compiled" IN_LIST FEATURES)
  file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/lib")
endif()

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
