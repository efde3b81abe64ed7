# cython: language_level=3
"""V-trace targets (Espeholt et al. 2018) over a batch of trajectory fragments `[B, T]`.

Row b is one fragment: T consecutive steps of one env of one actor, acted
by a behaviour policy mu; the targets are for the learner's policy pi. With
rho_t = pi(a_t|x_t) / mu(a_t|x_t) (given as log_rhos), for step t of a row:

    V_next_t = 0                      if terminated[t]
             = truncated_values[t]    elif truncated[t]   (V(final obs): a time limit bootstraps)
             = bootstrap_value        elif t == T-1       (V(obs after the fragment): a fragment
                                                           end is not an episode end)
             = values[t+1]            otherwise
    A_next_t = 0 if an episode ended at t or t == T-1, else vs[t+1] - values[t+1]
    delta_t  = min(rho_bar, rho_t) * (rewards[t] + gamma * V_next_t - values[t])
    vs[t]    = values[t] + delta_t + gamma * lam * min(c_bar, rho_t) * A_next_t
    pg_advantages[t] = min(pg_rho_bar, rho_t) * (rewards[t] + gamma * (V_next_t + A_next_t) - values[t])

so V_next_t + A_next_t is vs[t+1] inside an episode, and the target of the
state after an episode or fragment end otherwise. The recursion runs
backwards per row, in float64 whatever the input dtype; rows are
independent, so nothing flows from one fragment (or episode) into another.
With rho_bar = c_bar = pg_rho_bar = inf, lam = 1 and pi = mu, vs is the
n-step return bootstrapped at the fragment end; lam < 1 (the paper's
Remark 1: c_i = lam * min(c_bar, rho_i)) mixes in shorter returns, as
GAE's lambda does.
"""
import numpy as np

cimport numpy as cnp
from libc.math cimport exp, isnan

from aiorl._ext._checks cimport as_flags, as_real_array, check_fraction
from aiorl._ext._common cimport floating, uint8_t

cnp.import_array()


cdef inline double _clip(double bound, double x) noexcept nogil:
    # NaN stays NaN: clipped to the bound it would make a NaN behaviour logit a finite loss.
    return bound if x > bound else x


cdef void _vtrace_kernel(const floating[:, ::1] log_rhos, const floating[:, ::1] rewards,
                         const floating[:, ::1] values, const floating[::1] bootstrap,
                         const uint8_t[:, ::1] terminated, const uint8_t[:, ::1] truncated,
                         const floating[:, ::1] truncated_values, double gamma, double lam, double rho_bar,
                         double c_bar, double pg_rho_bar, floating[:, ::1] vs,
                         floating[:, ::1] pg_advantages) noexcept nogil:
    """Backward recursion per fragment (rows are contiguous: fragment outer, time inner)."""
    cdef Py_ssize_t B = values.shape[0], T = values.shape[1]
    cdef Py_ssize_t b, t
    cdef double rho, next_value, next_acc, acc, v
    for b in range(B):
        acc = 0.0
        for t in range(T - 1, -1, -1):
            if terminated[b, t]:
                next_value = 0.0
                next_acc = 0.0
            elif truncated[b, t]:
                next_value = truncated_values[b, t]
                next_acc = 0.0
            elif t == T - 1:
                next_value = bootstrap[b]
                next_acc = 0.0
            else:
                next_value = values[b, t + 1]
                next_acc = acc
            rho = exp(<double> log_rhos[b, t])
            v = values[b, t]
            acc = _clip(rho_bar, rho) * (rewards[b, t] + gamma * next_value - v) \
                + gamma * lam * _clip(c_bar, rho) * next_acc
            vs[b, t] = <floating> (v + acc)
            pg_advantages[b, t] = <floating> (_clip(pg_rho_bar, rho)
                                              * (rewards[b, t] + gamma * (next_value + next_acc) - v))


cdef int _check_bound(str what, double value) except -1:
    if isnan(value) or not value > 0.0:
        raise ValueError(f"{what} must be > 0 (inf: no clipping), got {value!r}")
    return 0


def vtrace(log_rhos, rewards, values, bootstrap_value, terminated, truncated, double gamma,
           double rho_bar=1.0, double c_bar=1.0, pg_rho_bar=None, truncated_values=None, double lam=1.0):
    """(vs, pg_advantages), both [B, T], for a batch of fragments (see the module docstring).

    log_rhos: log pi(a|x) - log mu(a|x); log_rhos, rewards, values: [B, T];
    bootstrap_value: [B], V of the observation after each fragment;
    terminated, truncated: [B, T] bool; truncated_values: [B, T], V(final
    observation) wherever truncated and not terminated (other entries are
    ignored), required if any such step exists. pg_rho_bar None: rho_bar;
    lam in [0, 1] scales the traces.
    Results are float32 when log_rhos, rewards and values are all float32,
    else float64.
    """
    check_fraction("gamma", gamma)
    check_fraction("lam", lam)
    _check_bound("rho_bar", rho_bar)
    _check_bound("c_bar", c_bar)
    cdef double pg_bar = rho_bar if pg_rho_bar is None else float(pg_rho_bar)
    _check_bound("pg_rho_bar", pg_bar)
    values = np.asarray(values)
    if values.ndim != 2:
        raise ValueError(f"values: expected shape (B, T), got {values.shape}")
    cdef Py_ssize_t B = values.shape[0], T = values.shape[1]
    log_rhos, rewards = np.asarray(log_rhos), np.asarray(rewards)
    single = log_rhos.dtype == rewards.dtype == values.dtype == np.float32
    dtype = np.float32 if single else np.float64
    cdef int typenum = cnp.NPY_FLOAT32 if single else cnp.NPY_FLOAT64
    log_rhos = as_real_array(log_rhos, "log_rhos", (B, T), typenum)
    rewards = as_real_array(rewards, "rewards", (B, T), typenum)
    values = as_real_array(values, "values", (B, T), typenum)
    bootstrap_value = as_real_array(bootstrap_value, "bootstrap_value", (B,), typenum)
    terminated = as_flags(terminated, "terminated", (B, T))
    truncated = as_flags(truncated, "truncated", (B, T))
    bootstrapping = truncated & ~terminated
    if truncated_values is None:
        if bootstrapping.any():
            b, t = np.argwhere(bootstrapping)[0]
            raise ValueError(f"truncated[{b}, {t}] is set (and terminated is not) but truncated_values "
                             f"was not given: pass V(final observation) for truncated steps")
        truncated_values = values            # never read
    else:
        truncated_values = as_real_array(truncated_values, "truncated_values", (B, T), typenum)
    vs = np.empty((B, T), dtype=dtype)
    pg_advantages = np.empty((B, T), dtype=dtype)
    cdef const uint8_t[:, ::1] term = terminated.view(np.uint8)
    cdef const uint8_t[:, ::1] trunc = truncated.view(np.uint8)
    cdef const float[:, ::1] lr32, r32, v32, tv32
    cdef const float[::1] boot32
    cdef float[:, ::1] vs32, pg32
    cdef const double[:, ::1] lr64, r64, v64, tv64
    cdef const double[::1] boot64
    cdef double[:, ::1] vs64, pg64
    if single:
        lr32, r32, v32, tv32, boot32 = log_rhos, rewards, values, truncated_values, bootstrap_value
        vs32, pg32 = vs, pg_advantages
        with nogil:
            _vtrace_kernel(lr32, r32, v32, boot32, term, trunc, tv32, gamma, lam, rho_bar, c_bar, pg_bar, vs32, pg32)
    else:
        lr64, r64, v64, tv64, boot64 = log_rhos, rewards, values, truncated_values, bootstrap_value
        vs64, pg64 = vs, pg_advantages
        with nogil:
            _vtrace_kernel(lr64, r64, v64, boot64, term, trunc, tv64, gamma, lam, rho_bar, c_bar, pg_bar, vs64, pg64)
    return vs, pg_advantages
