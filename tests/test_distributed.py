"""Distributed norms on gloo, 2 and 4 CPU processes (see dist_scenarios.py)."""

from __future__ import annotations

import json
import math
import socket
import time

import pytest
import torch
import torch.distributed as dist

import dist_scenarios

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

REL = 1e-6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world, out, names=None, collective_timeout=120, deadline=600):
    """Runs scenarios (default: all of dist_scenarios.SCENARIOS) on ``world`` fresh
    processes; returns each rank's records. Ranks that issue different
    collectives raise after ``collective_timeout`` seconds; processes still
    running after ``deadline`` seconds are killed and the test fails."""
    context = torch.multiprocessing.spawn(
        dist_scenarios.worker,
        args=(world, _free_port(), str(out), names, collective_timeout),
        nprocs=world,
        join=False,
    )
    end = time.monotonic() + deadline
    while not context.join(timeout=max(0.0, end - time.monotonic())):
        if time.monotonic() >= end:
            for process in context.processes:
                process.kill()
                process.join()
            pytest.fail(f"the ranks hung: killed after {deadline} s")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def ranks(request, tmp_path_factory):
    """Runs every scenario once on a fresh process group; returns each rank's records."""
    world = request.param
    return run_ranks(world, tmp_path_factory.mktemp(f"dist{world}"))


def _scenario(ranks, name):
    records = [r[name] for r in ranks]
    for record in records:
        assert "exception" not in record, record.get("exception")
    return records


def _check_pairs(records, rel=REL):
    for record in records:
        for key, (got, expected) in record.items():
            assert got == pytest.approx(expected, rel=rel), key
    assert all(r == records[0] for r in records), "ranks disagree"


def test_plain_disjoint_shards_with_group(ranks):
    _check_pairs(_scenario(ranks, "plain_shards_with_group"))


def test_a_plan_cached_without_group_never_serves_a_call_with_group(ranks):
    records = _scenario(ranks, "cached_plans_with_and_without_group")
    for record in records:
        for key, (got, expected) in record.items():
            assert got == pytest.approx(expected, rel=REL), key


def test_dtensor_shard_and_replicate(ranks):
    records = _scenario(ranks, "dtensor_placements")
    for record in records:
        got, expected = record.pop("tensor_norms")
        assert got == pytest.approx(expected, rel=REL)
    _check_pairs(records)


def test_two_dimensional_mesh(ranks):
    if len(ranks) % 2:
        pytest.skip("needs an even number of ranks")
    _check_pairs(_scenario(ranks, "two_d_mesh"))


def test_mixed_meshes_in_one_call(ranks):
    _check_pairs(_scenario(ranks, "mixed_meshes"))


def test_nan_on_one_rank_reaches_every_rank(ranks):
    for record in _scenario(ranks, "nan_on_one_rank"):
        assert all(math.isnan(value) for value in record.values()), record


def test_partial_placement_is_rejected_on_every_rank(ranks):
    for record in _scenario(ranks, "partial_is_rejected"):
        assert record["error"] and "Partial" in record["error"]


def test_fsdp2_clip_matches_torch_on_the_unsharded_model(ranks):
    for record in _scenario(ranks, "fsdp2_clip"):
        got, expected, kind = record["norm"]
        assert got == pytest.approx(expected, rel=1e-5)
        assert kind == "Tensor"  # a plain tensor, the same on every rank
        assert record["max_grad_diff"] <= 1e-6
        assert record["clipped_norm"] == pytest.approx(0.5, rel=1e-5)


def test_dtensor_clip_matches_torch(ranks):
    for record in _scenario(ranks, "dtensor_clip_matches_torch"):
        got, expected = record["norm"]
        assert got == pytest.approx(expected, rel=1e-6)
        assert record["max_grad_diff"] <= 1e-6


def test_a_dtensor_norm_given_to_clip_is_its_full_value(ranks):
    for record in _scenario(ranks, "dtensor_norm_given_to_clip"):
        assert record["kind"] == "DTensor"  # what torch's get_total_norm returns on DTensors
        got, expected = record["total_norm"]
        assert got == pytest.approx(expected, rel=1e-6)
        assert record["max_grad_diff"] <= 1e-6
        assert record["partial_max_grad_diff"] <= 1e-6  # a Partial norm: its sum, not the local share


def test_cached_plan_follows_dtensor_gradients(ranks):
    _check_pairs(_scenario(ranks, "cached_plan_follows_dtensor_gradients"))


def test_cached_plan_follows_dtensor_layouts(ranks):
    _check_pairs(_scenario(ranks, "cached_plan_follows_dtensor_layouts"))


def test_module_to_swaps_dtensor_parameters_after_a_cached_clip(ranks):
    _check_pairs(_scenario(ranks, "module_to_after_a_cached_clip"))


def test_group_tensor_norms_with_uneven_items(ranks):
    for record in _scenario(ranks, "group_tensor_norms_with_uneven_items"):
        got, expected = record["total"]
        assert got == pytest.approx(expected, rel=REL)
        got, expected = record["per_item"]
        assert got == pytest.approx(expected, rel=REL)


def test_l2_partials_of_every_scale_merge_across_ranks(ranks):
    # 1e200 on one rank, subnormals on another: the scaled merge keeps the norm finite and exact.
    _check_pairs(_scenario(ranks, "l2_extremes_across_ranks_on_the_torch_backend"), rel=1e-12)


def test_l2_extremes_across_ranks_on_the_default_backend(ranks):
    # The same on the C++ kernels: needs their scaled float64 L2 partials.
    _check_pairs(_scenario(ranks, "l2_extremes_across_ranks"), rel=1e-12)


def test_l2_sum_that_overflows_only_across_ranks_is_finite(ranks):
    _check_pairs(_scenario(ranks, "l2_sum_overflows_only_across_ranks"), rel=1e-12)


def test_unscaled_partials_keep_their_bits(ranks):
    for record in _scenario(ranks, "unscaled_partials_keep_their_bits"):
        assert record["same bits"]


def test_every_rank_issues_the_same_collectives_whatever_the_values(ranks):
    records = _scenario(ranks, "same_collectives_whatever_the_values")
    assert records[0]["issued"] and all(r["issued"] == records[0]["issued"] for r in records)


def test_norm_types_only_torch_computes_across_ranks(ranks):
    records = _scenario(ranks, "norm_types_only_torch_computes_across_ranks")
    for record in records:
        assert "norm_type=0" in record.pop("p=0 on DTensors")  # refused on every rank, before any collective
    _check_pairs(records)


def test_group_and_dtensors_where_a_rank_holds_no_plain_gradient(tmp_path):
    # Ranks that issue their collectives in different orders wait on each other:
    # each collective (and the ranks' start-up rendezvous, which a busy machine
    # can spread out) gives up after 90 s, and the test after 4 minutes.
    name = "group_and_dtensors_where_a_rank_holds_no_plain_gradient"
    records = _scenario(run_ranks(2, tmp_path, [name], collective_timeout=90, deadline=240), name)
    for record in records:
        got, expected = record.pop("per item")
        assert got == pytest.approx(expected, rel=1e-12)
    _check_pairs(records, rel=1e-12)
