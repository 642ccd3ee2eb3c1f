"""stepsim as a package: one import namespace, shipped scenarios by name, `stepsim list`,
and a wheel that works outside the checkout."""

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from stepsim.cli import main
from stepsim.cli.common import ray_package_dir
from stepsim.scenario import shipped_scenarios
from stepsim.scenario.files import scenario_path

ROOT = Path(__file__).resolve().parent.parent


def test_every_shipped_scenario_is_found_by_name():
    shipped = shipped_scenarios()
    assert set(shipped) == {p.stem for p in (ROOT / "scenarios").glob("*.toml")}
    assert "tiny-2gpu" in shipped
    # every name `stepsim list` shows resolves to its file, dots in it included
    for name, path in shipped.items():
        assert scenario_path(name) == path
    assert scenario_path("llama3.1-405b-1024-h100").name == "llama3.1-405b-1024-h100.toml"


def test_run_takes_a_shipped_scenario_by_name(capsys):
    assert main(["run", "tiny-2gpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "tiny-2gpu"


def test_a_name_that_is_neither_file_nor_shipped_is_one_line(capsys):
    assert main(["run", "tiny-3gpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "no scenario file 'tiny-3gpu' and no shipped scenario of that name" in err
    assert "tiny-2gpu" in err and "stepsim list" in err


def test_a_readme_path_outside_the_checkout_names_the_shipped_scenario(
    capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # scenarios/tiny-2gpu.toml is not here
    assert main(["run", "scenarios/tiny-2gpu.toml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "a shipped scenario has that name" in err and "`stepsim run tiny-2gpu`" in err


def test_list_shows_scenarios_and_presets(capsys):
    assert main(["list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert set(listed["scenarios"]) == set(shipped_scenarios())
    assert "a100-sxm4-80gb" in listed["gpus"] and "dgx-a100" in listed["nodes"]
    assert "uncalibrated" in listed["gpus"]["a100-sxm4-40gb"]
    assert main(["list"]) == 0
    assert "tiny-2gpu" in capsys.readouterr().out


def test_a_ray_cluster_gets_the_package_laid_out_as_a_wheel_lays_it(tmp_path):
    staged = Path(ray_package_dir(tmp_path))
    assert staged.name == "stepsim"
    for module in ("__init__.py", "cli/__init__.py", "schedules/__init__.py", "topologies/node.py"):
        assert (staged / module).is_file(), module
    assert not list(staged.rglob("__pycache__"))


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory):
    """The wheel built from a copy of this checkout (setuptools' build/ folder stays out
    of the checkout, and nothing stale in it can reach the wheel), installed (without
    its dependencies, which this environment has) into a folder of its own."""
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"
    skip = (".git", ".venv", "build", "dist", "out", "*.egg-info", "__pycache__", ".*cache")
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*skip, ".hypothesis"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", str(source), "-w", str(out)]
    subprocess.run(build, check=True, capture_output=True, cwd=out)
    (wheel,) = out.glob("stepsim-*.whl")
    site = out / "site"
    install = [*pip, "install", "--no-deps", "--target", str(site), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, cwd=out)
    return wheel, site


def test_the_wheel_installs_one_namespace_with_its_data(wheel_site):
    wheel, _ = wheel_site
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {
        "stepsim",
        wheel.name.split("-py3")[0] + ".dist-info",
    }
    for data in (
        "scenarios/tiny-2gpu.toml",
        "scenarios/validation/megatron_2021_table1.csv",
        "scenarios/jobs/two-jobs-spread.toml",
    ):
        assert f"stepsim/{data}" in names


def test_the_wheel_runs_outside_the_checkout(wheel_site, tmp_path):
    _, site = wheel_site
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}

    def outside(*argv):
        """A Python process in a folder outside the checkout, seeing only the wheel."""
        done = subprocess.run(
            [sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert outside("-c", "import stepsim; print(stepsim.__file__)").startswith(str(site))
    assert json.loads(outside("-m", "stepsim", "run", "tiny-2gpu", "--json"))["name"] == "tiny-2gpu"
    listed = json.loads(outside("-m", "stepsim", "list", "--json"))["scenarios"]
    assert "mt-nlg-530b-420nodes" in listed
    # the documentation the help texts point at ships too (`stepsim docs NAME`)
    docs = json.loads(outside("-m", "stepsim", "docs", "--json"))["docs"]
    assert {"design", "memory", "calibration", "moe"} <= set(docs)
    assert outside("-m", "stepsim", "docs", "memory").startswith("# Memory per GPU")
    rows = outside(
        "-c",
        "from stepsim.scenario import read_validation_set, shipped_dir;"
        "print(sum(map(len, read_validation_set(shipped_dir() / 'validation').values())))",
    )
    assert int(rows) > 20
