"""Serving batches for ragged paged attention: which sequences a step holds, how many query
tokens each brings (cu_q_lens, num_seqs), how long its cached keys are (kv_lens) and which pages
hold them (page_indices). Speed depends on them (a decode step reads whole caches for one token
each; a prefill step computes long causal blocks), and random integers are no page table: the
tuner makes them with one of these (KernelOptions.workloads).

Arguments: q [max_num_batched_tokens, ...], kv_pages [total_pages, page_size, ...], kv_lens
[max_num_seqs], page_indices [max_num_seqs, pages_per_seq], cu_q_lens [max_num_seqs + 1],
num_seqs [1]."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

PREFILL_SEQS = 2  # sequences a prefill step holds (at most)


def _batch(args: Sequence[Any], q_lens: list[int], rng: np.random.Generator) -> dict:
    """The data arguments of a step whose sequences bring `q_lens` query tokens each, each
    cache at least as long as its queries and at most its pages hold; pages drawn at random
    from the pool, each used once where the pool allows."""
    tokens = args[0].shape[0]
    total_pages, page_size = args[1].shape[:2]
    max_seqs, pages_per_seq = args[3].shape
    capacity = pages_per_seq * page_size
    n = len(q_lens)
    kv_lens = np.zeros(max_seqs, np.int32)
    for i, q_len in enumerate(q_lens):
        kv_lens[i] = rng.integers(q_len, capacity + 1)
    pool = rng.permutation(max(total_pages, max_seqs * pages_per_seq)) % total_pages
    page_indices = pool[: max_seqs * pages_per_seq].reshape(max_seqs, pages_per_seq)
    cu_q_lens = np.zeros(max_seqs + 1, np.int32)
    cu_q_lens[1 : n + 1] = np.cumsum(q_lens)
    cu_q_lens[n + 1 :] = cu_q_lens[n]
    assert cu_q_lens[n] <= tokens
    return {
        2: kv_lens,
        3: page_indices.astype(np.int32),
        4: cu_q_lens,
        5: np.array([n], np.int32),
    }


def decode(args: Sequence[Any], rng: np.random.Generator) -> dict:
    """Every sequence slot decoding one token (as many as the tokens allow)."""
    n = min(args[3].shape[0], args[0].shape[0])
    return _batch(args, [1] * n, rng)


def prefill(args: Sequence[Any], rng: np.random.Generator) -> dict:
    """A few sequences prefilling: their prompts share the step's tokens, each within what
    its pages hold."""
    tokens = args[0].shape[0]
    capacity = args[3].shape[1] * args[1].shape[1]
    n = min(PREFILL_SEQS, args[3].shape[0], tokens)
    q_len = min(tokens // n, capacity)
    return _batch(args, [q_len] * n, rng)


def mixed(args: Sequence[Any], rng: np.random.Generator) -> dict:
    """Continuous batching: one prompt chunk (half the tokens, within a cache) beside the other
    slots decoding."""
    tokens, max_seqs = args[0].shape[0], args[3].shape[0]
    capacity = args[3].shape[1] * args[1].shape[1]
    chunk = max(1, min(tokens // 2, capacity))
    decoding = max(0, min(max_seqs - 1, tokens - chunk))
    return _batch(args, [chunk] + [1] * decoding, rng)


WORKLOADS = {"decode": decode, "prefill": prefill, "mixed": mixed}
