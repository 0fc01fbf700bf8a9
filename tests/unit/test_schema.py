"""pods.schema: every committed config passes it and comes back complete and typed; its errors are one line that
names the key; a dict caller that leaves keys out gets the schema's defaults (the only ones: the code has none)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from pods import schema
from pods.errors import ConfigError
from support.config import CONF, compose

GROUPS = ["model", "dataset", "hardware", "rollout", "algorithm", "logger"]
CASES = [[]] + [[f"experiment={p.stem}"] for p in sorted((CONF / "experiment").glob("*.yaml"))]
CASES += [[f"{g}={p.stem}"] for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))]


def _model(group: str, name: str):
    shapes = schema.SHAPES.get(group)
    if shapes is None:
        return {"hardware": schema.Hardware, "algorithm": schema.Algorithm}.get(group)
    got = shapes.get(name, shapes["*"])
    return got if not isinstance(got, tuple) else None


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: " ".join(o) or "defaults")
def test_every_config_passes_and_comes_back_complete(overrides):
    cfg = compose(overrides)
    out = schema.check(cfg)
    assert isinstance(out, schema.Root)
    assert schema.check(copy.deepcopy(out.model_dump())) == out  # idempotent: checking the completed config changes nothing
    for section in ("sampling", "train", "optim", "eval", *GROUPS):
        node = getattr(out, section)
        model = _model(section, node.name) if section in GROUPS else getattr(schema, section.capitalize())
        if model is not None:
            assert type(node) is model, section  # the shape its name picks
            assert set(node.model_dump()) == set(model.model_fields), section  # every key present, no other
    for k, v in cfg["train"].items():  # values are kept (ints for float keys become floats)
        assert getattr(out.train, k) == v


def test_a_dict_caller_gets_the_schema_defaults():
    cfg = compose([])
    for section, key in [
        ("algorithm", "token_rule"),
        ("algorithm", "correction"),
        ("train", "keep_checkpoints"),
        ("eval", "at_start"),
        ("hardware", "logprob_chunk_tokens"),
        ("optim", "warmup_ratio"),
    ]:
        del cfg[section][key]
    del cfg["sampling"]
    out = schema.check(cfg)
    assert out.algorithm.token_rule == "all" and out.algorithm.correction == "none"
    assert out.train.keep_checkpoints is None and out.eval.at_start is True and out.optim.warmup_ratio == 0.0
    assert out.sampling == schema.Sampling()


def test_types_are_normalised():
    out = schema.check(compose(["train.time_budget_s=60", "optim.lr=1"]))
    assert out.train.time_budget_s == 60.0 and isinstance(out.train.time_budget_s, float)
    assert isinstance(out.optim.lr, float) and isinstance(out.algorithm.n, int)


BAD = [
    (("optim", "lr"), "abc", "optim.lr must be a number, got 'abc'"),
    (("optim", "lr"), -1.0, "optim.lr must be >= 0, got -1.0"),
    (("train", "max_steps"), 0, "train.max_steps must be >= 1 (or null), got 0"),
    (("algorithm", "n"), True, "algorithm.n must be an integer, got True"),
    (("algorithm", "n"), 2.5, "algorithm.n must be an integer, got 2.5"),
    (("hardware", "finetune"), "qlora", "hardware.finetune must be one of 'full' or 'lora', got 'qlora'"),
    (("optim", "betas"), [0.9, 0.99, 0.999], "optim.betas must have 2 items"),
    (("eval", "max_tokenz"), 3, "eval.max_tokenz: unknown key; did you mean 'eval.max_tokens'?"),
    (("rollout", "max_batchsize"), 3, "rollout.max_batchsize: unknown key; did you mean 'rollout.max_batch'?"),
    (("hardware", "lora"), {"r": 8, "alfa": 8}, "hardware.lora.alfa: unknown key; did you mean 'hardware.lora.alpha'?"),
    (("dataset", "test_size"), 0, "dataset.test_size must be >= 1, got 0"),
    (("train", "sampler_gap_warn"), 0.0, "train.sampler_gap_warn must be > 0 (or null), got 0.0"),
]


@pytest.mark.parametrize(("where", "value", "message"), BAD, ids=[m.split(" ")[0] for _, _, m in BAD])
def test_errors_are_one_line_naming_the_key(where, value, message):
    cfg = compose([])
    cfg[where[0]][where[1]] = value
    with pytest.raises(ConfigError) as e:
        schema.check(cfg)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_the_shape_follows_the_option():
    """rollout=hf has no vLLM keys: a vLLM key under hf is unknown there; a missing name is named."""
    cfg = compose([])
    cfg["rollout"]["gpu_memory_utilization"] = 0.5
    with pytest.raises(ConfigError, match=r"rollout.gpu_memory_utilization: unknown key; valid keys here: name, max_batch"):
        schema.check(cfg)
    cfg = compose([])
    del cfg["logger"]["name"]
    with pytest.raises(ConfigError, match="logger.name is required"):
        schema.check(cfg)


def test_closest_key_for_keys_hydra_did_not_have():
    from pods.schema import closest_key

    assert closest_key("optim.lrr").startswith("optim.lrr: unknown key; did you mean 'optim.lr'?")
    assert closest_key("rollout.gpu_memory_utilisation").startswith(
        "rollout.gpu_memory_utilisation: unknown key; did you mean 'rollout.gpu_memory_utilization'?"
    )
    assert (
        closest_key("hardware.dist_backend")
        == "hardware.dist_backend is not set by the chosen group option: add it with +hardware.dist_backend=VALUE"
    )
    assert closest_key("seed.x") == "seed.x: unknown key ('seed' is not a section)"


def test_config_nodes_are_the_schema_defaults_and_validate():
    """The nodes Hydra composes from (``_schema``, ``<group>/_<shape>``) hold the schema's defaults; with the required
    keys of a real option added they pass the schema unchanged."""
    nodes = schema.nodes()
    assert nodes["_schema"]["train"] == schema.Train().model_dump()
    assert nodes["algorithm/_base"] == {
        k: v for k, v in schema.Algorithm(name="x", n=2, m=2, rule="all").model_dump().items() if k not in ("name", "n", "m", "rule")
    }
    full = {**nodes["hardware/_base"], "name": "x"}
    assert schema.Hardware.model_validate(full).model_dump() == full


def test_the_hardware_profile_chooses_the_optimizer_unless_the_run_names_one():
    """hardware=l40s_lora used to train with plain AdamW unless the experiment file read its optimizer key."""
    assert compose(["hardware=l40s_lora"])["optim"]["name"] == "adamw_8bit"
    for exp in ("gsm8k_qwen3b_pods_64_16_l40s", "math_qwen3b_grpo_8_8_l40s", "gsm8k_llama3b_pods_64_16_l40s"):
        assert compose([f"experiment={exp}"])["optim"]["name"] == "adamw_8bit", exp
    assert compose(["hardware=l40s_lora", "optim.name=adamw"])["optim"]["name"] == "adamw"
    assert compose([])["optim"]["name"] == "adamw" and compose(["hardware=h100x8_zero3"])["optim"]["name"] == "adamw"
    cfg = compose(["hardware=l40s_lora"])
    cfg["optim"]["name"] = None  # a dict caller leaving it out: check() fills in the profile's
    assert schema.check(cfg).optim.name == "adamw_8bit"


def test_of_validates_a_dict_over_the_defaults_and_passes_a_section_as_it_is():
    """``Section.of`` is the one door from a plain dict: validated, or ConfigError in one line naming the dotted key;
    never an unvalidated section (the package builds none: no ``model_construct`` anywhere in it)."""
    a = schema.Algorithm(name="grpo", n=4, m=4, rule="all")
    assert schema.Algorithm.of(a) is a
    assert schema.SparseRl.of({"cap": 2}) == schema.SparseRl(cap=2.0)  # over the defaults, lax as a dict caller's
    for section, node, message in [
        (schema.Algorithm, {"n": "lots", "m": -3}, "algorithm.n must be an integer, got 'lots' (and 3 more)"),
        (schema.Algorithm, {"name": "x", "n": 2, "m": 4, "rule": "max_variance"}, "algorithm.m (4) must be <= algorithm.n (2)"),
        (schema.SparseRl, {"band_low": 2.0}, "algorithm.sparse_rl.band_low < band_high required, got [2.0, 1.5]"),
        (schema.Lora, {"alfa": 8}, "hardware.lora.alfa: unknown key; did you mean 'hardware.lora.alpha'?"),
        (schema.Eval, {"temperature": -1}, "eval.temperature must be >= 0, got -1"),
        (schema.Hardware, ["cpu"], "hardware must be a mapping, got list"),
    ]:
        with pytest.raises(ConfigError) as e:
            section.of(node)
        assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(ConfigError, match="train.group_repeats must divide"):
        schema.complete(schema.Train, prompts_per_step=3, group_repeats=2)
    package = Path(schema.__file__).parents[1]
    assert not [p for p in package.rglob("*.py") if "model_construct" in p.read_text()]


def test_a_section_is_read_by_attribute_only():
    """No dict doors: item access and item assignment raise TypeError (no value reaches a section unvalidated)."""
    root = schema.check(compose([]))
    for section in (root, root.train, root.algorithm):
        name = next(iter(type(section).model_fields))
        with pytest.raises(TypeError):
            section[name]  # noqa: B018 - the read itself is what is tested
        with pytest.raises(TypeError):
            section[name] = getattr(section, name)
        assert not any(hasattr(section, door) for door in ("get", "keys", "__getitem__", "__setitem__", "__contains__"))


def test_one_sampling_section_one_set_of_defaults():
    """The training run's sampling, the evaluation, a benchmark suite and an engine call all carry the Sampling keys
    of one class, with its defaults (none redefined); greedy is an evaluation's choice, never the training run's."""
    from pods.engines import Sampling as Call
    from pods.eval.benchmarks import Suite

    keys = schema.Sampling.model_fields
    for sub in (schema.Eval, Suite, Call):
        assert issubclass(sub, schema.Sampling)
        assert all(repr(sub.model_fields[k]) == repr(keys[k]) for k in keys), sub.__name__  # inherited as they are
    call = Call.draw(schema.complete(schema.Eval, temperature=0.0, max_tokens=7, stop=["\n"]), seed=3)
    assert call == Call(temperature=0.0, top_p=1.0, top_k=-1, max_tokens=7, stop=["\n"], seed=3)
    assert schema.check(compose(["eval.temperature=0"])).eval.temperature == 0.0
    cfg = compose([])
    cfg["sampling"]["temperature"] = 0.0
    with pytest.raises(ConfigError, match=r"^sampling.temperature must be > 0, got 0.0$"):
        schema.check(cfg)
    for suite in sorted((CONF / "suite").glob("*.yaml")):  # a suite's length is its own (the shared default is 12)
        assert "\nmax_tokens:" in suite.read_text(), suite.name
