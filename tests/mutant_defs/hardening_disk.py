"""Mutants of issue 44's full disk (a real one: a small tmpfs filled mid-run); each was checked by hand."""

T = "tests/cluster/test_full_disk.py::"
FULL_DISK = T + "test_a_disk_full_mid_run_ends_the_run_in_one_line_with_no_temporary_file_left"

MUTANTS = [
    dict(
        name="checkpoint-temp-left-on-a-full-disk",
        path="aiorl/io/checkpoint.py",
        old="    finally:\n        with contextlib.suppress(OSError):\n            tmp.unlink()\n    return path\n",
        new="    finally:\n        pass\n    return path\n",
        tests=[FULL_DISK],
    ),
    dict(
        name="policy-temps-left-on-a-full-disk",
        path="aiorl/io/export.py",
        old="        for tmp in temps.values():\n            with contextlib.suppress(OSError):\n                tmp.unlink(missing_ok=True)\n",
        new="        pass\n",
        tests=[FULL_DISK],
    ),
    dict(
        name="full-disk-run-restarted",
        path="aiorl/launch/local.py",
        old="    return os.strerror(errno.ENOSPC) in cause\n",
        new="    return False\n",
        tests=[T + "test_a_learner_failed_for_a_full_disk_does_not_restart_the_whole_run"],
    ),
    dict(
        name="launcher-unwritten-run-restarted",
        path="aiorl/launch/local.py",
        old="        if self.unwritten:\n",
        new="        if False:\n",
        tests=[T + "test_a_learner_failed_for_a_full_disk_does_not_restart_the_whole_run"],
    ),
    dict(
        name="policy-program-full-disk-in-torchs-words",
        path="aiorl/io/export.py",
        old="lambda f: f.write(_saved_program(program)))",
        new="lambda f: torch.export.save(program, f))",
        tests=[T + "test_a_policy_program_on_a_full_disk_is_one_line_saying_so_and_leaves_no_temporary_file"],
    ),
]
