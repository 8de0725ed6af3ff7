"""A refactor's safety net: every decoding strategy, and MuLo-SD at each of its knob branches, decoded on the
shipped zoo at batch 8 and batch 1, saved as tokens, then checked token for token after the change.

    python scripts/tokens_snapshot.py save  /tmp/before.pt     # before the change
    python scripts/tokens_snapshot.py check /tmp/before.pt     # after: ends "tokens_snapshot: differ=none"

Eight prompts of a development world; about six minutes on two idle cores. A setting missing from the snapshot
(one added since) is decoded and listed as new, not compared. Infer overrides after the path decode at another
setting, `--only` keeps some settings (the 256 px regime, where `ar` alone takes minutes):

    python scripts/tokens_snapshot.py save /tmp/before256.pt size=256 models.verifier=synthscenes_ar_v3 \
        --only ar,zipar,pjd,sjd,mulosd,mulosd_resample,mulosd_dw2
"""

from __future__ import annotations

import argparse

import torch

from mulosd.config import register_configs, with_overrides
from mulosd.eval import prompt_set

# a name -> its infer overrides; the strategy is the name's first word
SETTINGS = {
    "ar": {}, "zipar": {"window": 3}, "sd": {}, "lantern": {}, "sjd": {}, "sjd_maximal": {"sjd_coupling": "maximal"},
    "pjd": {}, "mulosd": {}, "mulosd_resample": {"expanded": "resample"},
    "mulosd_paper": {"expanded": "resample", "radius": 1, "draft_rows": 4}, "mulosd_radius0": {"radius": 0},
    "mulosd_tau1": {"tau": 1.0}, "mulosd_sampled": {"acceptance": "sampled"}, "mulosd_serial": {"resample": "serial"},
    "mulosd_parallel": {"resample": "parallel"}, "mulosd_draft_serial": {"draft": "serial"},
    "mulosd_raster": {"rejection": "raster"}, "mulosd_jacobi": {"resample_jacobi": 2},
    "mulosd_threshold": {"acceptance": "threshold", "relative": True}, "mulosd_delta": {"delta": 0.5},
    "mulosd_dw2": {"draft_window": 2},
}


def snapshot(overrides: list[str], names: list[str]) -> dict[tuple[str, int], torch.Tensor]:
    from hydra import compose, initialize_config_dir

    from mulosd.paths import CONF
    from mulosd.pipeline import Pipeline

    register_configs()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose(config_name="infer", overrides=["prompt=x", *overrides])
    prompts = prompt_set(8, seed=4242)
    pipe = Pipeline.from_config(cfg, {name.split("_")[0] for name in names})
    out = {}
    for name in names:
        strategy = name.split("_")[0]
        c = with_overrides(cfg, SETTINGS[name])
        for batch in (8, 1):
            ids = torch.arange(len(prompts)).split(batch)
            out[(name, batch)] = torch.cat([pipe.decode(strategy, c, prompts[i[0]:i[-1] + 1], i)[0] for i in ids])
        print(f"{name}: batch 1 {'==' if torch.equal(out[(name, 8)], out[(name, 1)]) else '!='} batch 8", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("save", "check"))
    parser.add_argument("path")
    parser.add_argument("overrides", nargs="*", help="infer overrides, e.g. size=256")
    parser.add_argument("--only", help="comma-separated settings (default: all of them)")
    args = parser.parse_intermixed_args()
    names = args.only.split(",") if args.only else list(SETTINGS)
    if unknown := [n for n in names if n not in SETTINGS]:
        parser.error(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(SETTINGS)}")
    if args.action == "check":  # before decoding: a snapshot of another setting would differ everywhere
        saved = torch.load(args.path, weights_only=True)
        if saved.get("overrides") != args.overrides:  # a snapshot from before overrides were recorded has none
            parser.error(f"{args.path} was saved with overrides {saved.get('overrides')}, not {args.overrides}")
    torch.set_num_threads(1)
    tokens = snapshot(args.overrides, names)
    if args.action == "save":
        torch.save({"overrides": args.overrides, "tokens": tokens}, args.path)
        print(f"tokens_snapshot: saved={len(tokens)} -> {args.path}")
        return
    before = saved["tokens"]
    differ = sorted(f"{n}@{b}" for (n, b), t in tokens.items()
                    if (n, b) in before and not torch.equal(before[(n, b)], t))
    new = sorted(f"{n}@{b}" for n, b in tokens if (n, b) not in before)
    print(f"tokens_snapshot: differ={','.join(differ) or 'none'} new={','.join(new) or 'none'}")


if __name__ == "__main__":
    main()
