"""Conan 2 recipe for hone, a header-only C++20 library.

    conan create . -pr:h default -pr:h packaging/conan/profiles/debian12 -pr:b default -nr

creates the package offline against the distribution's oneTBB, xtensor, xsimd, zstd, xxHash and Open MPI
(declared as [platform_requires] in that profile); without the second profile the dependencies
come from a remote (ConanCenter) as usual. See docs/install.md.

Options map to components (CMake targets of the generated hone-config.cmake):
    (always)   hone::hone  (component "hone")
    cuda=True  hone::cuda  (component "cuda", defines HONE_WITH_CUDA=1, CUDA::cudart)
    mpi=True   hone::mpi   (component "mpi",  defines HONE_WITH_MPI=1, MPI)
    nccl=True  hone::nccl  (component "nccl", defines HONE_WITH_NCCL=1, NCCL; needs cuda=True)
"""

import os
import re
import textwrap

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load, save

required_conan_version = ">=2.0.5"

# Where package() writes the CMake snippets that package_info() hands to CMakeDeps as build
# modules (included at the end of the generated hone-config.cmake).
_MODULES_DIR = os.path.join("lib", "cmake", "hone-conan")

# Dependencies that Conan does not model, or that a profile's [platform_requires] turned into
# "provided by the system" (CMakeDeps then generates nothing for them and drops them from hone's
# targets). Each snippet finds the dependency with CMake and links it into hone's target, the way
# hone's own honeConfig.cmake does.
_MODULES = {
    "onetbb": """\
        find_package(TBB CONFIG REQUIRED)
        target_link_libraries(hone::hone INTERFACE TBB::tbb)
        """,
    "xtensor": """\
        find_package(xtensor CONFIG REQUIRED)
        target_link_libraries(hone::hone INTERFACE xtensor)
        """,
    "xsimd": """\
        find_package(xsimd CONFIG REQUIRED)
        target_link_libraries(hone::hone INTERFACE xsimd)
        """,
    "zstd": """\
        find_package(zstd CONFIG REQUIRED)
        if(TARGET zstd::libzstd_shared)
          target_link_libraries(hone::hone INTERFACE zstd::libzstd_shared)
        else()
          target_link_libraries(hone::hone INTERFACE zstd::libzstd_static)
        endif()
        """,
    "xxhash": """\
        if(NOT TARGET xxHash::xxhash)
          list(PREPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_LIST_DIR}")
          find_package(xxHash 0.8 REQUIRED)
          list(POP_FRONT CMAKE_MODULE_PATH)
        endif()
        target_link_libraries(hone::hone INTERFACE xxHash::xxhash)
        """,
    "openmpi": """\
        find_package(MPI REQUIRED COMPONENTS CXX)
        target_link_libraries(hone::mpi INTERFACE MPI::MPI_CXX)
        """,
    "cuda": """\
        find_package(CUDAToolkit REQUIRED)
        target_link_libraries(hone::cuda INTERFACE CUDA::cudart)
        target_compile_options(hone::cuda INTERFACE
                               $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
        """,
    "nccl": """\
        if(NOT TARGET NCCL::NCCL)
          find_package(CUDAToolkit REQUIRED)
          list(PREPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_LIST_DIR}")
          find_package(NCCL REQUIRED)
          list(POP_FRONT CMAKE_MODULE_PATH)
        endif()
        target_link_libraries(hone::nccl INTERFACE NCCL::NCCL)
        """,
}


class HoneConan(ConanFile):
    name = "hone"
    description = "Fast, lean C++ training loops: policies for your own model"
    license = "MIT"
    topics = ("machine-learning", "training", "header-only", "cuda", "tbb")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"cuda": [True, False], "mpi": [True, False], "nccl": [True, False]}
    default_options = {"cuda": False, "mpi": False, "nccl": False}
    # Headers only (not editor or temporary files that may sit next to them).
    exports_sources = ("include/*.hpp", "include/*.cuh", "include/*.h", "cmake/FindNCCL.cmake",
                       "cmake/FindxxHash.cmake", "LICENSE")
    no_copy_source = True

    def set_version(self):
        # The single source of truth is project(hone VERSION x.y.z) in CMakeLists.txt.
        if self.version:
            return
        text = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
        match = re.search(r"project\(\s*hone\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)", text)
        if not match:
            raise ConanInvalidConfiguration("CMakeLists.txt has no project(hone VERSION x.y.z)")
        self.version = match.group(1)

    def requirements(self):
        # Ranges that hold the Debian 12 versions (onetbb 2021.8.0, xtensor 0.24.3, xsimd 8.1.0,
        # zstd 1.5.4, xxhash 0.8.1, openmpi 4.1.4) and the matching ConanCenter ones.
        self.requires("onetbb/[>=2021.8.0 <2023]")
        self.requires("xtensor/[>=0.24.3 <0.25]")
        self.requires("xsimd/[>=8.1.0 <11]")
        self.requires("zstd/[>=1.5.4 <1.6]")
        # xxHash: XXH3-128 checkpoint hashes (used header-only).
        self.requires("xxhash/[>=0.8.1 <0.9]")
        if self.options.mpi:
            self.requires("openmpi/[>=4.1.4 <6]")

    def validate(self):
        check_min_cppstd(self, 20)
        if self.options.nccl and not self.options.cuda:
            raise ConanInvalidConfiguration("hone/*:nccl=True needs hone/*:cuda=True")

    def package_id(self):
        # Header-only: one package for every configuration (options only select components).
        self.info.clear()

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        for pattern in ("*.hpp", "*.cuh", "*.h"):
            copy(self, pattern, os.path.join(self.source_folder, "include"),
                 os.path.join(self.package_folder, "include"))
        modules = os.path.join(self.package_folder, _MODULES_DIR)
        copy(self, "FindNCCL.cmake", os.path.join(self.source_folder, "cmake"), modules)
        copy(self, "FindxxHash.cmake", os.path.join(self.source_folder, "cmake"), modules)
        for name, body in _MODULES.items():
            save(self, os.path.join(modules, f"hone-{name}.cmake"),
                 f"# Included by hone-config.cmake (Conan CMakeDeps): {name}.\n"
                 + textwrap.dedent(body))

    def _system_provided(self, dep_name):
        """True when a profile's [platform_requires] supplies dep_name: Conan then has no package
        folder and no cpp_info for it, and hone's build modules find it with CMake instead."""
        # A platform requirement is hidden from self.dependencies[...] (a KeyError) but still listed
        # by items(), with no package folder.
        for require, dep in self.dependencies.items():
            if require.ref.name == dep_name and not require.build:
                return dep.package_folder is None
        return False

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.set_property("cmake_file_name", "hone")
        # The package-wide target; the component targets are hone::hone, hone::cuda, ...
        self.cpp_info.set_property("cmake_target_name", "hone::all")

        modules = []

        core = self.cpp_info.components["hone"]
        core.set_property("cmake_target_name", "hone::hone")
        core.bindirs = []
        core.libdirs = []
        # A component may only require Conan-provided packages: CMakeDeps rejects a requirement on
        # a platform one, which its build module links instead.
        core.requires = []
        for dep, component in (("onetbb", "libtbb"), ("xtensor", "xtensor"), ("xsimd", "xsimd"),
                               ("zstd", "zstdlib"), ("xxhash", "libxxhash")):
            if self._system_provided(dep):
                modules.append(dep)
            else:
                core.requires.append(f"{dep}::{component}")

        if self.options.cuda:
            cuda = self.cpp_info.components["cuda"]
            cuda.set_property("cmake_target_name", "hone::cuda")
            cuda.bindirs = []
            cuda.libdirs = []
            cuda.defines = ["HONE_WITH_CUDA=1"]
            cuda.requires = ["hone"]
            modules.append("cuda")

        if self.options.mpi:
            mpi = self.cpp_info.components["mpi"]
            mpi.set_property("cmake_target_name", "hone::mpi")
            mpi.bindirs = []
            mpi.libdirs = []
            mpi.defines = ["HONE_WITH_MPI=1"]
            mpi.requires = ["hone"]
            if self._system_provided("openmpi"):
                modules.append("openmpi")
            else:
                mpi.requires.append("openmpi::ompi-c")

        if self.options.nccl:
            nccl = self.cpp_info.components["nccl"]
            nccl.set_property("cmake_target_name", "hone::nccl")
            nccl.bindirs = []
            nccl.libdirs = []
            nccl.defines = ["HONE_WITH_NCCL=1"]
            nccl.requires = ["cuda"]
            modules.append("nccl")

        self.cpp_info.set_property(
            "cmake_build_modules",
            [os.path.join(_MODULES_DIR, f"hone-{name}.cmake") for name in modules])
