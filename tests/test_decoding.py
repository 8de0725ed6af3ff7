"""Decoding: MuLo-SD against plain AR, the draft at tau = 0, islands and expansion on hand-made masks,
pooled acceptance by hand, batch independence and refused configurations."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from mulosd.ar import ARBackbone, Transformer, TransformerConfig, Warpers
from mulosd.data.synthscenes import caption_text, sample_scene
from mulosd.data.synthscenes.encoder import SceneCaptionEncoder
from mulosd.decoding import MuLoSDConfig
from mulosd.decoding.acceptance import (
    accepted_prefix,
    outside_pool,
    pooled_accept,
    pooled_mass,
    residual,
    sampled_accept,
)
from mulosd.decoding.ar import decode_ar
from mulosd.decoding.islands import IslandSchedule, expand, islands, raster_linked_islands
from mulosd.decoding.mulosd import decode_mulosd
from mulosd.decoding.zipar import decode_zipar
from mulosd.samplers import LatentDownsampler, LatentUpsampler
from mulosd.tokenizer.neighbours import neighbour_table

V = 48


def _backbone_models():
    torch.manual_seed(0)

    def make(grid):
        m = Transformer(TransformerConfig(vocab_size=V, grid=grid, dim=32, layers=2, heads=2, cond_dim=16))
        m = m.double().eval()
        with torch.no_grad():
            m.null_cond.normal_()
        return m

    verifier, drafter, enc = make(8), make(4), SceneCaptionEncoder(16).double()
    codebook = torch.randn(V, 8)
    up = LatentUpsampler(codebook, 2, 16, 1).double().eval()
    down = LatentDownsampler(codebook, 2, 16, 1).double().eval()
    return verifier, drafter, enc, up, down, neighbour_table(codebook, 8)


MODELS = _backbone_models()


def knobs(**settings) -> MuLoSDConfig:
    """MuLo-SD on these tiny models, simplest first: one low-res row a round drafted serially, islands resampled in
    parallel, the paper's threshold test over the 8-neighbour table and its expansion (radius 1, resampled); each
    test sets what it is about."""
    return MuLoSDConfig(**{"pool_k": 8, "draft_rows": 1, "draft": "serial", "draft_window": 4,
                           "resample": "parallel", "acceptance": "threshold", "radius": 1,
                           "expanded": "resample"} | settings)
CAPTIONS = [caption_text(sample_scene(0, i).prompt) for i in range(3)]


def _mulosd(cfg, captions=CAPTIONS, up=None, **kw):
    verifier, drafter, enc, u, d, nb = MODELS
    return decode_mulosd(ARBackbone(verifier, enc, 2.0), ARBackbone(drafter, enc, 2.0), up or u.up, d.down,
                         captions, nb, cfg, seed=5, rounds=True, **kw)


@pytest.mark.parametrize("resample", ["serial", "parallel"])
def test_everything_rejected_reproduces_plain_ar(resample):
    verifier, _, enc, *_ = MODELS
    want, _ = decode_ar(ARBackbone(verifier, enc, 2.0), CAPTIONS, seed=5)
    got, trace = _mulosd(knobs(tau=1.5, resample=resample))
    assert torch.equal(got, want)
    assert trace.counts["accepted"] == 0 and trace.counts["resampled"] == 3 * 64


def test_zipar_drafting_saves_drafter_steps_and_changes_nothing_the_verifier_decides():
    verifier, _, enc, *_ = MODELS
    want, _ = decode_ar(ARBackbone(verifier, enc, 2.0), CAPTIONS, seed=5)
    serial = _mulosd(knobs(tau=1.5, resample="serial", draft_rows=2))[1]
    got, zipar = _mulosd(knobs(tau=1.5, resample="serial", draft_rows=2, draft="zipar", draft_window=2))
    assert torch.equal(got, want)  # everything rejected: the verifier's tokens whatever the draft
    # 2 rounds of 2 low-res rows of 4: serial drafting 7 forwards per round, ZipAR (window 2) 5
    assert serial.forwards["drafter"] - zipar.forwards["drafter"] == 2 * 2
    assert zipar.counts["provisional_kv"] == 2 * 3  # each round's second row starts on a provisional slot
    batch, _ = _mulosd(knobs(tau=0.05, draft_rows=2, draft="zipar", draft_window=2))
    alone, _ = _mulosd(knobs(tau=0.05, draft_rows=2, draft="zipar", draft_window=2), captions=CAPTIONS[1:2],
                       image_ids=torch.tensor([1]))
    assert torch.equal(alone[0], batch[1])


def test_tau_zero_returns_the_upsampled_draft():
    _, _, _, u, _, _ = MODELS
    calls = []

    def recording_up(low):
        out = u.up(low)
        calls.append(out)
        return out

    got, trace = _mulosd(knobs(tau=0.0, draft_rows=1), up=recording_up)
    # round k up-samples the low-res prefix of k+1 rows; its last 2 high-res rows are the round's draft
    draft = torch.cat([c[:, 2 * k:2 * k + 2] for k, c in enumerate(calls)], dim=1)
    assert len(calls) == 4 and torch.equal(got, draft)
    assert trace.counts["resampled"] == 0 and trace.forwards["verifier"] == 1 + 4  # the prefix, then 4 verifications
    assert all(r.accepted.sum() == r.drafted.sum() for r in trace.rounds)
    # each round records what it drafted: the up-sampled block in place over the committed rows before it,
    # and the low-res grid whose prefix U_r read
    for k, (r, c) in enumerate(zip(trace.rounds, calls, strict=True)):
        high = r.high_draft.view(3, 8, 8)
        assert torch.equal(high[:, :2 * k + 2], got[:, :2 * k + 2]) and not high[:, 2 * k + 2:].any()
        assert torch.equal(u.up(r.low_draft.view(3, 4, 4)[:, :k + 1]), c)


def test_draft_temperature_zero_drafts_the_drafters_mode():
    _, drafter, enc, u, _, _ = MODELS
    mode, _ = decode_ar(ARBackbone(drafter, enc, 2.0), CAPTIONS, seed=5, warpers=Warpers(temperature=0))
    one_round = {"tau": 0.0, "draft_rows": 4}  # the whole low-res image in one round, every draft accepted
    got, trace = _mulosd(knobs(draft_temperature=0.0, **one_round))
    assert torch.equal(trace.rounds[0].low_draft.view(3, 4, 4), mode) and torch.equal(got, u.up(mode))
    # the drafter's temperature only: the verifier samples as before (everything rejected -> ar's tokens)
    sampled = _mulosd(knobs(**one_round))[1].rounds[0].low_draft.view(3, 4, 4)
    assert not torch.equal(sampled, mode)
    cold = _mulosd(knobs(tau=1.5, resample="serial", draft_temperature=0.0))[0]
    assert torch.equal(cold, decode_ar(ARBackbone(MODELS[0], enc, 2.0), CAPTIONS, seed=5)[0])


@pytest.mark.parametrize("tau", [0.02, 0.1])
def test_an_image_is_the_same_alone_and_in_a_batch(tau):
    cfg = knobs(tau=tau, radius=1)
    batch, trace = _mulosd(cfg)
    for i, c in enumerate(CAPTIONS):
        alone, _ = _mulosd(cfg, captions=[c], image_ids=torch.tensor([i]))
        assert torch.equal(alone[0], batch[i])
    r = trace.rounds[1]
    assert torch.equal(r.accepted | r.resampled, r.drafted) and not (r.accepted & r.resampled).any()


@pytest.mark.parametrize("cfg", [knobs(tau=0.1), knobs(tau=0.1, draft_rows=2, draft="zipar"),
                                 knobs(tau=1.5, resample="zipar")])
def test_the_critical_path_is_accounted_by_phase(cfg):
    """steps = 1 (the two prefix forwards) + drafting + verification + resampling, each phase one forward per
    step: every drafter forward after its prefix drafts, one verification per round, the rest resample."""
    _, trace = _mulosd(cfg)
    c, rounds = trace.counts, 4 // cfg.draft_rows
    assert trace.steps == 1 + c["draft_steps"] + c["verify_steps"] + c["resample_steps"]
    assert c["draft_steps"] == trace.forwards["drafter"] - 1 and c["verify_steps"] == rounds
    assert c["resample_steps"] == trace.forwards["verifier"] - 1 - rounds


def test_islands_are_the_8_connected_components_of_hand_made_masks():
    mask = np.array([[1, 1, 0, 0, 0, 1],
                     [0, 0, 1, 0, 0, 0],   # (1,2) touches (0,1) diagonally: same island
                     [0, 0, 0, 0, 1, 0],
                     [1, 0, 0, 0, 0, 1]], dtype=bool)  # (3,5) touches (2,4) diagonally
    labels, n = islands(mask)
    assert n == 4
    groups = sorted(sorted(map(tuple, np.argwhere(labels == k).tolist())) for k in range(1, n + 1))
    assert groups == [[(0, 0), (0, 1), (1, 2)], [(0, 5)], [(2, 4), (3, 5)], [(3, 0)]]
    # a row's end and the next row's start are not 8-adjacent, but for resampling they are linked: the model
    # predicts a row's first token from the slot of the previous row's last one
    wrap = np.array([[0, 0, 1], [1, 0, 0], [0, 0, 0]], dtype=bool)
    assert islands(wrap)[1] == 2
    assert [g.tolist() for g in raster_linked_islands(wrap)] == [[2, 3]]


def _drain(schedule):
    """The steps an island schedule takes: per step, the positions it has ready (all marked done at once)."""
    steps = []
    while ready := schedule.ready():
        steps.append(sorted(u for u, _, _ in ready))
        for _, j, i in ready:
            schedule.mark(j, i)
    return steps


def test_island_schedules_by_hand():
    # two islands on a 2 x 6 block starting at raster position 12 (row 2 of a 6-wide grid)
    redo = torch.tensor([[0, 1, 1, 1, 0, 0],
                         [0, 1, 1, 0, 0, 1]], dtype=torch.bool).flatten()
    par = IslandSchedule.of(redo, 12, 6, "parallel", 2)
    assert par.islands == [[13, 14, 15, 19, 20], [23]] and par.first == 13
    assert _drain(par) == [[13, 23], [14], [15], [19], [20]]  # raster within an island, islands side by side
    assert _drain(IslandSchedule.of(redo, 12, 6, "serial", 2)) == [[13], [14], [15], [19], [20], [23]]
    # ZipAR, window 2: (i+1, j) waits for (i, j + 1) only
    assert _drain(IslandSchedule.of(redo, 12, 6, "zipar", 2)) == [[13, 23], [14], [15, 19], [20]]
    z = IslandSchedule.of(redo, 12, 6, "zipar", 2)
    z.mark(0, 0)
    assert z.pending(0, 14) and not z.pending(0, 13) and not z.pending(1, 14)
    assert z.pending_in_row(0, 2) == [14, 15] and z.row_size(0, 3) == 2 and z.first_pending(99) == 14
    assert IslandSchedule.of(torch.zeros(12, dtype=torch.bool), 0, 6, "parallel", 2).first is None


def _ready_by_definition(schedule, tentative, window):
    """IslandSchedule.ready as its docstring defines it, every position of every island looked at in raster
    order (ready skips the rest of a row at the first position it cannot ask)."""
    out = []
    for j, island in enumerate(schedule.islands):
        live, asked = [False] * len(island), {}
        for i, u in enumerate(island):
            row = u // schedule.grid
            if schedule.done[j][i] or window is not None and asked.get(row, 0) >= window:
                continue
            live[i] = all(schedule.done[j][k] or (live[k] and island[k] in tentative
                                                  and (window is None or island[k] // schedule.grid == row))
                          for k in schedule.blockers[j][i])
            if live[i]:
                asked[row] = asked.get(row, 0) + 1
                out.append((u, j, i))
    return out


def test_an_island_schedules_few_blockers_decide_as_all_it_waits_for():
    """`blockers` keeps, per position, the few earlier positions that stand for all it waits for; on random
    islands, tentative drafts and outcomes, the schedule asks and decides exactly as with every one of them,
    and as its definition says."""
    rng = np.random.default_rng(0)
    G = 8
    for trial in range(60):
        redo = torch.tensor(rng.random((4, G)) < 0.6).flatten()
        mode, window = ("parallel", "serial", "zipar")[trial % 3], 1 + trial % 4
        jacobi = window if trial % 2 else None
        fast, full = (IslandSchedule.of(redo, 2 * G, G, mode, window) for _ in range(2))
        reach = window - 1 if mode == "zipar" else G
        full.blockers = [[[k for k, v in enumerate(isl[:i]) if v // G == u // G or v % G <= u % G + reach]
                          for i, u in enumerate(isl)] for isl in full.islands]
        tentative = {p for isl in full.islands for p in isl if rng.random() < 0.4}
        while asked := full.ready(tentative, jacobi):
            assert fast.ready(tentative, jacobi) == asked == _ready_by_definition(fast, tentative, jacobi)
            stood, decided = set(), []
            for u, j, i in asked:  # as the resampler decides: a query whose blockers are final or stood now
                isl = full.islands[j]
                verdicts = {all(s.done[j][m] or isl[m] in stood for m in s.blockers[j][i]) for s in (fast, full)}
                assert len(verdicts) == 1
                if verdicts.pop():
                    decided.append((j, i))
                    if u in tentative and rng.random() < 0.5:
                        stood.add(u)
                    tentative.discard(u)
            for j, i in decided:
                fast.mark(j, i)
                full.mark(j, i)
        assert fast.done == full.done and all(all(d) for d in full.done)


def test_the_trace_counts_differences_and_keeps_rounds_only_when_asked():
    verifier, drafter, enc, u, d, nb = MODELS
    v, q = ARBackbone(verifier, enc, 2.0), ARBackbone(drafter, enc, 2.0)
    cfg = knobs(tau=0.1)
    _, first = decode_mulosd(v, q, u.up, d.down, CAPTIONS, nb, cfg, seed=5)
    _, second = decode_mulosd(v, q, u.up, d.down, CAPTIONS, nb, cfg, seed=5, rounds=True)
    assert first.rounds == [] and len(second.rounds) == 4  # one per low-res row
    # the backbones' counters keep counting; each trace holds its own run's share
    assert first.forwards == second.forwards and v.calls == 2 * first.forwards["verifier"]
    assert first.counts == second.counts and all(type(c) is int for c in first.counts.values())
    _, ar = decode_ar(v, CAPTIONS, seed=5)
    assert ar.forwards["verifier"] == ar.steps == 64


def test_expansion_never_touches_positions_before_t0():
    rejected = torch.zeros(1, 4, 6, dtype=torch.bool)
    rejected[0, 1, 3] = True  # t0 = 9
    rejected[0, 3, 0] = True
    grown = expand(rejected, radius=1)[0]
    flat = grown.flatten()
    assert not flat[:9].any(), "nothing before the first rejected position may be resampled"
    want = torch.zeros(4, 6, dtype=torch.bool)
    want[1, 3:5] = True  # row 1: only u >= t0 of the 3x3 neighbourhood
    want[2, 2:5] = True
    want[2, 0:2] = True  # from (3,0)
    want[3, 0:2] = True
    assert torch.equal(grown, want)
    assert torch.equal(expand(rejected, radius=0)[0], rejected[0])
    assert expand(rejected, radius=0, rejection="raster")[0].flatten().tolist() == [False] * 9 + [True] * 15
    assert not expand(torch.zeros(2, 3, 3, dtype=torch.bool), radius=2).any()


def test_pooled_acceptance_by_hand():
    p = torch.tensor([[[0.5, 0.2, 0.2, 0.1]]])
    neighbours = torch.tensor([[1, 2, 3], [2, 0, 3], [1, 0, 3], [2, 1, 0]])
    draft = torch.tensor([[1]])
    assert pooled_mass(p.log(), draft, neighbours, 0).item() == pytest.approx(0.2)
    assert pooled_mass(p.log(), draft, neighbours, 1).item() == pytest.approx(0.4)
    assert pooled_mass(p.log(), draft, neighbours, 2).item() == pytest.approx(0.9)
    assert pooled_mass(p.log(), draft, neighbours, 2, delta=0.3).item() == pytest.approx(0.5)
    assert pooled_accept(p.log(), draft, neighbours, 2, tau=0.9)
    assert not pooled_accept(p.log(), draft, neighbours, 1, tau=0.5)
    # relative: against the mode's pooled mass (token 0: 0.5 + 0.2 with k=1), 0.4 >= 0.5 * 0.7
    assert pooled_accept(p.log(), draft, neighbours, 1, tau=0.5, relative=True)
    assert not pooled_accept(p.log(), draft, neighbours, 1, tau=0.6, relative=True)
    q = torch.tensor([[[0.25, 0.25, 0.25, 0.25]]])
    assert torch.allclose(residual(p.log(), q.log()).exp(), torch.tensor([[[1.0, 0, 0, 0]]]), atol=1e-6)


@pytest.mark.parametrize("bad", [{"tau": float("nan")}, {"tau": -0.1}, {"delta": 1.5}, {"radius": -1},
                                 {"rejection": "diagonal"}, {"resample": "zigzag"}, {"resample_window": 0},
                                 {"draft_rows": 0}, {"pool_k": -2}, {"draft_temperature": -0.5},
                                 {"draft_temperature": float("nan")}, {"acceptance": "coin"},
                                 {"acceptance": "sampled", "relative": True},
                                 {"acceptance": "ratio", "relative": True}, {"expanded": "keep"}])
def test_bad_configs_are_refused(bad):
    with pytest.raises(ValueError):
        MuLoSDConfig(**bad)


def test_sampled_acceptance_chooses_the_drafts_pool_as_often_as_the_verifier_would():
    """Accept with probability min(1, mass / (tau q)), redraw outside the pool: at tau = 1 and q = 1 the pool a
    position ends in is distributed as under p (checked over 20000 draws); below 1 a pool is kept more often."""
    from mulosd.ar.noise import ACCEPT, uniform
    from mulosd.ar.sampling import sample

    p = torch.tensor([0.05, 0.3, 0.15, 0.1, 0.4])
    neighbours = torch.tensor([[1, 2], [0, 2], [3, 1], [2, 4], [3, 2]])
    n, draft = 20000, torch.zeros(1, 20000, dtype=torch.long)  # pool of code 0 with k = 1: {0, 1}, p = 0.35
    logp = p.log().expand(1, n, -1)
    pos = torch.arange(n)[None]
    for tau, q, keep in ((1.0, None, 0.35), (0.7, None, 0.5), (1.0, torch.full((1, n), 0.5), 0.7)):
        acc = sampled_accept(logp, draft, neighbours, 1, tau, uniform(3, torch.tensor([0]), pos, ACCEPT), q=q)[0]
        redrawn = sample(outside_pool(logp[0], draft[0], neighbours, 1)[None], 3, torch.tensor([0]), pos)[0]
        assert not ((redrawn == 0) | (redrawn == 1)).any(), "a redraw never lands in the rejected pool"
        final = torch.where(acc, draft[0], redrawn)
        assert (final <= 1).float().mean().item() == pytest.approx(keep, abs=0.015)
        outside = torch.bincount(final[final > 1], minlength=5)[2:].double()
        assert torch.allclose(outside / outside.sum(), p[2:].double() / p[2:].sum(), atol=0.02)  # p outside the pool
    assert sampled_accept(logp, draft, neighbours, 1, 0.0, torch.full((1, n), 0.999)).all()  # tau 0: every draft
    whole = torch.tensor([[0.6, 0.4, 0.0, 0.0, 0.0]]).log()  # no mass outside the pool: p is kept
    assert torch.equal(outside_pool(whole, torch.tensor([0]), neighbours, 1), whole)


def test_sampled_acceptance_redraws_rejected_positions_outside_their_drafts_pool():
    verifier, _, enc, u, _, nb = MODELS
    cfg = knobs(tau=1.0, pool_k=4, radius=1, acceptance="sampled", resample="zipar", draft_rows=2)
    got, trace = _mulosd(cfg)
    redrawn = 0
    for r in trace.rounds:
        rejected = r.rejected.view(3, 64)
        pool = torch.cat([r.high_draft[..., None], nb[r.high_draft][..., :4]], dim=-1)
        assert not (pool == got.view(3, 64, 1)).any(-1)[rejected].any()
        redrawn += int(rejected.sum())
    assert 0 < redrawn < 3 * 64  # some drafts accepted, some redrawn
    assert trace.counts["accepted"] > 0
    alone, _ = _mulosd(cfg, captions=CAPTIONS[2:], image_ids=torch.tensor([2]))
    assert torch.equal(alone[0], got[2])
    assert torch.equal(_mulosd(knobs(tau=0.0, acceptance="sampled"))[0], _mulosd(knobs(tau=0.0))[0])


def test_ratio_acceptance_divides_by_the_drafters_pooled_mass():
    """Same draft, same uniforms in the first round: dividing by the drafter's pooled mass q <= 1 only accepts
    more, and where q < 1 somewhere strictly more."""
    first = {}
    for mode in ("sampled", "ratio"):
        trace = _mulosd(knobs(tau=1.0, pool_k=4, acceptance=mode, draft_rows=2))[1]
        first[mode] = trace.rounds[0]
    assert torch.equal(first["sampled"].high_draft, first["ratio"].high_draft)
    assert not (first["ratio"].rejected & ~first["sampled"].rejected).any()
    assert (first["sampled"].rejected & ~first["ratio"].rejected).any()
    cfg = knobs(tau=0.5, pool_k=4, acceptance="ratio", resample="zipar", draft_rows=2)
    batch, _ = _mulosd(cfg)
    alone, _ = _mulosd(cfg, captions=CAPTIONS[1:2], image_ids=torch.tensor([1]))
    assert torch.equal(alone[0], batch[1])



def test_accepted_prefix_stops_at_the_first_rejection_or_the_first_lane_without_a_draft():
    ratio = torch.tensor([[2.0, 0.5, 1.0, 3.0], [0.2, 1.0, 1.0, 1.0], [1.0, 1.0, 0.9, 1.0]])
    u = torch.tensor([[0.9, 0.4, 0.0, 0.5], [0.3, 0.0, 0.0, 0.0], [0.1, 0.2, 0.95, 0.0]], dtype=torch.double)
    assert accepted_prefix(ratio, u).tolist() == [4, 0, 2]  # the third row's 0.95 >= 0.9 stops it
    valid = torch.tensor([[True, True, False, True], [True] * 4, [True] * 4])
    assert accepted_prefix(ratio, u, valid).tolist() == [2, 0, 2]
    assert accepted_prefix(ratio[0], u[0]).item() == 4  # one image's drafts (exact SD)

def test_draft_rows_null_drafts_the_whole_grid_in_one_round_without_d_r():
    verifier, drafter, enc, u, d, nb = MODELS
    downs = []

    def down(x):
        downs.append(x)
        return d.down(x)

    cfg = knobs(tau=0.3, draft_rows=None)
    got, trace = decode_mulosd(ARBackbone(verifier, enc, 2.0), ARBackbone(drafter, enc, 2.0), u.up, down, CAPTIONS,
                               nb, cfg, seed=5, rounds=True)
    assert len(trace.rounds) == 1 and trace.counts["verify_steps"] == 1 and not downs
    assert torch.equal(got, _mulosd(knobs(tau=0.3, draft_rows=4))[0])  # the 4 x 4 drafter's whole grid
    assert len(_mulosd(knobs(tau=0.3, draft_rows=2))[1].rounds) == 2 and MuLoSDConfig().draft_rows is None


def test_draft_rows_must_divide_the_drafter_grid():
    with pytest.raises(ValueError, match="draft_rows"):
        _mulosd(knobs(draft_rows=3))


def _tiny_pair(vocab=6, grids=(2, 2)):
    """A verifier and a drafter (grids: theirs) of `vocab` codes, and a caption encoder."""
    def make(seed, grid):
        torch.manual_seed(seed)
        m = Transformer(TransformerConfig(vocab_size=vocab, grid=grid, dim=16, layers=1, heads=2, cond_dim=8))
        m = m.double().eval()
        with torch.no_grad():
            m.head.weight.mul_(40)  # peaked, unequal distributions: acceptance is neither always nor never
        return m

    torch.manual_seed(0)
    return make(0, grids[0]), make(1, grids[1]), SceneCaptionEncoder(8).double()


@pytest.mark.slow
def test_exact_speculative_decoding_samples_the_verifiers_distribution():
    """Chi-square of the first two tokens' joint over 2000 images against the verifier's exact probabilities
    (the test caught a drafter-distribution leak with chi2 = 576; plain AR samples give 15-30 at 19 dof)."""
    from mulosd.decoding.sd import SDConfig, decode_sd

    verifier, drafter, enc = _tiny_pair()
    cap, B, V = "a red circle on a gray background", 2000, 6
    tokens, trace = decode_sd(ARBackbone(verifier, enc), ARBackbone(drafter, enc), [cap] * B, SDConfig(gamma=2),
                              seed=1)
    assert 0 < trace.counts["accepted"] < trace.counts["drafted"]
    stat, limit = _joint_chi2(tokens, verifier, enc, cap, V)
    assert stat < limit, (stat, limit)


def _joint_chi2(tokens, verifier, enc, cap, V, k=2):
    """Chi-square of the first k tokens' joint against the verifier's exact probabilities (every prefix of
    k - 1 tokens enumerated) -> (statistic, its p = 0.001 critical value). Cells expected fewer than 5 times are
    pooled into one: with the peaked tiny models some expect under one sample, and their terms alone pushed
    plain AR's statistic past the limit."""
    from scipy.stats import chi2

    from mulosd.ar import Warpers, warp

    bb = ARBackbone(verifier, enc)
    joint = warp(bb.start([cap]), Warpers())[0, 0].exp().double()  # [V]: p(x0)
    for t in range(1, k):  # p(x0 .. xt) = p(x0 .. xt-1) p(xt | x0 .. xt-1), over all V**t prefixes
        prefixes = torch.cartesian_prod(*[torch.arange(V)] * t).view(-1, t)
        bb.start([cap] * len(prefixes))
        nxt = warp(bb(torch.arange(t).expand(len(prefixes), t), prefixes), Warpers())[:, -1].exp().double()
        joint = (joint.flatten()[:, None] * nxt).flatten()
    expected = joint * tokens.shape[0]
    flat = tokens.flatten(1)[:, :k]
    seen = torch.bincount((flat * V ** torch.arange(k - 1, -1, -1)).sum(1), minlength=V ** k).double()
    big = expected >= 5
    seen, expected = (torch.cat([x[big], x[~big].sum()[None]]) for x in (seen, expected))
    return ((seen - expected) ** 2 / expected).sum().item(), chi2.ppf(0.999, int(big.sum()))


@pytest.mark.parametrize("window, coupling", [(2, "gumbel"), (4, "gumbel"), (4, "maximal")])
def test_speculative_jacobi_decoding_samples_the_verifiers_distribution(window, coupling):
    """SJD is lossless: its first three tokens over 2000 images against the verifier's exact joint (a Jacobi
    draft accepted without the p / q test, redrawn from p instead of the residual, or a coupled redraw recorded
    with the wrong q, fails this; the third token is the first a coupled redraw can reach)."""
    from mulosd.decoding import SJDConfig
    from mulosd.decoding.sjd import decode_sjd

    verifier, _, enc = _tiny_pair()
    cap, B, V = "a red circle on a gray background", 2000, 6
    tokens, trace = decode_sjd(ARBackbone(verifier, enc), [cap] * B, SJDConfig(window=window, coupling=coupling),
                               seed=1)
    assert 0 < trace.counts["accepted"] < trace.counts["drafted"]
    stat, limit = _joint_chi2(tokens, verifier, enc, cap, V, k=3)
    assert stat < limit, (stat, limit)


def test_maximal_coupling_keeps_the_old_draft_as_often_as_a_sample_of_p_can():
    """The point of SCD: a redraw past the first rejection is a sample of its new p that equals the old draft
    with probability 1 - TV(p, q_old), the most any coupling achieves; the Gumbel coupling (the same position's
    draft noise) keeps it less often. 20000 redraws of one position against fixed p and q_old."""
    from scipy.stats import chisquare

    from mulosd.decoding.sjd import _coupled, _draw

    torch.manual_seed(0)
    B, V, N = 20000, 5, 64
    logq, logp = (torch.randn(V).mul(1.5).log_softmax(-1).expand(B, 1, V) for _ in range(2))
    ids, n, position = torch.arange(B), torch.zeros(B, dtype=torch.long), torch.zeros(B, 1, dtype=torch.long)
    old = _draw(logq, 0, ids, position)
    gumbel = _draw(logp, 0, ids, position)  # what coupling=gumbel redraws: the position's own noise, new p
    coupled = _coupled(gumbel, logp, old, logq, position, n, 0, ids, N)
    tv = 0.5 * (logp[0, 0].exp() - logq[0, 0].exp()).abs().sum().item()
    kept, kept_gumbel = (coupled == old).double().mean().item(), (gumbel == old).double().mean().item()
    assert abs(kept - (1 - tv)) < 4 * (tv * (1 - tv) / B) ** 0.5 + 1e-3, (kept, 1 - tv)
    assert kept > kept_gumbel + 0.01, (kept, kept_gumbel)
    counts = torch.bincount(coupled.flatten(), minlength=V).double()
    expected = logp[0, 0].double().softmax(-1) * B
    assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-3  # a sample of p



def test_a_coupled_redraw_survives_the_rounding_a_batch_brings():
    """A batch's matmuls round the verifier's p differently from a lone image's (up to 1e-4 in log p), and an
    image must decode the same either way: a coupled redraw may move only where two codes tie. Inverting the
    residual's CDF failed this (a sum over the codebook moves the draw across code boundaries: 2% of report-world
    images differed between batch 1 and 8)."""
    from mulosd.decoding.sjd import _coupled

    torch.manual_seed(0)
    B, V, N = 4000, 1024, 4096
    logq, logp = (torch.randn(B, 1, V).mul(2).log_softmax(-1) for _ in range(2))
    ids, n, position = torch.arange(B), torch.zeros(B, dtype=torch.long), torch.zeros(B, 1, dtype=torch.long)
    old = logq.argmax(-1)  # an unlikely draft under p: it is redrawn nearly always
    nudged = (logp + 1e-4 * torch.randn_like(logp)).log_softmax(-1)
    a, b = (_coupled(old, lp, old, logq, position, n, 0, ids, N) for lp in (logp, nudged))
    redrawn = (a != old).sum().item()
    assert redrawn > B // 2
    assert (a != b).sum().item() <= 1, (a != b).sum().item()  # inversion: 7 of these 4000

def test_sjd_alone_and_in_a_batch_and_its_counters():
    from mulosd.decoding import SJDConfig
    from mulosd.decoding.sjd import decode_sjd

    verifier, _, enc, *_ = MODELS
    cfg = SJDConfig(window=4)
    batch, trace = decode_sjd(ARBackbone(verifier, enc, 2.0), CAPTIONS, cfg, seed=5)
    for i, c in enumerate(CAPTIONS):
        alone, _ = decode_sjd(ARBackbone(verifier, enc, 2.0), [c], cfg, seed=5, image_ids=torch.tensor([i]))
        assert torch.equal(alone[0], batch[i])
    # every iteration commits at least one token per image; the forwards are the prefix plus the iterations
    assert trace.forwards["verifier"] == trace.steps <= 1 + 64
    assert trace.counts["accepted"] <= trace.counts["drafted"] <= 3 * 64
    # a window of 1 drafts each position from its exact distribution: every draft passes, one forward a token
    _, one = decode_sjd(ARBackbone(verifier, enc, 2.0), CAPTIONS, SJDConfig(window=1), seed=5)
    assert one.counts["accepted"] == one.counts["drafted"] == 3 * 64 and one.steps == 1 + 64


def test_speculative_decoding_batch_independence_and_lantern():
    from mulosd.decoding.sd import SDConfig, decode_sd

    verifier, drafter, enc = _tiny_pair()
    caps = [caption_text(sample_scene(1, i).prompt) for i in range(3)]
    nb = neighbour_table(torch.randn(6, 4), 3)
    for cfg in (SDConfig(gamma=3), SDConfig(gamma=2, acceptance="lantern", pool_k=2, delta=0.3)):
        batch, _ = decode_sd(ARBackbone(verifier, enc), ARBackbone(drafter, enc), caps, cfg, seed=4, neighbours=nb)
        for i, c in enumerate(caps):
            alone, _ = decode_sd(ARBackbone(verifier, enc), ARBackbone(drafter, enc), [c], cfg, seed=4,
                                 neighbours=nb, image_ids=torch.tensor([i]))
            assert torch.equal(alone[0], batch[i])
    # lantern with no neighbour mass is exact speculative sampling, draw for draw
    exact, _ = decode_sd(ARBackbone(verifier, enc), ARBackbone(drafter, enc), caps, SDConfig(gamma=2), seed=4)
    relaxed, _ = decode_sd(ARBackbone(verifier, enc), ARBackbone(drafter, enc), caps,
                           SDConfig(gamma=2, acceptance="lantern", pool_k=2, delta=0.0), seed=4, neighbours=nb)
    assert torch.equal(exact, relaxed)


def test_zipar_with_a_full_row_window_is_plain_ar_and_counts_its_forwards():
    from mulosd.decoding.zipar import decode_zipar

    verifier, _, enc, *_ = MODELS
    want, _ = decode_ar(ARBackbone(verifier, enc, 2.0), CAPTIONS, seed=5)
    got, trace = decode_zipar(ARBackbone(verifier, enc, 2.0), CAPTIONS, window=8, seed=5)
    assert torch.equal(got, want) and trace.counts["provisional_kv"] == 0
    fast, trace = decode_zipar(ARBackbone(verifier, enc, 2.0), CAPTIONS, window=2, seed=5)
    assert trace.forwards["verifier"] == 1 + 8 + 7 * 2 - 1  # prefix, then W + (H-1)s steps less the first
    assert torch.equal(fast[:, 0], want[:, 0]), "the first row has its full context either way"
    assert trace.counts["provisional_kv"] == 7 * 7
    with pytest.raises(ValueError):
        decode_zipar(ARBackbone(verifier, enc), CAPTIONS, window=0)


def test_frechet_distance_is_zero_on_identical_sets_and_grows_with_a_shift():
    from mulosd.eval.fd import frechet_distance

    rng = np.random.default_rng(0)
    a = rng.normal(size=(200, 8))
    assert abs(frechet_distance(a, a)) < 1e-6
    near, far = frechet_distance(a, a + 0.1), frechet_distance(a, a + 1.0)
    assert near == pytest.approx(8 * 0.01, rel=1e-3) and far == pytest.approx(8.0, rel=1e-3)


def test_frechet_distance_equals_the_matrix_square_root_formula():
    """The eigenvalue trace against the textbook formula with an explicit matrix square root (scipy)."""
    from scipy import linalg

    from mulosd.eval.fd import frechet_distance

    rng = np.random.default_rng(1)
    a = rng.normal(size=(300, 6)) @ rng.normal(size=(6, 6))
    b = rng.normal(size=(300, 6)) @ rng.normal(size=(6, 6)) + 0.5
    s_a, s_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    textbook = ((a.mean(0) - b.mean(0)) ** 2).sum() + np.trace(s_a + s_b - 2 * linalg.sqrtm(s_a @ s_b).real)
    assert frechet_distance(a, b) == pytest.approx(textbook, rel=1e-6)


def _reject_a_rectangle(logp, draft):
    """Forced acceptance: in every round's 2 x 8 block, columns 1-5 of both rows are rejected (one island)."""
    accepted = torch.ones_like(draft, dtype=torch.bool).view(draft.shape[0], 2, 8)
    accepted[:, :, 1:6] = False
    return accepted.view_as(draft)


def test_zipar_within_islands_advances_rows_together():
    par_img, par = _mulosd(knobs(radius=0, resample="parallel"), accept=_reject_a_rectangle)
    zip_img, zipar = _mulosd(knobs(radius=0, resample="zipar", resample_window=2), accept=_reject_a_rectangle)
    # per round: the island's 10 positions, t0 = (0,1) straight from the verification; raster: 9 queries in a
    # row; ZipAR (window 2: (1,j) waits for (0,j+1)): (0,2) | (0,3)+(1,1) | (0,4)+(1,2) | (0,5)+(1,3) | (1,4) | (1,5)
    assert par.forwards["verifier"] == 1 + 4 * (1 + 9)
    assert zipar.forwards["verifier"] == 1 + 4 * (1 + 6)
    # a first row's positions see the same context either way (what ZipAR skips lies after them): same tokens
    assert torch.equal(zip_img[:, 0::2], par_img[:, 0::2])
    wide, _ = _mulosd(knobs(radius=0, resample="zipar", resample_window=8), accept=_reject_a_rectangle)
    assert torch.equal(wide, par_img)  # a full-row window waits for every earlier position: raster order
    cfg = knobs(tau=0.1, radius=1, resample="zipar", resample_window=1)
    batch, _ = _mulosd(cfg)
    for i, c in enumerate(CAPTIONS):
        alone, _ = _mulosd(cfg, captions=[c], image_ids=torch.tensor([i]))
        assert torch.equal(alone[0], batch[i])


def _retests(passing: bool):
    """The rectangle for the verification test; every re-test (a flat batch of drafts) passes, or fails."""
    def accept(logp, draft):
        return _reject_a_rectangle(logp, draft) if draft.dim() == 2 else torch.full_like(draft, passing, dtype=bool)
    return accept


def test_reverify_keeps_the_drafts_that_pass_again_and_resolves_a_run_of_them_in_one_forward():
    """Per round the rectangle (0..1, 1..5) is rejected; radius 1 grows R_X by (0,6), (1,0), (1,6). Raster order
    within the island (parallel): the paper resamples 12 positions after t0, one forward each. Reverify with
    passing re-tests: (0,2)..(0,5) one by one, then one forward asks (0,6), (1,0) and (1,1) (whose unfinished
    predecessors are drafts that may stand): both drafts stand, so (1,1) is sampled in that same forward;
    then (1,2)..(1,5) and (1,6): 10 forwards."""
    cfg = knobs(radius=1, resample="parallel")
    paper_img, paper = _mulosd(cfg, accept=_retests(True))
    got, trace = _mulosd(replace(cfg, expanded="reverify"), accept=_retests(True))
    assert paper.forwards["verifier"] == 1 + 4 * (1 + 12) and trace.forwards["verifier"] == 1 + 4 * (1 + 10)
    assert trace.counts["accepted"] == 3 * 4 * (16 - 10) and trace.counts["resampled"] == 3 * 4 * 10
    grown = torch.zeros(8, 8, dtype=torch.bool)
    grown[0::2, 6] = grown[1::2, 0] = grown[1::2, 6] = True
    for k, rnd in enumerate(trace.rounds):  # the grown positions hold their drafts and count as accepted
        rows = slice(16 * k, 16 * k + 16)
        assert torch.equal(got.flatten(1)[:, grown.flatten()][:, 3 * k:3 * k + 3],
                           rnd.high_draft[:, grown.flatten()][:, 3 * k:3 * k + 3])
        assert rnd.accepted[:, rows].sum() == 3 * 6 and not (rnd.accepted & rnd.resampled).any()
    # the first rows' rejected positions see the same final context either way: the same tokens
    assert torch.equal(got.view(3, 8, 8)[:, 0::2, 1:6], paper_img.view(3, 8, 8)[:, 0::2, 1:6])


@pytest.mark.parametrize("resample", ["serial", "parallel"])
def test_reverify_where_every_retest_fails_is_the_papers_resampling(resample):
    """No draft stands, so no speculative answer ever counts: each grown position is sampled from p once its
    context is final, exactly when and as the paper resamples it (R_X is one island per round here, queried in
    raster order, so every slot a query sees is final in both)."""
    cfg = knobs(radius=1, resample=resample, acceptance="threshold")
    want, paper = _mulosd(cfg, accept=_retests(False))
    got, trace = _mulosd(replace(cfg, expanded="reverify"), accept=_retests(False))
    assert torch.equal(got, want)
    assert trace.steps == paper.steps and trace.counts["resampled"] == paper.counts["resampled"]


@pytest.mark.parametrize("acceptance,tau", [("ratio", 2.0), ("sampled", 0.5)])  # half rejected, on these models
def test_reverify_keeps_more_drafts_in_fewer_steps_and_an_image_is_the_same_alone_and_in_a_batch(acceptance, tau):
    cfg = knobs(tau=tau, radius=1, resample="zipar", expanded="reverify", acceptance=acceptance,
                       draft_rows=2)
    batch, trace = _mulosd(cfg)
    paper = _mulosd(replace(cfg, expanded="resample"))[1]
    assert trace.counts["accepted"] > 2 * paper.counts["accepted"] and trace.steps < paper.steps
    for i, c in enumerate(CAPTIONS):
        alone, _ = _mulosd(cfg, captions=[c], image_ids=torch.tensor([i]))
        assert torch.equal(alone[0], batch[i])


@pytest.mark.slow
def test_jacobi_windows_in_islands_sample_the_verifiers_distribution():
    """Everything rejected and one island resampled in raster order (`serial`): with Jacobi windows along the
    rows MuLo-SD is SJD within each row, so lossless. The first three tokens over 2000 images against the
    verifier's exact joint (their drafts come from the verification forward, which saw the up-sampled drafts:
    a q unlike p, so the tests decide; a draft kept without the p / q test, or a failure drawn from p instead of
    the residual, fails this)."""
    V, cap, B = 6, "a red circle on a gray background", 2000
    verifier, drafter, enc = _tiny_pair(V, grids=(4, 2))
    codebook = torch.randn(V, 8, generator=torch.Generator().manual_seed(0))
    up = LatentUpsampler(codebook, 2, 16, 1).double().eval()
    down = LatentDownsampler(codebook, 2, 16, 1).double().eval()
    cfg = MuLoSDConfig(tau=1.5, pool_k=2, draft_rows=2, draft="serial", resample="serial", resample_jacobi=3,
                       acceptance="threshold")
    tokens, trace = decode_mulosd(ARBackbone(verifier, enc), ARBackbone(drafter, enc), up.up, down.down, [cap] * B,
                                  neighbour_table(codebook, 2), cfg, seed=1)
    assert trace.counts["accepted"] == 0 and 0 < trace.counts["jacobi_kept"] < trace.counts["jacobi_tested"]
    stat, limit = _joint_chi2(tokens, verifier, enc, cap, V, k=3)
    assert stat < limit, (stat, limit)


def test_jacobi_windows_in_islands_take_fewer_steps_and_decode_the_same_alone_and_in_a_batch():
    """Each island row commits the accepted prefix of its window and one more token per forward: never more
    forwards than without the window, fewer where drafts stand; with the grown drafts of `reverify` and sampled
    acceptance's restricted redraws too."""
    for cfg in (knobs(tau=1.5, draft_rows=4, resample="zipar", resample_window=2),
                knobs(tau=0.3, radius=1, draft_rows=2, resample="zipar", acceptance="sampled"),
                knobs(tau=2.0, radius=1, draft_rows=2, resample="parallel", expanded="reverify", acceptance="ratio")):
        _, plain = _mulosd(cfg)
        batch, trace = _mulosd(replace(cfg, resample_jacobi=3))
        assert trace.counts["resample_steps"] < plain.counts["resample_steps"], cfg
        assert 0 < trace.counts["jacobi_kept"] <= trace.counts["jacobi_tested"]
        assert trace.counts["accepted"] + trace.counts["resampled"] == 3 * 64
        for i, c in enumerate(CAPTIONS):
            alone, _ = _mulosd(replace(cfg, resample_jacobi=3), captions=[c], image_ids=torch.tensor([i]))
            assert torch.equal(alone[0], batch[i])


@pytest.mark.parametrize("window", [1, 2, 3])
def test_zipar_within_one_whole_image_island_is_zipar(window):
    """Everything rejected in a single round: R_X is the whole image, one island, and ZipAR within it must be
    decode_zipar token for token, row starts through the same provisional slots."""
    verifier, _, enc, *_ = MODELS
    want, zipar = decode_zipar(ARBackbone(verifier, enc, 2.0), CAPTIONS, window=window, seed=5)
    got, trace = _mulosd(knobs(tau=1.5, draft_rows=4, resample="zipar", resample_window=window))
    assert torch.equal(got, want)
    assert trace.counts["provisional_kv"] == 3 * zipar.counts["provisional_kv"]  # ours counts the whole batch
    assert trace.forwards["verifier"] == zipar.forwards["verifier"] + 1  # + the verification forward


@pytest.mark.slow
def test_after_precompile_no_decode_compiles():
    """The bench's warm-up: once precompile has run for a batch, ar and ZipAR decodes of that batch size
    compile nothing more, so no compilation falls inside a timed decode."""
    from torch._dynamo.utils import counters

    verifier, _, enc, *_ = MODELS
    bb = ARBackbone(verifier, enc, 2.5, compile=True)  # a scale no other test compiles: graphs of its own
    bb.precompile(CAPTIONS, Warpers(), seed=7)
    assert bb.cache is None and bb.calls == 0
    compiled = counters["frames"]["ok"]
    for window in (1, 2, 8):
        decode_zipar(bb, CAPTIONS, window=window, seed=7)
    decode_ar(bb, CAPTIONS, seed=7)
    assert counters["frames"]["ok"] == compiled, "a decode compiled a graph precompile did not"
    decode_ar(bb, CAPTIONS, seed=8)  # the check can fail: a new seed is a new draw graph
    assert counters["frames"]["ok"] > compiled


@pytest.mark.slow
def test_the_compiled_step_changes_no_token():
    """compile=true (torch.compile, token counts padded to buckets) against the eager step, fp64: plain AR and
    ZipAR the same token for token, MuLo-SD with every draft rejected and serial resampling still plain AR, and an
    image the same alone and in a batch."""
    verifier, drafter, enc, u, d, nb = MODELS

    def bb(model, compile):
        return ARBackbone(model, enc, 2.0, compile=compile)

    eager, _ = decode_ar(bb(verifier, False), CAPTIONS, seed=5)
    compiled, trace = decode_ar(bb(verifier, True), CAPTIONS, seed=5)
    assert torch.equal(compiled, eager) and trace.forwards["verifier"] == 64
    # ZipAR draws through the compiled sampler too (and writes several rows per forward)
    eager_zipar, _ = decode_zipar(bb(verifier, False), CAPTIONS, window=2, seed=5)
    assert torch.equal(decode_zipar(bb(verifier, True), CAPTIONS, window=2, seed=5)[0], eager_zipar)
    cfg = knobs(tau=1.5, resample="serial")
    got, _ = decode_mulosd(bb(verifier, True), bb(drafter, True), u.up, d.down, CAPTIONS, nb, cfg, seed=5)
    assert torch.equal(got, eager)
    cfg = knobs(tau=0.1)
    batch, _ = decode_mulosd(bb(verifier, True), bb(drafter, True), u.up, d.down, CAPTIONS, nb, cfg, seed=5)
    alone, _ = decode_mulosd(bb(verifier, True), bb(drafter, True), u.up, d.down, CAPTIONS[1:2], nb, cfg, seed=5,
                             image_ids=torch.tensor([1]))
    assert torch.equal(alone[0], batch[1])


def test_pjd_with_a_window_of_one_is_plain_ar_token_for_token():
    from mulosd.decoding import PJDConfig
    from mulosd.decoding.pjd import decode_pjd

    verifier, _, enc, *_ = MODELS
    want, ar = decode_ar(ARBackbone(verifier, enc, 2.0), CAPTIONS, seed=5)
    got, pjd = decode_pjd(ARBackbone(verifier, enc, 2.0), CAPTIONS, PJDConfig(window=1, start=1), seed=5)
    assert torch.equal(got, want) and pjd.steps == ar.steps and pjd.counts["drafted"] == 0


def test_pjd_decodes_an_image_the_same_alone_and_in_a_batch():
    """Each image advances by its own acceptances: its tokens do not depend on the images beside it (upstream's
    lockstep would move every image by the least any accepted)."""
    from mulosd.decoding import PJDConfig
    from mulosd.decoding.pjd import decode_pjd

    verifier, _, enc, *_ = MODELS
    cfg = PJDConfig(window=3, start=1)
    batch, trace = decode_pjd(ARBackbone(verifier, enc, 2.0), CAPTIONS, cfg, seed=5)
    accepted, steps = 0, []
    for i, c in enumerate(CAPTIONS):
        alone, one = decode_pjd(ARBackbone(verifier, enc, 2.0), [c], cfg, seed=5, image_ids=torch.tensor([i]))
        assert torch.equal(alone[0], batch[i]), i
        accepted += one.counts["accepted"]
        steps.append(one.steps)
    assert 0 < trace.counts["accepted"] == accepted < trace.counts["drafted"]
    assert len(set(steps)) > 1 and trace.steps == max(steps)  # an image that is done waits, writing a no-op


def test_pjd_one_row_at_a_time_samples_the_verifiers_distribution():
    """With rows one after another (start >= the grid's width) PJD is SJD within each row: lossless. The first
    three tokens over 2000 images against the verifier's exact joint (the third is the next row's first)."""
    from mulosd.decoding import PJDConfig
    from mulosd.decoding.pjd import decode_pjd

    verifier, _, enc = _tiny_pair()
    cap, B, V = "a red circle on a gray background", 2000, 6
    tokens, trace = decode_pjd(ARBackbone(verifier, enc), [cap] * B, PJDConfig(window=2, start=99), seed=1)
    assert 0 < trace.counts["accepted"] < trace.counts["drafted"]
    stat, limit = _joint_chi2(tokens, verifier, enc, cap, V, k=3)
    assert stat < limit, (stat, limit)


def test_pjd_runs_rows_together_in_fewer_forwards_and_its_windows_do_not_see_each_other():
    """Rows started early decode in fewer forwards than one row at a time; and a write in one group does not
    change what another group's write computes (the row-causal mask)."""
    from mulosd.decoding import PJDConfig
    from mulosd.decoding.pjd import decode_pjd

    verifier, _, enc, *_ = MODELS
    _, alone = decode_pjd(ARBackbone(verifier, enc, 2.0), CAPTIONS, PJDConfig(window=4, start=99), seed=5)
    _, together = decode_pjd(ARBackbone(verifier, enc, 2.0), CAPTIONS, PJDConfig(window=4, start=2), seed=5)
    assert together.steps < alone.steps and together.forwards["verifier"] == together.steps
    bb = ARBackbone(verifier, enc, 2.0)
    bb.start(CAPTIONS[:1])
    pos, tok = torch.tensor([[0, 1, 8, 9]]), torch.tensor([[3, 4, 5, 6]])
    grouped = bb(pos, tok, groups=torch.tensor([0, 0, 1, 1]))
    bb.forget_mask(torch.ones(1, 64, dtype=torch.bool))
    first = bb(pos[:, :2], tok[:, :2])
    bb.forget_mask(torch.ones(1, 64, dtype=torch.bool))
    second = bb(pos[:, 2:], tok[:, 2:])
    assert torch.allclose(grouped[:, :2], first, atol=1e-9) and torch.allclose(grouped[:, 2:], second, atol=1e-9)
