# cython: language_level=3
from numpy.random cimport bitgen_t

cdef bitgen_t *bitgen_of(object rng) except NULL
cdef object empty_1d(Py_ssize_t n, int typenum)
cdef int check_fraction(str what, double value) except -1
cdef object as_generator(object seed)
cdef object as_index_array(object x, str what)
cdef object as_float64_array(object x, str what, Py_ssize_t n)
cdef object as_uint64_array(object x, str what, Py_ssize_t n)
cdef object as_contiguous(object x)
cdef object as_flags(object x, str what, tuple shape)
cdef object as_real_array(object x, str what, tuple shape, int typenum)
