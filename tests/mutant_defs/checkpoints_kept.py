"""Mutants of issue 25's checkpoint rules: never pruned into loss, checked before use (safe
reads, digest, payload without torch), set aside when skipped, a resume that always continues,
the first checkpoint early. Run them with `tests/mutants.py --only checkpoints_kept`.
"""

CK = "tests/rundirs/test_checkpoint.py::"
RD = "tests/rundirs/test_rundir.py::"
RA = "tests/cluster/test_resume_always.py::"
CKPT = "aiorl/io/checkpoint.py"
ARCHIVE = "aiorl/io/torch_archive.py"
REFUSED = CK + "test_a_payload_torch_refuses_is_refused_without_torch"

MUTANTS = [
    # ------------------------------------------------------------------ pruning
    dict(
        name="prune_counts_the_file_just_written_among_the_others",
        path=CKPT,
        old="        if path.name == written.name or not is_good(path):\n",
        new="        if not is_good(path):\n",
        tests=[CK + "test_pruning_keeps_the_file_just_written_past_newer_named_bad_ones"],
    ),
    dict(
        name="prune_by_name_alone_counts_and_deletes_bad_files",
        path=CKPT,
        old="        if path.name == written.name or not is_good(path):\n",
        new="        if path.name == written.name:\n",
        tests=[
            CK + "test_pruning_keeps_the_file_just_written_past_newer_named_bad_ones",
            CK + "test_pruning_counts_only_good_files_towards_keep",
        ],
    ),
    dict(
        name="prune_keeps_the_newest_names_unchecked",  # the rule before issue 25
        path=CKPT,
        old="    kept = 1\n    for path in reversed(list_checkpoints(directory)):\n",
        new=(
            "    for old in list_checkpoints(directory)[:-keep]:\n        old.unlink(missing_ok=True)\n"
            "    kept = 1\n    for path in ():\n"
        ),
        tests=[CK + "test_pruning_keeps_the_file_just_written_past_newer_named_bad_ones"],
    ),
    dict(
        name="prune_keeps_the_newest_names_unchecked_in_a_real_run",
        path=CKPT,
        old="    kept = 1\n    for path in reversed(list_checkpoints(directory)):\n        if path.name",
        new=(
            "    for old in list_checkpoints(directory)[:-keep]:\n        old.unlink(missing_ok=True)\n"
            "    kept = 1\n    for path in ():\n        if path.name"
        ),
        tests=[RA + "test_resume_twice_past_corrupt_newer_files_with_one_checkpoint_kept"],
    ),
    dict(
        name="prune_judges_by_the_header_alone",
        path=CKPT,
        old="    try:\n        verify(path)\n    except CheckpointError:\n        return False\n",
        new="    try:\n        read_meta(path)\n    except CheckpointError:\n        return False\n",
        tests=[
            CK + "test_pruning_keeps_the_file_just_written_past_newer_named_bad_ones",
            CK + "test_pruning_counts_only_good_files_towards_keep",
        ],
    ),
    dict(
        name="prune_trusts_a_file_changed_since_it_was_checked",
        path=CKPT,
        old="    if identity is not None and _known_good.get(path) == identity:\n",
        new="    if path in _known_good:\n",
        tests=[CK + "test_pruning_notices_a_kept_file_changed_since_it_was_checked"],
    ),
    dict(
        name="prune_before_the_new_file_is_on_disk",
        path=CKPT,
        old=(
            "    path = atomic_write(root / checkpoint_name(learner_steps), lambda f: f.write(data))\n"
            "    _remember_good(path)\n    prune(root, keep, path)\n"
        ),
        new=(
            "    path = root / checkpoint_name(learner_steps)\n    prune(root, keep, path)\n"
            "    atomic_write(path, lambda f: f.write(data))\n    _remember_good(path)\n"
        ),
        tests=[CK + "test_the_new_file_is_on_disk_before_an_old_one_is_deleted"],
    ),
    dict(
        name="prune_by_name_alone_in_a_real_run",
        path=CKPT,
        old="        if path.name == written.name or not is_good(path):\n            continue\n",
        new="        if path.name == written.name:\n            continue\n",
        tests=[RA + "test_resume_twice_past_corrupt_newer_files_with_one_checkpoint_kept"],
    ),
    dict(
        name="writer_leaves_a_payload_a_resume_refuses",
        path=CKPT,
        old='    check_payload(io.BytesIO(payload), f"checkpoint at learner step {learner_steps} (not written)")\n',
        new="",
        tests=[CK + "test_the_writer_refuses_a_payload_a_resume_would_refuse"],
    ),
    # ------------------------------------------------------------------ checks before use
    dict(
        name="verify_skips_the_digest",
        path=CKPT,
        old="        f.check_digest(parts)\n",
        new="",
        tests=[
            CK + "test_pruning_notices_a_kept_file_changed_since_it_was_checked",
            CK + "test_the_digest_is_checked_in_chunks",
        ],
    ),
    dict(
        name="digest_read_whole",
        path=CKPT,
        old="            chunk = self.read_at(offset, min(CHUNK_BYTES, parts.digest_offset - offset))\n",
        new="            chunk = self.read_at(0, parts.digest_offset) if offset == 0 else b'-'\n",
        tests=[CK + "test_the_digest_is_checked_in_chunks"],
    ),
    dict(
        name="verify_skips_the_payload",
        path=CKPT,
        old="        check_payload(f.window(parts.payload_offset, parts.payload_len), f.name, path)\n",
        new="",
        tests=[
            CK + "test_newest_good_falls_back_past_whole_files_whose_payload_would_not_load",
            CK + "test_a_member_failing_its_crc_is_refused",
            RD + "test_resume_never_imports_torch",
        ],
    ),
    dict(
        name="archive_any_global_allowed",
        path=ARCHIVE,
        old="            if full not in ALLOWED_GLOBALS:\n",
        new="            if False:\n",
        tests=[REFUSED, CK + "test_a_payload_with_code_is_refused_by_weights_only"],
    ),
    dict(
        name="archive_any_opcode_allowed",
        path=ARCHIVE,
        old="                if op.name not in WEIGHTS_ONLY_OPCODES:\n",
        new="                if False:\n",
        tests=[REFUSED],
    ),
    dict(
        name="archive_storage_records_unchecked",
        path=ARCHIVE,
        old="        if self.records.get(record) != nbytes:\n",
        new="        if False:\n",
        tests=[REFUSED],
    ),
    dict(
        name="archive_anything_at_the_top",
        path=ARCHIVE,
        old='                    return None if is_dict(top) else f"it holds a {type(top).__name__}, not a dict"\n',
        new="                    return None\n",
        tests=[REFUSED],
    ),
    dict(
        name="archive_items_set_on_anything",
        path=ARCHIVE,
        old="            if len(items) % 2 or not is_dict(self.stack[-1]):\n",
        new="            if len(items) % 2:\n",
        tests=[REFUSED],
    ),
    dict(
        name="archive_version_record_not_required",
        path=ARCHIVE,
        old='    if "version" not in records:\n',
        new="    if False:\n",
        tests=[REFUSED],
    ),
    dict(
        name="archive_crcs_unchecked",
        path=ARCHIVE,
        old="            bad = archive.testzip()\n",
        new="            bad = None\n",
        tests=[CK + "test_a_member_failing_its_crc_is_refused"],
    ),
    dict(
        name="archive_check_imports_torch",
        path=ARCHIVE,
        old="import pickletools\n",
        new="import pickletools\n\nimport torch  # noqa: F401\n",
        tests=[RD + "test_resume_never_imports_torch"],
    ),
    # ------------------------------------------------------------------ safe reads
    dict(
        name="read_follows_symlinks",
        path=CKPT,
        old="os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC",
        new="os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC",
        tests=[CK + "test_a_symlink_under_a_checkpoint_name_is_refused"],
    ),
    dict(
        name="read_blocks_on_a_fifo",
        path=CKPT,
        old="os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC",
        new="os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC",
        tests=[CK + "test_a_fifo_under_a_checkpoint_name_is_refused_without_hanging"],
    ),
    dict(
        name="read_takes_any_kind_of_file",
        path=CKPT,
        old="            if not stat.S_ISREG(st.st_mode):\n",
        new="            if False:\n",
        tests=[
            CK + "test_a_fifo_under_a_checkpoint_name_is_refused_without_hanging",
            CK + "test_a_directory_under_a_checkpoint_name_is_refused",
        ],
    ),
    dict(
        name="read_whole_before_the_sizes_are_checked",
        path=CKPT,
        old="        parts = f.layout()\n        f.check_sizes(parts)\n        data = f.read_at(0, f.size)\n",
        new="        data = f.read_at(0, f.size)\n        parts = f.layout()\n        f.check_sizes(parts)\n",
        tests=[CK + "test_a_huge_file_that_is_not_a_checkpoint_is_refused_without_reading_it"],
    ),
    dict(
        name="meta_read_with_the_payload",
        path=CKPT,
        old="        return parse_meta(f.read_at(parts.meta_offset, parts.meta_len), str(path))\n",
        new="        return decode(f.read_at(0, f.size), str(path))[0]\n",
        tests=[CK + "test_meta_is_read_without_the_payload"],
    ),
    # ------------------------------------------------------------------ set aside, resume
    dict(
        name="set_aside_overwrites_an_earlier_bad_file",
        path=CKPT,
        old=(
            "    while os.path.lexists(target := path.with_name(f\"{path.name}.bad{'' if n == 1 else f'.{n}'}\")):\n"
            "        n += 1\n"
        ),
        new='    target = path.with_name(f"{path.name}.bad")\n',
        tests=[CK + "test_a_file_set_aside_gets_a_name_of_its_own"],
    ),
    dict(
        name="resume_leaves_skipped_files_in_place",
        path="aiorl/io/rundir.py",
        old="        skipped = [_set_aside(self.path, error) for error in bad]\n",
        new="        skipped = bad\n",
        tests=[
            RD + "test_resume_takes_the_newest_good_checkpoint_and_records_the_launch",
            RD + "test_resume_before_the_first_checkpoint_starts_the_run_again",
        ],
    ),
    dict(
        name="resume_without_a_checkpoint_refuses",
        path="aiorl/io/rundir.py",
        old="        if resume_from is None:\n",
        new='        if resume_from is None:\n            raise RunDirError(f"--resume {self.path}: no usable checkpoint")\n',
        tests=[RD + "test_resume_before_the_first_checkpoint_starts_the_run_again"],
    ),
    dict(
        name="resume_without_a_checkpoint_refuses_a_real_run",
        path="aiorl/io/rundir.py",
        old="        if resume_from is None:\n",
        new='        if resume_from is None:\n            raise RunDirError(f"--resume {self.path}: no usable checkpoint")\n',
        tests=[RA + "test_a_run_killed_before_its_first_checkpoint_starts_again_then_continues"],
    ),
    dict(
        name="restart_from_scratch_not_recorded",
        path="aiorl/io/rundir.py",
        old='            attempt["restart_from_scratch"] = resume_from is None\n',
        new='            attempt["restart_from_scratch"] = False\n',
        tests=[RD + "test_resume_before_the_first_checkpoint_starts_the_run_again"],
    ),
    dict(
        name="starting_over_said_nowhere",
        path="aiorl/cli/main.py",
        old='        print(f"aiorl: {run_dir.starting_over}", file=sys.stderr, flush=True)\n',
        new="        pass\n",
        tests=[RA + "test_a_run_killed_before_its_first_checkpoint_starts_again_then_continues"],
    ),
    dict(
        name="learner_0_leaves_a_file_it_cannot_load",
        path="aiorl/runtime/learner_outputs.py",
        old="        if not sets_aside:\n",
        new="        if True:\n",
        tests=[CK + "test_a_chosen_file_learner_0_cannot_load_is_set_aside_for_the_next_resume"],
    ),
    # ------------------------------------------------------------------ the first checkpoint early
    dict(
        name="no_early_first_checkpoint",
        path="aiorl/runtime/learner_outputs.py",
        old='        if first:\n            await self._checkpoint("first")\n',
        new='        if False:\n            await self._checkpoint("first")\n',
        tests=[RA + "test_the_first_checkpoint_comes_with_the_first_weights_published"],
    ),
    dict(
        name="synchronous_first_checkpoint_waits_for_publish_interval",
        path="aiorl/runtime/learner_outputs.py",
        old="        return 1 if self.synchronous else self.cfg.agent.publish_interval\n",
        new="        return self.cfg.agent.publish_interval\n",
        tests=[RA + "test_the_first_checkpoint_comes_with_the_first_weights_published"],
    ),
]
