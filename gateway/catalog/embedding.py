"""The tool search's semantic signal: a small static embedding model and the vectors of the indexed tools.

The model is WordLlama's `l2_supercat_256`: one 256-wide vector per token of the Llama 2 tokenizer (32,000 rows,
16 MiB in float16), shipped inside the `wordllama` wheel with its tokenizer, so nothing is downloaded: the
`semantic` extra installs it (`pip install 'manifold-gateway[semantic]'`). A text's vector is the mean of its
tokens' vectors, scaled to unit length. The weights are read with numpy from the safetensors file (mapped,
not copied) and the tokenizer with `tokenizers`; WordLlama's own loader is not used, as it looks for the
tokenizer under a folder name the wheel does not have.
"""

from __future__ import annotations

import importlib.util
import json
import struct
from functools import lru_cache
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from tokenizers import Tokenizer

WEIGHTS = Path("weights") / "l2_supercat_256.safetensors"
TOKENIZER = Path("tokenizers") / "l2_supercat_tokenizer_config.json"
TENSOR = "embedding.weight"
MAX_TOKENS = 512  # tokens of a text averaged (tool texts are cut well before this)

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


class StaticEmbedding:
    """Text to unit vector: the mean of the token vectors of a static embedding table."""

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


def package_folder(package: str = "wordllama") -> Path | None:
    """Where an installed package's files are, without importing it; None when it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@lru_cache(maxsize=1)
def bundled() -> StaticEmbedding | None:
    """The model shipped in the `wordllama` wheel, loaded once per process; None when it is not installed.

    `ModelMissing` when the package is there but its weights or tokenizer are not."""
    folder = package_folder()
    if folder is None:
        return None
    return StaticEmbedding.from_files(folder / WEIGHTS, folder / TOKENIZER)


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
    "ModelMissing",
    "Similarities",
    "StaticEmbedding",
    "Vectors",
    "bundled",
    "package_folder",
    "read_safetensors",
]
