"""The tiny CPU model: a Qwen2-architecture policy built in code, with its own tokenizer and a chat template.

``ensure_tiny(spec, cache_dir)`` returns a directory that loads through the same ``from_pretrained`` path
as hub models (and in vLLM: head_dim = 128 / 4 = 32). The first call trains a byte-level BPE tokenizer
on toy-task text, builds the model, gives it a short label-smoothed supervised warm start on the toy task's
TRAIN split (800 steps: greedy decoding then solves ~98% of the test sums, but sampling at T = 1 puts a stray token into
most answers: RL starts near 15% sampled accuracy with room to ~95%, see docs/cpu-miniature.md), and saves;
later calls hit the cache (keyed by a hash of the spec). A spec with a ``base`` (another tiny spec) skips the
tokenizer and the random init: it continues the base model (shipped, or built first) with its own warm start on its
own task (toy_sum's model continues toy_long's). The tokenizer pre-splits text with Qwen2's own regex,
so ``AutoTokenizer`` (which maps model_type qwen2 to Qwen2Tokenizer) and ``PreTrainedTokenizerFast`` encode
identically. ``spec["architecture"]: qwen3`` builds a Qwen3 instead (per-head q/k RMSNorms, no q/k/v biases, an
explicit head_dim) whose chat template has Qwen3's thinking switch: ``enable_thinking=false`` (a
``model.chat_template_kwargs``, which the builder folds into the spec: ``with_template_kwargs``) opens the answer with
an empty ``<think>`` block, and the warm start trains on the prompts so rendered.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path

import torch

from pods.log import setup
from pods.tasks.toy import canonical

ASSETS = Path(__file__).resolve().parent / "assets"  # shipped models: tiny-<key>/ (package data)
BUILD_THREADS = 1
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
THINK_SPECIALS = ["<think>", "</think>"]  # Qwen3's added tokens around its reasoning
QWEN3_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(
    "{{ '<|im_start|>assistant\n' }}",
    "{{ '<|im_start|>assistant\n' }}{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\n\n</think>\n\n' }}{% endif %}",
)
ARCHITECTURES = {  # spec["architecture"] -> (transformers class prefix, extra special tokens, chat template, config keys it names)
    "qwen2": ("Qwen2", [], CHAT_TEMPLATE, ()),
    "qwen3": ("Qwen3", THINK_SPECIALS, QWEN3_CHAT_TEMPLATE, ("head_dim",)),  # Qwen3Config's head_dim defaults to 128
}
QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
DEFAULT_SPEC = {
    "vocab_size": 384,
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "warm_start_steps": 800,  # 400 sat on the step where greedy addition is learnt: 0.97 greedy on one machine, 0.10 on another
    "warm_start_batch": 64,
    "warm_start_lr": 3e-3,
    "warm_start_label_smoothing": 0.25,
    "seed": 0,
    "dataset": {"name": "toy_arith", "low": 10, "high": 99, "train_size": 4000, "test_size": 200, "seed": 1234},
}


def spec_hash(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def architecture(spec: dict) -> tuple[str, list[str], str, tuple[str, ...]]:
    """(transformers class prefix, extra special tokens, chat template, config keys it names) of the spec's
    architecture (default qwen2)."""
    name = spec.get("architecture", "qwen2")
    if name not in ARCHITECTURES:
        raise ValueError(f"tiny model: unknown architecture '{name}'; valid: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def with_template_kwargs(spec: dict | None, chat_template_kwargs: dict | None) -> dict:
    """The spec a model section builds: its ``chat_template_kwargs`` folded in when there are any (the warm start
    renders its prompts with them, so they are part of the model's key); none leaves the spec, and its key, as it is."""
    return {**(spec or {}), "chat_template_kwargs": dict(chat_template_kwargs)} if chat_template_kwargs else dict(spec or {})


def build_tokenizer(texts: list[str], vocab_size: int, extra_specials: list[str] = (), chat_template: str = CHAT_TEMPLATE):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    specials = SPECIALS + list(extra_specials)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=chat_template, model_max_length=256
    )


def load_tokenizer(path: str | Path):
    """Load a tokenizer; a pods-built tiny tokenizer is loaded as the fast tokenizer it was saved as."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if (Path(path) / "pods_tiny.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


def _sft_batch(tokenizer, examples, device="cpu", target=canonical, template_kwargs: dict | None = None):
    """Prompt + answer token ids, with labels only on the answer (and its end-of-turn token); the prompt rendered with
    ``template_kwargs`` (``model.chat_template_kwargs``)."""
    seqs, labels = [], []
    for ex in examples:
        p = tokenizer.apply_chat_template(list(ex.messages), add_generation_prompt=True, tokenize=True, **(template_kwargs or {}))
        p = list(p["input_ids"] if hasattr(p, "keys") else p)
        a = tokenizer(target(ex) + "<|im_end|>", add_special_tokens=False)["input_ids"]
        seqs.append(p + a)
        labels.append([-100] * len(p) + a)
    width = max(map(len, seqs))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], device=device)
    lab = torch.tensor([s + [-100] * (width - len(s)) for s in labels], device=device)
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=device)
    return ids, lab, mask


def warm_start(
    model,
    tokenizer,
    train,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    label_smoothing: float = 0.0,
    target=canonical,
    template_kwargs: dict | None = None,
) -> None:
    """Supervised steps on the answers. ``label_smoothing`` > 0 leaves the policy under-confident (sampling at
    T = 1 errs where greedy decoding is right), the regime in which RL's early gains come from sharpening."""
    from pods.progress import bar as progress_bar

    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / steps))
    model.train()
    bar = progress_bar(range(steps), desc="tiny warm start", leave=False, mininterval=2.0)
    for _ in bar:
        ids, lab, mask = _sft_batch(tokenizer, rng.sample(train, batch), target=target, template_kwargs=template_kwargs)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), lab[:, 1:].flatten(), ignore_index=-100, label_smoothing=label_smoothing
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(), sched.step(), opt.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()


def build_tiny(spec: dict, out_dir: Path) -> dict:
    """Build, warm-start and save the tiny model + tokenizer into ``out_dir``; returns build info. One torch thread
    (a reduction's split depends on the thread count) under the caller's numerics: pinned, ``pods.numerics``."""
    t0, threads = time.time(), torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    try:
        model, tok = _train_tiny(spec)
    finally:
        torch.set_num_threads(threads)
    info = {"spec": spec, "params": sum(p.numel() for p in model.parameters()), "build_seconds": round(time.time() - t0, 1)}
    _publish(model, tok, {**info, "numerics": {**numerics_record(), "torch_threads": BUILD_THREADS}}, out_dir)
    return info


def dataset_section(spec: dict | None = None):
    """The task a tiny spec warm-starts on as its typed dataset section (``pods.schema.SHAPES``; the spec names no
    recipe or grader, which the task's loader does not read)."""
    from pods.schema import SHAPES, ToyDataset

    node = (spec or DEFAULT_SPEC)["dataset"]
    name = node.get("name", "toy_arith")
    return SHAPES["dataset"].get(name, ToyDataset).of({"name": name, "recipe": "toy", "grader": "toy", **node})


def _train_tiny(spec: dict):
    """The tokenizer trained on the task's text and the warm-started model (float32, eval mode)."""
    from transformers import GenerationConfig

    torch.manual_seed(spec["seed"])
    from pods.tasks import DATASETS

    name = spec["dataset"].get("name", "toy_arith")
    loader = DATASETS.get(name)
    target = DATASETS.spec(name).sft_target or canonical  # hook: another task warm-starts via its spec's ``sft_target``
    data = loader(dataset_section(spec))
    if spec.get("base"):  # continue from another tiny model (its tokenizer and weights): a short warm start on this task
        model, tok = _continued(spec["base"])
    else:
        texts = [ex.messages[0]["content"] + " " + target(ex) for ex in data.train] + ["user assistant system"]
        _, extra_specials, chat_template, _ = architecture(spec)
        tok = build_tokenizer(texts, spec["vocab_size"], extra_specials, chat_template)
        model = _fresh(spec, tok)
    warm_start(
        model,
        tok,
        data.train,
        spec["warm_start_steps"],
        spec["warm_start_batch"],
        spec["warm_start_lr"],
        spec["seed"],
        spec.get("warm_start_label_smoothing", 0.0),
        target,
        spec.get("chat_template_kwargs"),
    )
    model.generation_config = GenerationConfig(
        eos_token_id=[tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")], pad_token_id=tok.pad_token_id
    )
    return model, tok


def _continued(base: dict):
    """The model and tokenizer of the tiny spec ``base`` (shipped, or built first), in float32 train mode."""
    from transformers import Qwen2ForCausalLM

    path = ensure_tiny(base)
    return Qwen2ForCausalLM.from_pretrained(str(path)).float(), load_tokenizer(path)


def _fresh(spec: dict, tok):
    """A randomly initialised Qwen2 (or Qwen3: ``spec["architecture"]``) of the spec's shape for the tokenizer ``tok``."""
    import transformers

    prefix, _, _, named = architecture(spec)
    derived = {"head_dim": spec["hidden_size"] // spec["num_attention_heads"]}
    cfg = getattr(transformers, f"{prefix}Config")(
        **{k: derived[k] for k in named},
        vocab_size=len(tok),
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_hidden_layers"],
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"],
        max_position_embeddings=spec["max_position_embeddings"],
        tie_word_embeddings=True,
        rope_theta=10000.0,
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
    )
    return getattr(transformers, f"{prefix}ForCausalLM")(cfg).float()


def _publish(model, tok, info: dict, out_dir: Path) -> None:
    """Save into a private ``<out>.tmp<pid>`` and rename it to ``out_dir`` (atomic: a half-built model is never
    mistaken for a cached one). A process that loses the race to a concurrent build of the same key drops its copy."""
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "pods_tiny.json").write_text(json.dumps(info, indent=2))
        tmp.rename(out_dir)
    except OSError:
        if not (out_dir / "pods_tiny.json").exists():  # not a concurrent winner: a real error
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _drop_stale_builds(out: Path) -> None:
    """Remove ``<out>.tmp<pid>`` directories left by builds whose process is gone (killed mid-build)."""
    for tmp in out.parent.glob(out.name + ".tmp*"):
        pid = tmp.name.rsplit(".tmp", 1)[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(tmp, ignore_errors=True)


def numerics_record() -> dict:
    from pods.numerics import record

    rec = record()
    return {k: rec[k] for k in ("env", "torch_cpu_capability", "torch_threads", "torch", "cpu")}


def default_cache_dir() -> Path:
    return Path(os.environ.get("PODS_CACHE", Path(__file__).resolve().parents[1] / ".cache"))


def full_spec(spec: dict | None = None) -> dict:
    return {**DEFAULT_SPEC, **(spec or {})}


def asset_name(spec: dict | None = None) -> str:
    """The model's key: ``tiny-<hash of the full spec>`` (the shipped asset's and the cache's directory name)."""
    return f"tiny-{spec_hash(full_spec(spec))}"


def shipped(spec: dict | None = None) -> Path | None:
    """The directory of the model shipped with the package for ``spec`` (pods/assets/tiny-<key>), or None."""
    path = ASSETS / asset_name(spec)
    return path if (path / "pods_tiny.json").is_file() else None


def ensure_tiny(spec: dict | None = None, cache_dir: str | Path | None = None) -> Path:
    """The directory of the tiny model for ``spec``: the shipped one when the package has it (never written to),
    else built into ``cache_dir`` on first use (pinned numerics, one thread)."""
    found = shipped(spec)
    if found:
        return found
    out = Path(cache_dir or default_cache_dir()) / asset_name(spec)
    if not (out / "pods_tiny.json").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        _drop_stale_builds(out)
        log = setup()
        log.info(f"building the tiny model into {out} (once; cached afterwards): spec {asset_name(spec)} is not shipped")
        info = build_tiny(full_spec(spec), out)
        log.info(f"tiny model: {info['params']:,} params, built in {info['build_seconds']} s")
    return out


def weights_hash(model_dir: Path) -> str:
    """sha256 over the tensors' names, dtypes, shapes and bytes (sorted by name): equal hash = equal bits."""
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for name, t in sorted(load_file(str(Path(model_dir) / "model.safetensors")).items()):
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def weights_gap(a: Path, b: Path) -> dict[str, float]:
    """Max |a - b| per tensor of two model directories (same names and shapes)."""
    from safetensors.torch import load_file

    ta, tb = load_file(str(Path(a) / "model.safetensors")), load_file(str(Path(b) / "model.safetensors"))
    return {k: float((ta[k].double() - tb[k].double()).abs().max()) for k in sorted(ta)}


SHIPPED_FILES = [
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "pods_tiny.json",
]
