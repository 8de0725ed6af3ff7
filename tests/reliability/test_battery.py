"""The reliability battery at make test's size (`python -m mulosd.reliability --quick`), run once; one test
per promise reads its figures. The tests after it show that each check can fail."""

import json
import re
import subprocess
import sys
import threading

import pytest
import torch

from mulosd.reliability import faults, typos
from mulosd.reliability.common import Check, World, make_world

from ..conftest import ROOT

pytestmark = pytest.mark.slow  # end to end: real interpreters, real training or decoding


@pytest.fixture(scope="module")
def battery(tmp_path_factory, request):
    """The battery, run once; its progress lines (one per check, with the time so far) are shown as they come,
    past pytest's capture: it runs for minutes before the first of its tests reports."""
    work = tmp_path_factory.mktemp("battery")
    show = request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled
    err = (work / "stderr.txt").open("w")  # a file, not a pipe: a full stderr pipe would stall the battery
    proc = subprocess.Popen([sys.executable, "-m", "mulosd.reliability", "--quick", "--work", str(work / "runs"),
                             "--json", str(work / "battery.json")], cwd=ROOT, stdout=subprocess.PIPE, stderr=err,
                            text=True)
    watchdog = threading.Timer(900, proc.kill)  # a hung battery fails its tests instead of hanging make test
    watchdog.start()
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("["):
            with show():
                print(f"\n  battery {line.rstrip()}", end="", flush=True)
    proc.wait()
    watchdog.cancel()
    with show():
        print("\n  battery done; its tests: ", end="", flush=True)
    err.close()
    r = subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines), (work / "stderr.txt").read_text())
    report = json.loads((work / "battery.json").read_text()) if (work / "battery.json").is_file() else {}
    return r, report


def _check(battery, name):
    r, report = battery
    assert name in report, r.stdout[-3000:] + r.stderr[-3000:]
    c = report[name]
    assert c["total"] > 0 and c["passed"] == c["total"], c["failures"]
    return c


def test_the_battery_ends_with_its_line_and_passes(battery):
    r, _ = battery
    last = r.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"reliability: resume=(\d+)/\1 atomic=(\d+)/\2 faults=(\d+)/\3 typos=(\d+)/\4 "
                        r"unsafe_loads=0 nan_ckpts=0 ddp=ok", last), r.stdout[-3000:] + r.stderr[-2000:]
    assert r.returncode == 0


def test_killed_runs_resume_bitwise_with_the_same_samples(battery):
    c = _check(battery, "resume")
    assert c["total"] == 3 and c["figures"]["replayed"] == 0 and c["figures"]["skipped"] == 0
    assert set(c["figures"]["targets"].split(",")) == {"token_ce", "gan", "tokenizer"}


def test_sigterm_saves_and_exits_nonzero(battery):
    assert _check(battery, "sigterm")["figures"]["exit"] == 143


def test_killed_writes_leave_loadable_checkpoints_and_full_disks_raise(battery):
    c = _check(battery, "atomic")
    assert c["total"] == 8 + 2 and c["figures"]["full"] == c["figures"]["readonly"] == "raised"


def test_every_planted_fault_is_counted_in_its_category(battery):
    c = _check(battery, "faults")
    assert c["total"] == 100 and c["figures"]["pickles_executed"] == 0 and c["figures"]["partial"] == 0


def test_thirty_config_errors_exit_with_a_short_message_naming_the_key(battery):
    assert _check(battery, "typos")["total"] == 30


def test_nan_is_caught_within_a_step_and_never_checkpointed(battery):
    assert _check(battery, "nan_guards")["total"] == 8


def test_ddp_on_two_processes_reads_distinct_data(battery):
    c = _check(battery, "ddp")
    assert c["figures"]["samples_rank0"] == c["figures"]["samples_rank1"] == 8


def test_nothing_loads_unsafely(battery):
    c = _check(battery, "safe_loading")
    assert c["figures"]["unsafe_loads"] == 0 and c["figures"]["safetensors"] >= 1


# --- each check can fail ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    return make_world(tmp_path_factory.mktemp("world"))


def test_a_miscounted_fault_fails_the_faults_check(tmp_path, monkeypatch):
    from mulosd.data.stream import SampleCounter

    count = SampleCounter.count

    def forgetful(self, kind, detail=""):
        if kind != "duplicate_member":
            count(self, kind, detail)

    monkeypatch.setattr(SampleCounter, "count", forgetful)
    c = faults.run(tmp_path, shards=4, faults=40, repeats=1)
    assert not c.ok and any("duplicate_member" in f for f in c.failures)


def test_an_error_that_does_not_name_its_key_fails_the_typos_check(world, tmp_path):
    c = typos.run(world, tmp_path, cases=[("train.py", ["experiment=upsampler_ce", "r=3"], "model.width")])
    assert not c.ok and "not named" in c.failures[0]


def test_a_checkpoint_that_needs_unpickling_counts_as_unsafe(tmp_path):
    from mulosd.reliability.safeload import checkpoints_load_as_data

    torch.save({"w": torch.ones(2)}, tmp_path / "fine.ckpt")
    torch.save({"w": Check("planted")}, tmp_path / "code.ckpt")  # a class instance: needs full unpickling
    c = Check("safe")
    assert checkpoints_load_as_data([tmp_path], c) == 1 and c.passed == 1 and c.total == 2
