"""Mutants of issue 44's archive checks: a policy archive that could run code, write a file or take
memory, and a checkpoint larger than its records or a write that fails; each was checked by hand."""

ZIP = "aiorl/io/zip_members.py"
POLICY = "aiorl/io/policy_archive.py"
CKPT = "aiorl/io/checkpoint.py"
ARCHIVE = "aiorl/io/torch_archive.py"
D = "tests/rundirs/test_doctored_policies.py::"
DOCTORED = D + "test_a_doctored_policy_is_refused_in_one_line_and_runs_nothing"
READERS = D + "test_an_archive_two_readers_could_see_differently_is_refused"
S = "tests/rundirs/test_checkpoint_sizes.py::"
SPARSE = S + "test_a_sparse_checkpoint_larger_than_its_records_is_refused_before_it_is_hashed"
OPS = "tests/rundirs/test_policy_ops.py::"

MUTANTS = [
    # ------------------------------------------------------------------ the zip both readers see
    dict(
        name="archive-duplicate-names-allowed",
        path=ZIP,
        old="        if folded in seen:\n",
        new="        if False:\n",
        tests=[
            DOCTORED + "[sample inputs twice, the pickle first]",
            DOCTORED + "[weights config twice, the pickled first]",
        ],
    ),
    dict(
        name="archive-duplicate-names-case-sensitive",
        path=ZIP,
        old="        folded = member.name.casefold()\n",
        new="        folded = member.name\n",
        tests=[DOCTORED + "[sample inputs twice, in another case]"],
    ),
    dict(
        name="archive-local-header-name-unchecked",
        path=ZIP,
        old="    if sig != LOCAL_SIG or head[:nlen] != raw_name:\n",
        new="    if sig != LOCAL_SIG:\n",
        tests=[READERS + "[a local header naming another entry]"],
    ),
    dict(
        name="archive-compressed-entries-allowed",
        path=ZIP,
        old="    if flags & ENCRYPTED or method != 0:\n",
        new="    if flags & ENCRYPTED:\n",
        tests=[READERS + "[a zip bomb]"],
    ),
    dict(
        name="archive-declared-size-trusted",
        path=ZIP,
        old="    if usize != csize or disk not in (0, FULL16):\n",
        new="    if disk not in (0, FULL16):\n",
        tests=[READERS + "[a stored entry claiming 3 GiB]"],
    ),
    dict(
        name="archive-bytes-outside-members-allowed",
        path=ZIP,
        old="    if at != directory_offset:\n",
        new="    if False:\n",
        tests=[SPARSE + "[a hole before the directory]"],
    ),
    # ------------------------------------------------------------------ what the policy holds
    dict(
        name="policy-any-aten-op-allowed",
        path=POLICY,
        old='SAFE_TARGET = re.compile("|".join(re.escape(target) for target in sorted(ALLOWED_TARGETS)))',
        new='SAFE_TARGET = re.compile(r"(torch\\.ops\\.(aten|prims)\\.\\w+\\.\\w+|_operator\\.\\w+)")',
        tests=[DOCTORED + "[aten.from_file]", DOCTORED + "[aten.copy_]", DOCTORED + "[an op off the list]"],
    ),
    dict(
        name="policy-file-size-uncapped",
        path=POLICY,
        old="    if size > MAX_POLICY_BYTES:\n",
        new="    if False:\n",
        tests=[D + "test_a_sparse_archive_past_the_cap_is_refused_unread"],
    ),
    dict(
        name="policy-json-keys-twice-allowed",
        path=POLICY,
        old="        return unique_json.loads(data)\n",
        new="        return __import__('json').loads(data)\n",
        tests=[DOCTORED + "[a key twice in the weights config]"],
    ),
    dict(
        name="policy-weight-sizes-unchecked",
        path=POLICY,
        old="        if needed is None or needed > record.size:\n",
        new="        if needed is None:\n",
        tests=[DOCTORED + "[an empty weight of huge sizes]", DOCTORED + "[a weight larger than its record]"],
    ),
    dict(
        name="policy-expression-powers-allowed",
        path=POLICY,
        old='        if op == "*" and previous == "*":\n',
        new="        if False:\n",
        tests=[DOCTORED + "[a power tower]"],
    ),
    dict(
        name="policy-expression-huge-integers-allowed",
        path=POLICY,
        old='        if number is not None and len(number.lstrip("0")) > MAX_EXPR_DIGITS:\n',
        new="        if False:\n",
        tests=[DOCTORED + "[a huge integer]"],
    ),
    dict(
        name="policy-expression-length-unbounded",
        path=POLICY,
        old="    if len(expr) > MAX_EXPR_CHARS:\n",
        new="    if False:\n",
        tests=[DOCTORED + "[a long expression]"],
    ),
    dict(
        name="policy-expression-depth-unbounded",
        path=POLICY,
        old="        if tokens > MAX_EXPR_TOKENS or depth > MAX_EXPR_DEPTH:\n",
        new="        if tokens > MAX_EXPR_TOKENS:\n",
        tests=[DOCTORED + "[a deep expression]"],
    ),
    dict(
        name="policy-allowed-ops-stale",
        path=POLICY,
        old="layer_norm.default linear.default",
        new="linear.default",
        tests=[OPS + "test_every_op_aiorls_networks_export_is_allowed"],
    ),
    # ------------------------------------------------------------------ checkpoints
    dict(
        name="checkpoint-hashed-before-its-sizes",
        path=CKPT,
        old="        f.check_sizes(parts)\n        f.check_digest(parts)\n",
        new="        f.check_digest(parts)\n",
        tests=[SPARSE + "[a record no tensor names]"],
    ),
    dict(
        name="checkpoint-read-whole-without-its-sizes",
        path=CKPT,
        old="        f.check_sizes(parts)\n        data = f.read_at(0, f.size)\n",
        new="        data = f.read_at(0, f.size)\n",
        tests=[SPARSE + "[a record no tensor names]"],
    ),
    dict(
        name="checkpoint-damage-reported-as-sizes",
        path=CKPT,
        old="        if parts.payload_len <= HASHED_ANYWAY_BYTES:",
        new="        if False:",
        tests=[S + "test_a_small_file_damaged_in_its_zip_directory_is_named_corrupt"],
    ),
    dict(
        name="checkpoint-unreferenced-records-allowed",
        path=ARCHIVE,
        old='        if record.startswith("data/") and record not in check.storages:\n',
        new="        if False:\n",
        tests=[SPARSE + "[a record no tensor names]"],
    ),
    dict(
        name="checkpoint-write-error-unnamed",
        path=CKPT,
        old='        raise WriteError(exc.errno, f"{path}: {what} not written ({reason}); no partial file left") from None\n',
        new="        raise\n",
        tests=[S + "test_a_full_disk_leaves_no_temporary_file_and_names_the_checkpoint"],
    ),
    dict(
        name="checkpoint-temporary-file-left",
        path=CKPT,
        old="        with contextlib.suppress(OSError):\n            tmp.unlink()\n",
        new="        pass\n",
        tests=[
            S + "test_a_full_disk_leaves_no_temporary_file_and_names_the_checkpoint",
            S + "test_a_write_that_fails_half_way_leaves_no_temporary_file",
        ],
    ),
]
