"""Sizes and import circles of every distribution: does the core stay small?

Checks, and prints what it measures:

* the core distribution (``diffract_core/``) holds at most ``CORE_MAX_CODE`` lines of
  code (lines that are not blank, not comments and not docstrings) and at most
  ``CORE_MAX_LINES`` lines in all (as ``wc -l`` counts them): the first is the size the
  core is held to, the second keeps its documentation from growing unnoticed;
* no module of any distribution is longer than ``MODULE_MAX_LINES`` (the Triton kernel
  modules of kernel_fun excepted: a kernel and its launch code stay together);
* no distribution has an import circle: the graph of its modules' imports, at the top of
  a module and inside its functions alike (``TYPE_CHECKING`` blocks left out: they run
  for type checkers only), has no cycle. An import inside a function defers the load,
  not the dependency: a reader who follows it walks the same circle.

    python tools/sizes.py            # exit 1 when a limit is exceeded or a circle found

tests/test_sizes.py runs it in CI.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: A ratchet: the core's size today plus a little, on the way to issue 37's 5,000. Issue
#: 56 raised it by 5 code lines (config.py, shorter, paid for the rest): the one "inside"
#: rule every reader calls lives in the core, whose own side file (trainer_state.json)
#: obeys it and whose plugin surface hands it to third-party readers. Issue 60 raised it
#: by 59 code lines. 46: a URL is not a path, and a checkpoint's identity is a core record.
#: Object storage itself is a distribution (diffractml-sources-fsspec); the core gained the
#: seam alone: a format's schemes, stat and glob; URLs kept as URLs by open_path; an
#: identity of size and version tag checked through the format; the stores' ModelSource
#: import under TYPE_CHECKING (the lookup through the catalog would close a circle). 13:
#: a parameter's views kept with it in the chunks and the pool's tasks, so they slice it
#: where it was read (from object storage each re-read is fetched again: 1.6-3.4x).
#: Issue 60 again, 52 code lines: the runner runs kernels that read the same weights of
#: the same units on one read (read_together; per unit in this process, per task in the
#: pool), what ``diffract track``'s esd and svd need to fetch each tensor once (2.00x).
#: A unit's inputs, its kernels' outcomes and the pool's tasks carry their kernel now.
#: 2 more: a remote cluster's workers read checkpoints in object storage themselves
#: (an executor's reads_files may say "urls"), never shipped from the session.
#: Issue 71, 46 code lines: the distributions got names of their own (diffractml-*), and
#: the core now says in one line when another distribution (the registry's original
#: diffract-core) installed a `diffract` package over or under it (_diffract_shared, a
#: module outside the package so the command speaks even when the other's files won),
#: and `diffract --version` lists each installed distribution of the project.
#: Issue 77, 11 code lines: an executor a user chose (a plugin's: Ray, Dask) that ran none
#: of a step, the work being too small for its workers to pay, says so once, where the
#: decision is taken (the runner), instead of leaving the choice silently unused. 8 more:
#: install_hint tells a distribution that is installed but not loaded (autoload=False,
#: allow=, the environment variables) how to load it, not to pip install it again.
CORE_MAX_CODE = 6208
CORE_MAX_LINES = 9015
MODULE_MAX_LINES = 600
#: Modules exempt from MODULE_MAX_LINES (relative to ROOT).
EXEMPT = ("kernel_fun_gpu/src/kernel_fun/ops/*/_triton.py",)


def code_lines(source: str) -> int:
    """Lines that are not blank, not comments and not docstrings."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(1 for number, line in enumerate(source.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and number not in docstrings)


def distributions() -> dict[str, Path]:
    """Distribution folder (relative) -> its source root (the folder holding packages)."""
    out = {}
    for pyproject in sorted(ROOT.glob("**/pyproject.toml")):
        folder = pyproject.parent
        if folder == ROOT or ".venv" in folder.parts or "site-packages" in folder.parts:
            continue
        src = folder / "src"
        out[str(folder.relative_to(ROOT))] = src if src.is_dir() else folder
    return out


def modules(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module under ``src``."""
    out = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts:
            out[".".join(parts)] = path
    return out


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if _type_checking(node):
            return  # for type checkers only
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from package import module`` depends on the module, not on the package's
            # __init__ (which may re-export its modules: that is no circle)
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            targets = subs if len(subs) == len(node.names) else [base, *subs]
        for target in targets:
            while target and target not in known:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def check() -> list[str]:
    """Every problem found (empty: within the limits), printing the measurements."""
    problems = []
    from fnmatch import fnmatch

    for folder, src in distributions().items():
        mods = modules(src)
        texts = {n: p.read_text() for n, p in mods.items()}
        lines = {n: len(t.splitlines()) for n, t in texts.items()}
        total, code = sum(lines.values()), sum(code_lines(t) for t in texts.values())
        print(f"{folder}: {len(mods)} modules, {total} lines ({code} of code), longest "
              f"{max(lines.values(), default=0)}")
        if folder == "diffract_core" and code > CORE_MAX_CODE:
            problems.append(f"{folder}: {code} lines of code, more than {CORE_MAX_CODE}")
        if folder == "diffract_core" and total > CORE_MAX_LINES:
            problems.append(f"{folder}: {total} lines in all, more than {CORE_MAX_LINES}")
        for n, count in lines.items():
            rel = str(mods[n].relative_to(ROOT))
            if count > MODULE_MAX_LINES and not any(fnmatch(rel, e) for e in EXEMPT):
                problems.append(f"{rel}: {count} lines, more than {MODULE_MAX_LINES}")
        graph = {n: imports(p, n, set(mods)) for n, p in mods.items()}
        for group in circles(graph):
            problems.append(f"{folder}: import circle among {', '.join(group)}")
    return problems


def main() -> int:
    problems = check()
    for problem in problems:
        print(f"sizes: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
