# cython: language_level=3
"""R2D2's sequence adder: overlapping fixed-length sequences from vectorised env output,
carried across calls.

Per env, sequences of m steps start every p = m - overlap steps of an episode (steps 0, p,
2p, ... counted from the episode's first step), each with the recurrent state the actor
acted from at its first step. A sequence closes when it holds m steps, or at the first
episode end (terminated or truncated) inside it. Sequences never mix episodes: one cut by an
episode end is padded to m steps with zeros, and its mask marks the steps that exist. At an
episode end only the earliest open sequence is emitted: every later open one holds a suffix
of its steps (the same steps, less context), so an episode shorter than m gives exactly one
padded sequence.

A row (one sequence of L <= m steps) holds:

    obs[0..L]    the observation acted on at each step, then at index L the observation
                 after the last step (the true final one at an episode end; the bootstrap
                 observation otherwise); zeros after
    action[k], reward[k], mask[k] = k < L   for k < m (zeros past L)
    terminal     the last step ended the episode by termination: no bootstrap after it
                 (truncation, a time limit, bootstraps from obs[L] as a full sequence does)
    state        the recurrent state at step 0 (float32 [state_size], may be width 0)
    env          which env of the batch the sequence came from

Within an episode next_obs[t] == obs[t + 1], so one observation axis of m + 1 serves both.
Steps of sequences still open when the input ends stay in the adder and are completed by
the next call: splitting the input anywhere gives the same rows as one call. `flush`
emits the earliest open sequence of every env as it is (not terminal: it bootstraps from
its last observation), for an actor that stops.
"""
import numpy as np

cimport numpy as cnp
from libc.string cimport memmove, memset

from aiorl._ext._checks cimport as_contiguous, as_flags, as_real_array
from aiorl._ext._common cimport copy_row, int64_t, uint8_t

cnp.import_array()


cdef struct _Window:
    # Per env, the steps since its earliest open sequence's first step.
    char *obs          # [E, m + 1, obs_nb]
    char *act          # [E, m, act_nb]
    double *rew        # [E, m]
    char *state        # [E, m, state_nb]
    int64_t *held      # [E] steps held
    Py_ssize_t m, p, obs_nb, act_nb, state_nb


cdef struct _Out:
    char *obs          # [M, m + 1, obs_nb]
    char *act          # [M, m, act_nb]
    float *rew         # [M, m]
    uint8_t *mask      # [M, m]
    uint8_t *terminal  # [M]
    char *state        # [M, state_nb]
    int64_t *env       # [M]


cdef inline void _emit(_Window *w, _Out *o, Py_ssize_t row, Py_ssize_t e, Py_ssize_t h,
                       bint terminal) noexcept nogil:
    """Row `row` from env e's first h steps (padded to m)."""
    cdef Py_ssize_t m = w.m, k
    cdef char *dst = o.obs + row * (m + 1) * w.obs_nb
    cdef Py_ssize_t nbytes = (h + 1) * w.obs_nb
    memmove(dst, w.obs + e * (m + 1) * w.obs_nb, nbytes)
    memset(dst + nbytes, 0, (m + 1) * w.obs_nb - nbytes)
    dst = o.act + row * m * w.act_nb
    nbytes = h * w.act_nb
    memmove(dst, w.act + e * m * w.act_nb, nbytes)
    memset(dst + nbytes, 0, m * w.act_nb - nbytes)
    for k in range(m):
        if k < h:
            o.rew[row * m + k] = <float> w.rew[e * m + k]
            o.mask[row * m + k] = 1
        else:
            o.rew[row * m + k] = 0.0
            o.mask[row * m + k] = 0
    o.terminal[row] = terminal
    if w.state_nb > 0:
        memmove(o.state + row * w.state_nb, w.state + e * m * w.state_nb, w.state_nb)
    o.env[row] = e


cdef inline Py_ssize_t _drop_front(_Window *w, Py_ssize_t e, Py_ssize_t h) noexcept nogil:
    """Drop env e's first p steps (the sequence just emitted starts there, the next one p
    later); returns the steps left."""
    cdef Py_ssize_t m = w.m, p = w.p
    memmove(w.obs + e * (m + 1) * w.obs_nb, w.obs + (e * (m + 1) + p) * w.obs_nb, (h + 1 - p) * w.obs_nb)
    memmove(w.act + e * m * w.act_nb, w.act + (e * m + p) * w.act_nb, (h - p) * w.act_nb)
    memmove(w.rew + e * m, w.rew + e * m + p, (h - p) * sizeof(double))
    memmove(w.state + e * m * w.state_nb, w.state + (e * m + p) * w.state_nb, (h - p) * w.state_nb)
    return h - p


cdef Py_ssize_t _count(const int64_t *held, const uint8_t *term, const uint8_t *trunc,
                       Py_ssize_t T, Py_ssize_t E, Py_ssize_t m, Py_ssize_t p) noexcept nogil:
    """Rows the next `_add` emits: the same walk without copying anything."""
    cdef Py_ssize_t e, t, h, count = 0
    for e in range(E):
        h = held[e]
        for t in range(T):
            h += 1
            if term[t * E + e] or trunc[t * E + e]:
                count += 1
                h = 0
            elif h == m:
                count += 1
                h = m - p
    return count


cdef Py_ssize_t _add(_Window *w, _Out *o, const char *obs, const char *next_obs, const char *act,
                     const double *rew, const char *state, const uint8_t *term, const uint8_t *trunc,
                     Py_ssize_t T, Py_ssize_t E) noexcept nogil:
    """Append every (step, env) to its env's window, emitting rows in (step, env) order."""
    cdef Py_ssize_t m = w.m, t, e, h, i, count = 0
    cdef bint end
    for t in range(T):
        for e in range(E):
            h = w.held[e]
            i = t * E + e
            copy_row(w.obs + (e * (m + 1) + h) * w.obs_nb, obs + i * w.obs_nb, w.obs_nb)
            # Overwritten by the next step's obs, which within an episode is the same.
            copy_row(w.obs + (e * (m + 1) + h + 1) * w.obs_nb, next_obs + i * w.obs_nb, w.obs_nb)
            copy_row(w.act + (e * m + h) * w.act_nb, act + i * w.act_nb, w.act_nb)
            w.rew[e * m + h] = rew[i]
            if w.state_nb > 0:
                copy_row(w.state + (e * m + h) * w.state_nb, state + i * w.state_nb, w.state_nb)
            h += 1
            end = term[i] or trunc[i]
            if end or h == m:
                _emit(w, o, count, e, h, term[i] != 0)
                count += 1
                h = 0 if end else _drop_front(w, e, h)
            w.held[e] = h
    return count


cdef object _rows_like(Py_ssize_t count, Py_ssize_t steps, object like):
    """A new [count, steps, *like.shape[2:]] array of like's dtype (steps 0: no time axis)."""
    shape = (count,) + ((steps,) if steps else ()) + tuple(like.shape[2:])
    return np.empty(shape, dtype=like.dtype)


cdef class SequenceAdder:
    """`SequenceAdder(length, overlap)`: `add` takes one chunk of vectorised env output
    ``[T, num_envs, ...]`` (T may be 1) and returns the sequences that closed in it as a batch
    of rows (see the module docstring); `flush` returns the open ones and starts over.

    `add(obs, actions, rewards, next_obs, terminated, truncated, states)`: obs and next_obs
    ``[T, E, *obs_shape]`` of one dtype (kept: uint8 stays uint8), next_obs[t] the true final
    observation where an episode ended at t; actions ``[T, E, *action_shape]`` numeric;
    rewards ``[T, E]``; terminated, truncated ``[T, E]`` bool; states float32
    ``[T, E, state_size]``, the recurrent state each step was acted from (state_size may be 0).
    The first call fixes E and the row shapes; later calls must match.
    """
    cdef readonly Py_ssize_t length
    cdef readonly Py_ssize_t overlap
    cdef object _obs, _act, _rew, _state, _held   # the windows (None before the first add)

    def __init__(self, Py_ssize_t length, Py_ssize_t overlap):
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        if not 0 <= overlap < length:
            raise ValueError(f"overlap must be in [0, length), got {overlap} for length {length}")
        self.length, self.overlap = length, overlap
        self._held = None

    def __repr__(self):
        return f"SequenceAdder(length={self.length}, overlap={self.overlap}, held={self.held.tolist()})"

    @property
    def held(self):
        """Steps held per env (int64 copy; empty before the first add)."""
        return np.zeros(0, np.int64) if self._held is None else self._held.copy()

    def _check(self, obs, actions, states):
        E = obs.shape[1]
        if self._held is None:
            m = self.length
            self._obs = np.zeros((E, m + 1) + obs.shape[2:], obs.dtype)
            self._act = np.zeros((E, m) + actions.shape[2:], actions.dtype)
            self._rew = np.zeros((E, m), np.float64)
            self._state = np.zeros((E, m) + states.shape[2:], np.float32)
            self._held = np.zeros(E, np.int64)
            return
        for name, got, held in (("obs", obs, self._obs), ("actions", actions, self._act),
                                ("states", states, self._state)):
            if got.shape[1] != held.shape[0] or got.shape[2:] != held.shape[2:] or got.dtype != held.dtype:
                raise ValueError(f"{name}: the adder holds [{held.shape[0]} envs, {held.shape[2:]}] "
                                 f"{held.dtype}, got {got.shape} {got.dtype}")

    def add(self, obs, actions, rewards, next_obs, terminated, truncated, states):
        obs = as_contiguous(obs)
        if obs.ndim < 2 or obs.ndim > 32 or obs.dtype.kind not in "biufc":
            raise ValueError(f"obs: expected shape (T, num_envs, ...) numeric, got {obs.shape} {obs.dtype}")
        T, E = obs.shape[0], obs.shape[1]
        next_obs = as_contiguous(next_obs)
        if next_obs.shape != obs.shape or next_obs.dtype != obs.dtype:
            raise ValueError(f"next_obs: expected {obs.shape} {obs.dtype} like obs, got {next_obs.shape} "
                             f"{next_obs.dtype}")
        actions = as_contiguous(actions)
        if actions.ndim < 2 or actions.shape[:2] != (T, E) or actions.dtype.kind not in "biufc":
            raise ValueError(f"actions: expected shape ({T}, {E}, ...) numeric, got {actions.shape} "
                             f"{actions.dtype}")
        states = as_contiguous(states)
        if states.ndim != 3 or states.shape[:2] != (T, E) or states.dtype != np.float32:
            raise ValueError(f"states: expected shape ({T}, {E}, state_size) float32, got {states.shape} "
                             f"{states.dtype}")
        rewards = as_real_array(rewards, "rewards", (T, E), cnp.NPY_FLOAT64)
        terminated = as_flags(terminated, "terminated", (T, E))
        truncated = as_flags(truncated, "truncated", (T, E))
        self._check(obs, actions, states)
        return self._run(obs, actions, rewards, next_obs, terminated, truncated, states, T)

    def flush(self):
        """The earliest open sequence of every env, cut where the input ended (not terminal),
        ordered by env; {} if nothing was ever added. The adder then starts over."""
        if self._held is None:
            return {}
        E = self._held.shape[0]
        rows = [e for e in range(E) if self._held[e] > 0]
        M = len(rows)
        batch = self._new_batch(M, self._obs, self._act, self._state)
        cdef _Window w = self._window()
        cdef _Out o = self._out(batch)
        cdef Py_ssize_t i, e
        for i in range(M):
            e = rows[i]
            _emit(&w, &o, i, e, self._held[e], False)
        self._held = None
        return batch

    cdef dict _new_batch(self, Py_ssize_t M, object like_obs, object like_act, object like_state):
        m = self.length
        return {
            "obs": _rows_like(M, m + 1, like_obs),
            "action": _rows_like(M, m, like_act),
            "reward": np.empty((M, m), np.float32),
            "mask": np.empty((M, m), np.bool_),
            "terminal": np.empty(M, np.bool_),
            "state": _rows_like(M, 0, like_state),
            "env": np.empty(M, np.int64),
        }

    cdef _Window _window(self):
        cdef _Window w
        w.obs = <char *> cnp.PyArray_DATA(self._obs)
        w.act = <char *> cnp.PyArray_DATA(self._act)
        w.rew = <double *> cnp.PyArray_DATA(self._rew)
        w.state = <char *> cnp.PyArray_DATA(self._state)
        w.held = <int64_t *> cnp.PyArray_DATA(self._held)
        w.m, w.p = self.length, self.length - self.overlap
        w.obs_nb = self._obs.itemsize * int(np.prod(self._obs.shape[2:], dtype=np.int64))
        w.act_nb = self._act.itemsize * int(np.prod(self._act.shape[2:], dtype=np.int64))
        w.state_nb = 4 * int(np.prod(self._state.shape[2:], dtype=np.int64))
        return w

    cdef _Out _out(self, dict batch):
        cdef _Out o
        o.obs = <char *> cnp.PyArray_DATA(batch["obs"])
        o.act = <char *> cnp.PyArray_DATA(batch["action"])
        o.rew = <float *> cnp.PyArray_DATA(batch["reward"])
        o.mask = <uint8_t *> cnp.PyArray_DATA(batch["mask"])
        o.terminal = <uint8_t *> cnp.PyArray_DATA(batch["terminal"])
        o.state = <char *> cnp.PyArray_DATA(batch["state"])
        o.env = <int64_t *> cnp.PyArray_DATA(batch["env"])
        return o

    cdef dict _run(self, obs, actions, rewards, next_obs, terminated, truncated, states, Py_ssize_t T):
        cdef _Window w = self._window()
        cdef Py_ssize_t E = obs.shape[1], M
        cdef const uint8_t *term = <const uint8_t *> cnp.PyArray_DATA(terminated)
        cdef const uint8_t *trunc = <const uint8_t *> cnp.PyArray_DATA(truncated)
        with nogil:
            M = _count(w.held, term, trunc, T, E, w.m, w.p)
        batch = self._new_batch(M, obs, actions, states)
        cdef _Out o = self._out(batch)
        cdef const char *p_obs = <const char *> cnp.PyArray_DATA(obs)
        cdef const char *p_next = <const char *> cnp.PyArray_DATA(next_obs)
        cdef const char *p_act = <const char *> cnp.PyArray_DATA(actions)
        cdef const double *p_rew = <const double *> cnp.PyArray_DATA(rewards)
        cdef const char *p_state = <const char *> cnp.PyArray_DATA(states)
        with nogil:
            _add(&w, &o, p_obs, p_next, p_act, p_rew, p_state, term, trunc, T, E)
        return batch
