"""``pip install ./trainer`` gives a working package that declares what it imports."""

import ast
import os
import subprocess
import sys
import tomllib

TRAINER = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(TRAINER, "mmfeed_trainer")
# import name -> distribution name, where they differ
DIST = {"nats": "nats-py"}


def third_party_imports() -> set[str]:
    names = set()
    files = [os.path.join(d, f) for d, _, fs in os.walk(PACKAGE) for f in fs if f.endswith(".py")]
    for f in files:  # subpackages too (integrations/)
        for node in ast.walk(ast.parse(open(f).read())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
    optional = {"google_crc32c"}  # an alternative to crc32c, tried second
    return {n for n in names - optional if n not in sys.stdlib_module_names and n != "mmfeed_trainer"}


def test_dependencies_name_every_import():
    project = tomllib.load(open(os.path.join(TRAINER, "pyproject.toml"), "rb"))["project"]
    extras = project["optional-dependencies"]
    deps = project["dependencies"] + [d for k, v in extras.items() if k != "test" for d in v]
    declared = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in deps}
    want = {DIST.get(n, n) for n in third_party_imports()}
    assert want == declared, f"imported but not declared: {want - declared}; declared, never imported: {declared - want}"


def test_pip_install_gives_an_importable_package(tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), TRAINER], check=True, capture_output=True, timeout=300)
    out = subprocess.run([sys.executable, "-c", "import mmfeed_trainer.data as d; print(d.__file__)"],
                         env=dict(os.environ, PYTHONPATH=str(target)), cwd=tmp_path, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    assert out.strip().startswith(str(target)), out
    assert (target / "bin" / "mmfeed-train").exists()
    assert sorted(p.name for p in (target / "mmfeed_trainer" / "presets").iterdir()) == \
        ["base-8h.json", "base.json", "tiny.json"], "the model presets are package data"
