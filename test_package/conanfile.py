"""Conan 2 test_package for hone: builds and runs a consumer of the created package through
CMakeDeps + CMakeToolchain, linking the components that the package's options enabled."""

import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, cmake_layout


class HoneTestPackageConan(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeDeps", "CMakeToolchain"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def build(self):
        hone = self.dependencies["hone"]
        cmake = CMake(self)
        cmake.configure(variables={
            "HONE_TEST_CUDA": bool(hone.options.cuda),
            "HONE_TEST_MPI": bool(hone.options.mpi),
            "HONE_TEST_NCCL": bool(hone.options.nccl),
        })
        cmake.build()

    def test(self):
        if can_run(self):
            self.run(os.path.join(self.cpp.build.bindir, "test_package"), env="conanrun")
