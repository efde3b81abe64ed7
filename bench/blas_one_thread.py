"""Imported before numpy by the benches that time numpy's own loops or the wire: OpenBLAS (and
OpenMP) worker threads spin for a while after each call and would steal the cores from the code
being measured; nothing these benches time uses BLAS."""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
