"""Issue 24 (S2): answers an expert signs and inputs that are never changed quietly, on the library.

The 7B full fine-tune in the runbook's regime is model states (TRAIN-OOM-005), not activations; the runbook's canned
root cause is marked as its example; the bf16 regimes say how to load the weights; sizes need units; ZeRO needs
GPUs to shard across; a GPU or model name read as another is named in the notes."""

from __future__ import annotations

import pytest

from remediation.core import catalog
from remediation.host.diagnose import DiagnoseResult, render_text
from remediation.train.api import JobFlags, diagnose_oom, plan_job
from remediation.train.errors import TrainError
from remediation.train.gpus import parse_size
from remediation.train.models import builtin
from remediation.train.plan import PlanInput, plan, recommend
from remediation.train.render import model_loading_snippet, plan_to_dict
from remediation.train.settings import TrainSettings

GB = 10**9
GiB = 1024**3
RUNBOOK_OOM = (
    "step 512 loss 1.21\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total "
    "capacity; 77.42 GiB already allocated; 1.08 GiB free; 78.50 GiB reserved in total by PyTorch)\n"
)


# --- item 1: 004 or 005 from the planner's model-state bytes ------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [
        JobFlags(model="Llama-2-7b", regime="bf16-fp32-states"),
        JobFlags(params="7e9", regime="runbook", batch=8, seq_len=512),
        JobFlags(model="Mistral-7B", regime="bf16-fp32-states", batch=2, grad_accum=4, grad_checkpointing=True),
    ],
)
def test_runbook_7b_full_finetune_oom_is_model_states_not_activations(flags: JobFlags) -> None:
    """bf16 weights + fp32 Adam states (14 + 14 + 56 GB for 7B) with the step's temporaries cannot fit 79 GiB at any
    batch or length: TRAIN-OOM-005, as train.plan's recommendation says, never TRAIN-OOM-004."""
    result = diagnose_oom(RUNBOOK_OOM, TrainSettings(), flags)
    assert [f.id for f in result.findings] == ["TRAIN-OOM-001", "TRAIN-OOM-005"]
    finding = result.findings[1]
    assert "model states need" in finding.summary and "no batch or sequence length fits" in finding.summary
    assert result.plan is not None
    # train.plan on the same job and GPU says the same: batch and sequence settings cannot help
    job = result.plan.input
    assert "cannot help" in recommend(job).steps[0]


def test_lora_on_the_same_gpu_stays_activations() -> None:
    result = diagnose_oom(RUNBOOK_OOM, TrainSettings(), JobFlags(model="Llama-2-7b", method="lora", batch=8,
                                                                 seq_len=8192))
    assert [f.id for f in result.findings] == ["TRAIN-OOM-001", "TRAIN-OOM-004"]


# --- item 2: the runbook's canned root cause is marked as its example ------------------------------------------


def test_oom_runbook_root_cause_is_marked_as_the_runbooks_example() -> None:
    for entry_id in ("TRAIN-OOM-001", "TRAIN-OOM-004"):
        book = catalog.get(entry_id).runbook
        assert not book.root_cause.lower().startswith("batch size 8")
        assert "Example (the runbook's incident, not read from your text): batch size 8" in book.root_cause
        assert "the runbook's example, not read from your text" in book.symptoms
    result = diagnose_oom(RUNBOOK_OOM, TrainSettings())
    text = render_text(DiagnoseResult("oom", result.facts, result.findings))
    for line in text.splitlines():
        if "batch size 8" in line.lower():
            assert "example" in line.lower(), line


# --- item 3: the bf16 regimes say to load the weights in bf16 ---------------------------------------------------


@pytest.mark.parametrize("regime", ["bf16", "bf16-fp32-states"])
def test_bf16_regimes_tell_to_load_the_weights_in_bf16(regime: str) -> None:
    result, rec = plan_job(TrainSettings(), JobFlags(model="Llama-2-7b", gpu="H100-80GB", regime=regime,
                                                     method="lora"))
    doc = plan_to_dict(result, rec)
    assert any("torch_dtype=torch.bfloat16" in note and "from_pretrained" in note for note in doc["notes"])
    assert "from_pretrained(MODEL_ID, torch_dtype=torch.bfloat16)" in doc["recommendation"]["model_loading"]


def test_other_regimes_load_as_they_count() -> None:
    amp = plan(PlanInput(builtin("GPT-2"), regime="amp").checked())
    assert not any("bfloat16" in note for note in amp.notes)
    rec = recommend(PlanInput(builtin("GPT-2"), regime="amp", capacity_bytes=80 * GiB).checked())
    assert "torch_dtype=torch.float32" in model_loading_snippet(rec)
    q = recommend(PlanInput(builtin("Llama-2-7b"), method="qlora", capacity_bytes=80 * GiB).checked())
    assert "quantization_config=bnb_config" in model_loading_snippet(q)


# --- item 4: inputs are never changed quietly ---------------------------------------------------------------------


def test_sizes_need_units() -> None:
    assert parse_size("80GB") == 80 * GB and parse_size("80G") == 80 * GB
    assert parse_size("80GiB") == 80 * GiB and parse_size("80Gi") == 80 * GiB and parse_size("80 GiB") == 80 * GiB
    with pytest.raises(TrainError, match=r"^--gpu-memory 80: give a unit, e.g. 80GB"):
        parse_size("80")
    with pytest.raises(TrainError, match="give a unit"):
        plan_job(TrainSettings(), JobFlags(model="Llama-2-7b", gpu_memory="85899345920"))


def test_zero_stage_on_one_gpu_is_refused() -> None:
    with pytest.raises(TrainError, match=r"--zero-stage 3 shards across GPUs: give --gpus N"):
        plan_job(TrainSettings(), JobFlags(model="Llama-2-7b", zero_stage=3))
    result, _ = plan_job(TrainSettings(), JobFlags(model="Llama-2-7b", zero_stage=3, gpus=8))
    assert result.input.zero_stage == 3


def test_a_name_read_as_another_is_noted() -> None:
    result, rec = plan_job(TrainSettings(), JobFlags(model="Llama-3.1-8B", gpu="A100"))
    notes = plan_to_dict(result, rec)["notes"]
    assert any("--model Llama-3.1-8B is planned as the built-in Llama-3-8B" in n for n in notes), notes
    assert any("--gpu A100 is planned as A100-80GB" in n and "A100-40GB" in n for n in notes), notes
    exact, _ = plan_job(TrainSettings(), JobFlags(model="meta-llama/Llama-2-7b-hf", gpu="A100-80GB"))
    assert not any("is planned as" in n for n in exact.notes), exact.notes
