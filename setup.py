"""Declares the compiled replay core; all other metadata lives in pyproject.toml.

The extensions are required: a failed Cython or C compile fails the install.
There is no pure-Python fallback build.
"""
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = Path(__file__).parent
sources = sorted((HERE / "aiorl" / "_ext").glob("*.pyx"))
extensions = [
    Extension(
        f"aiorl._ext.{src.stem}",
        [str(src.relative_to(HERE))],
        # numpy headers: the C array API and numpy.random's bitgen_t.
        include_dirs=[numpy.get_include()],
        extra_compile_args=["-O3"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for src in sources
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    ),
)
