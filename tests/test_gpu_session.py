"""benchmarks/gpu_session.py, the driver of a session on a lent GPU machine: every part's
commands fit one call of the device tool and name benchmarks and options that exist, and a
command's output, record, failure and time limit end up in the part's tarball. (Its parts
themselves need a GPU; here they only print their commands.)"""

from __future__ import annotations

import json
import re
import runpy
import shlex
import subprocess
import sys
import tarfile

import pytest

from .helpers import ROOT, benchmark_module

SCRIPT = ROOT / "benchmarks" / "gpu_session.py"
GS = runpy.run_path(str(SCRIPT))  # the module's functions, without running main


def dry_run(part: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), part, "--dry-run"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return proc.stdout.splitlines()


@pytest.mark.parametrize("part", GS["PARTS"])
def test_every_part_fits_one_call_and_names_benchmarks_and_options_that_exist(part):
    """Each command's time limit, and each benchmark's arguments parsed by its parser."""
    lines = dry_run(part)
    assert lines, f"part {part} has no commands"
    seconds = [int(re.match(r"\[\s*(\d+) s\]", line).group(1)) for line in lines]
    assert sum(seconds) <= GS["PART_SECONDS"] < 600
    for line in lines:
        argv = shlex.split(line.split(": ", 1)[1])
        script = re.fullmatch(r"benchmarks/(\w+\.py)", argv[1]) if len(argv) > 1 else None
        if not script:
            continue
        assert (ROOT / "benchmarks" / script.group(1)).is_file()
        benchmark_module(script.group(1))["arguments"]().parse_args(argv[2:])  # exit 2 if not


def test_the_validate_part_runs_the_preset_with_its_plain_setting_only(tmp_path):
    path = GS["validate_config"](tmp_path, "mirror", 7, 300)
    import yaml

    override = yaml.safe_load(path.read_text())
    assert override["train"] == {"settings": ["plain"], "epochs": 7}
    assert override["certify"]["n_points"] == override["attack"]["n_points"] == 300
    assert override["results"] == f"results/gpu-validate-{tmp_path.name}"
    assert override["data"]["mirrors"]["mnist"] == "mirror"
    # the preset with this override passes the config's own checks (an absolute results
    # folder did not, and the part failed on its first GPU run)
    from snakemake.utils import update_config

    from crosslip.config.validate import validate

    config: dict = {}
    for file in GS["PRESET"]:
        update_config(config, yaml.safe_load((ROOT / file).read_text()))
    update_config(config, override)
    validate(config)


def test_a_command_leaves_its_log_its_record_or_why_there_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSLIP_COMMIT", "abc1234")
    command = GS["Command"]
    py = sys.executable
    ok = command("bench_x_cuda", [py, "-c", "print('hello'); print('{\"speedup\": 2.5}')"], 30)
    summary = GS["run"](ok, tmp_path)
    assert summary["status"] == 0 and summary["record"] == "bench_x_cuda.json"
    rec = json.loads((tmp_path / "bench_x_cuda.json").read_text())
    assert rec["result"] == {"speedup": 2.5} and rec["commit"] == "abc1234"
    assert rec["name"] == "bench_x_cuda" and rec["command"].startswith("python3 -c ")
    assert "hello" in (tmp_path / "bench_x_cuda.log").read_text()
    no_json = GS["run"](command("bench_y", [py, "-c", "print('no json')"], 30), tmp_path)
    assert no_json["status"] == 0 and no_json["record"].startswith("no JSON line")
    failed = GS["run"](command("bench_z", [py, "-c", "raise SystemExit(3)"], 30), tmp_path)
    assert failed["status"] == 3 and "record" not in failed
    slow = GS["run"](command("slow", [py, "-c", "import time; time.sleep(30)"], 1), tmp_path)
    assert slow["status"] == "timed out after 1 s" and slow["seconds"] < 10
    missing = GS["run"](command("gone", ["no-such-program-here"], 5, record=False), tmp_path)
    assert missing["status"] == "not found: no-such-program-here"


def test_snakemake_seconds_add_up_each_rules_benchmark_files(tmp_path):
    header = "s\th:m:s\tmax_rss\n"
    for rule, name, s in [
        ("train_grid", "a", 10.5),
        ("attack_grid", "a", 3),
        ("attack_grid", "b", 2),
    ]:
        folder = tmp_path / "benchmarks" / rule / "mnist"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.tsv").write_text(header + f"{s}\t0:00:10\t100\n")
    assert GS["snakemake_seconds"](tmp_path) == {"attack_grid": 5.0, "train_grid": 10.5}


def test_a_part_is_packed_into_one_tarball(tmp_path):
    """The whole ``check`` part cannot run without a GPU; a part whose commands are given
    here runs through main and leaves one tarball with the logs, records and summary."""
    code = (
        "import runpy, sys\n"
        f"gs = runpy.run_path({str(SCRIPT)!r}, run_name='gpu_session')\n"
        "cmd = gs['Command']\n"
        "py = sys.executable\n"
        "gs['main'].__globals__['commands'] = lambda part, args, work: [\n"
        "    cmd('bench_a_cpu', [py, '-c', 'print(\\'{\"x\": 1}\\')'], 30)]\n"
        "sys.argv = ['gpu_session.py', 'compile', '--out', sys.argv[1]]\n"
        "gs['main']()\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, cwd=ROOT)
    with tarfile.open(tmp_path / "gpu-compile.tar.gz") as tar:
        names = sorted(tar.getnames())
        summary = json.load(tar.extractfile("summary.json"))
    assert names == ["bench_a_cpu.json", "bench_a_cpu.log", "summary.json"]
    assert summary["part"] == "compile" and summary["commands"][0]["status"] == 0
