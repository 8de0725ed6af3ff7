"""Safe loading: every checkpoint the project writes loads with weights_only=True; shipped and exported
weights are safetensors that round-trip exactly with their recorded SHA-256; a payload planted in a
checkpoint is never run, whichever loader meets it (resume, the LlamaGen loader, the zoo loader)."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
from pathlib import Path

import torch
from safetensors.torch import load_file
from safetensors.torch import save as save_bytes

from .common import ROOT, Check, World, child_env, train_command
from .faults import Payload


def checkpoints_load_as_data(roots: list[Path], check: Check) -> int:
    """Every .ckpt under `roots` through torch.load(weights_only=True); returns how many refused."""
    refused = 0
    for path in sorted(p for root in roots for p in Path(root).rglob("*.ckpt")):
        try:
            torch.load(path, weights_only=True, map_location="cpu")
            ok = True
        except Exception as e:  # noqa: BLE001 - any failure is the finding
            ok, refused = False, refused + 1
            path = f"{path}: {type(e).__name__}: {str(e)[:200]}"
        check.trial(ok, f"{path} does not load with weights_only=True")
    return refused


def safetensors_round_trip(dirs: list[Path], check: Check) -> None:
    """model.safetensors matches config.json's SHA-256, and loading then saving it gives the same bytes."""
    for d in dirs:
        data = (d / "model.safetensors").read_bytes()
        recorded = json.loads((d / "config.json").read_text()).get("sha256")
        again = save_bytes(load_file(d / "model.safetensors"))
        check.trial(recorded == hashlib.sha256(data).hexdigest() == hashlib.sha256(again).hexdigest(),
                    f"{d}: recorded {recorded}, file {hashlib.sha256(data).hexdigest()}, "
                    f"round trip {hashlib.sha256(again).hexdigest()}")


def _refuses(name: str, load, marker: Path, check: Check) -> bool:
    """`load()` must raise without running the payload; returns whether the payload ran."""
    try:
        load()
        refused = False
    except Exception:  # noqa: BLE001 - any refusal will do; running the payload is the failure
        refused = True
    ran = marker.exists()
    check.trial(refused and not ran, f"{name}: refused={refused}, payload ran={ran}")
    marker.unlink(missing_ok=True)
    return ran


def planted_payloads(world: World, work: Path, check: Check) -> int:
    """Plant a payload where each loader reads; returns how many ran (must be 0)."""
    from ..llamagen.checkpoints import read_pt
    from ..zoo import load_tokenizer

    work.mkdir(parents=True, exist_ok=True)
    marker = work / "payload_ran"
    planted = {"state_dict": {"w": torch.zeros(2)}, "mulosd": {"batches_seen": 1}, "evil": Payload(marker)}
    ckpt = work / "planted.ckpt"
    with open(ckpt, "wb") as f:
        pickle.dump(planted, f)  # a plain pickle, as an attacker would write it
    torch.save(planted, work / "planted_torch.ckpt")
    ran = 0

    # 1. resuming a run from it (Lightning's loader, through our checkpoint IO)
    run_dir = work / "resume_planted"
    for name in ("planted.ckpt", "planted_torch.ckpt"):
        r = subprocess.run(train_command(run_dir / name, [*world.sampler("token_ce"), f"ckpt_path={work / name}"]),
                           cwd=ROOT, capture_output=True, text=True, timeout=300, env=child_env())
        check.trial(r.returncode != 0 and not marker.exists() and "Traceback" not in r.stderr,
                    f"train.py ckpt_path={name}: exit {r.returncode}, payload ran={marker.exists()}, "
                    f"stderr {r.stderr[-300:]!r}")
        ran += marker.exists()
        marker.unlink(missing_ok=True)
    # 2. the LlamaGen .pt reader
    pt = work / "vq_ds16_t2i.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "evil": Payload(marker)}, pt)
    ran += _refuses("read_pt", lambda: read_pt(pt), marker, check)
    # 3. a zoo directory whose weights file is a pickle
    fake = work / "fake_tokenizer"
    fake.mkdir(exist_ok=True)
    (fake / "model.safetensors").write_bytes(pickle.dumps(Payload(marker)))
    (fake / "config.json").write_text(json.dumps(json.loads((world.tokenizer / "config.json").read_text())
                                                 | {"sha256": hashlib.sha256((fake / "model.safetensors")
                                                                             .read_bytes()).hexdigest()}))
    ran += _refuses("zoo loader", lambda: load_tokenizer(fake), marker, check)
    return ran


def run(world: World, work: Path, checkpoint_roots: list[Path], export_dirs: list[Path]) -> Check:
    check = Check("safe_loading")
    refused = checkpoints_load_as_data(checkpoint_roots, check)
    zoo = [d for d in (ROOT / "zoo").iterdir() if (d / "config.json").is_file()] if (ROOT / "zoo").is_dir() else []
    safetensors_round_trip(zoo + export_dirs, check)
    ran = planted_payloads(world, work / "planted", check)
    check.figures.update(checkpoints_refusing_weights_only=refused, payloads_run=ran, safetensors=len(zoo) +
                         len(export_dirs))
    check.figures["unsafe_loads"] = refused + ran
    return check
