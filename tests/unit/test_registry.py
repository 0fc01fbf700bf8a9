"""``pods.registry.Registry``'s specs: what a plug-in needs is a typed object registered with it, read by ``spec(name)``
(the spec type's defaults when none was given, a lazy entry's without importing it), and a spec of another type is
refused. Then the shipped registries: every spec the code registers is of its registry's type."""

from __future__ import annotations

import sys
from dataclasses import FrozenInstanceError, dataclass

import pytest

from pods.registry import Registry


@dataclass(frozen=True)
class Needs:
    stats: bool = False
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Other:
    stats: bool = False


def test_a_spec_registered_with_an_entry_is_read_back_and_the_default_fills_in():
    reg = Registry("thing", spec=Needs)

    @reg.register("eager", spec=Needs(stats=True, keys=("a",)))
    def eager():
        return 1

    reg.register("plain", lambda: 2)
    assert reg.get("eager") is eager and reg.spec("eager") == Needs(stats=True, keys=("a",))
    assert reg.spec("plain") == Needs() and reg.get("plain")() == 2
    with pytest.raises(FrozenInstanceError):
        reg.spec("eager").stats = False  # a spec cannot be changed after registration


def test_a_lazy_entrys_spec_is_known_without_importing_it():
    reg = Registry("thing", spec=Needs)
    module = "pods_test_never_imported_module"
    reg.register_lazy("heavy", f"{module}:fn", spec=Needs(stats=True))
    assert reg.spec("heavy").stats and module not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        reg.get("heavy")  # the import happens only here


def test_a_spec_of_another_type_or_on_a_registry_without_specs_is_refused():
    reg = Registry("thing", spec=Needs)
    with pytest.raises(TypeError, match="thing 'x': the spec must be a Needs, got Other"):
        reg.register("x", lambda: 0, spec=Other(stats=True))
    with pytest.raises(TypeError, match="the spec must be a Needs, got dict"):
        reg.register_lazy("y", "m:f", spec={"stats": True})
    assert "x" not in reg and "y" not in reg  # nothing half-registered
    bare = Registry("bare")
    with pytest.raises(TypeError, match="the spec must be a no spec, got Needs"):
        bare.register("z", lambda: 0, spec=Needs())
    bare.register("z", lambda: 0)
    with pytest.raises(TypeError, match="bare entries carry no spec"):
        bare.spec("z")


def test_the_spec_type_must_be_a_frozen_dataclass():
    @dataclass
    class Mutable:
        x: int = 0

    for bad in (Mutable, dict, int):
        with pytest.raises(TypeError, match="must be a frozen dataclass"):
            Registry("thing", spec=bad)


def test_unknown_names_and_conflicting_registrations_fail_with_the_valid_names():
    reg = Registry("thing", spec=Needs)
    fn = reg.register("a", lambda: 0, spec=Needs(stats=True))
    reg.register("a", fn, spec=Needs(stats=True))  # the same entry again: fine
    reg.register("b", fn)  # one function under a second name, with the default spec
    assert reg.spec("b") == Needs()
    with pytest.raises(ValueError, match="registered twice with different specs"):
        reg.register("a", fn, spec=Needs(stats=False))
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("a", lambda: 1)
    with pytest.raises(ValueError, match="unknown thing 'c'; valid: a, b"):
        reg.spec("c")


def test_the_shipped_registries_carry_their_specs():
    from pods.downsample import RULES, RuleSpec
    from pods.engines.kv_policies import KV_POLICIES, KvSpec
    from pods.losses import AGGREGATIONS, AggSpec
    from pods.tasks import DATASETS
    from pods.tasks.base import DatasetSpec
    from pods.tokens import CORRECTIONS, TOKEN_SELECTORS, TokenSpec

    for reg, kind in ((RULES, RuleSpec), (AGGREGATIONS, AggSpec), (TOKEN_SELECTORS, TokenSpec), (CORRECTIONS, TokenSpec)):
        assert reg.spec_type is kind and all(type(reg.spec(n)) is kind for n in reg.names())
    assert (KV_POLICIES.spec_type, DATASETS.spec_type) == (KvSpec, DatasetSpec)
    # what the loop asks of each: a whole-step rule gathers, the D3S selector needs entropies, Sparse-RL the pre-pass
    assert [n for n in RULES.names() if RULES.spec(n).across_ranks] == ["d3s_cross_step", "d3s_two_stage"]
    assert [n for n in RULES.names() if RULES.spec(n).cross_group] == ["d3s_cross", "d3s_cross_step", "d3s_two_stage"]
    assert RULES.spec("d3s_two_stage").options == ("m_intra",) and RULES.spec("max_variance") == RuleSpec()
    assert TOKEN_SELECTORS.spec("d3s_top_k") == TokenSpec(needs_entropy=True, fraction_keys=("token_keep", "token_keep_final"))
    assert CORRECTIONS.spec("sparse_rl") == TokenSpec(needs_stats=True) and CORRECTIONS.spec("none") == TokenSpec()
    assert [n for n in KV_POLICIES.names() if KV_POLICIES.spec(n).needs_queries] == ["rkv", "snapkv"]
    assert [n for n in AGGREGATIONS.names() if AGGREGATIONS.spec(n).prepare is not None] == ["bnpo", "seq_mean_token_sum_norm"]
    from pods.tasks.toy import canonical

    assert DATASETS.spec("toy_long").sft_target is not None and DATASETS.spec("toy_arith").sft_target is canonical
