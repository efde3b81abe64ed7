"""Mutants of the parts guard ("Parts own their state") and of the complexity list: each breaks one
rule of tests/tooling/test_layers.py, and its tests on a tiny synthetic package must catch it."""

LAYERS = "tests/tooling/test_layers.py"
MIXIN = f"{LAYERS}::test_the_guard_flags_a_mixin_that_reads_its_hosts_state"
TEMPLATE = f"{LAYERS}::test_the_guard_counts_a_template_bases_class_annotations"
BASES = f"{LAYERS}::test_the_guard_follows_a_base_through_imports_to_what_it_assigns"
KINDS = f"{LAYERS}::test_the_guard_sees_every_way_to_set_and_read_and_the_stdlib_bases_it_checks"
SHRINK = f"{LAYERS}::test_the_allowlists_only_shrink"
SYNTHETIC = [MIXIN, TEMPLATE, BASES, KINDS]

MUTANTS = [
    dict(
        name="parts-guard-stops-following-bases",
        path=LAYERS,
        old="        for base in info.node.bases:\n            parts = _dotted(base)\n",
        new="        for base in info.node.bases[:0]:\n            parts = _dotted(base)\n",
        tests=SYNTHETIC,
    ),
    dict(
        name="parts-guard-stops-counting-class-annotations",
        path=LAYERS,
        old="        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):\n",
        new="        elif isinstance(stmt, ast.AugAssign):\n",
        tests=SYNTHETIC,
    ),
    dict(
        name="parts-guard-stops-counting-self-stores",
        path=LAYERS,
        old="            else:\n                info.stored.add(child.attr)\n",
        new="            else:\n                pass\n",
        tests=SYNTHETIC,
    ),
    dict(
        name="parts-guard-ignores-setattr",
        path=LAYERS,
        old='for fn, arity in (("setattr", 3), ("object.__setattr__", 3)):',
        new='for fn, arity in (("object.__setattr__", 3),):',
        tests=SYNTHETIC,
    ),
    dict(
        name="parts-guard-misses-getattr-reads",
        path=LAYERS,
        old='_literal_attr(child, "getattr", me, 2)',
        new='_literal_attr(child, "getattr", me, 3)',
        tests=SYNTHETIC,
    ),
    dict(
        name="parts-guard-follows-no-imports",
        path=LAYERS,
        old="            return self.resolve_qualified(module, ([attr] if attr else []) + rest, depth + 1)\n",
        new="            return None\n",
        tests=SYNTHETIC,
    ),
    dict(
        name="parts-guard-reads-closures-that-rebind-self",
        path=LAYERS,
        old="isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and me in _parameters(child):",
        new="isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not _parameters(child):",
        tests=SYNTHETIC,
    ),
    dict(
        name="parts-guard-checks-classes-with-a-third-party-base",
        path=LAYERS,
        old="    if module not in CHECKED_STDLIB:\n        return None\n",
        new="    if module not in CHECKED_STDLIB:\n        return set()\n",
        tests=SYNTHETIC,
    ),
    dict(
        name="parts-guard-forgets-what-stdlib-bases-define",
        path=LAYERS,
        old="    members = {n for k in cls.__mro__ for n in vars(k)}\n",
        new="    members = set()\n",
        tests=SYNTHETIC,
    ),
    dict(
        name="parts-guard-ignores-the-allowlist",
        path=LAYERS,
        old="    new = {cls: attrs - known.get(cls, set()) for cls, attrs in found.items()}\n",
        new="    new = dict(found)\n",
        tests=[SHRINK],
    ),
    dict(
        name="parts-guard-keeps-stale-allowlist-entries",
        path=LAYERS,
        old="    stale = {cls: attrs - found.get(cls, set()) for cls, attrs in known.items()}\n",
        new="    stale = {cls: set() for cls in known}\n",
        tests=[SHRINK],
    ),
    dict(
        name="complexity-list-keeps-stale-entries",
        path=LAYERS,
        old="sorted((Counter(known) - Counter(found)).elements())",
        new="[]",
        tests=[SHRINK],
    ),
    dict(
        name="complexity-list-counts-a-name-once",
        path=LAYERS,
        old="sorted((Counter(found) - Counter(known)).elements())",
        new="sorted(set(found) - set(known))",
        tests=[SHRINK],
    ),
]
