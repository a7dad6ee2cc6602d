"""The embedder: a sentence-transformers model, loaded once per process on first use (never at
import), run for passages through torch or ONNX Runtime (``CONCORD_PASSAGE_ENCODER``) and for
queries through ONNX Runtime on one thread (``CONCORD_QUERY_ENCODER``)."""

from __future__ import annotations

import logging
import os
import threading
from contextlib import AbstractContextManager, nullcontext
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from shared.settings import Settings, get_settings

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    from shared.ingest.onnx_encoder import OnnxEncoder, Precision

log = logging.getLogger(__name__)


class Embedder:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.model_path = settings.embedding_model_path()
        self._model: SentenceTransformer | None = None
        self._query_encoders: dict[int, OnnxEncoder | None] = {}  # by thread count
        self._passage_encoder: OnnxEncoder | None = None
        self._passage_encoder_tried = False
        self._counting_tokenizer: Tokenizer | None = None
        self._lock = threading.Lock()

    @property
    def passage_encoding(self) -> str:
        """The passage encoder in use: the setting, with ``auto`` decided for this CPU."""
        chosen = self.settings.passage_encoder
        if chosen == "auto":
            return "torch-bf16" if cpu_has_native_bf16() else "torch"
        return chosen

    @property
    def model_id(self) -> str:
        """Cache key for embeddings: the configured model (name or path) plus prompt, and the
        mark of an encoder whose vectors are close to fp32 torch's but not equal (bf16, int8):
        never mixed in the cache."""
        model = self.settings.embedding_model or "all-MiniLM-L6-v2"
        encoding = self.passage_encoding
        if encoding.startswith("onnx") and self.passage_encoder() is None:
            encoding = "torch"  # not exportable as is (or no writable state dir): fp32 torch
        # (int8 vectors cached before passages were encoded one per call carry "|int8": they
        # depended on their batch-mates, so they are not reused.)
        mark = {"torch-bf16": "|bf16", "onnx-int8": "|int8-alone"}.get(encoding, "")
        return f"{model}|{self.settings.passage_prompt}{mark}"

    def model(self) -> SentenceTransformer:
        with self._lock:
            if self._model is None:
                import os

                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                from sentence_transformers import SentenceTransformer

                model = SentenceTransformer(self.model_path, device=self.settings.embedding_device)
                dim = model.get_embedding_dimension()
                if dim != self.settings.embedding_dim:
                    raise RuntimeError(
                        f"embedding model {self.model_path} produces {dim}-dimensional vectors "
                        f"but the schema stores {self.settings.embedding_dim}"
                    )
                self._model = model
            return self._model

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """The (start, end) character offsets of the model's tokens in ``text``, without
        special tokens: what chunk sizes and the policy's token budget count. From a copy of
        the fast tokenizer with neither truncation nor padding (the ONNX encoders' copies
        truncate at the model's length), called directly: through the transformers wrapper
        each call cost 0.1 ms, a fifth of a 100-result search's policy."""
        if self._counting_tokenizer is None:
            from shared.ingest.onnx_encoder import direct_tokenizer

            self._counting_tokenizer = direct_tokenizer(self.model(), max_length=None)
        tokenizer = self._counting_tokenizer
        offsets: list[tuple[int, int]] = []
        # A long text a window at a time: one call holds the GIL throughout (10 MiB of
        # punctuation took 17 s), and a worker's lease heartbeat, a thread of the same
        # process, must beat every few seconds or the batch's leases run out under it.
        for start, end in tokenizing_windows(text):
            part = tokenizer.encode(text[start:end], add_special_tokens=False).offsets
            offsets += part if start == 0 else [(s + start, e + start) for s, e in part]
        return offsets

    def embed_passages(self, texts: list[str], token_counts: list[int] | None = None) -> np.ndarray:
        """``token_counts``, where the caller already knows them, spare tokenizing every text
        once more only to batch texts of similar length together."""
        return self._encode([self.settings.passage_prompt + t for t in texts], token_counts)

    def embed_query(self, text: str, threads: int = 1) -> np.ndarray:
        """``threads``: 1 while Elasticsearch works on the same search (the lexical arm runs
        meanwhile), more when it does not (a dense-only search)."""
        encoder = self.query_encoder(threads)
        if encoder is not None:
            return encoder.encode(self.settings.query_prompt + text)
        # fp32 torch, whatever encodes passages: a query is never quantized or in bf16.
        return np.asarray(self._torch_encode([self.settings.query_prompt + text])[0])

    def query_encoder(self, threads: int = 1) -> OnnxEncoder | None:
        """The ONNX query encoder on ``threads`` threads (CONCORD_QUERY_ENCODER=onnx, the
        default), or None where queries go through torch: configured so, or the model cannot
        be exported as is."""
        if self.settings.query_encoder != "onnx":
            return None
        if threads in self._query_encoders:
            return self._query_encoders[threads]  # the per-query path: no lock once decided
        model = self.model()
        with self._lock:
            if threads not in self._query_encoders:
                self._query_encoders[threads] = self._onnx(model, "queries", threads, "fp32")
        return self._query_encoders[threads]

    def passage_encoder(self) -> OnnxEncoder | None:
        """The ONNX passage encoder (CONCORD_PASSAGE_ENCODER=onnx or onnx-int8), with as many
        threads as torch would use here, or None where passages go through torch."""
        if not self.passage_encoding.startswith("onnx") or self._passage_encoder_tried:
            return self._passage_encoder
        precision: Precision = "int8" if self.passage_encoding == "onnx-int8" else "fp32"
        model = self.model()
        with self._lock:
            if not self._passage_encoder_tried:
                threads = self.settings.embedding_threads or _torch_threads()
                self._passage_encoder = self._onnx(model, "passages", threads, precision)
                self._passage_encoder_tried = True
        return self._passage_encoder

    def _onnx(
        self, model: SentenceTransformer, what: str, threads: int, precision: Precision
    ) -> OnnxEncoder | None:
        from shared.ingest.onnx_encoder import OnnxEncoder, export_dir_for

        try:
            return OnnxEncoder(
                model,
                export_dir_for(self.model_path, self.settings.onnx_export_root()),
                threads,
                precision,
            )
        except Exception as e:  # an unsupported layout, a read-only state directory...
            log.warning("%s are encoded with torch: %s: %s", what, type(e).__name__, e)
            return None

    def _encode(self, texts: list[str], lengths: list[int] | None = None) -> np.ndarray:
        out = np.zeros((len(texts), self.settings.embedding_dim), dtype=np.float32)
        if not texts:
            return out
        onnx = self.passage_encoder()
        if onnx is not None:
            # One text per call. int8's activations are quantized with one scale per call, so
            # in a batch a passage's vector moved with its batch-mates (a cosine of 0.987 to
            # the same text encoded alone), and those may be another tenant's texts; alone it
            # is a function of its own text. Unpadded, it is also faster on one thread: 500
            # SciFact chunks took 6.0 s one by one against 6.8-7.2 s in length batches
            # (fp32: 11.0-12.0 s against 13.8 s).
            for i, text in enumerate(texts):
                out[i] = onnx.encode(text)
            return out
        model = self.model()
        if lengths is None:
            lengths = [
                len(ids)
                for ids in model.tokenizer(
                    texts, truncation=True, max_length=model.max_seq_length, verbose=False
                )["input_ids"]
            ]
        for batch in length_batches(
            lengths, self.settings.embedding_batch_size, self.settings.embedding_batch_cost_tokens
        ):
            with self._precision():
                out[batch] = self._torch_encode([texts[i] for i in batch])
        return out

    def _torch_encode(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) float32 unit vectors from sentence-transformers, in one call."""
        vectors = self.model().encode(
            texts,
            batch_size=len(texts),
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), -1)

    def _precision(self) -> AbstractContextManager[object]:
        """bfloat16 autocast for torch-bf16 (the model's matrix products on the CPU's bf16
        units, its vectors back in fp32), else nothing."""
        if self.passage_encoding != "torch-bf16":
            return nullcontext()
        import torch

        return torch.autocast("cpu", dtype=torch.bfloat16)


@lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """AMX or AVX-512 BF16, where bfloat16 matrix products run natively (elsewhere torch
    emulates them, slower than fp32)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("amx_bf16", "avx512_bf16"))


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def torch_threads_per_process(settings: Settings, processes: int) -> int:
    """Torch threads for each of ``processes`` encoding processes on this machine: the
    configured count, else a fair share of the cores (two processes of two threads on two
    cores ran at half the speed of two of one)."""
    return settings.embedding_threads or max(1, (os.cpu_count() or 1) // max(processes, 1))


TOKENIZING_WINDOW_CHARS = 100_000


def tokenizing_windows(text: str, size: int = TOKENIZING_WINDOW_CHARS) -> list[tuple[int, int]]:
    """``text`` cut into spans of at most about ``size`` characters, each cut just before a
    space that stands between two other characters, in the second half of the span: no
    token spans it, and a tokenizer that puts a word's space in the word's token (byte-level
    BPE, SentencePiece) finds it at the start of the next span, as in the whole text; so the
    tokens of the spans are the tokens of the whole. A span of more than half a window with
    no such space (one "word" of 50,000 characters, text spaced by tabs only) is cut where it
    is; there the counts may differ by a token or two from one call's, on a text no one
    reads."""
    windows, start = [], 0
    while len(text) - start > size:
        end, lowest = start + size, start + size // 2
        cut = text.rfind(" ", lowest, end)
        while cut > lowest and (text[cut - 1].isspace() or text[cut + 1].isspace()):
            cut = text.rfind(" ", lowest, cut)
        end = cut if cut > lowest else end
        windows.append((start, end))
        start = end
    windows.append((start, len(text)))
    return windows


def length_batches(lengths: list[int], max_batch: int, batch_cost: int) -> list[list[int]]:
    """Group text indices into encoder batches of at most ``max_batch``, cheapest first.

    A batch costs its size times its longest text (every text is padded to that length) plus
    ``batch_cost`` tokens for the call itself. Sorted by length, the cheapest split into
    contiguous runs is a small dynamic programme. Why it matters: a worker embeds a few dozen
    documents at a time, whose chunks range from a short tail to the full window; fixed runs
    of ``max_batch`` padded ~18 % more tokens than the texts held, and on CPU a smaller batch
    is also no slower per token (its activations stay in cache)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    cost = [0] + [float("inf")] * len(order)
    start = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        longest = lengths[order[end - 1]]
        for first in range(max(0, end - max_batch), end):
            candidate = cost[first] + longest * (end - first) + batch_cost
            if candidate < cost[end]:
                cost[end], start[end] = candidate, first
    batches = []
    end = len(order)
    while end > 0:
        batches.append(order[start[end] : end])
        end = start[end]
    return batches[::-1]


@lru_cache
def get_embedder() -> Embedder:
    return Embedder(get_settings())
