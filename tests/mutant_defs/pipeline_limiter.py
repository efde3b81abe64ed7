"""Mutants of issue #28's first part: the rate limiter that never stalls the pipeline (credits
pipelined on both sides, a band derived from them, a held side named by its bound) and IMPALA's
throttle under the same credits.

Run them with `.venv/bin/python tests/mutants.py --only pipeline_limiter`.
"""

LIMIT = "tests/replay/test_ratelimit.py"
BAND = f"{LIMIT}::test_the_band_holds_and_someone_can_always_move"
MIDDLE = f"{LIMIT}::test_from_the_middle_of_the_band_neither_side_waits_for_its_whole_window"
EAGER = f"{LIMIT}::test_an_eager_learner_is_held_by_the_ratio_and_never_starves_the_actors"
SLOW = f"{LIMIT}::test_a_slow_learner_gets_every_batch_it_asks_for_and_holds_the_actors"
FLOOR = f"{LIMIT}::test_the_error_buffer_follows_acme_with_a_floor_of_both_sides_credits"
FLOW = f"{LIMIT}::test_credits_go_out_deep_and_evenly_and_come_back_when_an_actor_goes_away"
HELD = f"{LIMIT}::test_a_learner_held_back_is_counted_by_its_bound"
BOUNDS = f"{LIMIT}::test_each_bound_is_named"
RESTORE = f"{LIMIT}::test_a_restored_shard_starts_in_the_middle_of_the_band"
RUN = f"{LIMIT}::test_a_limited_run_keeps_the_ratio_and_the_slower_side_never_waits_on_round_trips"
SLOW_RUN = f"{LIMIT}::test_a_slow_learner_holds_the_actors_back_by_credits_and_nothing_is_dropped"
ROOM = "tests/replay/test_trajectory_queue.py::test_queue_room_grants_credits_while_the_queue_has_room_for_them"

MUTANTS = [
    # ------------------------------------------------------------------ the band
    dict(
        name="band_leaves_out_the_actors_credits",
        path="aiorl/runtime/ratelimit.py",
        old="self.error_buffer = max(tolerance * self.spi * self.min_size, self.learner_window + self.actor_window)",
        new="self.error_buffer = max(tolerance * self.spi * self.min_size, self.learner_window + self.spi * self.batch_rows)",
        tests=[MIDDLE, EAGER, FLOOR],
    ),
    dict(
        name="band_leaves_out_the_learners_prefetch",
        path="aiorl/runtime/ratelimit.py",
        old="self.error_buffer = max(tolerance * self.spi * self.min_size, self.learner_window + self.actor_window)",
        new="self.error_buffer = max(tolerance * self.spi * self.min_size, self.learner_batch + self.actor_window)",
        tests=[MIDDLE, FLOOR],
    ),
    dict(
        name="actor_window_counts_one_actor",
        path="aiorl/runtime/ratelimit.py",
        old="self.actor_window = self.spi * actors * self.actor_credits * self.batch_rows",
        new="self.actor_window = self.spi * self.actor_credits * self.batch_rows",
        tests=[MIDDLE, EAGER],
    ),
    dict(
        name="grant_forgets_the_credits_already_out",
        path="aiorl/runtime/ratelimit.py",
        old="return (self.inserted + self.reserved + self.batch_rows) * self.spi - self.sampled <= self.max_diff",
        new="return (self.inserted + self.batch_rows) * self.spi - self.sampled <= self.max_diff",
        tests=[BAND],
    ),
    dict(
        name="lower_bound_ignores_the_batch_drawn",
        path="aiorl/runtime/ratelimit.py",
        old="        if self.diff - self.learner_batch < self.min_diff:",
        new="        if self.diff < self.min_diff:",
        tests=[BAND],
    ),
    dict(
        name="min_size_not_a_bound",
        path="aiorl/runtime/ratelimit.py",
        old="        if size < self.min_size:\n            return MIN_SIZE",
        new="        if size < 0:\n            return MIN_SIZE",
        tests=[FLOOR, BOUNDS],
    ),
    dict(
        name="restore_starts_at_the_band_bottom",
        path="aiorl/runtime/ratelimit.py",
        old="self.sampled = max(0, math.floor(size * self.spi - self.spi * self.min_size))",
        new="self.sampled = max(0, math.floor(size * self.spi - self.min_diff))",
        tests=[RESTORE],
    ),
    # ------------------------------------------------------------------ the memory host's credits
    dict(
        name="credits_two_deep_whatever_the_limiter_says",
        path="aiorl/runtime/memory/flow.py",
        old="        depth = self.limiter.actor_credits\n",
        new="        depth = 2\n",
        tests=[FLOW, RUN],
    ),
    dict(
        name="default_depth_back_to_two",
        path="aiorl/config/sections.py",
        old="    \"and IMPALA's queue): deep enough to hide a credit's round trip (see aiorl/runtime/ratelimit.py).\",\n        default=16,",
        new="    \"and IMPALA's queue): deep enough to hide a credit's round trip (see aiorl/runtime/ratelimit.py).\",\n        default=2,",
        tests=[RUN],
    ),
    dict(
        name="band_sized_for_one_learner_credit",
        path="aiorl/runtime/memory/replay_store.py",
        old="            learner_credits=c.learners * c.learner_credits,",
        new="            learner_credits=1,",
        tests=[f"{LIMIT}::test_a_memory_host_sizes_its_band_for_every_actor_and_learner_credit"],
    ),
    dict(
        name="closed_actor_keeps_its_credits",
        path="aiorl/runtime/memory/flow.py",
        old="            self.limiter.release(link.credits)\n",
        new="            self.limiter.release(0)\n",
        tests=[FLOW],
    ),
    dict(
        name="starved_actor_not_named_held",
        path="aiorl/runtime/memory/flow.py",
        old="                starved = any(link.credits == 0 for link in open_links)",
        new="                starved = False",
        tests=[FLOW, SLOW_RUN],
    ),
    dict(
        name="held_counts_not_kept",
        path="aiorl/runtime/memory/flow.py",
        old="        self.holds[bound] += 1\n",
        new="",
        tests=[HELD, RUN],
    ),
    dict(
        name="sample_blocked_counts_the_wrong_bound",
        path="aiorl/runtime/memory/replay_store.py",
        old="                if bound == RATIO_LOWER:",
        new="                if bound != RATIO_LOWER:",
        tests=[RUN],
    ),
    dict(
        name="limiter_metrics_not_in_rows",
        path="aiorl/runtime/coordinator/report.py",
        old='if k.startswith(("queue/", "limiter/"))',
        new='if k.startswith("queue/")',
        tests=[RUN],
    ),
    # ------------------------------------------------------------------ IMPALA's queue room
    dict(
        name="queue_room_never_counts_a_throttled_grant",
        path="aiorl/runtime/fragments.py",
        old="        self._blocked = True\n",
        new="        pass\n",
        tests=[ROOM],
    ),
    dict(
        name="queue_room_ignores_credits_out",
        path="aiorl/runtime/fragments.py",
        old="return not self.throttle or len(self.queue) + (self.reserved + 1) * self.per_message <= self.queue.capacity",
        new="return not self.throttle or len(self.queue) + self.per_message <= self.queue.capacity",
        tests=[ROOM],
    ),
]
