"""The documentation site builds strictly, and what it generates from the code says what the code
says (issue 27): every key `aiorl config keys` knows with its type, default and doc, each
algorithm's keys, math and examples, the metrics keys, and the Python API's docstrings.

The site is built once, as `make docs` builds it but into a temporary directory; the expected
values are read in-process from the modules the site's generator reads (`aiorl.experiment.reference`,
the registry, `aiorl.io.metrics`). MkDocs is the `docs` extra: without it these tests fail (CI
installs every extra), they are not skipped."""

from __future__ import annotations

import ast
import html
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from aiorl.algos import available_algorithms, get_settings
from aiorl.experiment import reference as config_reference
from aiorl.io.metrics import ROW_KEYS

ROOT = Path(__file__).resolve().parents[2]
DOCS_PACKAGES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def _missing_docs_packages() -> list[str]:
    missing = []
    for name in DOCS_PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ModuleNotFoundError, ValueError):  # the parent of a dotted name is absent
            found = False
        if not found:
            missing.append(name)
    return missing


def require_docs_extra() -> None:
    missing = _missing_docs_packages()
    if missing:
        pytest.fail(
            f"the documentation site needs the `docs` extra (pip install -e '.[docs]'): {', '.join(missing)} missing",
            pytrace=False,
        )


def test_the_docs_extra_is_installed():
    require_docs_extra()  # a failure, not a skip: CI installs every extra, and `make test` builds the site


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    require_docs_extra()
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout[-3000:]}{result.stderr[-6000:]}"
    return out


def page(site: Path, name: str) -> str:
    path = site / name / "index.html" if name else site / "index.html"
    assert path.is_file(), f"the site has no page {name or 'index'}"
    return path.read_text()


BLOCK = r"p|div|li|ul|ol|dl|dt|dd|table|thead|tbody|tr|td|th|h[1-6]|pre|br|hr|blockquote|details|summary|nav|article"


def text_of(markup: str) -> str:
    """The visible text of some HTML as a reader sees it: block elements apart, inline ones (code,
    links) run on with their words, whitespace collapsed."""
    markup = re.sub(r"<(script|style)\b.*?</\1>", " ", markup, flags=re.S)
    markup = re.sub(rf"</?(?:{BLOCK})\b[^>]*>", " ", markup)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", markup)).split())


def article(markup: str) -> str:
    """The page's own content, without the navigation (which names every page)."""
    return markup[markup.index("<article") : markup.index("</article>")]


class Tables(HTMLParser):
    """The rows of every table of a page, each under the id of the heading above it."""

    def __init__(self):
        super().__init__()
        self.rows: dict[str, list[list[str]]] = {}
        self.heading = ""
        self.cell: list[str] | None = None
        self.row: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag in ("h1", "h2", "h3", "h4"):
            self.heading = dict(attrs).get("id", "")
        elif tag == "tr":
            self.row = []
        elif tag in ("td", "th") and self.row is not None:
            self.cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.row.append(" ".join("".join(self.cell).split()))
            self.cell = None
        elif tag == "tr" and self.row is not None:
            if self.row and self.row[0] != "key":  # the header row
                self.rows.setdefault(self.heading, []).append(self.row)
            self.row = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def tables(markup: str) -> dict[str, list[list[str]]]:
    parser = Tables()
    parser.feed(article(markup))
    return parser.rows


def words(text: str) -> str:
    """Source text (a docstring, a key's doc) as the page shows it: without code backticks and
    list markers, whitespace collapsed."""
    return " ".join(re.sub(r"(?m)^\s*- ", " ", text).replace("`", "").split())


def expected_row(key) -> list[str]:
    """A key's row as `aiorl config` has it: path, type, default as YAML, doc."""
    return [key.path, key.type, config_reference._flow(key.default), words(key.doc)]


# ---------------------------------------------------------------------------- the build


def test_the_site_builds_strictly_with_every_page_of_its_nav(site):
    nav = yaml.safe_load(re.sub(r"!\S+", "", (ROOT / "mkdocs.yml").read_text()))["nav"]

    def sources(entries):
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            yield from sources(value) if isinstance(value, list) else [value]

    for source in sources(nav):
        name = "" if source == "index.md" else source.removesuffix(".md").removesuffix("index").rstrip("/")
        assert "<article" in page(site, name), source


# ---------------------------------------------------------------------------- config reference


def test_the_config_reference_holds_every_key_aiorl_config_keys_knows(site):
    rows = tables(page(site, "reference/config"))
    listed = config_reference.all_keys()  # what `aiorl config keys` prints
    shown = {row[0] for section in rows.values() for row in section}
    missing = sorted(set(listed) - {"algo"} - shown)
    assert not missing, f"the config reference leaves out keys `aiorl config keys` lists: {missing}"
    assert not shown - set(listed), f"the config reference shows keys aiorl does not know: {shown - set(listed)}"
    for key in config_reference.keys():  # the shared sections, under their own heading
        section = key.path.split(".")[0]
        assert expected_row(key) in rows[section], f"{key.path}: its row differs from `aiorl config keys`"
    algo_text = text_of(page(site, "reference/config")).split(" env ¶")[0]
    assert all(name in algo_text for name in available_algorithms())


@pytest.mark.parametrize("algo", available_algorithms())
def test_each_algorithms_model_keys_are_on_the_reference_and_on_its_page(site, algo):
    model = [k for k in config_reference.keys(algo) if k.path.startswith("model.")]
    expected = [expected_row(k) for k in model]
    assert tables(page(site, "reference/config")).get(f"model-{algo}", []) == expected
    algo_page = page(site, f"algorithms/{algo}")
    assert [row for rows in tables(algo_page).values() for row in rows] == expected
    compact = "".join(text_of(article(algo_page)).split())
    for key, value in get_settings(algo).agent_defaults.items():  # its own defaults of shared keys
        assert f"agent.{key}:{config_reference._flow(value)}" in compact, key


# ---------------------------------------------------------------------------- algorithm pages


def module_docstring(relative: str) -> str:
    return ast.get_docstring(ast.parse((ROOT / relative).read_text()))


def examples_of(algo: str) -> list[Path]:
    return [p for p in sorted((ROOT / "examples").glob("*.yaml")) if yaml.safe_load(p.read_text())["algo"] == algo]


@pytest.mark.parametrize("algo", available_algorithms())
def test_each_algorithm_page_states_its_math_and_includes_its_examples(site, algo):
    text = text_of(article(page(site, f"algorithms/{algo}")))
    docstring = module_docstring(f"aiorl/algos/{algo}.py")
    text = text.replace("`", "")  # formulas are code blocks, where the docstring's backticks stay
    for paragraph in docstring.split("\n\n"):  # every paragraph and formula of the docstring
        said = words(paragraph)
        assert said in text, f"algorithms/{algo}: the docstring's {said[:60]!r}... is not on the page"
    for example in examples_of(algo):
        first_key = next(line for line in example.read_text().splitlines() if line.startswith("algo:"))
        comment = words(example.read_text().splitlines()[0].lstrip("# "))
        assert comment in text and first_key in text, f"algorithms/{algo} does not include {example.name}"


def test_the_algorithms_page_lists_the_registry(site):
    markup = article(page(site, "algorithms"))
    for algo in available_algorithms():
        first = words(module_docstring(f"aiorl/algos/{algo}.py").split("\n\n")[0])
        assert first in text_of(markup), algo
        assert f'href="{algo}/"' in markup, f"the algorithms page does not link {algo}'s page"


# ---------------------------------------------------------------------------- metrics and the API


def test_the_metrics_page_lists_every_row_key(site):
    rows = [row for section in tables(page(site, "reference/metrics")).values() for row in section]
    shown = {name.strip() for row in rows for name in row[0].split(",")}
    assert set(ROW_KEYS) <= shown, f"metrics keys missing from the site: {sorted(set(ROW_KEYS) - shown)}"
    # Every line of the docstring's key table, each column's text, is on the page: continuation
    # lines of a meaning included.
    text = text_of(article(page(site, "reference/metrics")))
    lines = module_docstring("aiorl/io/metrics.py").splitlines()
    rules = [i for i, line in enumerate(lines) if re.fullmatch(r"=+ +=+", line.strip())]
    for line in lines[rules[0] + 1 : rules[1]]:
        for piece in re.split(r"\s{2,}", line.strip()):
            assert words(piece.replace("``", "")) in text, f"the metrics page lacks {piece!r}"


def test_the_api_page_holds_the_public_apis_docstrings(site):
    import aiorl

    markup = page(site, "reference/api")
    text = text_of(article(markup))
    run_doc = words(inspect.getdoc(aiorl.run))
    assert run_doc in text, "the API page does not hold aiorl.run's docstring"
    for name in aiorl.__all__:
        if name == "__version__":
            continue
        obj = getattr(aiorl, name)
        path = f"{obj.__module__}.{obj.__qualname__}"
        assert f'id="{path}"' in markup, f"aiorl.{name} ({path}) has no entry on the API page"
        doc = inspect.getdoc(obj) or ""
        if doc.startswith(f"{obj.__name__}("):  # the signature a dataclass without a docstring gets
            continue
        first = words(doc.split("\n\n")[0])
        assert first in text, f"aiorl.{name}: its docstring is not on the API page"
