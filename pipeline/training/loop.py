"""The training loop shared by the teacher, the students and pruning's fine-tune.

Label-smoothed cross-entropy (loss.py), Adam(0.9, 0.98, 1e-9) with inverse-square-root warmup,
gradient clipping, batches by token count with length bucketing (batches.py), validation loss and
greedy BLEU each epoch (validation.py), checkpoint averaging. The budget is steps or epochs, so
that one recipe trains the same model on any machine; minutes are only a cap, and a training the
cap cuts short says so in its result.
Speed-only switches (bf16, attention kernel, fused Adam, threads) are measured on the machine at
hand (pipeline/training/speed_probe.py), or taken from the recipe's lock where an earlier build of
the same artifact recorded them, and kept in the checkpoint and the result. A killed run resumes
from its last checkpoint (model, optimizer, schedule, position in the data order, RNG; see
checkpoints.py) to the same weights as a run never killed: nothing a step computes depends on the
clock or on when checkpoints were taken (tests/store/test_one_content_per_id.py).
Several processes (torchrun; gloo on CPU, nccl on GPU) split each epoch's batches.
"""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from model.transformer import Transformer

from ..corpora.encoded import Corpus, make_batches
from . import speed_probe, validation
from .batches import Batch, BatchFeed, collate, collate_soft, prepare_batch  # noqa: F401 (collate*: callers')
from .checkpoints import Checkpoints
from .loss import label_smoothed_loss
from .settings import TrainConfig, budget_text, cut_text
from .validation import ValidationSet


def inverse_sqrt_lr(step: int, peak: float, warmup: int) -> float:
    """Linear warmup to `peak`, then decay with 1/sqrt(step) (the paper's schedule, peak-normalised)."""
    step = max(step, 1)
    if warmup <= 0:
        return peak
    return peak * min(step / warmup, math.sqrt(warmup / step))


def cooldown_factor(progress: float, cooldown: float) -> float:
    """1 until the last `cooldown` fraction of the training budget, then a linear fall to 0 at its
    end. Under a fixed budget a decay to zero ends in a better model than the slow 1/sqrt tail
    alone (Li et al., 2020, "Budgeted Training"); cooldown 0 keeps the plain schedule."""
    if cooldown <= 0 or progress <= 1 - cooldown:
        return 1.0
    return max(0.02, (1 - progress) / cooldown)


class Trainer:
    # The progress line's training loss (the mean since its last figure) is read from the device
    # at most this often: reading it makes a CUDA host wait for the step to finish.
    LOSS_EVERY_S = 1.0
    PREFETCH_BATCHES = 2  # how many batches the loader thread keeps ready

    def __init__(
        self,
        model: Transformer,
        cfg: TrainConfig,
        train: Corpus,
        valid: ValidationSet,
        tokenizer,
        work: Path,
        log: Callable[[str], None],
        progress,
        device: str = "cpu",
        teacher: Transformer | None = None,
        kd_alpha: float = 0.0,
        kd_temperature: float = 1.0,
        probe_threads: list[int] | None = None,
        speed: speed_probe.SpeedChoice | None = None,
        prefetch: bool | None = None,
    ):
        self.cfg, self.train_set, self.valid, self.tokenizer = cfg, train, valid, tokenizer
        self.log, self.progress, self.device = log, progress, torch.device(device)
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.model = model.to(self.device)
        self.ckpt = Checkpoints(work)
        self.teacher = teacher.to(self.device).eval() if teacher is not None else None
        self.kd_alpha, self.kd_temperature = kd_alpha, kd_temperature
        self.budget_used = 0.0  # fraction of the training budget used so far (drives the cooldown)
        self.probe_threads = probe_threads if self.world == 1 else None
        # Chosen when fit() starts, unless given (a caller that has chosen already, or a test).
        self.fixed_speed = speed
        # Batches made ahead by a loader thread: on CUDA, where the device would otherwise wait
        # for them. On the CPU a batch costs a fraction of a millisecond against a step's hundreds,
        # and the thread would take time from the compute threads, so each step makes its own.
        self.prefetch = self.device.type == "cuda" if prefetch is None else prefetch
        self.running_loss = _RunningLoss(self.LOSS_EVERY_S)
        self.speed: speed_probe.SpeedChoice | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.ddp_model = self.model
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.ddp_model = DistributedDataParallel(
                self.model, device_ids=None if self.device.type == "cpu" else [self.device.index]
            )

    # ---------------------------------------------------------------- main loop
    def fit(self) -> dict:
        cfg = self.cfg
        torch.manual_seed(cfg.seed + self.rank)
        state = {
            "step": 0,
            "epoch": 0,
            "batch": 0,
            "elapsed_s": 0.0,
            "history": [],
            "kept": [],
            "tokens": 0,
            "resumed_from": [],
        }
        saved = self.ckpt.saved_state()
        self._choose_speed(saved.get("speed") if saved else None)
        if saved is not None:
            state = self.ckpt.load(self.model, self.optimizer)
            state["resumed_from"].append(state["step"])
            self.log(
                f"resumed from checkpoint at step {state['step']} (epoch {state['epoch'] + 1}, "
                f"batch {state['batch']}, {state['elapsed_s'] / 60:.1f} min already trained)"
            )
        if self.rank == 0:  # snapshots of a run killed before its checkpoint recorded them
            self.ckpt.drop_unkept(state["kept"])
        session_start = time.monotonic()
        elapsed = lambda: state["elapsed_s"] + time.monotonic() - session_start  # noqa: E731
        last_ckpt = time.monotonic()
        eta = _Forecast(self, state)
        # A run resumed from a checkpoint taken when its budget ran out must not take another step.
        # Mid-epoch, the budget used counts the epoch's batches done, as it did before the kill:
        # the first step's cooldown (an epoch budget's) then gets the learning rate it would have.
        done = state["batch"] / self._batches_in(state["epoch"]) if state["batch"] else 0.0
        stop_reason = self._budget_reached(state, elapsed(), done)
        max_epochs = cfg.max_epochs or 10**9
        if state["epoch"] >= max_epochs:
            stop_reason = stop_reason or f"max_epochs ({cfg.max_epochs})"

        while state["epoch"] < max_epochs and stop_reason is None:
            batches = make_batches(self.train_set, cfg.batch_tokens, cfg.seed, state["epoch"], self.rank, self.world)
            self.model.train()
            with (
                self.progress(f"epoch {state['epoch'] + 1}", total=len(batches), unit="batches") as bar,
                self.batch_feed(batches[state["batch"] :]) as feed,
            ):
                bar.advance(state["batch"])
                t_epoch, tok_epoch = time.monotonic(), 0
                for batch in feed:
                    ntok = self._train_step(batch, state["step"] + 1)
                    state["step"] += 1
                    state["batch"] += 1
                    state["tokens"] += ntok
                    tok_epoch += ntok
                    _killed_at(state["step"])
                    rate = tok_epoch * self.world / max(1e-6, time.monotonic() - t_epoch)
                    bar.advance(
                        1,
                        postfix=f"{self.running_loss.text()}lr {self.optimizer.param_groups[0]['lr']:.2e} "
                        f"{rate:.0f} tok/s{eta.update(len(batches))}",
                    )
                    stop_reason = self._budget_reached(state, elapsed(), state["batch"] / len(batches))
                    if stop_reason:
                        break
                    if time.monotonic() - last_ckpt > cfg.checkpoint_every_minutes * 60:
                        self._save_checkpoint(state, elapsed(), session_start)
                        last_ckpt = time.monotonic()
            partial = state["batch"] < len(batches)
            if not partial:
                state["epoch"] += 1
                state["batch"] = 0
            self._end_of_epoch(state, partial)
            self._save_checkpoint(state, elapsed(), session_start)
            if self.rank == 0:  # only now that the checkpoint names the new `kept`
                self.ckpt.drop_unkept(state["kept"])
            last_ckpt = time.monotonic()
            if stop_reason is None and state["epoch"] >= max_epochs:
                stop_reason = f"max_epochs ({cfg.max_epochs})"
            if stop_reason is None:
                stop_reason = self._budget_reached(state, elapsed(), 0.0)
        return self._finish(state, elapsed(), stop_reason or "done")

    def _batches_in(self, epoch: int) -> int:
        cfg = self.cfg
        return max(1, len(make_batches(self.train_set, cfg.batch_tokens, cfg.seed, epoch, self.rank, self.world)))

    def _choose_speed(self, saved: dict | None) -> None:
        """The speed switches: those of the checkpoint a resumed run continues (one training, one
        precision), else measured now; rank 0 decides for every rank. Then the optimizer."""
        cfg = self.cfg
        if saved is not None or self.fixed_speed is not None:
            self.speed = speed_probe.SpeedChoice.from_dict(saved) if saved is not None else self.fixed_speed
            if self.world == 1:
                torch.set_num_threads(self.speed.threads)
            how = "kept from the checkpoint" if saved is not None else self.speed.source
        else:
            choice = [None]
            if self.rank == 0:
                choice = [self._probe_speed().to_dict()]
            if self.world > 1:
                dist.broadcast_object_list(choice, 0)
            self.speed = speed_probe.SpeedChoice.from_dict(choice[0])
            how = f"probe {self.speed.probe_s:.1f} s"
        self.log(f"speed: {self.speed.summary()}; {how}")
        if self.speed.warning and saved is None:
            self.log(f"warning: {self.speed.warning}")
        opt_cls = torch.optim.AdamW if cfg.weight_decay > 0 else torch.optim.Adam
        self.optimizer = opt_cls(
            self.model.parameters(),
            lr=cfg.lr,
            betas=(0.9, 0.98),
            eps=1e-9,
            weight_decay=cfg.weight_decay,
            fused=self.speed.fused_optimizer or None,
            foreach=None if self.speed.fused_optimizer else True,
        )

    def _probe_speed(self) -> speed_probe.SpeedChoice:
        cfg, tok = self.cfg, self.tokenizer
        batches = make_batches(self.train_set, cfg.batch_tokens, cfg.seed, 0)
        full = max(batches, key=len)
        part = full[: max(1, len(full) // 4)]  # a quarter of a batch: the probe in a second or two
        src, tin, tout = collate(self.train_set, part, tok.pad_id, tok.bos_id, tok.eos_id, self.device)
        target = tout[tout != tok.pad_id]
        self.model.train()
        return speed_probe.choose(
            self.model,
            (src, tin, tout),
            lambda logits: label_smoothed_loss(logits, target, cfg.label_smoothing),
            self.device,
            cfg.bf16,
            torch.get_num_threads(),
            self.probe_threads,
            steps=min(cfg.max_steps or 10**12, (cfg.max_epochs or 10**6) * len(batches)),
            pass_to_step=4.4,
        )  # a step: four times the probe's rows, plus the optimizer and batching

    def _save_checkpoint(self, state: dict, elapsed_s: float, session_start: float) -> None:
        if self.rank == 0:
            self.ckpt.save(self.model, self.optimizer, {**state, "elapsed_s": elapsed_s, "speed": self.speed.to_dict()})
        if self.world > 1:
            dist.barrier()

    def _budget_reached(self, state: dict, elapsed_s: float, epoch_fraction: float) -> str | None:
        """Whether the budget is spent or the time cap reached; also updates `self.budget_used`,
        the fraction of the budget (steps or epochs, the first to run out) used so far, which the
        learning-rate cooldown follows. Time never moves the schedule: a model trained to its budget
        is the same on a fast machine and a slow one, and one the cap cuts is recorded as cut."""
        cfg = self.cfg
        fractions = []
        if cfg.max_steps is not None:
            fractions.append(state["step"] / cfg.max_steps)
        if cfg.max_epochs is not None:
            fractions.append((state["epoch"] + epoch_fraction) / cfg.max_epochs)
        progress = max(fractions)
        reason = None
        if cfg.max_steps is not None and state["step"] >= cfg.max_steps:
            reason = f"max_steps ({cfg.max_steps})"
        elif cfg.max_minutes is not None and elapsed_s >= cfg.max_minutes * 60:
            reason = f"max_minutes ({cfg.max_minutes:g})"
        if self.world > 1:  # every rank must stop at the same step and use the same lr: rank 0 decides
            flag = torch.tensor(
                [1.0 if reason else 0.0, progress],
                dtype=torch.float64,
                device=self.device if self.device.type == "cuda" else "cpu",
            )
            dist.broadcast(flag, 0)
            progress = float(flag[1])
            reason = reason or ("stopped by rank 0" if flag[0].item() else None)
        self.budget_used = progress
        return reason

    def batch_feed(self, indices: list[np.ndarray]) -> BatchFeed:
        """The training batches of `indices`, in order, made on the host (ahead, in a thread, where
        self.prefetch; pinned for the copy on CUDA)."""
        tok = self.tokenizer
        soft = self.train_set.soft is not None and self.kd_alpha > 0
        pin = self.device.type == "cuda"
        return BatchFeed(
            lambda index: prepare_batch(self.train_set, index, tok.pad_id, tok.bos_id, tok.eos_id, soft, pin),
            indices,
            self.PREFETCH_BATCHES if self.prefetch else 0,
        )

    def _train_step(self, batch: Batch, step: int) -> int:
        """One optimizer step on `batch`; returns its target tokens. Nothing here waits for the
        device: the loss is added up there (self.running_loss)."""
        cfg = self.cfg
        batch = batch.to(self.device, non_blocking=True)
        lr = inverse_sqrt_lr(step, cfg.lr, cfg.warmup_steps) * cooldown_factor(self.budget_used, cfg.cooldown)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        soft = (batch.soft_ids, batch.soft_probs, self.kd_alpha) if batch.soft_ids is not None else None
        with (
            speed_probe.attention_context(self.speed.attention),
            torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.speed.bf16),
        ):
            logits = self.ddp_model(batch.src, batch.tgt_in, keep=batch.keep)
            loss = label_smoothed_loss(logits, batch.target, cfg.label_smoothing, soft)
            if self.teacher is not None and self.kd_alpha > 0:
                with torch.no_grad():
                    teacher_logits = self.teacher(batch.src, batch.tgt_in, keep=batch.keep)
                t = self.kd_temperature
                kl = (
                    F.kl_div(
                        F.log_softmax(logits.float() / t, -1),
                        F.log_softmax(teacher_logits.float() / t, -1),
                        log_target=True,
                        reduction="batchmean",
                    )
                    * t
                    * t
                )
                loss = (1 - self.kd_alpha) * loss + self.kd_alpha * kl
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_norm)
        self.optimizer.step()
        self.running_loss.add(loss)
        return batch.tokens

    # ---------------------------------------------------------------- validation
    def valid_loss(self, model: Transformer) -> float:
        return validation.valid_loss(model, self.valid.corpus, self.tokenizer, self.cfg.batch_tokens, self.device)

    def valid_bleu(self, model: Transformer) -> float | None:
        return validation.valid_bleu(model, self.valid, self.tokenizer, self.device)

    def _end_of_epoch(self, state: dict, partial: bool) -> None:
        if self.rank == 0:
            t0 = time.monotonic()
            loss = self.valid_loss(self.model)
            bleu = self.valid_bleu(self.model)
            self.model.train()
            label = f"epoch{state['epoch']}" + (f"_step{state['step']}" if partial else "")
            entry = {
                "epoch": state["epoch"],
                "step": state["step"],
                "partial": partial,
                "valid_loss": round(loss, 4),
                "valid_bleu": bleu,
                "name": label,
                "train_tokens": state["tokens"],
                "validation_s": round(time.monotonic() - t0, 1),
            }
            state["history"].append(entry)
            self.log(
                f"{label}: valid loss {loss:.3f}"
                + (f", valid BLEU (greedy) {bleu:.2f}" if bleu is not None else "")
                + f" at step {state['step']}"
            )
            self._keep_snapshot(state, entry)
        if self.world > 1:
            dist.barrier()

    def _rank_key(self, entry: dict) -> tuple:
        bleu = entry["valid_bleu"]
        return (bleu if bleu is not None else 0.0, -entry["valid_loss"])

    def _keep_snapshot(self, state: dict, entry: dict) -> None:
        """Keep the best N epoch-end weights (by valid BLEU, then loss) for averaging. Checkpoints
        record before they delete: the new snapshot is saved here, the checkpoint naming the new
        `kept` next (fit), and only then are dropped snapshots deleted (Checkpoints.drop_unkept)."""
        entry = dict(entry)  # its own copy: `history` holds the entry without the snapshot's record
        kept = state["kept"] + [entry]
        kept.sort(key=self._rank_key, reverse=True)
        keep_n = self.cfg.average_checkpoints
        if entry in kept[:keep_n]:
            entry["snapshot"] = self.ckpt.save_snapshot(self.model, entry["name"])
        state["kept"] = kept[:keep_n]

    def _finish(self, state: dict, elapsed_s: float, reason: str) -> dict:
        cfg = self.cfg
        result = {
            "steps": state["step"],
            "epochs": state["epoch"],
            "train_minutes": round(elapsed_s / 60, 2),
            "stopped_by": reason,
            "history": state["history"],
            "train_tokens": state["tokens"],
            "resumed_from_steps": state["resumed_from"],
            "tokens_per_s": round(state["tokens"] * self.world / max(1e-6, elapsed_s), 1),
            "budget": budget_text(cfg.max_steps, cfg.max_epochs, cfg.max_minutes),
            "precision": self.speed.precision,
            "speed": self.speed.to_dict(),
        }
        if reason.startswith("max_minutes"):
            result["cut_by_time"] = cut_text(state["step"], cfg.max_steps, cfg.max_epochs)
            self.log(
                f"warning: {result['cut_by_time']} (max_minutes {cfg.max_minutes:g}): this model is "
                "not the one the recipe's budget trains"
            )
        if self.rank != 0:
            return result
        kept = state["kept"]
        if not kept:
            raise RuntimeError("training ended without a single validated checkpoint")
        best = kept[0]
        self.model.load_state_dict(self.ckpt.load_snapshot(best))
        chosen = {
            "kind": "best",
            "from": [best["name"]],
            "valid_loss": best["valid_loss"],
            "valid_bleu": best["valid_bleu"],
        }
        if len(kept) > 1:
            states = [self.ckpt.load_snapshot(k) for k in kept]
            averaged = {k: sum(s[k].float() for s in states) / len(states) for k in states[0]}
            best_state = {k: v.clone() for k, v in self.model.state_dict().items()}
            self.model.load_state_dict({k: v.to(best_state[k].dtype) for k, v in averaged.items()})
            avg_loss, avg_bleu = self.valid_loss(self.model), self.valid_bleu(self.model)
            self.log(
                f"average of {len(kept)} checkpoints: valid loss {avg_loss:.3f}"
                + (f", valid BLEU {avg_bleu:.2f}" if avg_bleu is not None else "")
                + f" (best single: {best['valid_bleu']})"
            )
            if self._rank_key({"valid_bleu": avg_bleu, "valid_loss": avg_loss}) >= self._rank_key(best):
                chosen = {
                    "kind": "average",
                    "from": [k["name"] for k in kept],
                    "valid_loss": round(avg_loss, 4),
                    "valid_bleu": avg_bleu,
                }
            else:
                self.model.load_state_dict(best_state)
        self.model.eval()
        result.update(chosen_checkpoint=chosen, best_valid_loss=chosen["valid_loss"], valid_bleu=chosen["valid_bleu"])
        return result


# For tests of resuming: the training process SIGKILLs itself right after this step (a kill that
# lands at a known step, between a checkpoint and the next).
KILL_AFTER_STEP_ENV = "PIPELINE_KILL_AFTER_STEP"


def _killed_at(step: int) -> None:
    if os.environ.get(KILL_AFTER_STEP_ENV) == str(step):
        os.kill(os.getpid(), signal.SIGKILL)


class _RunningLoss:
    """The training loss's mean over the steps since it was last read, added up on the device and
    read (a wait for the device on CUDA) at most every `every_s` seconds."""

    def __init__(self, every_s: float):
        self.every_s = every_s
        self.total: torch.Tensor | None = None
        self.steps = 0
        self.read_at = -math.inf
        self.mean: float | None = None

    def add(self, loss: torch.Tensor) -> None:
        loss = loss.detach()
        self.total = loss if self.total is None else self.total + loss
        self.steps += 1

    def text(self) -> str:
        """'loss X ' with the latest figure ('' before the first)."""
        if self.steps and time.monotonic() - self.read_at >= self.every_s:
            self.mean = float(self.total) / self.steps
            self.total, self.steps, self.read_at = None, 0, time.monotonic()
        return "" if self.mean is None else f"loss {self.mean:.3f} "


class _Forecast:
    """The time a training still needs for its budget, at the rate measured since it (re)started:
    logged once after its first minute, then kept in the progress line."""

    FIRST_AFTER_S = 60.0

    def __init__(self, trainer: Trainer, state: dict):
        self.trainer, self.state = trainer, state
        self.start, self.start_step = time.monotonic(), state["step"]
        self.logged = False

    def update(self, batches_per_epoch: int) -> str:
        spent = time.monotonic() - self.start
        done = self.state["step"] - self.start_step
        if spent < self.FIRST_AFTER_S or done <= 0:
            return ""
        cfg, state = self.trainer.cfg, self.state
        left = [cfg.max_steps - state["step"]] if cfg.max_steps is not None else []
        if cfg.max_epochs is not None:
            left.append((cfg.max_epochs - state["epoch"]) * batches_per_epoch - state["batch"])
        if not left:
            return ""
        steps_left = max(0, min(left))
        # Each epoch end validates; count the ones still to come at the last one's cost.
        history = state["history"]
        epochs_left = math.ceil((steps_left + state["batch"]) / max(1, batches_per_epoch))
        validation = epochs_left * (history[-1]["validation_s"] if history else 0.0)
        seconds = steps_left * spent / done + validation
        if cfg.max_minutes is not None:
            cap_left = cfg.max_minutes * 60 - (state["elapsed_s"] + spent)
            if seconds > cap_left and not self.logged:
                self.trainer.log(
                    f"warning: at this rate the max_minutes cap ({cfg.max_minutes:g}) will cut "
                    f"this training near step {state['step'] + int(cap_left * done / spent)}"
                )
        if not self.logged:
            self.logged = True
            finish = time.strftime("%H:%M", time.localtime(time.time() + seconds))
            self.trainer.log(
                f"{spent / done:.2f} s a step: the budget's {steps_left} steps left take about "
                f"{speed_probe.duration(seconds)} more (done near {finish})"
            )
        return f" eta {speed_probe.duration(seconds)}"
