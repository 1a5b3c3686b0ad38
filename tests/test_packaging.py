"""The installed package, not the checkout: `pip wheel --no-deps .` holds every module and every
file the code reads at run time, under the hf2triton namespace only; installed non-editable into
a fresh virtual environment, `hf2triton` works from any directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

# The repository's folders and where the wheel puts them.
MAPPED = {
    "hf2triton": "hf2triton",
    "cli": "hf2triton/cli",
    "flows": "hf2triton/flows",
    "tasks": "hf2triton/tasks",
    "model_repository": "hf2triton/model_repository",
}
# Files read at run time, besides modules (relative to the repository).
DATA = [
    "model_repository/model.py",
    "model_repository/config.pbtxt.template",
    "infra/Dockerfile",
    "infra/serving-requirements.txt",
    *(f"infra/k8s/{p.name}" for p in (ROOT / "infra" / "k8s").iterdir()),
]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # A copy of the tree git knows (tracked, or new and not ignored): building in the checkout
    # would leave build/ behind, and a wheel must not depend on what lies ignored there.
    src = out / "src"
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    )
    for path in listed.stdout.splitlines():
        if (ROOT / path).is_file():
            (src / path).parent.mkdir(parents=True, exist_ok=True)
            (src / path).write_bytes((ROOT / path).read_bytes())
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    return next(out.glob("hf2triton-*.whl"))


def test_wheel_holds_every_module_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = []
    for folder, inside in MAPPED.items():
        for module in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in module.parts:
                continue
            want = f"{inside}/{module.relative_to(ROOT / folder).as_posix()}"
            if want not in names:
                missing.append(want)
    missing += [f"hf2triton/{p}" for p in DATA if f"hf2triton/{p}" not in names]
    assert not missing, f"the wheel lacks {missing}"
    tops = {n.split("/")[0] for n in names if not n.startswith("hf2triton-")}
    assert tops == {"hf2triton"}, f"generic top-level names in site-packages: {tops}"
    assert not any(n.startswith("hf2triton/tests") or "tiny_models" in n for n in names), (
        "fixture models ship in the package"
    )


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed (not editable). Its dependencies are
    the pipeline environment's, reached through a .pth file (the editable hf2triton there is
    not: .pth files in a folder a .pth adds are not run), so nothing is downloaded."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "pipeline-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    # pip --target writes no console script: the entry point as pip would write it.
    script = venv / "bin" / "hf2triton"
    script.write_text(
        f"#!{venv / 'bin' / 'python'}\nimport sys\n"
        "from hf2triton.cli.main import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    return venv


def test_installed_package_runs_from_another_directory(installed, tmp_path):
    python = installed / "bin" / "python"
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import hf2triton, hf2triton.tasks.deploy as t; "
            "print(hf2triton.__file__); print(t.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert all(str(installed) in line for line in where.stdout.split()), where.stdout
    schema = subprocess.run(
        [str(installed / "bin" / "hf2triton"), "schema"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert schema.returncode == 0, schema.stderr
    assert json.loads(schema.stdout)["title"] == "hf2triton release spec"


@pytest.mark.e2e
def test_installed_package_releases_the_default_model(installed, tmp_path):
    """The README's release, from the installed package run in another directory."""
    env = {
        **os.environ,
        "HF2TRITON_HOME": str(tmp_path / "home"),
        "HF2TRITON_SERVING_ENV": str(ROOT / ".venv-serving"),
        "PYTHONPATH": "",
    }
    from hf2triton.util.net import free_port

    ports = [free_port() for _ in range(4)]
    spec = tmp_path / "minilm.yaml"
    text = (ROOT / "releases" / "minilm-embedder.yaml").read_text()
    text = text.replace(
        "data/embedding-validation.txt",
        str(ROOT / "releases" / "data" / "embedding-validation.txt"),
    )
    for key, port in zip(
        ("http_port: 8000", "grpc_port: 8001", "metrics_port: 8002", "openai: {port: 9000"), ports
    ):
        text = text.replace(
            key, f"{key.split(':')[0]}: {port}" if "{" not in key else f"openai: {{port: {port}"
        )
    # ONNX Runtime's candidates alone: the installed package's release is what this checks (the
    # README's main command, which CI runs first, releases the spec with every runtime).
    text += "runtime:\n  candidates: [{name: onnxruntime, precision: fp32}]\n"
    spec.write_text(text)
    try:
        done = run_cli(
            [str(installed / "bin" / "hf2triton"), "release", str(spec)], 900, env=env, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        assert summary["endpoint"]["http"].startswith(f"http://127.0.0.1:{ports[0]}/")
        assert summary["metrics"]["min_cosine"] >= 0.99
    finally:
        subprocess.run(
            [str(installed / "bin" / "hf2triton"), "server", "stop"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
        )
