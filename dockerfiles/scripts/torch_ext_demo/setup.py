"""Builds the demo extension with torch.utils.cpp_extension (g++): dockerfiles/cpp-extension.Dockerfile."""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="attnforge-ext-demo",
    version="1.0",
    packages=["attnforge_ext_demo"],
    ext_modules=[CppExtension("attnforge_ext_demo._C", ["attnforge_ext_demo/ops.cpp"])],
    cmdclass={"build_ext": BuildExtension},
)
