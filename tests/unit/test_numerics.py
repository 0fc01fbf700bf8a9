"""Pinned CPU numerics (pods.numerics): the pin sets defaults and never overrides the user, torch reads it at its
first dispatch, and config.json records it with the model asset."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pods.numerics import PINNED, THREADS, pin, record, summary_line

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_pin_sets_defaults_keeps_the_users_values_and_can_be_turned_off():
    env = {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": ""}  # an empty value counts as unset
    done = pin(env)
    assert env["MKL_CBWR"] == "COMPATIBLE" and "MKL_CBWR" not in done
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert set(done) >= {"ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"} and set(done) <= {*PINNED, *THREADS}
    native = {"PODS_NUMERICS": "native"}
    assert pin(native) == {} and native == {"PODS_NUMERICS": "native"}


def _capability(env: dict, code: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in (*PINNED, "PODS_NUMERICS")}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env, "PYTHONPATH": ROOT}, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_torch_runs_the_pinned_kernels_when_pin_runs_before_torch_loads():
    code = "from pods.numerics import pin; pin(); import torch; print(torch.backends.cpu.get_cpu_capability())"
    assert _capability({}, code) == "AVX2"
    assert _capability({"ATEN_CPU_CAPABILITY": "default"}, code) == "DEFAULT"  # the user's choice wins
    # the variable is read at the first dispatch, not at import: a pin after `import torch` (no op yet) still holds
    late = "import torch; from pods.numerics import pin; pin(); print(torch.backends.cpu.get_cpu_capability())"
    assert _capability({}, late) == "AVX2"


def test_record_and_the_config_json_provenance():
    from pods.models import provenance
    from pods.schema import Model

    rec = record()
    assert rec["torch_cpu_capability"] in ("DEFAULT", "AVX2", "AVX512", "ZVECTOR", "VSX", "SVE256", "SVE128")
    assert rec["env"].get("ATEN_CPU_CAPABILITY", "").upper() in ("", rec["torch_cpu_capability"])
    assert summary_line(rec).startswith("numerics: torch kernels ")
    prov = provenance(Model(name="tiny", builder="tiny"))
    json.dumps(prov)  # config.json holds it
    assert prov["model"]["asset"].startswith("tiny-") and prov["model"]["shipped"] is True
    assert provenance(Model(name="q", path="Qwen/Qwen2.5-3B-Instruct"))["model"] == {"asset": "Qwen/Qwen2.5-3B-Instruct"}
