"""Mutants of a role's worker threads (issue 30: the CPU a run spends): each leaves the threads
that run a role's offloaded steps on MKL's default thread count instead of the process's;
tests/test_role_threads.py catches each."""

TEST = "tests/test_role_threads.py::test_a_roles_worker_threads_keep_the_processs_torch_thread_count"

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
        old="asyncio.Runner(loop_factory=role_loop)",
        new="asyncio.Runner(loop_factory=__import__('uvloop').new_event_loop)",
        tests=[TEST],
    ),
]
