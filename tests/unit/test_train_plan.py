"""The planner: the runbook's table, regimes as explicit inputs, the calibration points, the recommendations."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from remediation.train import calibration
from remediation.train.api import JobFlags, plan_job
from remediation.train.errors import TrainError
from remediation.train.gpus import GPUS, gpu, parse_size
from remediation.train.models import builtin, spec_from_params
from remediation.train.plan import REGIMES, PlanInput, plan, recommend
from remediation.train.render import lora_config_snippet, plan_to_dict, training_arguments_snippet
from remediation.train.settings import TrainSettings
from tests.conftest import ROOT

GB = 10**9
GiB = 1024**3
SEVEN_B = spec_from_params(7_000_000_000)


def test_runbook_table_for_its_assumptions() -> None:
    """7B, bf16 weights and gradients, fp32 Adam states: ~14 / ~14 / ~56 GB, minimum ~84 GB plus activations."""
    p = PlanInput(SEVEN_B, regime="bf16-fp32-states", optimizer="adamw", batch=2, grad_accum=4, seq_len=512,
                  fused_optimizer=True, capacity_bytes=80 * GiB).checked()
    result = plan(p)
    b = result.breakdown
    assert (b["parameters"], b["gradients"], b["optimizer_states"]) == (14 * GB, 14 * GB, 56 * GB)
    assert result.model_states == 84 * GB
    # with accumulation the gradients stay alive through the next forward: 84 GB plus activations
    assert result.phases["forward_end"] == 84 * GB + b["activations"] + b["logits"]
    assert result.fits is False  # the runbook's 80 GB card cannot hold it
    assert PlanInput(SEVEN_B, regime="runbook").checked().regime == "bf16-fp32-states"


@pytest.mark.parametrize(
    ("regime", "per_param"),
    [("bf16", 8), ("bf16-fp32-states", 12), ("mixed", 16), ("amp", 16), ("fp32", 16)],
)
def test_model_state_bytes_per_parameter(regime: str, per_param: int) -> None:
    result = plan(PlanInput(SEVEN_B, regime=regime).checked())
    assert result.model_states == per_param * 7 * GB
    assert regime in REGIMES and REGIMES[regime].description


def test_the_other_anchors_18_and_20_bytes() -> None:
    # HF's "model memory anatomy": fp32 weights plus their 16-bit copies in the forward, 18 bytes per parameter
    amp = plan(PlanInput(SEVEN_B, regime="amp", batch=1, seq_len=1).checked())
    assert amp.model_states + amp.transients["autocast_weight_copies"] == pytest.approx(18 * 7 * GB, rel=0.01)
    # DeepSpeed's ZeRO estimator on one GPU: 2 + (2 + 4) + (4 + 8) = 20 bytes per parameter during the step
    mixed = plan(PlanInput(SEVEN_B, regime="mixed", fused_optimizer=True).checked())
    assert mixed.phases["optimizer_step"] == 20 * 7 * GB


@pytest.mark.parametrize(("optimizer", "per_param"), [("adamw", 8), ("sgd-momentum", 4), ("sgd", 0)])
def test_optimizer_state_bytes(optimizer: str, per_param: int) -> None:
    result = plan(PlanInput(SEVEN_B, regime="fp32", optimizer=optimizer).checked())
    assert result.breakdown["optimizer_states"] == per_param * 7 * GB


def test_eight_bit_adamw_keeps_small_tensors_in_32_bits() -> None:
    spec = builtin("GPT-2")  # 768-wide norms and biases: under bitsandbytes' 4096-element minimum
    states = plan(PlanInput(spec, optimizer="adamw-8bit").checked()).breakdown["optimizer_states"]
    small = sum(t for t in spec.param_tensors if t < 4096)
    big = spec.params - small
    assert small > 0
    assert states == 8 * small + 2 * big + 2 * 4 * -(-big // 256)  # two 1-byte states and a fp32 absmax per block


def test_lora_and_qlora_memory() -> None:
    spec = builtin("Llama-2-7b")
    lora = plan(PlanInput(spec, method="lora", lora_r=16, lora_targets=("q_proj", "v_proj")).checked())
    assert lora.trainable_params == 8_388_608 and lora.total_params == 6_738_415_616
    assert lora.breakdown["parameters"] == spec.params * 2 + 8_388_608 * 4
    assert lora.breakdown["gradients"] == 8_388_608 * 4
    assert lora.breakdown["optimizer_states"] == 8_388_608 * 8
    qlora = plan(PlanInput(spec, method="qlora").checked())
    # NF4 + double quantization: ~4.127 bits for each linear weight; embeddings, norms and head in fp32
    # (peft's prepare_model_for_kbit_training)
    frozen = qlora.breakdown["parameters"] - qlora.trainable_params * 4
    assert frozen == int(spec.linear_params * (0.5 + 1 / 64 + 4 / 16384)) + (spec.params - spec.linear_params) * 4
    assert qlora.peak_bytes < lora.peak_bytes


def test_activations_grow_with_tokens_and_checkpointing_cuts_them() -> None:
    spec = builtin("Llama-3-8B")
    base = PlanInput(spec, batch=4, seq_len=2048).checked()
    a1 = plan(base).breakdown["activations"]
    a2 = plan(replace(base, seq_len=4096)).breakdown["activations"]
    assert a2 == pytest.approx(2 * a1, rel=0.01)  # FlashAttention: no s^2 term
    eager = plan(replace(base, attention="eager", seq_len=4096)).breakdown["activations"]
    assert eager > 1.5 * a2
    ckpt = plan(replace(base, grad_checkpointing=True)).breakdown["activations"]
    assert ckpt < 0.2 * a1  # "60-80% less memory" and more, for the activations alone
    logits = plan(base).breakdown["logits"]
    assert logits == pytest.approx(4 * 2048 * 128_256 * 12 * 1.055, rel=0.001)


def test_zero_stages_shard_states_gradients_parameters() -> None:
    spec = builtin("Llama-2-13b")
    one = plan(PlanInput(spec, regime="mixed").checked()).breakdown
    for stage, sharded in ((1, {"optimizer_states"}), (2, {"optimizer_states", "gradients"}),
                           (3, {"optimizer_states", "gradients", "parameters"})):
        b = plan(PlanInput(spec, regime="mixed", gpus=8, zero_stage=stage).checked()).breakdown
        for key in ("optimizer_states", "gradients", "parameters"):
            if key in sharded:
                assert b[key] < one[key] / 4
            else:
                assert b[key] == one[key]


# Issue 23: a peak under-predicted by more than 5 % out of sample is a defect (an under-prediction is an OOM; 5 % is
# the headroom recommendations keep, so a plan they call comfortable still fits). Checked leave-one-out: the scale is
# refitted without the point, so the test cannot pass by fitting the point. Over-prediction wastes memory but does not
# crash a job: it is bounded more loosely, at 10 % (the real-GPU LoRA figure in the issue is about +10 %).
UNDER_TOLERANCE = 0.05
OVER_TOLERANCE = 0.10


@pytest.mark.parametrize("row", calibration.loo_rows(), ids=lambda r: r.point.id)
def test_leave_one_out_error_on_development_points(row: calibration.LooRow) -> None:
    point = row.point
    shown = (f"{point.id}: predicted {row.predicted / GB:.2f} GB (scale {row.scale}), "
             f"measured {point.measured_bytes / GB}")
    assert row.error >= -UNDER_TOLERANCE, f"under-predicted out of sample by {-row.error:.1%}: {shown}"
    assert row.error <= OVER_TOLERANCE, f"over-predicted out of sample by {row.error:.1%}: {shown}"


@pytest.mark.parametrize("row", calibration.peak_rows(), ids=lambda r: r[0].id)
def test_in_sample_error_on_development_points(row: tuple[calibration.PeakPoint, int, float]) -> None:
    point, predicted, error = row
    assert -UNDER_TOLERANCE <= error <= OVER_TOLERANCE, (
        f"{point.id}: predicted {predicted / GB:.2f} GB, measured {point.measured_bytes / GB}"
    )


def test_recommendation_headroom_covers_the_worst_out_of_sample_under_prediction() -> None:
    assert PlanInput(builtin("Llama-2-7b")).headroom >= calibration.loo_worst_under()


def test_qlora_dequantization_is_a_bf16_weight_and_its_fp32_absmax() -> None:
    spec = builtin("Llama-3-8B")
    p = PlanInput(spec, method="qlora", lora_r=32, lora_targets=("all-linear",), seq_len=512).checked()
    w = spec.largest_linear
    assert plan(p).transients["dequantization"] == 2 * w + 4 * -(-w // 64)


@pytest.mark.parametrize("row", calibration.capacity_rows(), ids=lambda r: r[0].id)
def test_capacity_constraints(row: tuple[calibration.CapacityPoint, bool, int | None]) -> None:
    point, agrees, longest = row
    assert agrees, f"{point.id}: {point.what}"
    if point.listed_seq is not None:
        assert longest is not None and longest >= point.listed_seq


def test_scale_is_the_fitted_one() -> None:
    from remediation.train.plan import ACTIVATION_SCALE

    assert calibration.fit_scale() == pytest.approx(ACTIVATION_SCALE, abs=0.006)


# --- recommendations -------------------------------------------------------------------------------------------


def test_recommendation_keeps_the_effective_batch() -> None:
    """The runbook's S2: batch 8 does not fit; a smaller per-device batch with accumulation keeps 8."""
    p = PlanInput(builtin("Llama-2-7b"), method="lora", batch=8, seq_len=4096, capacity_bytes=gpu("A100-40GB").bytes)
    p = p.checked()
    assert plan(p).fits is False
    rec = recommend(p)
    assert rec.fits and rec.plan.fits
    assert rec.per_device_train_batch_size * rec.gradient_accumulation_steps == 8
    assert rec.per_device_train_batch_size < 8
    assert rec.max_seq_length == 4096 and rec.max_seq_length_ceiling is not None
    assert rec.max_seq_length_ceiling >= 4096
    snippet = training_arguments_snippet(rec)
    assert f"per_device_train_batch_size={rec.per_device_train_batch_size}," in snippet
    assert f"gradient_accumulation_steps={rec.gradient_accumulation_steps}," in snippet
    assert "max_seq_length = 4096" in snippet
    compile(snippet.replace("TrainingArguments", "dict"), "<snippet>", "exec")


def test_recommendation_ladder_goes_to_lora_when_states_do_not_fit() -> None:
    p = PlanInput(builtin("Llama-2-13b"), regime="mixed", batch=4, seq_len=2048,
                  capacity_bytes=gpu("A100-80GB").bytes).checked()
    result = plan(p)
    assert result.states_fit is False
    rec = recommend(p)
    assert rec.fits and rec.method in ("lora", "qlora")
    lora = lora_config_snippet(rec)
    assert lora is not None and "target_modules=['q_proj', 'v_proj']" in lora
    compile(lora.replace("LoraConfig", "dict").replace("BitsAndBytesConfig", "dict"), "<lora>", "exec")


def test_recommendation_when_it_fits_grows_the_batch() -> None:
    p = PlanInput(builtin("GPT-2"), batch=1, grad_accum=8, seq_len=512, capacity_bytes=gpu("H100").bytes).checked()
    rec = recommend(p)
    assert rec.fits and rec.per_device_train_batch_size == 8 and rec.gradient_accumulation_steps == 1


def test_nothing_fits_says_so() -> None:
    p = PlanInput(builtin("Llama-3-70B"), method="qlora", batch=1, seq_len=4096, capacity_bytes=8 * GiB).checked()
    rec = recommend(p)
    assert not rec.fits


def test_json_document_and_task_exit_codes() -> None:
    result, rec = plan_job(TrainSettings(), JobFlags(model="Llama-2-7b", gpu="H100", method="lora", batch=4,
                                                     seq_len=2048))
    doc = plan_to_dict(result, rec)
    assert {"breakdown", "trainable_params", "total_params", "peak_bytes", "fits", "recommendation"} <= set(doc)
    assert set(doc["breakdown"]) == {"parameters", "gradients", "optimizer_states", "activations", "logits",
                                     "cuda_context", "allocator_overhead"}
    assert doc["trainable_params"] == 8_388_608 and doc["total_params"] == 6_738_415_616
    json.dumps(doc)
    cmd = [str(ROOT / ".venv" / "bin" / "invoke"), "train.plan", "--model", "Llama-2-7b", "--gpu", "A10",
           "--batch", "8", "--seq-len", "4096", "--format", "json"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr  # full fine-tune of 7B does not fit an A10
    out = json.loads(proc.stdout)
    assert out["fits"] is False and out["recommendation"]["fits"] is True
    bad = subprocess.run([*cmd[:2], "--model", "Llama-2-7b", "--regime", "fp8"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=False)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--regime 'fp8'" in bad.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (JobFlags(), "name the model once"),
        (JobFlags(model="Llama-2-7b", params="7e9"), "name the model once"),
        (JobFlags(params="seven"), "--params 'seven' is not a number"),
        (JobFlags(model="Llama-2-7b", gpu="B9000"), "--gpu 'B9000' is not known"),
        (JobFlags(model="Llama-2-7b", gpu_memory="lots"), "--gpu-memory 'lots' is not a size"),
        (JobFlags(model="Llama-2-7b", batch=0), "--batch 0 must be at least 1"),
        (JobFlags(model="Llama-2-7b", zero_stage=4), "--zero-stage 4"),
        (JobFlags(model="Llama-2-7b", method="dora"), "--method 'dora'"),
        (JobFlags(model="Llama-2-7b", optimizer="lion"), "--optimizer 'lion'"),
        (JobFlags(config="/nonexistent/config.json"), "cannot read it"),
    ],
)
def test_bad_input_is_one_line(flags: JobFlags, message: str) -> None:
    with pytest.raises(TrainError) as exc:
        plan_job(TrainSettings(), flags)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_gpu_table_reuses_skus_and_sizes_parse() -> None:
    from remediation.core import skus

    assert gpu("A100-80GB").memory_mib == skus.A100_80GB_PCIE.memory_mib
    assert gpu("h100").memory_mib == skus.H100_80GB_HBM3.memory_mib
    assert {"A100-40GB", "A100-80GB", "H100-80GB", "H200", "A10"} <= set(GPUS)
    assert parse_size("80GiB") == 80 * GiB and parse_size("48 GB") == 48 * GB and parse_size("24564MiB") == 24564 << 20


def test_config_file_flag(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "config.json"
    path.write_text(json.dumps({"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32,
                                "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                                "vocab_size": 32000, "max_position_embeddings": 32768}))
    result, _ = plan_job(TrainSettings(), JobFlags(config=str(path), gpu="H100"))
    assert result.total_params == 7_241_732_096


def test_module_runs_without_torch_imported() -> None:
    code = "import remediation.train.plan, remediation.train.oom, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
