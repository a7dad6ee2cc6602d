"""The embedding model run through ONNX Runtime: the same sentence-transformers weights,
exported once, for queries and (``CONCORD_PASSAGE_ENCODER``) for passages.

Queries: a query is one short text, so the encoder's cost is almost all per-call overhead,
which torch's eager mode pays op by op. The same weights exported to ONNX encode a SciFact
query in 3.8 ms on one thread instead of 6.8 ms with torch on two (vectors within 2e-7), and
leave the other core to Elasticsearch, which works on the lexical arm at the same time.

Passages: one text per call, unpadded and mean-pooled over its tokens, as sentence-transformers
pools them (Embedder._encode says why not in batches). ``onnx`` runs the exported graph as it
is (fp32, the same vectors as torch to ~1e-6); ``onnx-int8`` runs a copy whose linear layers'
weights are quantized to int8 (dynamic quantization: activations are quantized per call at
run time, so per text), which is faster on CPU and close to the fp32 vectors but not equal to
them: its vectors are cached under a model id of their own, and the stores keep fp32 vectors
either way.

The exports are written once per model under the state directory (CONCORD_ONNX_EXPORT_DIR)
and reused by every process: the first process to need one writes it while holding a lock on
the directory, and the others wait for it rather than write it too. A model this module
cannot reproduce exactly (pooling other than mean or CLS, extra modules) keeps torch.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
SUPPORTED_POOLING = ("mean", "cls")
Precision = Literal["fp32", "int8"]


class UnsupportedModel(Exception):
    """The model's modules are not [Transformer, Pooling(mean|cls), Normalize?]."""


class OnnxEncoder:
    """Encodes texts with the model's ONNX export on ``threads`` threads."""

    def __init__(
        self,
        model: SentenceTransformer,
        export_dir: Path,
        threads: int = 1,
        precision: Precision = "fp32",
    ) -> None:
        import onnxruntime

        modules = [type(m).__name__ for m in model]
        if modules[:2] != ["Transformer", "Pooling"] or modules[2:] not in ([], ["Normalize"]):
            raise UnsupportedModel(f"modules {modules}")
        self.pooling = str(model[1].pooling_mode)
        if self.pooling not in SUPPORTED_POOLING:
            raise UnsupportedModel(f"pooling {self.pooling!r}")
        self.normalize = modules[2:] == ["Normalize"]
        self.max_length = int(model.max_seq_length or 512)
        self.tokenizer = direct_tokenizer(model, self.max_length)
        path = export_dir / "model.onnx"
        made_once(path, lambda: _export(model, path))
        if precision == "int8":
            quantized = export_dir / "model-int8.onnx"
            made_once(quantized, lambda: _quantize(path, quantized))
            path = quantized
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = onnxruntime.InferenceSession(
            str(path), options, providers=["CPUExecutionProvider"]
        )
        self._lock = threading.Lock()

    def encode(self, text: str) -> np.ndarray:
        """One text's float32 vector: unpadded, so pooling is over every one of its tokens."""
        tokens = self.tokenizer.encode(text)
        feeds = {
            "input_ids": np.array([tokens.ids], dtype=np.int64),
            "attention_mask": np.array([tokens.attention_mask], dtype=np.int64),
            "token_type_ids": np.array([tokens.type_ids], dtype=np.int64),
        }
        with self._lock:  # one session: calls queue rather than oversubscribe the threads
            hidden = self.session.run(None, feeds)[0][0]
        vector = hidden[0] if self.pooling == "cls" else hidden.mean(axis=0)
        if self.normalize:
            vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
        return np.asarray(vector, dtype=np.float32)


def direct_tokenizer(model: SentenceTransformer, max_length: int | None) -> Tokenizer:
    """A copy of the model's fast tokenizer, called directly, without padding and truncated
    at ``max_length`` tokens (None: never). Truncated, it gives the same ids, attention mask
    and type ids as the transformers wrapper called with ``truncation=True,
    max_length=max_length`` (all 2,180 chunks of 1,000 SciFact documents, and texts past the
    limit), in 0.17 ms a text instead of 0.32: about 3 % of a passage's encoding and 4 % of
    a query's."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(model.tokenizer.backend_tokenizer.to_str())
    tokenizer.no_padding()
    if max_length is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(max_length=max_length)
    return tokenizer


def export_dir_for(model_path: str, export_root: Path) -> Path:
    """One export per model (and torch version, which writes the graph)."""
    import torch

    key = hashlib.sha256(f"{os.path.abspath(model_path)}|{torch.__version__}".encode()).hexdigest()
    return export_root / key[:16]


def made_once(path: Path, make: Callable[[], None]) -> None:
    """``make()`` writes ``path`` unless it exists, under an exclusive lock on its directory,
    so that processes starting together (a worker's pool, three test runs) wait for one
    writer. Not only to save the work: ONNX Runtime's quantizer writes a fixed
    ``model-inferred.onnx`` beside its input and deletes it, so two at once made one of them
    fail, and that process silently kept fp32 torch for its life (other vectors than its
    peers', cached under another key)."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if not path.exists():
            make()


def _export(model: SentenceTransformer, path: Path) -> None:
    """Export the transformer body (token embeddings out; pooling stays in numpy). Written to
    a temporary name and renamed, so processes starting together never read half a file."""
    import torch

    class Body(torch.nn.Module):
        def __init__(self, body: Any) -> None:
            super().__init__()
            self.body = body

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.body(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    sample = model.tokenizer(["an example query"], return_tensors="pt")
    inputs = tuple(
        sample[name] if name in sample else torch.zeros_like(sample["input_ids"])
        for name in INPUT_NAMES
    )
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    log.info("exporting the embedding model to ONNX: %s", path)
    with torch.no_grad():
        torch.onnx.export(
            Body(model[0].auto_model).eval(),
            inputs,
            str(temporary),
            input_names=list(INPUT_NAMES),
            output_names=["token_embeddings"],
            dynamic_axes={
                name: {0: "batch", 1: "sequence"} for name in (*INPUT_NAMES, "token_embeddings")
            },
            opset_version=17,
            dynamo=False,
        )
    os.replace(temporary, path)


def _quantize(path: Path, quantized: Path) -> None:
    """int8 weights for the matrix multiplications (dynamic quantization), one scale per
    output channel (one per matrix left some passages' vectors at a cosine of 0.90 to
    fp32's; per channel, 0.99 at worst on 200 SciFact abstracts), written beside the fp32
    export the same way (a temporary name, then renamed)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    temporary = quantized.with_suffix(f".{os.getpid()}.tmp")
    log.info("quantizing the ONNX export to int8: %s", quantized)
    quantize_dynamic(
        str(path),
        str(temporary),
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
        per_channel=True,
    )
    os.replace(temporary, quantized)
