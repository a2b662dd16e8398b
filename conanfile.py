"""Conan 2 recipe for hone, a header-only C++20 library, and its command-line tools.

    conan create . -pr:h default -pr:h packaging/conan/profiles/debian12 -pr:b default -nr

creates the package offline against the distribution's oneTBB, zstd, xxHash, xtensor and Open MPI
(declared as [platform_requires] in that profile); without the second profile the dependencies
come from a remote (ConanCenter) as usual. See docs/install.md.

Options map to components (CMake targets of the generated hone-config.cmake, whose root target
hone::all links them all, as the one of hone's own CMake package does):
    (always)      hone::hone     (component "hone")
    xtensor=True  hone::xtensor  (component "xtensor", defines HONE_WITH_XTENSOR=1, xtensor)
    cuda=True     hone::cuda     (component "cuda", defines HONE_WITH_CUDA=1, CUDA::cudart)
    mpi=True      hone::mpi      (component "mpi",  defines HONE_WITH_MPI=1, MPI)
    nccl=True     hone::nccl     (component "nccl", defines HONE_WITH_NCCL=1, NCCL; needs cuda=True)
    compiled=True hone::compiled (component "compiled": the static library libhone_compiled.a,
                  built with CMake; defines HONE_SEPARATE_COMPILATION=1 for its users, see
                  docs/install.md, "Separate compilation")
    tools=True    bin/hone-ckpt and bin/hone-info, built with CMake (the default; with
                  tools=False and compiled=False the package is headers only, one package for
                  every configuration)
"""

import os
import re
import textwrap

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
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
        find_package(xtensor 0.24 CONFIG REQUIRED)
        target_link_libraries(hone::xtensor INTERFACE xtensor)
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


# Components, in the order hone's CMake package lists them.
_COMPONENTS = ("xtensor", "cuda", "mpi", "nccl")


class HoneConan(ConanFile):
    name = "hone"
    description = "Fast, lean C++ training loops: policies for your own model"
    license = "MIT"
    # No homepage or url: the project has no published address yet, and Conan needs neither for a
    # recipe created from this checkout (tests/package/run_metadata.cmake checks that no packaging
    # file names an address CMakeLists.txt does not).
    topics = ("machine-learning", "training", "header-only", "cuda", "tbb")
    # Headers, executables and (compiled=True) a static library: not one of Conan's package types.
    # configure() makes it a header-library or a static-library when it holds only those.
    package_type = "unknown"
    settings = "os", "arch", "compiler", "build_type"
    options = {"tools": [True, False], "compiled": [True, False], "xtensor": [True, False],
               "cuda": [True, False], "mpi": [True, False], "nccl": [True, False]}
    default_options = {"tools": True, "compiled": False, "xtensor": False, "cuda": False,
                       "mpi": False, "nccl": False}
    # The headers, and what builds the tools and hone::compiled (not editor or temporary files
    # that may sit there).
    exports_sources = ("include/*.hpp", "include/*.cuh", "include/*.h", "CMakeLists.txt",
                       "cmake/*", "tools/*", "src/*.cpp", "LICENSE")
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

    def configure(self):
        if not self.options.tools:
            self.package_type = "static-library" if self.options.compiled else "header-library"

    def _builds(self):
        """True when CMake builds something: the tools, hone::compiled or both."""
        return bool(self.options.tools or self.options.compiled)

    def layout(self):
        cmake_layout(self, src_folder=".")

    def requirements(self):
        # Ranges that hold the Debian 12 versions (onetbb 2021.8.0, zstd 1.5.4, xxhash 0.8.1,
        # xtensor 0.24.3, openmpi 4.1.4) and the matching ConanCenter ones.
        self.requires("onetbb/[>=2021.8.0 <2023]")
        self.requires("zstd/[>=1.5.4 <1.6]")
        # xxHash: XXH3-128 checkpoint hashes (used header-only).
        self.requires("xxhash/[>=0.8.1 <0.9]")
        if self.options.xtensor:
            self.requires("xtensor/[>=0.24.3 <0.25]")
        if self.options.mpi:
            self.requires("openmpi/[>=4.1.4 <6]")

    def validate(self):
        check_min_cppstd(self, 20)
        if self.settings.os != "Linux":
            # docs/install.md, "Platform", names the Linux-only parts.
            raise ConanInvalidConfiguration(
                "hone supports Linux only: its checkpoint, io and replay-storage headers use "
                "POSIX file APIs (mmap, fsync of directories, pread/pwrite, posix_fallocate) and "
                f"Linux-only calls (renameat2 with RENAME_EXCHANGE), not available on "
                f"{self.settings.os}")
        if self.options.nccl and not self.options.cuda:
            raise ConanInvalidConfiguration("hone/*:nccl=True needs hone/*:cuda=True")

    def package_id(self):
        if not self.info.options.tools and not self.info.options.compiled:
            # Headers only: one package for every configuration.
            self.info.clear()
            return
        # The tools and hone::compiled depend on the settings (and the package holds the library
        # only with compiled=True, so that option stays in the id); the other components only
        # select what package_info() declares, so their option sets share one binary package.
        for option in _COMPONENTS:
            delattr(self.info.options, option)
        for dep in ("xtensor", "openmpi"):
            if dep in self.info.requires.pkg_names:
                self.info.requires.remove(dep)

    def generate(self):
        if not self._builds():
            return
        tc = CMakeToolchain(self)
        # Only the tools and hone::compiled, as asked: no other component, test, example or
        # benchmark (hone's option() defaults).
        for variable in ("HONE_ENABLE_XTENSOR", "HONE_ENABLE_CUDA", "HONE_ENABLE_MPI",
                         "HONE_ENABLE_NCCL", "HONE_BUILD_TESTS", "HONE_BUILD_EXAMPLES",
                         "HONE_BUILD_BENCH", "HONE_BUILD_FUZZERS"):
            tc.cache_variables[variable] = False
        tc.cache_variables["HONE_BUILD_TOOLS"] = bool(self.options.tools)
        tc.cache_variables["HONE_ENABLE_COMPILED"] = bool(self.options.compiled)
        tc.cache_variables["HONE_INSTALL"] = True
        tc.generate()
        CMakeDeps(self).generate()

    def build(self):
        if not self._builds():
            return
        cmake = CMake(self)
        cmake.configure()
        if self.options.tools:
            cmake.build()
        else:
            cmake.build(target="hone_compiled")

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        if self.options.tools:
            # bin/hone-ckpt, bin/hone-info: hone's install component "tools".
            CMake(self).install(component="tools")
        if self.options.compiled:
            # The static library only: Conan's CMakeDeps writes the CMake files (package_info()).
            copy(self, "libhone_compiled.a", self.build_folder,
                 os.path.join(self.package_folder, "lib"), keep_path=False)
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
        # find_package(hone) finds the generated hone-config.cmake. Its package-wide target is
        # hone::all, a name hone's own CMake package defines too (hone::hone and the components
        # found); the component targets are hone::hone, hone::xtensor, hone::cuda, ...
        self.cpp_info.set_property("cmake_file_name", "hone")
        self.cpp_info.set_property("cmake_target_name", "hone::all")

        modules = []

        core = self.cpp_info.components["hone"]
        core.set_property("cmake_target_name", "hone::hone")
        core.bindirs = ["bin"] if self.options.tools else []
        core.libdirs = []
        # A component may only require Conan-provided packages: CMakeDeps rejects a requirement on
        # a platform one, which its build module links instead.
        core.requires = []
        for dep, component in (("onetbb", "libtbb"), ("zstd", "zstdlib"),
                               ("xxhash", "libxxhash")):
            if self._system_provided(dep):
                modules.append(dep)
            else:
                core.requires.append(f"{dep}::{component}")

        if self.options.compiled:
            compiled = self.cpp_info.components["compiled"]
            compiled.set_property("cmake_target_name", "hone::compiled")
            compiled.bindirs = []
            compiled.libdirs = ["lib"]
            compiled.libs = ["hone_compiled"]
            # As hone's own CMake package: every file of a program agrees on the macro.
            compiled.defines = ["HONE_SEPARATE_COMPILATION=1"]
            compiled.requires = ["hone"]

        if self.options.xtensor:
            xtensor = self.cpp_info.components["xtensor"]
            xtensor.set_property("cmake_target_name", "hone::xtensor")
            xtensor.bindirs = []
            xtensor.libdirs = []
            xtensor.defines = ["HONE_WITH_XTENSOR=1"]
            xtensor.requires = ["hone"]
            if self._system_provided("xtensor"):
                modules.append("xtensor")
            else:
                xtensor.requires.append("xtensor::xtensor")

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
