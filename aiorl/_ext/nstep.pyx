# cython: language_level=3
"""n-step transitions from vectorised environment output, carried across calls.

For the transition starting at step t of an env stream, the window runs over
steps t, t+1, ..., t+m-1 and stops after n steps or at the first episode end
(terminated or truncated) inside it, whichever comes first:

    reward   = sum_{k<m} gamma**k * r[t+k]
    next_obs = next_obs[t+m-1]           (the true final observation at an episode end)
    done     = terminated[t+m-1]         (the window hit a termination)
    discount = 0 if done else gamma**m   (the bootstrap factor for V(next_obs))

so the target is reward + discount * V(next_obs): truncation (a time limit)
ends the window but still bootstraps, termination does not.

A window that has not closed when the input ends (fewer than n steps left and
no episode end) is kept in the carry and completed by the next call, so no
transition is lost or cut short at batch boundaries. `n_step_flush` closes
the pending windows early (bootstrapping from the last next_obs), for an
actor that stops.
"""
import numpy as np

cimport numpy as cnp

from aiorl._ext._checks cimport as_contiguous, as_flags, as_real_array, check_fraction, empty_1d
from aiorl._ext._common cimport copy_row, floating, int64_t, uint8_t

cnp.import_array()

cdef class NStepCarry:
    """Opaque state between `n_step_adjustment` calls: the steps whose window is still open.

    Holds, for the last `rows` steps of every env, obs, action, reward and
    next_obs, and per env how many of those trailing steps are still pending.
    Immutable: each call returns a new carry.
    """
    cdef readonly Py_ssize_t n
    cdef readonly double gamma
    cdef readonly Py_ssize_t num_envs
    cdef object _pending          # int64 [num_envs]
    cdef object _obs              # [rows, num_envs, *obs_shape], obs dtype
    cdef object _actions          # [rows, num_envs, *action_shape]
    cdef object _rewards          # float64 [rows, num_envs]
    cdef object _next_obs         # like _obs

    @property
    def pending(self):
        """Open windows per env (int64 copy)."""
        return self._pending.copy()

    def __len__(self):
        """Open windows over all envs."""
        return int(self._pending.sum())

    def __repr__(self):
        return (f"NStepCarry(n={self.n}, gamma={self.gamma}, num_envs={self.num_envs}, "
                f"pending={self._pending.tolist()})")


cdef inline bint _is_float32(object x):
    return cnp.PyArray_Check(x) and cnp.PyArray_TYPE(<cnp.ndarray> x) == cnp.NPY_FLOAT32


cdef int _check_params(Py_ssize_t n, double gamma) except -1:
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return check_fraction("gamma", gamma)


cdef struct _Rows:
    # A logical time axis [-carry_rows, T): steps < 0 come from the carry.
    const char *carry
    const char *new
    Py_ssize_t carry_rows
    Py_ssize_t num_envs
    Py_ssize_t nbytes             # bytes of one (step, env) row


cdef inline const char *_row(const _Rows *r, Py_ssize_t step, Py_ssize_t env) noexcept nogil:
    if step < 0:
        return r.carry + ((r.carry_rows + step) * r.num_envs + env) * r.nbytes
    return r.new + (step * r.num_envs + env) * r.nbytes


cdef Py_ssize_t _nstep_kernel(
        _Rows obs, _Rows actions, _Rows next_obs,
        const double *carry_rewards, const floating *rewards,
        const uint8_t *terminated, const uint8_t *truncated,
        const int64_t *pending, Py_ssize_t steps, Py_ssize_t n, const double *gamma_pow,
        bint flush, int64_t *new_pending,
        char *out_obs, char *out_action, char *out_next_obs,
        float *out_reward, uint8_t *out_done, float *out_discount) noexcept nogil:
    """Emit every window that closes, ordered by (start step, env); returns how many.

    Starts range over the carry's pending steps (step -pending[e] .. -1) and
    the new steps 0 .. steps-1. Carried steps never hold an episode end (a
    window reaching one closes), so only new steps are checked for ends. A
    window still open at the end of the input goes to new_pending, unless
    `flush`, which closes it at the last step.
    """
    cdef Py_ssize_t E = obs.num_envs
    cdef Py_ssize_t start, e, k, step, last, count = 0
    cdef double ret
    cdef bint closed, term
    for e in range(E):
        new_pending[e] = 0
    for start in range(-obs.carry_rows, steps):
        for e in range(E):
            if start < -pending[e]:
                continue
            ret = 0.0
            closed = False
            term = False
            k = 0
            while k < n:
                step = start + k
                if step >= steps:
                    break
                if step < 0:
                    ret += gamma_pow[k] * carry_rewards[(obs.carry_rows + step) * E + e]
                else:
                    ret += gamma_pow[k] * rewards[step * E + e]
                k += 1
                if step >= 0 and (terminated[step * E + e] or truncated[step * E + e]):
                    closed = True
                    term = terminated[step * E + e] != 0
                    break
            if k == n:
                closed = True
            if not closed and not flush:
                new_pending[e] += 1
                continue
            # A flushed window ran out of input after k >= 1 steps (starts < steps).
            last = start + k - 1
            copy_row(out_obs + count * obs.nbytes, _row(&obs, start, e), obs.nbytes)
            copy_row(out_action + count * actions.nbytes, _row(&actions, start, e), actions.nbytes)
            copy_row(out_next_obs + count * next_obs.nbytes, _row(&next_obs, last, e), next_obs.nbytes)
            out_reward[count] = <float> ret
            out_done[count] = term
            out_discount[count] = 0.0 if term else <float> gamma_pow[k]
            count += 1
    return count


cdef _Rows _rows_of(object carry_arr, object new_arr, Py_ssize_t carry_rows, Py_ssize_t num_envs):
    cdef _Rows r
    r.carry = NULL
    if carry_arr is not None:
        r.carry = <const char *> cnp.PyArray_DATA(carry_arr)
    r.new = <const char *> cnp.PyArray_DATA(new_arr)
    r.carry_rows = carry_rows
    r.num_envs = num_envs
    r.nbytes = _row_bytes(new_arr)
    return r


cdef Py_ssize_t _row_bytes(cnp.ndarray arr):
    """Bytes of one [step, env] row of a C-contiguous [T, E, ...] array."""
    cdef Py_ssize_t k, nbytes = cnp.PyArray_ITEMSIZE(arr)
    for k in range(2, cnp.PyArray_NDIM(arr)):
        nbytes *= cnp.PyArray_DIMS(arr)[k]
    return nbytes


cdef object _empty_rows(Py_ssize_t count, cnp.ndarray like):
    """A new [count, *like.shape[2:]] array of like's dtype."""
    cdef cnp.npy_intp dims[32]
    cdef int k, nd = cnp.PyArray_NDIM(like) - 1
    dims[0] = count
    for k in range(1, nd):
        dims[k] = cnp.PyArray_DIMS(like)[k + 1]
    return cnp.PyArray_EMPTY(nd, dims, cnp.PyArray_TYPE(like), 0)


cdef object _run(NStepCarry carry, obs, actions, rewards, next_obs, terminated, truncated,
                 Py_ssize_t n, double gamma, bint flush):
    """Shared body of n_step_adjustment (flush=False) and n_step_flush (flush=True)."""
    cdef Py_ssize_t T = obs.shape[0], E = obs.shape[1]
    cdef Py_ssize_t L = 0 if carry is None else carry._obs.shape[0]
    pending = empty_1d(E, cnp.NPY_INT64) if carry is None else carry._pending
    cdef int64_t *pend = <int64_t *> cnp.PyArray_DATA(pending)
    cdef Py_ssize_t e, k, upper = T * E
    for e in range(E):
        if carry is None:
            pend[e] = 0
        upper += pend[e]
    # gamma ** k as repeated products (the reference builds the same table).
    gamma_pow_arr = empty_1d(n + 1, cnp.NPY_FLOAT64)
    cdef double *gpow = <double *> cnp.PyArray_DATA(gamma_pow_arr)
    gpow[0] = 1.0
    for k in range(1, n + 1):
        gpow[k] = gpow[k - 1] * gamma
    out_obs = _empty_rows(upper, obs)
    out_action = _empty_rows(upper, actions)
    out_next_obs = _empty_rows(upper, obs)
    out_reward = empty_1d(upper, cnp.NPY_FLOAT32)
    out_done = empty_1d(upper, cnp.NPY_BOOL)
    out_discount = empty_1d(upper, cnp.NPY_FLOAT32)
    new_pending = empty_1d(E, cnp.NPY_INT64)

    c_obs = None if carry is None else carry._obs
    c_act = None if carry is None else carry._actions
    c_next = None if carry is None else carry._next_obs
    cdef _Rows r_obs = _rows_of(c_obs, obs, L, E)
    cdef _Rows r_act = _rows_of(c_act, actions, L, E)
    cdef _Rows r_next = _rows_of(c_next, next_obs, L, E)
    cdef const double *c_rew = NULL
    if carry is not None:
        c_rew = <const double *> cnp.PyArray_DATA(carry._rewards)
    # Flags are bool arrays: one byte, 0 or 1.
    cdef const uint8_t *term = <const uint8_t *> cnp.PyArray_DATA(terminated)
    cdef const uint8_t *trunc = <const uint8_t *> cnp.PyArray_DATA(truncated)
    cdef int64_t *new_pend = <int64_t *> cnp.PyArray_DATA(new_pending)
    cdef char *o_obs = <char *> cnp.PyArray_DATA(out_obs)
    cdef char *o_act = <char *> cnp.PyArray_DATA(out_action)
    cdef char *o_next = <char *> cnp.PyArray_DATA(out_next_obs)
    cdef float *o_rew = <float *> cnp.PyArray_DATA(out_reward)
    cdef uint8_t *o_done = <uint8_t *> cnp.PyArray_DATA(out_done)
    cdef float *o_disc = <float *> cnp.PyArray_DATA(out_discount)
    cdef Py_ssize_t count, keep = 0
    cdef const float *rew32 = NULL
    cdef const double *rew64 = NULL
    if cnp.PyArray_TYPE(rewards) == cnp.NPY_FLOAT32:
        rew32 = <const float *> cnp.PyArray_DATA(rewards)
    else:
        rew64 = <const double *> cnp.PyArray_DATA(rewards)
    with nogil:
        if rew32 != NULL:
            count = _nstep_kernel(r_obs, r_act, r_next, c_rew, rew32, term, trunc, pend, T, n, gpow,
                                  flush, new_pend, o_obs, o_act, o_next, o_rew, o_done, o_disc)
        else:
            count = _nstep_kernel(r_obs, r_act, r_next, c_rew, rew64, term, trunc, pend, T, n, gpow,
                                  flush, new_pend, o_obs, o_act, o_next, o_rew, o_done, o_disc)
        for e in range(E):
            keep = max(keep, new_pend[e])
    if count < upper:
        out_obs, out_action, out_next_obs = out_obs[:count], out_action[:count], out_next_obs[:count]
        out_reward, out_done, out_discount = out_reward[:count], out_done[:count], out_discount[:count]
    batch = {"obs": out_obs, "action": out_action, "reward": out_reward,
             "next_obs": out_next_obs, "done": out_done, "discount": out_discount}
    if flush:
        return batch, None

    # The open windows of env e are its last new_pending[e] steps; keep the
    # last max(new_pending) steps of the logical [carry; new] time axis.
    cdef NStepCarry nxt = NStepCarry.__new__(NStepCarry)
    nxt.n, nxt.gamma, nxt.num_envs, nxt._pending = n, gamma, E, new_pending
    nxt._obs = _tail(c_obs, obs, keep)
    nxt._actions = _tail(c_act, actions, keep)
    nxt._rewards = _tail(None if carry is None else carry._rewards, rewards, keep)
    if cnp.PyArray_TYPE(nxt._rewards) != cnp.NPY_FLOAT64:
        nxt._rewards = nxt._rewards.astype(np.float64)
    nxt._next_obs = _tail(c_next, next_obs, keep)
    return batch, nxt


cdef object _tail(object carried, object new, Py_ssize_t keep):
    """Copy of the last `keep` steps of [carried; new] along time (never a view of the input)."""
    if keep <= new.shape[0]:
        return new[new.shape[0] - keep:].copy()
    return np.concatenate([carried[carried.shape[0] - (keep - new.shape[0]):], new])


def n_step_adjustment(obs, actions, rewards, next_obs, terminated, truncated, Py_ssize_t n, double gamma,
                      carry=None):
    """n-step transitions of vectorised env output `[T, num_envs, ...]`; returns (batch, carry).

    obs, next_obs: [T, E, *obs_shape], same dtype (kept: uint8 stays uint8);
    next_obs[t] must be the true final observation where an episode ended at
    t (Gymnasium's `final_obs` with same-step autoreset; with next-step
    autoreset the caller drops the reset rows first, they are no transition).
    actions: [T, E, *action_shape] any numeric dtype. rewards: [T, E] float.
    terminated, truncated: [T, E] bool (Gymnasium's flags). carry: None or the
    carry returned by the previous call for the same envs.

    batch: flat [M, ...] arrays "obs", "action", "reward" (float32), "next_obs",
    "done" (bool: the window hit a termination), "discount" (float32: gamma**m,
    0 after a termination), one per window that closed in this call, ordered
    by (start step, env); windows still open stay in the returned carry (see
    the module docstring for the exact definition).
    """
    _check_params(n, gamma)
    obs = as_contiguous(obs)
    if obs.ndim < 2 or obs.ndim > 32 or obs.dtype.kind not in "biufc":
        raise ValueError(f"obs: expected shape (T, num_envs, ...) numeric, got {obs.shape} {obs.dtype}")
    cdef Py_ssize_t T = obs.shape[0], E = obs.shape[1]
    next_obs = as_contiguous(next_obs)
    if next_obs.shape != obs.shape or next_obs.dtype != obs.dtype:
        raise ValueError(f"next_obs: expected {obs.shape} {obs.dtype} like obs, got {next_obs.shape} {next_obs.dtype}")
    actions = as_contiguous(actions)
    if actions.ndim < 2 or actions.ndim > 32 or actions.shape[:2] != (T, E) or actions.dtype.kind not in "biufc":
        raise ValueError(f"actions: expected shape ({T}, {E}, ...) numeric, got {actions.shape} {actions.dtype}")
    shape = (T, E)
    rewards = as_real_array(rewards, "rewards", shape,
                            cnp.NPY_FLOAT32 if _is_float32(rewards) else cnp.NPY_FLOAT64)
    terminated = as_flags(terminated, "terminated", shape)
    truncated = as_flags(truncated, "truncated", shape)
    cdef NStepCarry c = None
    if carry is not None:
        if not isinstance(carry, NStepCarry):
            raise ValueError(f"carry: expected the NStepCarry a previous call returned, got {type(carry).__name__}")
        c = carry
        if c.n != n or c.gamma != gamma:
            raise ValueError(f"carry was made with n={c.n}, gamma={c.gamma}; this call has n={n}, gamma={gamma}")
        if c.num_envs != E:
            raise ValueError(f"carry holds {c.num_envs} envs; this call has {E}")
        if c._obs.shape[2:] != obs.shape[2:] or c._obs.dtype != obs.dtype:
            raise ValueError(f"obs: carry holds rows {c._obs.shape[2:]} {c._obs.dtype}, "
                             f"got {obs.shape[2:]} {obs.dtype}")
        if c._actions.shape[2:] != actions.shape[2:] or c._actions.dtype != actions.dtype:
            raise ValueError(f"actions: carry holds rows {c._actions.shape[2:]} {c._actions.dtype}, "
                             f"got {actions.shape[2:]} {actions.dtype}")
    return _run(c, obs, actions, rewards, next_obs, terminated, truncated, n, gamma, False)


def n_step_flush(carry, double gamma):
    """Close the carry's open windows now: a batch like `n_step_adjustment`'s.

    Each open window is cut at the last step seen: reward sums its m < n
    steps, next_obs is that step's next_obs, done is False and discount is
    gamma**m (these windows hold no episode end, or they would have closed).
    """
    if not isinstance(carry, NStepCarry):
        raise ValueError(f"carry: expected an NStepCarry, got {type(carry).__name__}")
    cdef NStepCarry c = carry
    if c.gamma != gamma:
        raise ValueError(f"carry was made with gamma={c.gamma}; this call has gamma={gamma}")
    E = c.num_envs
    # No new steps: every pending window is cut where the carry ends.
    empty = lambda arr: np.empty((0,) + arr.shape[1:], dtype=arr.dtype)
    batch, _ = _run(c, empty(c._obs), empty(c._actions), np.empty((0, E)), empty(c._next_obs),
                    np.zeros((0, E), np.bool_), np.zeros((0, E), np.bool_), c.n, gamma, True)
    return batch


class NStep:
    """Stateful n-step adder over a fixed set of env streams: `NStep(n, gamma)`.

    `add(obs, actions, rewards, next_obs, terminated, truncated)` takes one
    chunk `[T, num_envs, ...]` (T may be 1) and returns the transitions whose
    window closed; `flush()` returns the rest (an actor that stops) and starts over.
    """

    def __init__(self, n, gamma):
        _check_params(n, gamma)
        self.n = int(n)
        self.gamma = float(gamma)
        self._carry = None

    def __repr__(self):
        return f"NStep(n={self.n}, gamma={self.gamma}, pending={self.pending})"

    @property
    def pending(self):
        """Transitions whose window is still open."""
        return 0 if self._carry is None else len(self._carry)

    def add(self, obs, actions, rewards, next_obs, terminated, truncated):
        batch, self._carry = n_step_adjustment(obs, actions, rewards, next_obs, terminated, truncated,
                                               self.n, self.gamma, self._carry)
        return batch

    def flush(self):
        """Every still-open window, cut short (see n_step_flush); {} if nothing was ever added."""
        if self._carry is None:
            return {}
        batch = n_step_flush(self._carry, self.gamma)
        self._carry = None
        return batch
