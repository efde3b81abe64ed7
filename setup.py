"""Declares the compiled replay core; all other metadata lives in pyproject.toml.

The extensions are required: a failed Cython or C compile fails the install.
There is no pure-Python fallback build.
"""

import os
import sys
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
        # -g0: Python's own CFLAGS ask for debug information, a quarter of the compile's CPU
        # (38 s instead of 52 s for all modules); nobody steps through the generated C.
        extra_compile_args=["-O3", "-g0"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for src in sources
]

# The generated C depends on the numpy (and Python) it was generated against, and one
# checkout is built for several (.ci/run builds for the oldest and the newest Python):
# each gets its own generated C, or a build would compile C made for another numpy.
C_DIR = HERE / "build" / f"cython-py{sys.version_info[0]}{sys.version_info[1]}-numpy{numpy.__version__}"

# Every module on its own core, for Cython's C and for the C compiler: a build took 50 s of CPU
# on one core of the 2-core machine, and CI builds once per Python. A failure in any job still
# fails the build (the pools re-raise it).
JOBS = len(os.sched_getaffinity(0))

setup(
    ext_modules=cythonize(
        extensions,
        build_dir=str(C_DIR.relative_to(HERE)),
        nthreads=JOBS,
        language_level=3,
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    ),
    options={"build_ext": {"parallel": JOBS}},
)
