"""`benchmarks/peers.py`'s paired ratios: what its comparison lines report, checked on
times whose answer is known."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np


def _peers():
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "peers.py"
    spec = importlib.util.spec_from_file_location("peers_benchmark", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_load_shared_by_a_round_cancels_in_its_ratio():
    peers = _peers()
    rng = np.random.default_rng(1)
    load = rng.uniform(1.0, 1.8, 300)  # each round's slowdown, the same for both calls
    peer = list(10.0 * load)
    ours = list(10.3 * load)  # 3% slower in every round
    mid, low, high = peers.paired_ratio(ours, peer)
    assert abs(mid - 1.03) < 1e-12
    assert abs(low - 1.03) < 1e-12
    assert abs(high - 1.03) < 1e-12
    # the same times paired across rounds (as if each round's two calls met different
    # loads): the load no longer cancels, and the interval widens
    shuffled = list(np.asarray(ours)[rng.permutation(300)])
    _, low, high = peers.paired_ratio(shuffled, peer)
    assert high - low > 0.05


def test_the_interval_holds_the_median_of_the_round_ratios():
    peers = _peers()
    rng = np.random.default_rng(2)
    peer = rng.uniform(9.0, 11.0, 101)
    ours = peer * rng.uniform(0.9, 1.1, 101)
    mid, low, high = peers.paired_ratio(list(ours), list(peer))
    ratios = ours / peer
    assert mid == float(np.median(ratios))  # 101 rounds: the middle one
    assert ratios.min() <= low <= mid <= high <= ratios.max()
    assert peers.paired_ratio(list(ours), list(peer)) == (mid, low, high)  # seeded


def test_comparisons_name_what_ran_and_say_when_no_peer_did():
    peers = _peers()
    rounds = {"fwd_ms": [1.0, 1.0, 1.0], "step_ms": [2.0, 2.0, 2.0]}
    rows = [
        peers.Row(name="precision W8A8 PTQ", rounds=rounds),
        peers.Row(name="qwix W8A8 PTQ", rounds={"fwd_ms": [0.5, 0.5, 0.5]}),
    ]
    text = peers.format_comparisons(rows)
    assert "W8A8 PTQ forward / Qwix              2.000  [2.000, 2.000]" in text
    assert "Flax" not in text  # its rows did not run
    alone = peers.format_comparisons(rows[:1])
    assert alone.splitlines()[1] == "  none: no peer ran (see the notes)"


def test_the_null_comparison_is_reported_apart_from_the_peers():
    peers = _peers()
    rows = [
        peers.Row(name="  original operands", rounds={"step_ms": [2.0, 2.0, 2.0]}),
        peers.Row(name="  same, compiled again", rounds={"step_ms": [2.2, 2.2, 2.2]}),
    ]
    lines = peers.format_comparisons(rows).splitlines()
    assert lines[1] == "  none: no peer ran (see the notes)"
    assert lines[2] == "  null: Qwix's rule, compiled twice    1.100  [1.100, 1.100]"
