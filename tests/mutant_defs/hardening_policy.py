"""Mutants of issue 44's "a policy aiorl opens is data, not a program": the tensor file's checks, the
rebuild's size-before-allocation rule, --trust-program, and a failed export that leaves nothing behind."""

TF = "tests/rundirs/test_tensor_file.py::"
PD = "tests/rundirs/test_policy_data.py::"
DOCTORED_FILE = TF + "test_a_doctored_file_is_refused_in_one_line_naming_it"

MUTANTS = [
    dict(
        name="tensor-file-header-length-uncapped",
        path="aiorl/io/tensor_file.py",
        old="if length > MAX_HEADER_BYTES or 8 + length > file_size:",
        new="if 8 + length > file_size:",
        tests=[TF + "test_a_header_longer_than_the_cap_is_refused_though_the_file_holds_it"],
    ),
    dict(
        name="tensor-file-duplicate-keys-kept",
        path="aiorl/io/tensor_file.py",
        old='header = unique_json.loads(f.read(length).decode("utf-8"))',
        new='header = __import__("json").loads(f.read(length).decode("utf-8"))',
        tests=[DOCTORED_FILE + "[a duplicate key]"],
    ),
    dict(
        name="tensor-file-any-dtype",
        path="aiorl/io/tensor_file.py",
        old="    if dtype not in DTYPES:\n",
        new="    if False:\n",
        tests=[DOCTORED_FILE + "[a bad dtype]"],
    ),
    dict(
        name="tensor-file-span-not-its-shapes-size",
        path="aiorl/io/tensor_file.py",
        old="    if span[1] - span[0] != size:\n",
        new="    if False:\n",
        tests=[DOCTORED_FILE + "[a span not its shape's size]"],
    ),
    dict(
        name="tensor-file-gaps-allowed",
        path="aiorl/io/tensor_file.py",
        old="        if entry.begin != offset:\n",
        new="        if entry.begin < offset:\n",
        tests=[DOCTORED_FILE + "[a gap between spans]"],
    ),
    dict(
        name="tensor-file-trailing-bytes-allowed",
        path="aiorl/io/tensor_file.py",
        old="    if end != file_size:\n",
        new="    if end > file_size:\n",
        tests=[DOCTORED_FILE + "[trailing bytes]"],
    ),
    dict(
        name="tensor-file-bytes-uncapped",
        path="aiorl/io/tensor_file.py",
        old="        if offset > max_bytes:\n",
        new="        if False:\n",
        tests=[TF + "test_the_cap_on_the_tensors_bytes"],
    ),
    dict(
        name="policy-json-duplicate-keys-kept",
        path="aiorl/io/policy_data.py",
        old='meta = unique_json.loads(raw.decode("utf-8"))',
        new='meta = __import__("json").loads(raw.decode("utf-8"))',
        tests=[PD + "test_a_policy_json_with_a_duplicate_key_is_refused"],
    ),
    dict(
        name="rebuild-allocates-before-the-sizes-are-checked",
        path="aiorl/evaluation/rebuild.py",
        old='    with torch.device("meta"):\n        shapes = algo.acting_module()',
        new="    if True:\n        shapes = algo.acting_module()",
        tests=[PD + "test_rebuild_allocates_nothing_before_the_sizes_are_checked"],
    ),
    dict(
        name="rebuild-weights-not-compared-with-the-network",
        path="aiorl/evaluation/rebuild.py",
        old="    check_against(shapes, checked, max_bytes)\n",
        new="",
        tests=[PD + "test_a_doctored_record_is_refused_in_one_line_exit_2[an extra tensor]"],
    ),
    dict(
        name="rebuild-space-size-unbounded",
        path="aiorl/io/policy_data.py",
        old="    if size > MAX_SPACE_ELEMENTS:\n",
        new="    if False:\n",
        tests=[PD + "test_a_doctored_record_is_refused_in_one_line_exit_2[a gigantic observation space]"],
    ),
    dict(
        name="rebuild-keeps-the-fresh-weights",
        path="aiorl/evaluation/rebuild.py",
        old="    module.load_state_dict(state, strict=True)\n",
        new="",
        tests=[PD + "test_the_rebuilt_policy_acts_as_the_module_exported"],
    ),
    dict(
        name="program-loaded-without-trust",
        path="aiorl/io/export.py",
        old="    if not trust_program:\n        kind = ",
        new="    if False:\n        kind = ",
        tests=[PD + "test_a_program_alone_is_refused_without_trust_program"],
    ),
    dict(
        name="eval-drops-trust-program",
        path="aiorl/evaluation/evaluate.py",
        old="            args.trust_program,\n",
        new="",
        tests=[PD + "test_the_eval_of_a_real_policy_scores_and_a_program_alone_needs_trust_program"],
    ),
    dict(
        name="export-leaves-its-temporary-files",
        path="aiorl/io/export.py",
        old="                tmp.unlink(missing_ok=True)\n",
        new="                pass\n",
        tests=[PD + "test_a_failed_write_leaves_no_temporary_file_and_says_what_in_one_line"],
    ),
    dict(
        name="ddpg-policy-json-without-its-rebuild-record",
        path="aiorl/algos/apex_ddpg.py",
        old='            "rebuild": self.policy_record(),\n',
        new="",
        tests=[PD + "test_the_rebuilt_policy_acts_as_the_module_exported"],
    ),
]
