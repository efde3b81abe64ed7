"""Mutants of a role's worker threads (issue 30: the CPU a run spends): an actor's threads left on
MKL's default thread count instead of the process's, or a learner's held to it;
tests/runtime/test_role_threads.py catches each."""

TEST = "tests/runtime/test_role_threads.py::test_an_actors_worker_threads_keep_the_processs_torch_thread_count"
LEARNER = "tests/runtime/test_role_threads.py::test_a_learners_worker_threads_keep_mkls_own_thread_count"

MUTANTS = [
    dict(
        name="role-executor-threads-start-without-the-torch-thread-count",
        path="aiorl/runtime/process.py",
        old='ThreadPoolExecutor(thread_name_prefix="asyncio", initializer=torch_threads_here)',
        new='ThreadPoolExecutor(thread_name_prefix="asyncio")',
        tests=[TEST],
    ),
    dict(
        name="run-role-on-a-plain-uvloop-loop",
        path="aiorl/runtime/process.py",
        old="asyncio.Runner(loop_factory=lambda: role_loop(kind))",
        new="asyncio.Runner(loop_factory=__import__('uvloop').new_event_loop)",
        tests=[TEST],
    ),
    dict(
        name="learner-threads-held-to-the-torch-thread-count",
        path="aiorl/runtime/process.py",
        old='    if kind == "actor":\n        loop.set_default_executor(',
        new="    if True:\n        loop.set_default_executor(",
        tests=[LEARNER],
    ),
]
