"""Speed-only switches of a training, chosen by measuring this machine at the model's own shapes.

Each switch changes how fast a step runs, never what the recipe asks for: bf16 autocast, the
attention kernel, the fused optimizer and the thread count. Where a switch is left to `auto`,
a probe of a few forward/backward passes decides it, and the choice goes into the stage's
manifest with the timings that made it. Why measure instead of asking the CPU what it has:
AVX-512 with bf16 makes autocast about twice as fast as float32 for the default teacher, while on
AVX2 alone the same autocast is emulated and 25x slower (a 2500-token teacher step: 1.0 s in
float32, 25 s in bf16, torch 2.13 with the AVX2 cap); a flag table would be one more guess.
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..engine.machine import ISA_LEVELS, cpu_isa, effective_isa

# A switch is kept only when it is at least this much faster than the exact float32 / default
# path: a tie keeps the simpler one, so that noise cannot flip a choice between two runs.
MARGIN = 0.95
# The attention kernel and the thread count have a long-measured default (plain math, all the
# cores); another is chosen only when it wins by more than a machine's load can fake.
SWITCH_MARGIN = 0.85
# bf16 more than this many times slower than float32 on one matrix product means it is emulated:
# no full model pass is tried (it would take tens of seconds).
EMULATED = 2.0


@dataclass
class SpeedChoice:
    bf16: bool
    attention: str  # "math" (PyTorch's plain-math kernel) or "default" (PyTorch chooses)
    fused_optimizer: bool
    threads: int
    isa: str
    reasons: dict = field(default_factory=dict)  # switch -> why, one line each
    probe_ms: dict = field(default_factory=dict)  # what was timed, in ms
    warning: str | None = None
    probe_s: float = 0.0
    # Where the choice came from: "probed" (measured when this training started) or "recorded in
    # the lock" (an earlier build of the same artifact id measured it; see from_record).
    source: str = "probed"

    @property
    def precision(self) -> str:
        return "bf16" if self.bf16 else "float32"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "SpeedChoice":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def record(self) -> dict:
        """What changes a training's numbers, for the lock file (`choices`); from_record reads it."""
        return {k: getattr(self, k) for k in RECORDED}

    def summary(self) -> str:
        why = self.reasons.get("bf16", "")
        return (
            f"{self.precision}{f' ({why})' if why else ''}; attention {self.attention}, "
            f"{'fused' if self.fused_optimizer else 'foreach'} Adam, {self.threads} thread"
            f"{'s' if self.threads != 1 else ''}; CPU {self.isa}"
        )


# The switches that change a training's numbers, not only its speed: the thread count (how sums
# are split), float32 or bf16, the attention kernel, the fused or foreach Adam; and the machine they
# were measured on.
RECORDED = ("bf16", "attention", "fused_optimizer", "threads", "isa")


def from_record(record: dict | None, isa: str, max_threads: int) -> tuple[SpeedChoice | None, str | None]:
    """The choice an earlier build of the same artifact recorded (the lock's `choices.speed`), where
    it fits this machine: the same CPU (or GPU) kind and no more threads than this training may
    use. Else (None, why it is measured again), or (None, None) where nothing was recorded."""
    if not record:
        return None, None
    if not isinstance(record, dict) or set(RECORDED) - set(record):
        return None, "speed: the lock's recorded choice is incomplete; measured again"
    if record["isa"] != isa:
        return None, f"speed: the lock's choice was measured on {record['isa']}, this machine is {isa}; measured again"
    if not isinstance(record["threads"], int) or not 1 <= record["threads"] <= max_threads:
        return None, (
            f"speed: the lock's choice uses {record['threads']} threads, this training may use {max_threads}; "
            "measured again"
        )
    choice = SpeedChoice(**{k: record[k] for k in RECORDED}, source="recorded in the lock")
    choice.reasons = {k: "recorded in the lock" for k in ("bf16", "attention", "fused_optimizer", "threads")}
    return choice, None


def device_isa(device) -> str:
    """What a choice is measured on: the CPU's instruction set, or the GPU's name."""
    device = torch.device(device)
    return cpu_isa() if device.type == "cpu" else torch.cuda.get_device_name(device)


def attention_context(kernel: str):
    return sdpa_kernel(SDPBackend.MATH) if kernel == "math" else contextlib.nullcontext()


def choose(
    model: torch.nn.Module,
    batch: tuple,
    loss_fn: Callable,
    device: torch.device,
    bf16: str,
    threads: int,
    probe_threads: list[int] | None = None,
    steps: int | None = None,
    pass_to_step: float = 1.0,
) -> SpeedChoice:
    """Decide the switches for training `model` on batches like `batch` (src, tgt_in, tgt_out).

    bf16: "auto" (measure), "on" / "off" (as asked; "on" where it measures slower still runs, with
    `warning` set). `probe_threads`: thread counts to try (None: keep `threads`). The model's
    weights, gradients and the RNG state are as they were when this returns. `steps` and
    `pass_to_step` (a training step's time over one probe pass's) are for the projected time in
    the warning only.
    """
    t0 = time.monotonic()
    choice = SpeedChoice(
        bf16=False,
        attention="default",
        fused_optimizer=device.type in ("cpu", "cuda"),
        threads=threads,
        isa=cpu_isa() if device.type == "cpu" else torch.cuda.get_device_name(device),
    )
    rng = torch.get_rng_state()
    try:
        if device.type == "cuda":
            supported = torch.cuda.is_bf16_supported()
            choice.bf16 = bf16 == "on" or (bf16 == "auto" and supported)
            choice.reasons["bf16"] = (
                f"recipe says {bf16}"
                if bf16 != "auto"
                else "auto: the GPU supports bf16"
                if supported
                else "auto: the GPU has no bf16"
            )
            choice.reasons["attention"] = "PyTorch chooses on CUDA"
            choice.reasons["fused_optimizer"] = "fused Adam on CUDA"
            return choice
        _choose_cpu(choice, model, batch, loss_fn, bf16, probe_threads, steps, pass_to_step)
    finally:
        torch.set_rng_state(rng)
        model.zero_grad(set_to_none=True)
        choice.probe_s = round(time.monotonic() - t0, 2)
    return choice


def _choose_cpu(choice: SpeedChoice, model, batch, loss_fn, bf16: str, probe_threads, steps, pass_to_step) -> None:
    all_threads = torch.get_num_threads()

    def timed_pass(use_bf16: bool, attention: str) -> float:
        start = time.perf_counter()
        with attention_context(attention), torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            loss = loss_fn(model(*batch))
        loss.backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    # bf16: one matrix product at the model's shapes finds emulation cheaply; then whole passes.
    kernel_fp32, kernel_bf16 = _matmul_ms(model, batch)
    choice.probe_ms.update(matmul_float32=_ms(kernel_fp32), matmul_bf16=_ms(kernel_bf16))
    # Only where the product is big enough for arithmetic to outweigh the casts (tiny models go on
    # to whole passes, which cost them nothing).
    emulated = kernel_bf16 > EMULATED * kernel_fp32 and kernel_fp32 > 2e-4
    candidates = {"float32": lambda: timed_pass(False, "math")}
    if not emulated:
        candidates["bf16"] = lambda: timed_pass(True, "math")
    passes = interleaved(candidates, rounds=3)
    fp32 = passes["float32"]
    choice.probe_ms["pass_float32"] = _ms(fp32)
    if emulated:
        slowdown = kernel_bf16 / kernel_fp32
        native = (
            ""
            if ISA_LEVELS.index(effective_isa(choice.isa)) >= ISA_LEVELS.index("AVX512-BF16")
            else f", no native bf16 on {effective_isa(choice.isa)}"
        )
        measured = (
            f"bf16 {slowdown:.1f}x slower than float32 on one matrix product at this model's shapes "
            f"({_ms(kernel_bf16)} vs {_ms(kernel_fp32)} ms{native})"
        )
    else:
        choice.probe_ms["pass_bf16"] = _ms(passes["bf16"])
        slowdown = passes["bf16"] / fp32
        measured = f"a forward/backward pass took {_ms(passes['bf16'])} ms in bf16, {_ms(fp32)} ms in float32"
    if bf16 == "auto":
        choice.bf16 = not emulated and slowdown < MARGIN
        choice.reasons["bf16"] = f"auto: {measured}"
    else:
        choice.bf16 = bf16 == "on"
        choice.reasons["bf16"] = f"recipe says {bf16}; {measured}"
        if choice.bf16 and slowdown > 1.0:
            projected = ""
            if steps:
                step_fp32 = fp32 * pass_to_step
                projected = (
                    f": about {duration(steps * step_fp32 * slowdown)} for its {steps} steps instead of "
                    f"{duration(steps * step_fp32)} in float32"
                )
            choice.warning = (
                f"bf16: on, but bf16 measured {slowdown:.1f}x slower than float32 on this CPU "
                f"({choice.isa}){projected}; bf16: auto lets the probe choose"
            )
    precision = choice.bf16 and not emulated

    # Attention kernel, at the chosen precision: PyTorch's own choice only where clearly faster.
    plain = passes["bf16" if precision else "float32"]
    other = challenge(plain, lambda: timed_pass(precision, "default"))
    choice.probe_ms.update(attention_math=_ms(plain), attention_default=_ms(other))
    choice.attention = "default" if other < SWITCH_MARGIN * plain else "math"
    choice.reasons["attention"] = f"auto: a pass {_ms(plain)} ms in plain math, {_ms(other)} ms as PyTorch chooses"

    # Threads, with the rest chosen: fewer than all the cores only where clearly faster. A change
    # of count restarts the thread pool, so each count is timed in a block of its own.
    chosen = min(plain, other)
    counts = sorted({n for n in (probe_threads or []) if n != all_threads}, reverse=True)
    if counts:
        timings = {all_threads: chosen}
        for n in counts:
            torch.set_num_threads(n)
            timings[n] = challenge(chosen, lambda: timed_pass(precision, choice.attention))
        torch.set_num_threads(all_threads)
        fastest = min(timings, key=timings.get)
        choice.threads = fastest if timings[fastest] < SWITCH_MARGIN * chosen else all_threads
        choice.probe_ms["pass_by_threads"] = {str(n): _ms(t) for n, t in sorted(timings.items())}
        choice.reasons["threads"] = "auto: " + ", ".join(
            f"{n} thread{'s' if n > 1 else ''} {_ms(t)} ms" for n, t in sorted(timings.items())
        )
        torch.set_num_threads(choice.threads)
    else:
        choice.reasons["threads"] = "as configured"

    # Optimizer: one Adam step over a copy of the parameters, fused kernel against foreach.
    fused, foreach = _adam_step_ms(model)
    choice.probe_ms.update(adam_fused=_ms(fused), adam_foreach=_ms(foreach))
    choice.fused_optimizer = fused <= foreach / MARGIN
    choice.reasons["fused_optimizer"] = f"auto: an Adam step {_ms(fused)} ms fused, {_ms(foreach)} ms foreach"


def challenge(incumbent: float, run: Callable[[], float]) -> float:
    """A challenger's time against the default's: its first pass (warm-up included, so an upper
    bound) settles it where it is slower anyway; else one more pass, and the better of the two."""
    first = run()
    return first if first >= SWITCH_MARGIN * incumbent else min(first, run())


def interleaved(candidates: dict, rounds: int) -> dict:
    """Each candidate's best time over `rounds` rounds that take them in turn, after one warm-up
    each (allocations, kernel choice, a thread pool's first start). Taking them in turn and
    keeping the best of each means a burst of load elsewhere slows one sample, not one candidate."""
    for run in candidates.values():
        run()
    best = {name: float("inf") for name in candidates}
    for _ in range(rounds):
        for name, run in candidates.items():
            best[name] = min(best[name], run())
    return best


def _matmul_ms(model, batch) -> tuple[float, float]:
    """One [tokens x d_model] @ [d_model x ffn] product (the FFN's, the model's largest matmul per
    token besides the vocabulary's), float32 and under bf16 autocast; best of five each."""
    d_model = model.cfg.d_model
    hidden = max(model.cfg.enc_ffn + model.cfg.dec_ffn)
    rows = min(512, max(64, int(batch[0].numel())))
    x, w = torch.randn(rows, d_model), torch.randn(hidden, d_model)

    def run(use_bf16: bool) -> float:
        best = float("inf")
        for _ in range(6):  # the first is a warm-up; the best of the rest, whatever else runs
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
                torch.nn.functional.linear(x, w).sum().item()
            best = min(best, time.perf_counter() - start)
        return best

    return run(False), run(True)


def _adam_step_ms(model) -> tuple[float, float]:
    params = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    timings = []
    for fused in (True, False):
        copies = [copy.deepcopy(p) for p in params]
        for c, p in zip(copies, params):
            c.grad = p.grad.clone()
        opt = torch.optim.Adam(
            copies, lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=fused, foreach=None if fused else True
        )
        opt.step()  # warm-up: creates the moments
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            opt.step()
            best = min(best, time.perf_counter() - start)
        timings.append(best)
    return timings[0], timings[1]


def _ms(seconds: float) -> float:
    """Milliseconds to three significant figures."""
    ms = seconds * 1000
    return float(f"{ms:.3g}") if ms > 0 else 0.0


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
