"""Plain numpy implementations of the replay kernels: test oracles and benchmark baselines.

Nothing imports this module implicitly; `aiorl.replay` is always the compiled
code. Each function here is written for clarity, vectorised with numpy where
that stays obvious, and follows the same arithmetic order as the compiled
kernel so that tests can compare results bitwise:

- SumTree: the 8-ary layout and summation order of `aiorl._ext.sumtree`
  (see its module docstring), one numpy step per tree level.
- ReplayBuffer / PrioritizedReplayBuffer: the same ring, rng use and
  priority formulas as the compiled buffers, with numpy gathers.
- n_step_adjustment / n_step_flush: windows accumulated one offset k < n at a
  time over the whole [time, env] grid.
- gae: the backward recursion, one numpy step per time step.
- vtrace: the backward recursion over fragments [B, T], one numpy step per
  time step (exp from libm, as the kernel's).
"""

import math

import numpy as np

RESERVED_NAMES = ("indices", "weights", "generations")


def _round8(n):
    return (n + 7) // 8 * 8


def _pairwise8(g):
    """Sum over the last axis of 8 values, ((g0+g1)+(g2+g3))+((g4+g5)+(g6+g7))."""
    return ((g[..., 0] + g[..., 1]) + (g[..., 2] + g[..., 3])) + ((g[..., 4] + g[..., 5]) + (g[..., 6] + g[..., 7]))


def _running8(g):
    """Running sums P[k] = g0 + ... + g(k-1), k = 0..7, in the compiled kernel's order."""
    g01 = g[:, 0] + g[:, 1]
    g0123 = g01 + (g[:, 2] + g[:, 3])
    g45 = g[:, 4] + g[:, 5]
    return np.stack(
        [np.zeros_like(g01), g[:, 0], g01, g01 + g[:, 2], g0123, g0123 + g[:, 4], g0123 + g45, g0123 + (g45 + g[:, 6])],
        axis=1,
    )


class SumTree:
    """Sum-tree over `capacity` leaves with the compiled SumTree's semantics.

    levels[0] is the top 8-slot group, levels[-1] the leaves (padded with 0 to
    a multiple of 8); node p of level k-1 sums the group [8p, 8p+8) of level k.
    `min` is the smallest positive leaf (+inf if none).
    """

    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        sizes = [_round8(capacity)]
        while sizes[-1] > 8:
            sizes.append(_round8(sizes[-1] // 8))
        self.levels = [np.zeros(size) for size in reversed(sizes)]
        self.mins = [np.full(size, np.inf) for size in reversed(sizes[1:])]

    @property
    def total(self):
        return float(_pairwise8(self.levels[0]))

    @property
    def min(self):
        return float(self._group_min(0, np.array([0]))[0])

    def _group_min(self, k, groups):
        g = self.levels[k].reshape(-1, 8)[groups] if k == len(self.levels) - 1 else self.mins[k].reshape(-1, 8)[groups]
        if k == len(self.levels) - 1:
            g = np.where(g > 0, g, np.inf)
        return g.min(axis=1)

    def get(self, indices):
        return self.levels[-1][np.asarray(indices, dtype=np.int64)].copy()

    def update(self, indices, values):
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        val = np.asarray(values, dtype=np.float64).reshape(-1)
        if idx.size == 0:
            return
        if idx.min() < 0 or idx.max() >= self.capacity or not (np.isfinite(val).all() and (val >= 0).all()):
            raise ValueError("indices out of range or values not finite and >= 0")
        # Last occurrence wins: keep, for every distinct index, its last value.
        rev_first = np.unique(idx[::-1], return_index=True)[1]
        keep = idx.size - 1 - rev_first
        self.levels[-1][idx[keep]] = val[keep]
        nodes = np.unique(idx)
        for k in range(len(self.levels) - 1, 0, -1):
            nodes = np.unique(nodes // 8)
            self.levels[k - 1][nodes] = _pairwise8(self.levels[k].reshape(-1, 8)[nodes])
            self.mins[k - 1][nodes] = self._group_min(k, nodes)

    def sample(self, batch_size, rng):
        """Stratified: draw j targets mass (j + U_j) * (total / batch_size), U_j = rng.random()."""
        total = self.total
        if not total > 0:
            raise ValueError("nothing to sample")
        u = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
        node = np.zeros(batch_size, dtype=np.int64)
        for level in self.levels:
            g = level.reshape(-1, 8)[node]
            run = _running8(g)
            c = (u[:, None] >= run[:, 1:]).sum(axis=1)
            # Rounding can push u past the group's sum onto an empty last child:
            # step back to the last child with mass.
            edge = (c == 7) & (g[:, 7] == 0)
            if edge.any():
                c[edge] = 7 - np.argmax(g[edge][:, ::-1] > 0, axis=1)
            u = u - run[np.arange(batch_size), c]
            node = 8 * node + c
        return node


class ReplayBuffer:
    """Uniform ring buffer with the compiled ReplayBuffer's ring and sampling."""

    def __init__(self, capacity, spec, seed=None):
        self.capacity = capacity
        self.spec = {name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in spec.items()}
        self.storage = {name: np.zeros((capacity,) + shape, dtype) for name, (shape, dtype) in self.spec.items()}
        self.rng = np.random.default_rng(seed)
        self.size = 0
        self.next = 0
        self.added = 0

    def __len__(self):
        return self.size

    def _write(self, batch):
        n = len(next(iter(batch.values())))
        if n > self.capacity:
            raise ValueError("batch larger than capacity")
        idx = (self.next + np.arange(n)) % self.capacity
        for name, arr in self.storage.items():
            arr[idx] = batch[name]
        self.next = (self.next + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        self.added += n
        return idx

    def add(self, batch):
        return self._write(batch)

    def generation(self, indices):
        back = (self.next - 1 - np.asarray(indices)) % self.capacity
        return (self.added - 1 - back).astype(np.uint64)

    def _gather(self, idx):
        return {name: arr.take(idx, axis=0) for name, arr in self.storage.items()}

    def sample(self, batch_size):
        idx = np.minimum((self.rng.random(batch_size) * self.size).astype(np.int64), self.size - 1)
        out = self._gather(idx)
        out["indices"] = idx
        return out


#: Priorities are clipped to this (the compiled buffer's MAX_PRIORITY).
MAX_PRIORITY = 1e8


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay with the compiled buffer's formulas and rng use."""

    def __init__(self, capacity, spec, alpha, eps=1e-6, seed=None):
        super().__init__(capacity, spec, seed)
        self.alpha = alpha
        self.eps = eps
        self.max_priority = 1.0
        self.tree = SumTree(capacity)

    def _values(self, priorities):
        q = np.minimum(np.asarray(priorities, dtype=np.float64), MAX_PRIORITY) + self.eps
        return q if self.alpha == 1.0 else np.power(q, self.alpha)

    def add(self, batch, priorities=None):
        idx = self._write(batch)
        if priorities is None:
            q = np.full(len(idx), self.max_priority)
        else:
            q = self._values(priorities)
            self.max_priority = max(self.max_priority, float(q.max())) if len(q) else self.max_priority
        self.tree.update(idx, q)
        return idx

    def sample(self, batch_size, beta):
        idx = self.tree.sample(batch_size, self.rng)
        out = self._gather(idx)
        out["indices"] = idx
        out["weights"] = np.power(self.tree.get(idx) / self.tree.min, -beta).astype(np.float32)
        out["generations"] = self.generation(idx)
        return out

    def update_priorities(self, indices, priorities, generations=None):
        idx = np.asarray(indices, dtype=np.int64)
        q = self._values(priorities)
        if idx.size and (idx.min() < 0 or idx.max() >= self.size):
            raise ValueError("index out of range")
        fresh = (
            np.ones(idx.size, dtype=bool)
            if generations is None
            else self.generation(idx) == np.asarray(generations, dtype=np.uint64)
        )
        if fresh.any():
            self.max_priority = max(self.max_priority, float(q[fresh].max()))
            self.tree.update(idx[fresh], q[fresh])
        return int((~fresh).sum())


def _n_step(obs, actions, rewards, next_obs, terminated, truncated, n, gamma, carry, flush):
    obs, actions, next_obs = np.asarray(obs), np.asarray(actions), np.asarray(next_obs)
    rewards = np.asarray(rewards, dtype=np.float64)
    T, E = rewards.shape
    if carry is None:
        carry = {
            "obs": obs[:0],
            "actions": actions[:0],
            "rewards": rewards[:0],
            "next_obs": next_obs[:0],
            "pending": np.zeros(E, dtype=np.int64),
        }
    L = len(carry["rewards"])
    # One time axis: the carried steps (which hold no episode end), then the new ones.
    O = np.concatenate([carry["obs"], obs])
    A = np.concatenate([carry["actions"], actions])
    R = np.concatenate([carry["rewards"], rewards])
    NO = np.concatenate([carry["next_obs"], next_obs])
    term = np.concatenate([np.zeros((L, E), bool), np.asarray(terminated, dtype=bool)])
    ended = term | np.concatenate([np.zeros((L, E), bool), np.asarray(truncated, dtype=bool)])
    S = L + T
    starts = np.arange(S)[:, None]
    envs = np.arange(E)[None, :]
    valid = np.ones((S, E), dtype=bool)
    valid[:L] = np.arange(L)[:, None] >= L - carry["pending"][None, :]

    gamma_pow = np.cumprod([1.0] + [gamma] * n)  # repeated products, as the kernel's table
    ret = np.zeros((S, E))
    length = np.zeros((S, E), dtype=np.int64)
    closed = np.zeros((S, E), dtype=bool)
    hit_term = np.zeros((S, E), dtype=bool)
    open_ = valid.copy()
    for k in range(n):
        step = np.minimum(starts + k, max(S - 1, 0))
        active = open_ & (starts + k < S)
        ret = np.where(active, ret + gamma_pow[k] * R[step, envs], ret)
        length += active
        hit_term |= active & term[step, envs]
        closed |= active & (ended[step, envs] | (length == n))
        open_ = active & ~closed
    if flush:
        closed |= valid & (length > 0)
    s, e = np.nonzero(closed)
    last = s + length[s, e] - 1
    done = hit_term[s, e]
    batch = {
        "obs": O[s, e],
        "action": A[s, e],
        "reward": ret[s, e].astype(np.float32),
        "next_obs": NO[last, e],
        "done": done,
        "discount": np.where(done, 0.0, gamma_pow[length[s, e]]).astype(np.float32),
    }
    pending = (valid & ~closed).sum(axis=0).astype(np.int64)
    keep = int(pending.max()) if E else 0
    new_carry = {
        "obs": O[S - keep :],
        "actions": A[S - keep :],
        "rewards": R[S - keep :],
        "next_obs": NO[S - keep :],
        "pending": pending,
    }
    return batch, new_carry


def n_step_adjustment(obs, actions, rewards, next_obs, terminated, truncated, n, gamma, carry=None):
    """Same contract as `aiorl.replay.n_step_adjustment`; the carry is a plain dict here."""
    return _n_step(obs, actions, rewards, next_obs, terminated, truncated, n, gamma, carry, flush=False)


def n_step_flush(carry, gamma):
    """Same contract as `aiorl.replay.n_step_flush` for a carry from this module."""
    E = len(carry["pending"])
    empty = {key: carry[key][:0] for key in ("obs", "actions", "next_obs")}
    batch, _ = _n_step(
        empty["obs"],
        empty["actions"],
        np.zeros((0, E)),
        empty["next_obs"],
        np.zeros((0, E), bool),
        np.zeros((0, E), bool),
        len(carry["rewards"]) + 1,
        gamma,
        carry,
        flush=True,
    )
    return batch


def gae(rewards, values, bootstrap_value, terminated, truncated, gamma, lam, truncated_values=None):
    """Same contract as `aiorl.replay.gae`: the backward recursion, vectorised over envs."""
    rewards, values = np.asarray(rewards), np.asarray(values)
    dtype = np.float32 if rewards.dtype == np.float32 and values.dtype == np.float32 else np.float64
    r = rewards.astype(np.float64)
    v = values.astype(np.float64)
    boot = np.asarray(bootstrap_value, dtype=dtype).astype(np.float64)
    term = np.asarray(terminated, dtype=bool)
    trunc = np.asarray(truncated, dtype=bool)
    if truncated_values is None:
        if (trunc & ~term).any():
            raise ValueError("truncated steps need truncated_values")
        tv = np.zeros_like(v)
    else:
        tv = np.asarray(truncated_values, dtype=dtype).astype(np.float64)
    T = r.shape[0]
    adv = np.zeros_like(r)
    next_adv = np.zeros(r.shape[1])
    for t in range(T - 1, -1, -1):
        next_value = v[t + 1] if t + 1 < T else boot
        carry_adv = next_adv if t + 1 < T else np.zeros_like(next_adv)
        next_value = np.where(term[t], 0.0, np.where(trunc[t], tv[t], next_value))
        carry_adv = np.where(term[t] | trunc[t], 0.0, carry_adv)
        next_adv = r[t] + gamma * next_value - v[t] + gamma * lam * carry_adv
        adv[t] = next_adv
    return adv.astype(dtype), (adv + v).astype(dtype)


def vtrace(
    log_rhos,
    rewards,
    values,
    bootstrap_value,
    terminated,
    truncated,
    gamma,
    rho_bar=1.0,
    c_bar=1.0,
    pg_rho_bar=None,
    truncated_values=None,
    lam=1.0,
):
    """Same contract as `aiorl.replay.vtrace`: the backward recursion, vectorised over fragments."""
    log_rhos, rewards, values = np.asarray(log_rhos), np.asarray(rewards), np.asarray(values)
    single = log_rhos.dtype == rewards.dtype == values.dtype == np.float32
    dtype = np.float32 if single else np.float64
    lr = log_rhos.astype(dtype).astype(np.float64)
    r = rewards.astype(dtype).astype(np.float64)
    v = values.astype(dtype).astype(np.float64)
    boot = np.asarray(bootstrap_value, dtype=dtype).astype(np.float64)
    term = np.asarray(terminated, dtype=bool)
    trunc = np.asarray(truncated, dtype=bool)
    if truncated_values is None:
        if (trunc & ~term).any():
            raise ValueError("truncated steps need truncated_values")
        tv = np.zeros_like(v)
    else:
        tv = np.asarray(truncated_values, dtype=dtype).astype(np.float64)
    pg_rho_bar = rho_bar if pg_rho_bar is None else pg_rho_bar
    # math.exp is the C library's exp, which the kernel calls; numpy's own exp may round differently.
    rho = np.vectorize(math.exp, otypes=[np.float64])(lr) if lr.size else lr
    B, T = v.shape
    vs = np.zeros_like(v)
    pg = np.zeros_like(v)
    acc = np.zeros(B)
    for t in range(T - 1, -1, -1):
        ended = term[:, t] | trunc[:, t]
        next_value = v[:, t + 1] if t + 1 < T else boot
        next_value = np.where(term[:, t], 0.0, np.where(trunc[:, t], tv[:, t], next_value))
        next_acc = np.where(ended | (t + 1 == T), 0.0, acc)
        acc = (
            np.minimum(rho_bar, rho[:, t]) * (r[:, t] + gamma * next_value - v[:, t])
            + gamma * lam * np.minimum(c_bar, rho[:, t]) * next_acc
        )
        vs[:, t] = v[:, t] + acc
        pg[:, t] = np.minimum(pg_rho_bar, rho[:, t]) * (r[:, t] + gamma * (next_value + next_acc) - v[:, t])
    return vs.astype(dtype), pg.astype(dtype)


class FramePool:
    """Same contract as `aiorl._ext.framestore.FramePool`: counted slots in runs, a frame
    placed after its predecessor where it can, LIFO free runs, fresh runs in increasing
    order (so slot numbers agree with the compiled pool)."""

    def __init__(self, frame_shape, dtype, max_frames, block_frames=0, run_frames=16):
        self.frame_shape = tuple(int(d) for d in frame_shape)
        self.dtype = np.dtype(dtype)
        self.max_frames = max_frames
        self.run_frames = R = run_frames
        frame_bytes = self.dtype.itemsize * int(np.prod(self.frame_shape))
        slot_limit = 2 * max_frames + 2 * R
        want = max(block_frames if block_frames > 0 else max(1, (32 << 20) // frame_bytes), R)
        bf = 1
        while bf < want and (bf < slot_limit or bf < R):
            bf <<= 1
        self.block_frames = bf
        self.max_runs = -(-slot_limit // bf) * (bf // R)
        self.frames, self.counts = {}, {}
        self.fill, self.run_live = {}, {}
        self.free = []
        self.high_runs = 0
        self.tail = -1
        self.live = 0

    def __len__(self):
        return self.live

    @property
    def slots(self):
        return self.high_runs * self.run_frames

    @property
    def free_runs(self):
        return len(self.free)

    def _runs_available(self):
        return len(self.free) + self.max_runs - self.high_runs

    def can_add(self, n):
        return self.live + n <= self.max_frames and -(-n // self.run_frames) + 1 <= self._runs_available()

    def _is_live(self, slot):
        return 0 <= slot < self.slots and self.counts.get(int(slot), 0) > 0

    def _open_run(self):
        if self.free:
            run = self.free.pop()
        elif self.high_runs < self.max_runs:
            run = self.high_runs
            self.high_runs += 1
        else:
            return -1
        self.fill[run], self.run_live[run] = 0, 0
        return run

    def _place(self, run):
        slot = run * self.run_frames + self.fill[run]
        self.fill[run] += 1
        self.run_live[run] += 1
        return slot

    def _take_slot(self, after, remaining):
        R = self.run_frames
        if after >= 0 and self._is_live(after):
            run, pos = divmod(int(after), R)
            if pos + 1 < R and self.fill[run] == pos + 1:
                return self._place(run)
            if self._runs_available() > remaining // R + 2:
                return self._place(self._open_run())
        if self.tail < 0 or self.fill[self.tail] == R:
            self.tail = self._open_run()
        return self._place(self.tail)

    def add(self, frames, after=None):
        frames = np.asarray(frames)
        if frames.shape[1:] != self.frame_shape or frames.dtype != self.dtype:
            raise ValueError("frames of the wrong shape or dtype")
        n = len(frames)
        after = [-1] * n if after is None else [int(a) for a in np.asarray(after).reshape(-1)]
        if len(after) != n or any(a < -1 - j for j, a in enumerate(after)):
            raise ValueError("bad after")
        if not self.can_add(n):
            raise MemoryError("pool full")
        out = []
        for j, frame in enumerate(frames):
            slot = self._take_slot(after[j] if after[j] >= -1 else out[-2 - after[j]], n - j)
            self.frames[slot] = frame.copy()
            self.counts[slot] = 1
            out.append(slot)
        self.live += n
        return np.array(out, dtype=np.int64)

    def incref(self, slots):
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        if not all(self._is_live(s) for s in slots):
            raise ValueError("slot not live")
        for s in slots:
            self.counts[int(s)] += 1

    def decref(self, slots):
        for s in np.asarray(slots, dtype=np.int64).reshape(-1):
            if not self._is_live(s):
                raise ValueError("slot not live")
            self.counts[int(s)] -= 1
            if self.counts[int(s)] == 0:
                self.live -= 1
                run = int(s) // self.run_frames
                self.run_live[run] -= 1
                if self.run_live[run] == 0:
                    self.free.append(run)
                    if self.tail == run:
                        self.tail = -1

    def refcount(self, slots):
        slots = np.asarray(slots, dtype=np.int64)
        return np.array([self.counts.get(int(s), 0) for s in slots.reshape(-1)], np.int32).reshape(slots.shape)

    def take(self, slots):
        slots = np.asarray(slots, dtype=np.int64)
        if not all(self._is_live(s) for s in slots.reshape(-1)):
            raise ValueError("slot not live")
        out = np.empty(slots.shape + self.frame_shape, self.dtype)
        for pos in np.ndindex(slots.shape):
            out[pos] = self.frames[int(slots[pos])]
        return out

    def gather(self, tables, rows, outs=None):
        rows = np.asarray(rows, dtype=np.int64)
        results = []
        for table in tables:
            table = np.asarray(table, dtype=np.int64)
            if rows.size and (rows.min() < 0 or rows.max() >= len(table)):
                raise ValueError("row out of range")
            results.append(self.take(table[rows]))
        if outs is not None:
            for out, result in zip(outs, results):
                out[...] = result
            return list(outs)
        return results


class FrameStream:
    """Same contract as `aiorl._ext.framestore.FrameStream`, with a dict of held ids."""

    def __init__(self, pool, window, stack=1):
        self.pool = pool
        self.window = window
        self.stack = stack
        self.held_ids = {}  # id -> slot
        self.keep_from = 0

    @property
    def held(self):
        return len(self.held_ids)

    def holds(self, frame_id):
        return frame_id >= self.keep_from and frame_id in self.held_ids

    def check(self, frames, frame_ids, refs, keep_from):
        ids = np.asarray(frame_ids, dtype=np.int64)
        refs = np.asarray(refs, dtype=np.int64).reshape(-1)
        frames = np.asarray(frames)
        if frames.shape != (len(ids),) + self.pool.frame_shape or frames.dtype != self.pool.dtype:
            raise ValueError("frames do not match frame_ids or the pool")
        if keep_from < self.keep_from:
            raise ValueError("keep_from decreased")
        if len(ids) and ((ids < keep_from).any() or (np.diff(ids) <= 0).any()):
            raise ValueError("frame_ids not strictly increasing above keep_from")
        kept = {i for i in self.held_ids if i >= keep_from}
        positions = {i % self.window: i for i in kept}
        for f in ids:
            if int(f) in kept:
                raise ValueError("already held")
            if int(f) % self.window in positions:
                raise ValueError("window too small")
        if len(ids) and ids[-1] - ids[0] >= self.window:
            raise ValueError("span larger than the window")
        new = set(ids.tolist())
        for r in refs:
            if r < keep_from:
                raise ValueError("reference below keep_from")
            if int(r) not in kept and int(r) not in new:
                raise ValueError("reference neither held nor sent")
        if not self.pool.can_add(len(ids)):
            raise ValueError("pool full")

    def _predecessors(self, ids, refs):
        position = {int(f): p for p, f in enumerate(ids)}
        after = [-1] * len(ids)
        k = self.stack
        for st in range(len(refs) // k):
            for i in range(1, k):
                x, y = int(refs[st * k + i]), int(refs[st * k + i - 1])
                if x == y or x not in position:
                    continue
                p, q = position[x], position.get(y, -1)
                if 0 <= q < p:
                    after[p] = -2 - q
                elif q < 0 and y in self.held_ids:
                    after[p] = self.held_ids[y]
        return after

    def admit(self, frames, frame_ids, refs, keep_from):
        ids = np.asarray(frame_ids, dtype=np.int64)
        refs = np.asarray(refs, dtype=np.int64)
        after = self._predecessors(ids, refs.reshape(-1))
        # Released in the order the compiled stream frees them: by id, or by ring
        # position (id mod window) when keep_from jumps a whole window or more.
        order = (lambda i: i % self.window) if keep_from - self.keep_from >= self.window else (lambda i: i)
        for i in sorted((i for i in self.held_ids if i < keep_from), key=order):
            self.pool.decref([self.held_ids.pop(i)])
        self.keep_from = keep_from
        if len(ids):
            for f, slot in zip(ids, self.pool.add(frames, after)):
                self.held_ids[int(f)] = int(slot)
        return np.array([self.held_ids[int(r)] for r in refs.reshape(-1)], np.int64).reshape(refs.shape)

    def release(self):
        # The compiled stream releases in ring-position order (id mod window).
        for i in sorted(self.held_ids, key=lambda i: i % self.window):
            self.pool.decref([self.held_ids.pop(i)])


class SequenceAdder:
    """Same contract as `aiorl.replay.SequenceAdder`, written from the definition: per env the
    steps of the current episode, sequences starting at its steps 0, p, 2p, ..., the earliest
    one not yet emitted closing when it holds `length` steps or at the episode's end."""

    def __init__(self, length, overlap):
        if length < 1 or not 0 <= overlap < length:
            raise ValueError(f"bad length {length} / overlap {overlap}")
        self.length, self.period = length, length - overlap
        self.episodes = None  # per env: list of (obs, next_obs, action, reward, state) of the episode
        self.next_start = None  # per env: episode step of the earliest sequence not yet emitted
        self.like = None

    def add(self, obs, actions, rewards, next_obs, terminated, truncated, states):
        obs, actions, next_obs, states = map(np.asarray, (obs, actions, next_obs, states))
        T, E = obs.shape[:2]
        if self.episodes is None:
            self.episodes, self.next_start = [[] for _ in range(E)], [0] * E
            self.like = (obs[0, 0], actions[0, 0], states[0, 0])
        rows = []
        for t in range(T):
            for e in range(E):
                episode = self.episodes[e]
                episode.append((obs[t, e], next_obs[t, e], actions[t, e], float(rewards[t, e]), states[t, e]))
                end = bool(terminated[t, e] or truncated[t, e])
                start = self.next_start[e]
                if end or len(episode) - start == self.length:
                    rows.append(self._row(episode[start:], e, end and bool(terminated[t, e])))
                    self.next_start[e] = start + self.period
                if end:
                    self.episodes[e], self.next_start[e] = [], 0
        return self._stack(rows)

    def flush(self):
        if self.episodes is None:
            return {}
        rows = [
            self._row(episode[self.next_start[e] :], e, False)
            for e, episode in enumerate(self.episodes)
            if len(episode) > self.next_start[e]
        ]
        self.episodes = None
        return self._stack(rows)

    def _row(self, steps, env, terminal):
        m, L = self.length, len(steps)
        obs0, act0, _ = self.like
        obs = np.zeros((m + 1,) + obs0.shape, obs0.dtype)
        action = np.zeros((m,) + act0.shape, act0.dtype)
        reward = np.zeros(m, np.float32)
        for k, (o, _, a, r, _) in enumerate(steps):
            obs[k], action[k], reward[k] = o, a, r
        obs[L] = steps[-1][1]  # the observation after the last step
        return {
            "obs": obs,
            "action": action,
            "reward": reward,
            "mask": np.arange(m) < L,
            "terminal": np.bool_(terminal),
            "state": np.asarray(steps[0][4], np.float32),
            "env": np.int64(env),
        }

    def _stack(self, rows):
        m = self.length
        obs0, act0, state0 = self.like
        if not rows:
            return {
                "obs": np.zeros((0, m + 1) + obs0.shape, obs0.dtype),
                "action": np.zeros((0, m) + act0.shape, act0.dtype),
                "reward": np.zeros((0, m), np.float32),
                "mask": np.zeros((0, m), bool),
                "terminal": np.zeros(0, bool),
                "state": np.zeros((0,) + state0.shape, np.float32),
                "env": np.zeros(0, np.int64),
            }
        return {key: np.stack([row[key] for row in rows]) for key in rows[0]}
