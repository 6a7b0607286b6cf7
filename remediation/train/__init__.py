"""Training memory (runbook S2: CUDA out of memory mid fine-tuning).

- :mod:`.models`: model shapes (a built-in table of common configs, Hugging Face ``config.json`` parsed offline,
  or a bare parameter count), parameter and LoRA counts exactly as transformers and peft count them.
- :mod:`.plan`: the memory planner: bytes per component for a precision regime, optimizer, method (full, LoRA,
  QLoRA), batch, sequence length, gradient checkpointing and ZeRO stage; the peak, whether it fits, and the
  settings that make it fit.
- :mod:`.oom`: the parser of PyTorch / ROCm out-of-memory messages and the findings drawn from them (the ``oom``
  kind of ``invoke diagnose``).
- :mod:`.monitor`: GPU memory logging through NVML on a host, to CSV.
"""
