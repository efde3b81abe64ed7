"""Mutants of the tests' own machinery (issue 43, tests by concern): the `launch` fixture ends every
run it started, also when its test fails (tests/cluster/test_fixture.py runs such a test); bench/common.py writes the machine block, always ends
a launch and reads only whole metrics rows (tests/tooling/test_bench_tidy.py)."""

BENCH = "tests/tooling/test_bench_tidy.py::"

MUTANTS = [
    dict(
        name="launch-fixture-leaves-its-runs-running",
        path="tests/cluster_helpers.py",
        old="        for proc, run_dir, since in self.launched:\n            end(proc)",
        new="        for proc, run_dir, since in []:\n            end(proc)",
        tests=["tests/cluster/test_fixture.py::test_a_launched_run_whose_test_fails_mid_way_is_ended_at_teardown"],
    ),
    dict(
        name="bench-json-without-machine-block",
        path="bench/common.py",
        old='    result["machine"] = machine(load_before)\n',
        new="    pass\n",
        tests=[BENCH + "test_every_json_gains_the_machine_block_a_list_under_rows"],
    ),
    dict(
        name="bench-launch-left-running",
        path="bench/common.py",
        old="    def __exit__(self, *exc) -> None:\n        self.end()",
        new="    def __exit__(self, *exc) -> None:\n        pass",
        tests=[BENCH + "test_a_launch_is_always_ended"],
    ),
    dict(
        name="bench-metrics-rows-keep-a-half-written-line",
        path="bench/common.py",
        old="        except ValueError:\n            continue\n    return rows",
        new="        except ValueError:\n            rows.append({})\n    return rows",
        tests=[BENCH + "test_metrics_rows_leave_out_a_half_written_line"],
    ),
]
