"""Learner 0's outputs: checkpoints, evaluations during training, the final
evaluation and the exported policy (`LearnerOutputs`, a part of
`aiorl.runtime.learner.LearnerRole`).

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
run's counters and return window from the coordinator, so that ``--resume``
continues them. The state is serialized between two steps (training waits
that long); the file is written in the background. A resumed run's learners
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
import time
from pathlib import Path

from aiorl.io import checkpoint
from aiorl.io.rundir import Identity
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


class LearnerOutputs:
    """`LearnerRole`'s outputs, a mixin: it reads the role's core (under its `core_lock`), step
    counts and run state, and publishes the final weights (`_publish_weights`) before the last checkpoint."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Checkpoints are written with torch. Importing it holds the GIL for seconds, so it
        # happens now, before heartbeats start, and not in the middle of the run (an algorithm
        # that never imports torch itself, like random_agent, would otherwise miss heartbeats).
        import torch  # noqa: F401

        self.checkpoints: list[str] = []
        self.identity = Identity.from_env()
        self.last_checkpoint_t = time.monotonic()
        self.checkpointed = False  # this launch wrote (or tried) a checkpoint already
        self._writing: asyncio.Task | None = None
        # Learner 0 with run.eval_every / eval_interval_s; its process starts at registration.
        self.evaluator = (
            Evaluator(self.cfg, self.run_dir / "policy") if self.index == 0 and evaluation_on(self.cfg) else None
        )
        self._evaluating: asyncio.Task | None = None  # scoring the copies waiting, one at a time
        self._waiting: collections.deque[tuple] = collections.deque()  # policies copied, oldest first

    async def _maybe_checkpoint(self) -> None:
        r = self.cfg.run
        if self.index != 0:
            return
        by_steps = r.checkpoint_every and self.total_steps % r.checkpoint_every == 0
        by_time = (
            r.checkpoint_interval_s is not None and time.monotonic() - self.last_checkpoint_t >= r.checkpoint_interval_s
        )
        # A run pre-empted before its first interval must not start over: the first checkpoint comes
        # with the first weights published after learning started.
        first = (
            not self.checkpointed
            and (r.checkpoint_interval_s is not None or bool(r.checkpoint_every))
            and self.counters["learner_steps"] >= self.first_publication_step()
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
        if ev is not None and ev.due(self.total_steps):
            await self._take_policy(self.total_steps, ev.mark(self.total_steps))

    def _locked_policy(self) -> tuple[object, dict] | None:
        with self.core_lock:  # between two steps: never weights torn across a step
            return self.core.acting_policy()

    async def _take_policy(self, learner_steps: int, due_t: float) -> None:
        """Copy the current policy (training waits that long) for the evaluation process, which scores
        one at a time: copies wait, MAX_WAITING at most (past it the oldest is dropped, counted skipped)."""
        ev = self.evaluator
        env_steps = self.run_counters.get("env_steps", 0)
        t0 = time.perf_counter()
        policy = await asyncio.to_thread(self._locked_policy)
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
            self._evaluating = self.spawn(self._evaluate(ev), "evaluation")

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
            reply = await self.coordinator.request(
                "run_state", {"counters": dict(self.counters)}, timeout_s=self.cfg.cluster.coordinator_timeout_s
            )
            return dict(reply.meta)
        except Exception as exc:  # the coordinator is gone: the last counters a heartbeat brought
            self.log.warning("checkpoint without the coordinator's run state (%r); using the last heartbeat's", exc)
            return dict(self.run_counters)

    async def _checkpoint(self, reason: str, coordinator: bool = True) -> None:
        """Serialize the core between steps (training waits), write the file in the background."""
        self.last_checkpoint_t = time.monotonic()
        self.checkpointed = True
        if self._writing is not None:
            await self._writing  # one file at a time
        run_state = await self._run_state() if coordinator else dict(self.run_counters)
        lock_timeout_s = self.cfg.cluster.phase_timeout_s

        def serialize():
            # Bounded: a step stuck in a collective with a dead peer must not hold up the exit.
            if not self.core_lock.acquire(timeout=lock_timeout_s):
                raise TimeoutError(f"a learner step held the core for over {lock_timeout_s:g} s")
            try:
                state = self.core.state_dict()
                return None if state is None else checkpoint.serialize(state)
            finally:
                self.core_lock.release()

        try:
            payload = await asyncio.to_thread(serialize)
        except checkpoint.CheckpointError as exc:
            self.log.error("checkpoint at learner step %d (%s): %s", self.total_steps, reason, exc)
            return
        if payload is None:
            return
        meta = self.identity.stamp(
            {
                "reason": reason,
                "run": run_state,
                "algo": self.cfg.algo,
                "config_hash": self.cfg.config_hash(),
                "time": time.time(),
            }
        )
        steps, keep, directory = self.total_steps, self.cfg.run.keep_checkpoints, self.run_dir / "checkpoints"

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

    async def on_abnormal_end(self, why: str) -> None:
        if self.index != 0 or self.core is None:
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
                if self.evaluator is not None and ev.last_step != self.total_steps:
                    self.log.info("final evaluation: the policy at learner step %d", self.total_steps)
                    await self._take_policy(self.total_steps, ev.mark(self.total_steps))
                    if self._evaluating is not None:
                        await asyncio.wait({self._evaluating})
        except TimeoutError:
            self.log.warning(
                "the final evaluation did not end within %g s (%g x cluster.phase_timeout_s): "
                "stopped; policy/best/ is the best of the evaluations before it",
                budget_s,
                FINAL_EVALUATION_SHARE,
            )

    async def _finish_outputs(self) -> None:
        if self.evaluator is not None and self._signals == 0:  # a signal asks for a prompt end
            await self._final_evaluation()
        if self.evaluator is not None:
            self.evaluator.interrupt()  # one in flight ends at its next env step, unrecorded
        if self._evaluating is not None:
            await asyncio.gather(self._evaluating, return_exceptions=True)  # its error failed the role
        await self._publish_weights()
        await self._checkpoint("final")
        await self._checkpoint_written()
        directory = self.run_dir / "policy"
        directory.mkdir(parents=True, exist_ok=True)
        path = await asyncio.to_thread(self.core.export_policy, str(directory))
        if path:
            self.log.info("exported policy to %s", path)
