"""Learner 0's outputs: checkpoints, evaluations during training, the final
evaluation and the exported policy (`LearnerOutputs`, a part that
`aiorl.runtime.learner.LearnerRole` owns and calls at named moments; it sees the
learner only through a `LearnerAccess`).

Checkpoints (learner 0; `aiorl.io.checkpoint`): the first as soon as learning
has started, at the launch's first weights publication after
``learning_starts`` (its ``agent.publish_interval``-th learner step; for a
synchronous algorithm, DPPO or ES, after its first iteration), so that a run
pre-empted in its first minutes still continues from somewhere; then every
``run.checkpoint_interval_s`` seconds and/or ``run.checkpoint_every`` learner
steps (with both off, neither the first nor any other before the end), at shutdown, and
when the role ends abnormally (coordinator lost, told to exit early, a second
signal, its step failed because a data-parallel peer died) if it still can;
weights holding NaN or infinities are never checkpointed. Each records the
run's counters and return window from the coordinator (its last heartbeat's when
it is gone), so that ``--resume`` continues them; the run's learner steps are
learner 0's own count for each learner (`aiorl.io.rundir.run_learner_steps`),
never older totals: a resumed run's learners start from that count, and its
coordinator from the same (`aiorl.io.rundir.resumed_counters`). The state is
serialized between two steps (training waits that long); the file is written in
the background. A resumed run's learners
all load the checkpoint it continues from (`load_resume_checkpoint`).

Evaluations (`aiorl.runtime.evaluator`): the policy is copied between the two
steps where one comes due and scored in the evaluation process, one evaluation
at a time (copies wait meanwhile, a few at most); at a run's end by its
criterion the copies waiting and the final policy are scored too. Then the final
weights are published, checkpointed and the policy exported to ``policy/``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiorl.config import Config
from aiorl.io import checkpoint
from aiorl.io.rundir import Identity, make_subdir, run_learner_steps
from aiorl.runtime.evaluator import Evaluator, evaluation_on
from aiorl.runtime.phase import last_checkpoint_budget_s

# Of cluster.phase_timeout_s (the learners' deadline to finish): what the final evaluation may take;
# the rest is for publishing, the final checkpoint and the export.
FINAL_EVALUATION_SHARE = 0.5
# Policy copies that wait for the evaluation process while it scores another (or, at the run's
# start, traces its first export): a few absorb such a wait with none skipped (ES's first iterations
# come due faster than one evaluation at a time on a busy machine); past them the oldest is dropped
# (counted skipped), so an evaluation is never more than a few behind the policy.
MAX_WAITING = 3


def load_resume_checkpoint(core, path: str, sets_aside: bool) -> dict:
    """Load the checkpoint a resumed launch continues from into `core`; its meta.

    The launcher chose the file by checks that need no torch (`aiorl.io.checkpoint.verify`). Should
    the real weights-only load still refuse its content, the learner that `sets_aside` (learner 0,
    the one that writes checkpoints) renames it out of the checkpoints' names before the launch
    fails: the next ``--resume`` continues from the checkpoint before it instead of choosing this
    one again. A file that could not be read at all (an I/O error) stays where it is."""
    try:
        return core.load_checkpoint(path)
    except checkpoint.CheckpointUnreadable:
        raise
    except checkpoint.CheckpointError as exc:
        if not sets_aside:
            raise
        moved = checkpoint.set_aside(Path(path))
        raise checkpoint.CheckpointError(
            f"{exc}; set aside as {moved.name}: `aiorl run --resume` continues from the checkpoint before it", moved
        ) from None


@dataclass(frozen=True, kw_only=True)
class LearnerAccess:
    """All that learner 0's outputs see of their learner, which builds this from its own lock and
    methods: the core, read under the core's lock (`policy`, `state` and `export` block: the outputs
    call them in a worker thread), this launch's step count, the run's counters, and what the role
    does for them (ask the coordinator, publish, run a task)."""

    lock: threading.Lock  # held by a step: a read under it never sees weights torn across one
    core: Callable[[], object]  # the learner's `LearnerCore` (read only through the methods below)
    launch_steps: Callable[[], int]  # this learner's steps in this launch (`LearnerOutputs.resume`: before it)
    run_counters: Callable[[], dict]  # the run's counters, as the last heartbeat reply brought them
    run_state: Callable[[float], Awaitable]  # (timeout_s): the coordinator's run_state reply (may raise)
    publish: Callable[[], Awaitable[None]]  # publish the current weights
    spawn: Callable[..., asyncio.Task]  # (coroutine, name): a task whose failure fails the role

    def policy(self) -> tuple[object, dict] | None:
        """The acting policy and its meta, copied between two steps; None: the algorithm exports none."""
        with self.lock:
            return self.core().acting_policy()

    def state(self, read: Callable[[dict], object], timeout_s: float) -> object:
        """`read` of the core's state dict, the lock held throughout; None: the core has no state.
        The wait for the lock is bounded: a step stuck in a collective with a dead peer must not hold
        up the exit."""
        if not self.lock.acquire(timeout=timeout_s):
            raise TimeoutError(f"a learner step held the core for over {timeout_s:g} s")
        try:
            state = self.core().state_dict()
            return None if state is None else read(state)
        finally:
            self.lock.release()

    def export(self, directory: str) -> str | None:
        """Export the acting policy into `directory`; its file, or None (no policy to export)."""
        return self.core().export_policy(directory)


class LearnerOutputs:
    """Learner 0's checkpoints, evaluations and exported policy. Its learner calls it at named moments:
    `start` (registered), `after_step` (between two steps), `finish` (the run's end), `abnormal_end`,
    `interrupt` then `close` (the role's cleanup); evaluations ride on heartbeats (`heartbeat`,
    `reported`); `summary` is its part of the learner's summary. Every learner's loads the checkpoint
    its launch resumes from (`resume`); only learner 0's write anything: another's moments do nothing
    and its summary holds no checkpoint and no evaluation."""

    def __init__(
        self, cfg: Config, run_dir: Path, index: int, identity: Identity, log: logging.Logger, access: LearnerAccess
    ):
        # Checkpoints are written with torch. Importing it holds the GIL for seconds, so it
        # happens now, before heartbeats start, and not in the middle of the run (an algorithm
        # that never imports torch itself, like random_agent, would otherwise miss heartbeats).
        import torch  # noqa: F401

        self.cfg = cfg
        self.run_dir = run_dir
        self.writes = index == 0  # only learner 0 has outputs
        self.identity = identity
        self.log = log
        self.access = access
        self.step_base = 0  # this learner's steps before this launch (`resume`)
        self.synchronous = cfg.algorithm.is_synchronous(cfg)
        self.checkpoints: list[str] = []
        self.last_checkpoint_t = time.monotonic()
        self.checkpointed = False  # this launch wrote (or tried) a checkpoint already
        self._writing: asyncio.Task | None = None
        # Learner 0 with run.eval_every / eval_interval_s; its process starts at registration.
        self.evaluator = Evaluator(cfg, run_dir / "policy") if self.writes and evaluation_on(cfg) else None
        self._evaluating: asyncio.Task | None = None  # scoring the copies waiting, one at a time
        self._waiting: collections.deque[tuple] = collections.deque()  # policies copied, oldest first

    async def resume(self, core) -> int:
        """A resumed launch, its learner's core just built: the checkpoint it continues from loaded into
        `core` (every learner's); this learner's steps before this launch (0 when it does not resume)."""
        resume_from = self.identity.resume_from
        if not resume_from:
            return 0
        meta = await asyncio.to_thread(load_resume_checkpoint, core, resume_from, self.writes)
        self.step_base = int(meta["learner_steps"])
        self.log.info("resumed from %s (%d learner steps)", resume_from, self.step_base)
        return self.step_base

    def total_steps(self) -> int:
        """This learner's steps over the whole run, earlier launches included."""
        return self.step_base + self.access.launch_steps()

    def start(self) -> None:
        """The learner registered: the evaluation process starts now, not at the first evaluation: its
        imports (seconds of CPU, far more on a busy machine) overlap the run's start-up, and it is
        ready for the first evaluation."""
        if self.evaluator is not None:
            self.evaluator.start()

    def heartbeat(self) -> dict:
        """What the next heartbeat carries: the evaluations the coordinator has not acknowledged yet."""
        return {} if self.evaluator is None else {"evaluation": self.evaluator.summary()}

    def reported(self, evaluation: dict | None) -> None:
        """A heartbeat carrying `evaluation` was answered: those evaluations need not be sent again."""
        if self.evaluator is not None:
            self.evaluator.reported(evaluation)

    async def after_step(self) -> None:
        """Between two steps (learner 0 publishes first where actors wait for the weights): a
        checkpoint, then an evaluation, where one is due."""
        await self._maybe_checkpoint()
        await self._maybe_evaluate()

    def summary(self) -> dict:
        """The learner summary's ``checkpoints`` (files written) and ``evaluation``."""
        return {
            "checkpoints": self.checkpoints,
            "evaluation": self.evaluator.summary() if self.evaluator is not None else None,
        }

    def interrupt(self) -> None:
        """The role is ending: an evaluation in flight ends at its next env step, unrecorded."""
        if self.evaluator is not None:
            self.evaluator.interrupt()

    async def close(self) -> None:
        """End the evaluation process (bounded: it is killed past its deadline)."""
        if self.evaluator is not None:
            await asyncio.to_thread(self.evaluator.close)  # bounded: the process is killed past it

    async def _maybe_checkpoint(self) -> None:
        r = self.cfg.run
        if not self.writes:
            return
        total_steps = self.total_steps()
        by_steps = r.checkpoint_every and total_steps % r.checkpoint_every == 0
        by_time = (
            r.checkpoint_interval_s is not None and time.monotonic() - self.last_checkpoint_t >= r.checkpoint_interval_s
        )
        # A run pre-empted before its first interval must not start over: the first checkpoint comes
        # with the first weights published after learning started.
        first = (
            not self.checkpointed
            and (r.checkpoint_interval_s is not None or bool(r.checkpoint_every))
            and self.access.launch_steps() >= self.first_publication_step()
        )
        if first:
            await self._checkpoint("first")
        elif by_steps or by_time:
            await self._checkpoint("periodic")

    def first_publication_step(self) -> int:
        """This launch's learner step at which learner 0 first publishes trained weights."""
        return 1 if self.synchronous else self.cfg.agent.publish_interval

    async def _maybe_evaluate(self) -> None:
        """Between two steps: an evaluation due now gets the policy of this step, copied now."""
        ev = self.evaluator
        total_steps = self.total_steps()
        if ev is not None and ev.due(total_steps):
            await self._take_policy(total_steps, ev.mark(total_steps))

    async def _take_policy(self, learner_steps: int, due_t: float) -> None:
        """Copy the current policy (training waits that long) for the evaluation process, which scores
        one at a time: copies wait, MAX_WAITING at most (past it the oldest is dropped, counted skipped)."""
        ev = self.evaluator
        env_steps = self.access.run_counters().get("env_steps", 0)
        t0 = time.perf_counter()
        policy = await asyncio.to_thread(self.access.policy)
        copy_s = time.perf_counter() - t0  # what training waited (the core's lock held)
        if policy is None:
            self.log.warning("%s exports no policy: no evaluation during training", self.cfg.algo)
            self.evaluator = None
            return
        if len(self._waiting) >= MAX_WAITING:
            self._waiting.popleft()
            ev.skip()
        self._waiting.append((*policy, learner_steps, env_steps, copy_s, due_t, time.time()))
        if self._evaluating is None or self._evaluating.done():
            self._evaluating = self.access.spawn(self._evaluate(ev), "evaluation")

    async def _evaluate(self, ev) -> None:
        """Score the copies waiting in the evaluation process, oldest first, until none waits."""
        while self._waiting:
            args = self._waiting.popleft()
            try:
                await asyncio.to_thread(ev.run, *args)
            except OSError as exc:  # a full disk costs this evaluation, not the run
                ev.skip()
                self.log.error("evaluation at learner step %d failed: %s", args[2], exc)

    async def _run_state(self) -> dict:
        """The run's counters and return window, to record in a checkpoint."""
        try:
            reply = await self.access.run_state(self.cfg.cluster.coordinator_timeout_s)
            return dict(reply.meta)
        except Exception as exc:  # the coordinator is gone: the last counters a heartbeat brought
            self.log.warning("checkpoint without the coordinator's run state (%r); using the last heartbeat's", exc)
            return dict(self.access.run_counters())

    async def _checkpoint(self, reason: str, coordinator: bool = True) -> None:
        """Serialize the core between steps (training waits), write the file in the background."""
        self.last_checkpoint_t = time.monotonic()
        self.checkpointed = True
        if self._writing is not None:
            await self._writing  # one file at a time
        run_state = await self._run_state() if coordinator else dict(self.access.run_counters())
        lock_timeout_s = self.cfg.cluster.phase_timeout_s
        try:
            # Serialized under the lock: the state dict holds the core's own tensors.
            payload = await asyncio.to_thread(self.access.state, checkpoint.serialize, lock_timeout_s)
        except checkpoint.CheckpointError as exc:
            self.log.error("checkpoint at learner step %d (%s): %s", self.total_steps(), reason, exc)
            return
        if payload is None:
            return
        steps, keep, directory = self.total_steps(), self.cfg.run.keep_checkpoints, self.run_dir / "checkpoints"
        # The steps of the state serialized, not the run's totals as a heartbeat brought them (the
        # last one's, once the coordinator is gone), older by the steps since.
        run_state["learner_steps"] = run_learner_steps(steps, self.cfg.cluster.learners)
        meta = self.identity.stamp(
            {
                "reason": reason,
                "run": run_state,
                "algo": self.cfg.algo,
                "config_hash": self.cfg.config_hash(),
                "time": time.time(),
            }
        )

        async def write():
            try:
                path = await asyncio.to_thread(checkpoint.write_file, directory, steps, payload, meta, keep)
            except (OSError, checkpoint.CheckpointError) as exc:  # a full disk, a state a resume would refuse:
                self.log.error("checkpoint at learner step %d not written: %s", steps, exc)  # not the run's end
                return
            self.checkpoints.append(str(path))
            self.log.info("checkpoint %s (%s)", path.name, reason)

        self._writing = asyncio.create_task(write())

    async def _checkpoint_written(self) -> None:
        if self._writing is not None:
            await self._writing

    async def abnormal_end(self, why: str) -> None:
        """The role ends abnormally: a last checkpoint if it still can (and its core was built)."""
        if not self.writes or self.access.core() is None:
            return
        try:
            # Bounded: once the coordinator is gone, a launcher gives roles this long beyond the
            # coordinator timeout.
            async with asyncio.timeout(last_checkpoint_budget_s(self.cfg.cluster)):
                # A step still running in its thread holds the lock: the checkpoint waits for it.
                await self._checkpoint(f"abnormal end: {why}", coordinator=False)
                await self._checkpoint_written()
        except Exception as exc:
            self.log.error("could not write a checkpoint at the abnormal end (%r)", exc)

    async def _final_evaluation(self) -> None:
        """A run that ended by its criterion (budget or target, not a signal): the evaluation in
        flight finishes, then the final policy is scored unless that was it, so that policy/best/
        is chosen among every policy up to the final one. Without this, a short run whose one
        early evaluation was still exporting while training went on kept that early policy as its
        best, and `aiorl eval` scored it instead of a far better final one."""
        ev = self.evaluator
        budget_s = self.cfg.cluster.phase_timeout_s * FINAL_EVALUATION_SHARE
        try:
            async with asyncio.timeout(budget_s):
                if self._evaluating is not None:
                    await asyncio.wait({self._evaluating})  # not cancelled by the timeout; errors stay its own
                total_steps = self.total_steps()
                if self.evaluator is not None and ev.last_step != total_steps:
                    self.log.info("final evaluation: the policy at learner step %d", total_steps)
                    await self._take_policy(total_steps, ev.mark(total_steps))
                    if self._evaluating is not None:
                        await asyncio.wait({self._evaluating})
        except TimeoutError:
            self.log.warning(
                "the final evaluation did not end within %g s (%g x cluster.phase_timeout_s): "
                "stopped; policy/best/ is the best of the evaluations before it",
                budget_s,
                FINAL_EVALUATION_SHARE,
            )

    async def finish(self, signalled: bool) -> None:
        """The learner's end, its steps done and its memories told: the final evaluation (not after
        a signal: it asks for a prompt end), the final weights published and checkpointed, the
        policy exported to ``policy/``."""
        if not self.writes:
            return
        if self.evaluator is not None and not signalled:  # a signal asks for a prompt end
            await self._final_evaluation()
        self.interrupt()  # one in flight ends at its next env step, unrecorded
        if self._evaluating is not None:
            await asyncio.gather(self._evaluating, return_exceptions=True)  # its error failed the role
        await self.access.publish()
        await self._checkpoint("final")
        await self._checkpoint_written()
        directory = make_subdir(self.run_dir, "policy")  # RunDirDeleted: never made again
        path = await asyncio.to_thread(self.access.export, str(directory))
        if path:
            self.log.info("exported policy to %s", path)
