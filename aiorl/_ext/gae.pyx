# cython: language_level=3
"""Generalised advantage estimation over vectorised rollouts `[T, num_envs]`.

For step t of an env stream, with V_next the value of the state after step t:

    V_next  = 0                      if terminated[t]
            = truncated_values[t]    elif truncated[t]   (V(final_obs): a time limit still bootstraps)
            = bootstrap_value        elif t == T-1       (V(obs after the rollout))
            = values[t+1]            otherwise
    delta_t = rewards[t] + gamma * V_next - values[t]
    A_t     = delta_t + gamma * lam * A_{t+1}    (A_{t+1} taken as 0 when an episode
                                                  ended at t or t == T-1)
    value_targets = A + values

so the advantage never leaks across an episode boundary, and truncation is not
termination: a truncated step bootstraps from the value of its final
observation, which the caller passes as `truncated_values` (Gymnasium's
`final_obs` evaluated by the critic). Without it a truncated step is an error,
not a silent zero.
"""
import numpy as np

cimport numpy as cnp

from aiorl._ext._checks cimport as_flags, as_real_array, check_fraction
from aiorl._ext._common cimport floating, uint8_t

cnp.import_array()


cdef void _gae_kernel(const floating *rewards, const floating *values, const floating *bootstrap,
                      const uint8_t *terminated, const uint8_t *truncated, const floating *truncated_values,
                      Py_ssize_t T, Py_ssize_t E, double gamma, double lam, double *adv_next,
                      floating *advantages, floating *targets) noexcept nogil:
    """Backward recursion, time outer and env inner (rows are contiguous).

    Accumulates in float64: adv_next[e] (scratch of E doubles) holds A_{t+1}
    unrounded even when the outputs are float32.
    """
    cdef Py_ssize_t t, e, i
    cdef double next_value, next_adv, adv
    for t in range(T - 1, -1, -1):
        for e in range(E):
            i = t * E + e
            if terminated[i]:
                next_value = 0.0
                next_adv = 0.0
            elif truncated[i]:
                next_value = truncated_values[i]
                next_adv = 0.0
            elif t == T - 1:
                next_value = bootstrap[e]
                next_adv = 0.0
            else:
                next_value = values[i + E]
                next_adv = adv_next[e]
            adv = rewards[i] + gamma * next_value - values[i] + gamma * lam * next_adv
            adv_next[e] = adv
            advantages[i] = <floating> adv
            targets[i] = <floating> (adv + values[i])


def gae(rewards, values, bootstrap_value, terminated, truncated, double gamma, double lam,
        truncated_values=None):
    """(advantages, value_targets), both [T, num_envs], for a rollout (see the module docstring).

    rewards, values: [T, E]; bootstrap_value: [E], V of the observation after
    the last step; terminated, truncated: [T, E] bool; truncated_values:
    [T, E], V(final observation) wherever truncated and not terminated (other
    entries are ignored), required if any such step exists. Results are
    float32 when rewards and values are float32, else float64.
    """
    check_fraction("gamma", gamma)
    check_fraction("lam", lam)
    values = np.asarray(values)
    if values.ndim != 2:
        raise ValueError(f"values: expected shape (T, num_envs), got {values.shape}")
    cdef Py_ssize_t T = values.shape[0], E = values.shape[1]
    rewards = np.asarray(rewards)
    dtype = np.float32 if rewards.dtype == np.float32 and values.dtype == np.float32 else np.float64
    cdef int typenum = cnp.NPY_FLOAT32 if dtype == np.float32 else cnp.NPY_FLOAT64
    rewards = as_real_array(rewards, "rewards", (T, E), typenum)
    values = as_real_array(values, "values", (T, E), typenum)
    bootstrap_value = as_real_array(bootstrap_value, "bootstrap_value", (E,), typenum)
    terminated = as_flags(terminated, "terminated", (T, E))
    truncated = as_flags(truncated, "truncated", (T, E))
    bootstrapping = truncated & ~terminated
    if truncated_values is None:
        if bootstrapping.any():
            t, e = np.argwhere(bootstrapping)[0]
            raise ValueError(f"truncated[{t}, {e}] is set (and terminated is not) but truncated_values "
                             f"was not given: pass V(final observation) for truncated steps")
        truncated_values = values            # never read
    else:
        truncated_values = as_real_array(truncated_values, "truncated_values", (T, E), typenum)
    advantages = np.empty((T, E), dtype=dtype)
    targets = np.empty((T, E), dtype=dtype)
    scratch = np.empty(E, dtype=np.float64)
    cdef double *adv_next = <double *> cnp.PyArray_DATA(scratch)
    cdef const uint8_t *term = <const uint8_t *> cnp.PyArray_DATA(terminated)
    cdef const uint8_t *trunc = <const uint8_t *> cnp.PyArray_DATA(truncated)
    cdef char *r = <char *> cnp.PyArray_DATA(rewards)
    cdef char *v = <char *> cnp.PyArray_DATA(values)
    cdef char *boot = <char *> cnp.PyArray_DATA(bootstrap_value)
    cdef char *tv = <char *> cnp.PyArray_DATA(truncated_values)
    cdef char *adv = <char *> cnp.PyArray_DATA(advantages)
    cdef char *tgt = <char *> cnp.PyArray_DATA(targets)
    if dtype == np.float32:
        with nogil:
            _gae_kernel(<const float *> r, <const float *> v, <const float *> boot, term, trunc,
                        <const float *> tv, T, E, gamma, lam, adv_next, <float *> adv, <float *> tgt)
    else:
        with nogil:
            _gae_kernel(<const double *> r, <const double *> v, <const double *> boot, term, trunc,
                        <const double *> tv, T, E, gamma, lam, adv_next, <double *> adv, <double *> tgt)
    return advantages, targets
