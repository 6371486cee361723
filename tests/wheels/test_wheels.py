"""The distributions as users install them (issue 71): an sdist and a wheel of each
(tools/dists.py build), installed, not editable, into fresh virtual environments that
hold only what each case needs, with a smoke test run inside each (smoke.py); and the
checks that need no environment: every file of a package is in its wheel, every import
a distribution makes is one it declares, every version is VERSION's.

The environments share pip's cache; torch is installed only where a case needs it."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import dists  # noqa: E402

sys.path.remove(str(ROOT / "tools"))

VERSION = dists.version()
#: torch as the set-up installs it (the CPU build this machine's index serves).
TORCH = "torch==2.13.0"
#: Imports a distribution makes of a library it does not declare, and why that is right.
UNDECLARED = {
    ("diffractml-core", "IPython"): "only inside a running notebook, found in sys.modules",
    ("diffractml-core", "threadpoolctl"): "only under contextlib.suppress(ImportError)",
    ("diffractml-storage-local", "torch"): "only when the caller's torch is loaded",
    ("diffractml-kernel-fun-gpu", "diffract"): "its diffract plugin, loaded by diffract only",
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement(text: str) -> str:
    return _norm(re.split(r"[<>=!~\[; ]", text.strip(), maxsplit=1)[0])


# ---------------------------------------------------------------- without environments


def test_every_version_is_the_one_in_VERSION():
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", VERSION)
    assert dists.disagreements() == []
    names = [d["name"] for d in dists.distributions()]
    assert all(n.startswith(dists.PREFIX) for n in names), names
    for d in dists.distributions():  # every dependency between them under the new names
        meta = tomllib.loads((ROOT / d["folder"] / "pyproject.toml").read_text())["project"]
        ours = [r for r in meta.get("dependencies", []) if _requirement(r).startswith("diffract")]
        assert all(_requirement(r).startswith(dists.PREFIX) for r in ours), (d["name"], ours)


def test_a_version_that_disagrees_is_found(tmp_path, monkeypatch):
    """The check above can fail: a copied distribution whose pyproject says another."""
    monkeypatch.setattr(dists, "VERSION_FILE", tmp_path / "VERSION")
    (tmp_path / "VERSION").write_text("9.9.9\n")
    found = dists.disagreements()  # every place, each with the version it holds
    assert len(found) == len(dists._places()) > len(dists.FOLDERS)
    assert all(f.endswith(f": {VERSION}") for f in found), found


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level module, guarded) of each absolute import in ``path``; guarded: inside a
    ``try`` whose handler catches ImportError, or in such a handler (a fallback)."""
    tree = ast.parse(path.read_text())
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                "ImportError" in ast.unparse(h.type or ast.Name("BaseException"))
                for h in node.handlers):
            for part in [*node.body, *(s for h in node.handlers for s in h.body)]:
                guarded.update(id(n) for n in ast.walk(part))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[0], id(node) in guarded) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module.split(".")[0], id(node) in guarded))
    return out


def undeclared(folder: Path, name: str, packages: list[str]) -> list[str]:
    """Imports in ``folder``'s sources of a distribution its pyproject does not declare
    (as a dependency or in an extra), unguarded and not in :data:`UNDECLARED`."""
    meta = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    declared = {_norm(name)} | {_requirement(r) for r in meta.get("dependencies", [])}
    for extra in meta.get("optional-dependencies", {}).values():
        declared |= {_requirement(r) for r in extra}
    providers = metadata.packages_distributions()
    found = []
    for path in sorted((folder / "src").rglob("*.py")):
        for module, guarded in _imports(path):
            if (module in sys.stdlib_module_names or module in packages or guarded
                    or module.startswith("_diffract") or (meta["name"], module) in UNDECLARED):
                continue
            owners = {_norm(d) for d in providers.get(module, [])}
            if not owners & declared:
                found.append(f"{path.relative_to(folder)} imports {module} "
                             f"({', '.join(sorted(owners)) or 'no installed distribution'})")
    return sorted(set(found))


@pytest.mark.parametrize("folder", dists.FOLDERS)
def test_every_import_is_declared(folder):
    """A distribution that imports a library declares it (a dependency or an extra):
    installed alone it would otherwise fail at that import."""
    d = next(d for d in dists.distributions() if d["folder"] == folder)
    assert undeclared(ROOT / folder, d["name"], d["packages"]) == []


def test_an_undeclared_import_is_found(tmp_path):
    """The check above can fail: a copy of the views plugin that imports scipy."""
    copy = tmp_path / "views"
    shutil.copytree(ROOT / "plugins" / "diffract_views", copy,
                    ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    module = copy / "src" / "diffract_views" / "extra.py"
    module.write_text("import scipy.linalg\n")
    assert undeclared(copy, "diffractml-views", ["diffract_views"]) == [
        "src/diffract_views/extra.py imports scipy (scipy)"]


# ---------------------------------------------------------------- the wheels themselves


@pytest.fixture(scope="session")
def wheels(tmp_path_factory) -> Path:
    """An sdist and a wheel (built from the sdist) of every distribution."""
    out = tmp_path_factory.mktemp("dist")
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "dists.py"), "build", "--out",
                          str(out)], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    return out


def wheel_of(wheels: Path, name: str) -> Path:
    return wheels / f"{name.replace('-', '_')}-{VERSION}-py3-none-any.whl"


def missing_from_wheel(wheel: Path, folder: Path) -> list[str]:
    """Files under ``folder``/src that git tracks (a package's modules and data) and that
    ``wheel`` lacks."""
    tracked = subprocess.run(["git", "ls-files", "src"], cwd=folder, capture_output=True,
                             text=True, check=True).stdout.split()
    inside = set(zipfile.ZipFile(wheel).namelist())
    return sorted(f for f in (t.removeprefix("src/") for t in tracked) if f not in inside)


@pytest.mark.slow
@pytest.mark.parametrize("folder", dists.FOLDERS)
def test_every_file_of_a_package_is_in_its_wheel(wheels, folder):
    """Modules and data files (the report's charts, the core's distribution table, the
    kernels' design notes) reach the wheel built from the sdist, and its metadata names
    the distribution under its new name, its version, and its entry points."""
    d = next(d for d in dists.distributions() if d["folder"] == folder)
    wheel = wheel_of(wheels, d["name"])
    assert missing_from_wheel(wheel, ROOT / folder) == []
    info = f"{d['name'].replace('-', '_')}-{VERSION}.dist-info"
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f"{info}/METADATA").decode()
        assert f"\nName: {d['name']}\n" in meta and f"\nVersion: {VERSION}\n" in meta
        source = tomllib.loads((ROOT / folder / "pyproject.toml").read_text())["project"]
        eps = z.read(f"{info}/entry_points.txt").decode() if f"{info}/entry_points.txt" in \
            z.namelist() else ""
        for name in source.get("entry-points", {}).get("diffract", {}):
            assert f"\n{name} = " in "\n" + eps, (name, eps)


def test_a_data_file_left_out_of_a_wheel_is_found(tmp_path):
    """The check above can fail: a wheel of the report without its charts' code."""
    wheel = tmp_path / "r.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for f in subprocess.run(["git", "ls-files", "src"], cwd=ROOT / "plugins" /
                                "diffract_report", capture_output=True, text=True,
                                check=True).stdout.split():
            if not f.endswith("_charts.js"):
                z.writestr(f.removeprefix("src/"), b"")
    assert missing_from_wheel(wheel, ROOT / "plugins" / "diffract_report") == [
        "diffract_report/_charts.js"]


# ---------------------------------------------------------------- fresh environments


class Env:
    """A virtual environment of its own (no pip inside: this Python's pip installs into
    it with --python), holding what :meth:`install` put there and nothing else."""

    def __init__(self, folder: Path, wheels: Path):
        self.folder, self.wheels = folder, wheels
        self.python = folder / "bin" / "python"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)],
                       check=True)
        self.work = folder / "work"
        self.work.mkdir()

    def pip(self, *args: str) -> str:
        run = subprocess.run([sys.executable, "-m", "pip", "--python", str(self.python),
                              "--disable-pip-version-check", *args],
                             capture_output=True, text=True, timeout=900, env=self.environ())
        assert run.returncode == 0, f"pip {' '.join(args)}:\n{run.stdout}\n{run.stderr}"
        return run.stdout

    def install(self, *requirements: str) -> None:
        """By name, our distributions from the built wheels, the rest from the index
        (torch first, alone, from where the set-up takes it: the machine's own indexes,
        which a --find-links on the command line would replace)."""
        if TORCH in requirements:
            self.pip("install", "-q", TORCH)
        self.pip("install", "-q", "--find-links", str(self.wheels),
                 *(r for r in requirements if r != TORCH))
        self.pip("check")

    def environ(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTHON", "DIFFRACT_", "VIRTUAL_ENV", "TRITON_",
                                    "KERNEL_FUN_"))}
        env["PATH"] = f"{self.folder / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["DIFFRACT_STRICT_PLUGINS"] = "1"  # a plugin that fails to load fails the case
        return {**env, **extra}

    def smoke(self, case: str, **extra: str) -> str:
        script = self.folder / "smoke.py"
        shutil.copy(ROOT / "tests" / "wheels" / "smoke.py", script)
        run = subprocess.run([str(self.python), "-I", str(script), case, VERSION],
                             cwd=self.work, capture_output=True, text=True, timeout=900,
                             env=self.environ(**extra))
        out = run.stdout + run.stderr
        assert run.returncode == 0 and f"ok {case}" in run.stdout, out
        return out

    def installed(self) -> set[str]:
        listing = self.pip("list", "--format", "freeze")
        return {_norm(line.split("==")[0]) for line in listing.split()}


@pytest.fixture(scope="module")
def spectral_env(wheels, tmp_path_factory):
    """Environment (b): the core and the spectral pack (the third-party pack's tests
    install into it after case b)."""
    env = Env(tmp_path_factory.mktemp("env-b"), wheels)
    env.install("diffractml-kernels-spectral")
    yield env
    shutil.rmtree(env.folder, ignore_errors=True)


@pytest.fixture
def fresh(wheels, tmp_path):
    """A new environment, removed after the test (one with torch is over a GiB)."""
    env = Env(tmp_path / "env", wheels)
    yield env
    shutil.rmtree(env.folder, ignore_errors=True)


@pytest.mark.slow
def test_a_the_core_alone(fresh):
    """diffractml-core alone, no torch: import diffract, a session on numpy arrays with a
    kernel of the user's, `diffract --help` and `--version`, and the missing pieces
    named (diffractml-report for `analyze`, diffractml-formats for a checkpoint file)."""
    env = fresh
    env.install("diffractml-core")
    assert "torch" not in env.installed()
    env.smoke("core")


@pytest.mark.slow
def test_b_the_core_and_the_spectral_pack(spectral_env):
    assert not {"torch", "diffractml-report", "diffractml-formats"} & spectral_env.installed()
    spectral_env.smoke("spectral")


#: What a pack may import of the core: its public modules (docs/plugins.md).
PUBLIC = ("diffract", "diffract.plugins", "diffract.errors")
PACK = ROOT / "examples" / "diffractml-example-pack"


def private_imports(folder: Path) -> list[str]:
    """Imports in ``folder`` of a module of ``diffract`` outside :data:`PUBLIC` (or of
    a private name from one of them)."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module] if isinstance(node, ast.ImportFrom) and node.module
                       else [])
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            for module in modules:
                if module.split(".")[0] == "diffract" and (
                        module not in PUBLIC or any(n.startswith("_") for n in names)):
                    found.append(f"{path.name}:{node.lineno} {module}")
    return found


def test_the_pack_template_uses_the_public_api_only(tmp_path):
    assert private_imports(PACK) == []
    probe = tmp_path / "probe.py"  # the check can fail
    probe.write_text("from diffract.core.compute.spec import kernel\n"
                     "from diffract.plugins import _manager\nimport diffract.session\n")
    assert private_imports(tmp_path) == ["probe.py:1 diffract.core.compute.spec",
                                         "probe.py:2 diffract.plugins",
                                         "probe.py:3 diffract.session"]


def build_pack(source: Path, folder: Path, rename: str | None = None) -> Path:
    """Copy the pack to ``folder`` (outside this repository), optionally as another
    distribution and package (``rename``: its name), and build its wheel there."""
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__",
                                                                  "build"))
    assert not folder.resolve().is_relative_to(ROOT)
    if rename:
        package = rename.replace("-", "_")
        (folder / "src" / "diffract_example_pack").rename(folder / "src" / package)
        for path in [folder / "pyproject.toml", *(folder / "src").rglob("*.py")]:
            path.write_text(path.read_text().replace("diffractml-example-pack", rename)
                            .replace("diffract_example_pack", package))
    out = folder / "dist"
    run = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                          "--outdir", str(out), str(folder)], capture_output=True, text=True,
                         cwd=folder, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.mark.slow
def test_a_third_party_pack_built_outside_the_repository(spectral_env, tmp_path):
    """The example pack (the template a pack author copies), built as its own wheel in a
    folder outside this repository, installed into (b) beside the spectral pack: listed
    and computing; then a second pack registering the same kernel name: the conflict
    said by `diffract plugins` and by an apply, naming both distributions."""
    spectral_env.install(str(build_pack(PACK, tmp_path / "pack")))
    spectral_env.smoke("pack")
    spectral_env.install(str(build_pack(PACK, tmp_path / "clash", rename="clash-pack")))
    out = spectral_env.smoke("clash", DIFFRACT_STRICT_PLUGINS="0")
    assert "Conflicting plugins" in out


@pytest.mark.slow
def test_c_the_report_and_formats(fresh):
    env = fresh
    env.install("diffractml-kernels-spectral", "diffractml-report")
    assert {"diffractml-formats", "matplotlib"} <= env.installed()
    assert "torch" not in env.installed()
    env.smoke("report")


@pytest.mark.slow
def test_d_the_training_plugin_with_torch(fresh):
    env = fresh
    env.install(TORCH, "diffractml-training")
    env.smoke("training")


@pytest.mark.slow
def test_e_kernel_fun_with_fla_on_a_cpu(fresh):
    env = fresh
    # Triton's interpreter (this CPU's only way to run Triton) imports numpy; the CUDA
    # path does not, and neither torch nor triton declares it
    env.install(TORCH, "diffractml-kernel-fun-gpu", "numpy")
    assert "fla-core" in env.installed() and "diffractml-core" not in env.installed()
    env.smoke("kernel_fun", TRITON_INTERPRET="1", KERNEL_FUN_INTERPRET="1")


def stub_wheel(folder: Path, name: str, version: str, package: str) -> Path:
    """A wheel of a distribution ``name`` that installs a package ``package`` of its own
    (as the registry's original diffract-core and kernel-fun do)."""
    (folder / package).mkdir(parents=True)
    (folder / package / "__init__.py").write_text(f"STUB = {name!r}\n")
    (folder / package / "only_theirs.py").write_text("")
    (folder / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = '
        f'"setuptools.build_meta"\n[project]\nname = "{name}"\nversion = "{version}"\n'
        f'[tool.setuptools]\npackages = ["{package}"]\n')
    run = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                          "--outdir", str(folder / "dist"), str(folder)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    (wheel,) = (folder / "dist").glob("*.whl")
    return wheel


@pytest.mark.slow
def test_another_distribution_of_the_same_import_name_is_said_in_one_line(fresh, tmp_path):
    """The original diffract-core (a stub of that name providing `diffract`) installed
    before ours: `import diffract` and the `diffract` command say so in one line, naming
    both distributions and what to uninstall; installed after ours (its files won), the
    command still says it. The same for the registry's kernel-fun and kernel_fun."""
    env = fresh
    env.pip("install", "-q", str(stub_wheel(tmp_path / "orig", "diffract-core", "0.3.1",
                                            "diffract")))
    env.install("diffractml-core")
    want = ("diffract: the package 'diffract' here belongs to two distributions, "
            "diffractml-core (Diffract) and diffract-core 0.3.1 (another library of the same "
            "import name), whose files overwrite each other; keep one: pip uninstall "
            "diffract-core, then pip install --force-reinstall --no-deps diffractml-core\n")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(args, capture_output=True, text=True, cwd=env.work,
                              env=env.environ(), timeout=300)

    imported = run(str(env.python), "-I", "-c", "import diffract; print(diffract.__version__)")
    assert imported.stdout == f"{VERSION}\n" and imported.stderr == want
    version = run(str(env.folder / "bin" / "diffract"), "--version")
    assert version.returncode == 0 and version.stderr == want  # once, not per import
    assert f"diffractml-core  {VERSION}" in version.stdout
    env.pip("install", "-q", "--force-reinstall", "--no-deps",
            str(next((tmp_path / "orig" / "dist").glob("*.whl"))))
    theirs = run(str(env.folder / "bin" / "diffract"), "--version")
    assert theirs.stderr.startswith(want), theirs.stderr
    env.pip("install", "-q", str(stub_wheel(tmp_path / "kf", "kernel-fun", "0.2.0",
                                            "kernel_fun")))
    env.pip("install", "-q", "--no-deps", str(wheel_of(env.wheels, "diffractml-kernel-fun-gpu")))
    kf = run(str(env.python), "-I", "-c", "import kernel_fun")
    assert kf.stderr == (
        f"kernel_fun: the package 'kernel_fun' here belongs to two distributions, "
        f"diffractml-kernel-fun-gpu {VERSION} and kernel-fun 0.2.0 (another library of the "
        f"same import name), whose files overwrite each other; keep one: pip uninstall "
        f"kernel-fun, then pip install --force-reinstall --no-deps diffractml-kernel-fun-gpu\n")


@pytest.mark.slow
def test_alone_nothing_is_said(fresh):
    """Without another distribution of the name, import diffract says nothing."""
    fresh.install("diffractml-core")
    run = subprocess.run([str(fresh.python), "-I", "-c", "import diffract"],
                         capture_output=True, text=True, env=fresh.environ(), timeout=300)
    assert run.returncode == 0 and run.stderr == ""
