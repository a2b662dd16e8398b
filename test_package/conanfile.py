"""Conan 2 test_package for hone: builds and runs a consumer of the created package through
CMakeDeps + CMakeToolchain, linking the components that the package's options enabled, and runs
the packaged tools."""

import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, cmake_layout
from conan.errors import ConanException

_COMPONENTS = ("xtensor", "cuda", "mpi", "nccl", "compiled")


class HoneTestPackageConan(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeDeps", "CMakeToolchain"

    def requirements(self):
        # run=True: the package's bin/ (hone-ckpt, hone-info) goes on the PATH of "conanrun".
        self.requires(self.tested_reference_str, run=True)

    def layout(self):
        cmake_layout(self)

    def build(self):
        hone = self.dependencies["hone"]
        cmake = CMake(self)
        cmake.configure(variables={
            f"HONE_TEST_{component.upper()}": bool(hone.options.get_safe(component))
            for component in _COMPONENTS
        })
        cmake.build()

    def test(self):
        if not can_run(self):
            return
        self.run(os.path.join(self.cpp.build.bindir, "test_package"), env="conanrun")
        if self.dependencies["hone"].options.tools:
            self.run("hone-info", env="conanrun")
            # Without arguments hone-ckpt prints its usage and exits with status 2.
            status = self.run("hone-ckpt", env="conanrun", ignore_errors=True)
            if status != 2:
                raise ConanException(f"hone-ckpt without arguments exited with {status}, not 2")
