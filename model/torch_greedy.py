"""Greedy translation with the PyTorch model: `greedy_hypotheses` (a list of sentences, in batches
of similar lengths; what training validates and pruning scores with) and `greedy_on_device` (one
batch with the loop on the model's device).

mt_runtime/search.py brings each step's words to the host to choose the next tokens and drop the
sentences that ended: on a GPU that is a wait for the device at every step, longer than the
step. Here the words are chosen on the device, a sentence that has ended is fed EOS until it is
dropped, and the host looks only every CHECK_EVERY steps (are all done? which rows are left?)
and once at the end. The words are greedy_search's over TorchDecoder: each step's top 1 of the
same log-softmax, the same length limit.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from mt_runtime.search import GenerationConfig, greedy_search

from .torch_decoder import TorchDecoder
from .transformer import Transformer

CHECK_EVERY = 8  # decoder steps between the host's looks at which sentences have ended
# Sentences per greedy batch when validating: on the CPU as ever; on CUDA, where the search
# stays on the device (greedy_on_device), a validation set at once.
GREEDY_CHUNK = {"host": 128, "device": 1024}


def greedy_hypotheses(
    model: Transformer, sources: list[list[int]], device, on_chunk=None, on_device: bool | None = None
) -> list[list[int]]:
    """Greedy translations (ids) of `sources` (ids + EOS), in batches of similar lengths. On CUDA
    the search runs on the device and the host looks at it every few steps (greedy_on_device); on
    the CPU, mt_runtime/search.py's over TorchDecoder. The same words either way. `on_chunk(n)` after
    each batch."""
    device = torch.device(device)
    on_device = device.type == "cuda" if on_device is None else on_device
    cfg = model.cfg
    gen = GenerationConfig(
        beam=1, bos_id=cfg.bos_id, eos_id=cfg.eos_id, pad_id=cfg.pad_id, max_positions=cfg.max_positions
    )
    decoder = None if on_device else TorchDecoder(model, device)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    hyps: list[list[int]] = [[] for _ in order]
    size = GREEDY_CHUNK["device" if on_device else "host"]
    for start in range(0, len(order), size):
        chunk = order[start : start + size]
        batch = [sources[i] for i in chunk]
        found = greedy_on_device(model, batch, gen, device) if on_device else greedy_search(decoder, batch, gen)
        for i, h in zip(chunk, found):
            hyps[i] = h
        if on_chunk is not None:
            on_chunk(len(chunk))
    return hyps


@torch.inference_mode()
def greedy_on_device(
    model: Transformer, src: list[list[int]], gen: GenerationConfig, device, check_every: int = CHECK_EVERY
) -> list[list[int]]:
    """Greedy translations (ids, without EOS) of `src` (ids + EOS each), the model in eval mode."""
    device = torch.device(device)
    n = len(src)
    batch = np.full((n, max(len(s) for s in src)), gen.pad_id, dtype=np.int64)
    for i, s in enumerate(src):
        batch[i, : len(s)] = s
    memory, src_mask = model.encode(torch.from_numpy(batch).to(device))
    cross = model.cross_kv(memory)
    last = np.array([gen.max_len(len(s)) for s in src]) - 1  # per sentence: the step that must end it
    width = int(last.max()) + 1
    out = torch.full((n, width), gen.pad_id, dtype=torch.long, device=device)
    last_step = torch.from_numpy(last).to(device)
    alive = torch.arange(n, device=device)  # the sentence of each row
    ended = torch.zeros(n, dtype=torch.bool, device=device)
    tokens = torch.full((n, 1), gen.bos_id, dtype=torch.long, device=device)
    eos = torch.tensor(gen.eos_id, device=device)
    pad = torch.tensor(gen.pad_id, device=device)
    past = None
    for t in range(width):
        logits, past = model.decode_step(tokens, cross, src_mask, past)
        nxt = F.log_softmax(logits.float(), dim=-1).topk(1, dim=-1)[1][:, 0]
        nxt = torch.where(last_step <= t, eos, nxt)  # out of room: end here
        nxt = torch.where(ended, pad, nxt)
        out[alive, t] = nxt
        ended = ended | (nxt == eos)
        tokens = torch.where(ended, eos, nxt)[:, None]
        if (t + 1) % check_every == 0 and t + 1 < width:
            rows = torch.nonzero(~ended)[:, 0]  # the host waits here, once every check_every steps
            if len(rows) == 0:
                break
            if len(rows) < len(ended):
                cross = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in cross]
                past = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in past]
                src_mask, alive, last_step = src_mask.index_select(0, rows), alive[rows], last_step[rows]
                ended, tokens = ended[rows], tokens[rows]
    found = out.cpu().numpy()
    lengths = (found == gen.eos_id).argmax(axis=1)  # every row has its EOS by its last step
    return [row[: lengths[i]] for i, row in enumerate(found.tolist())]
