"""The operators that turn raw payloads into embeddings, one per modality.

Python does what ONNX cannot: decode bytes (Pillow, the ``wave`` module, UTF-8), resample audio,
normalise and tokenise text. The rest runs in ONNX Runtime. A payload that cannot be turned into an
input gets a per-row error (a code and a one-line message) and the batch goes on.
"""

from __future__ import annotations

import io
import unicodedata
import wave
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmlake.preprocessing.registry import OperatorSpec, Registry, package_resource, sha256_hex
from mmlake.preprocessing.runtime import RuntimeOptions, session

#: Per-row error codes (the features table's ``error_code``).
IMAGE_UNDECODABLE = "image_undecodable"
IMAGE_TOO_LARGE = "image_too_large"
AUDIO_UNDECODABLE = "audio_undecodable"
AUDIO_UNSUPPORTED = "audio_unsupported_encoding"
AUDIO_EMPTY = "audio_empty"
AUDIO_TOO_LONG = "audio_too_long"
TEXT_NOT_UTF8 = "text_not_utf8"
TEXT_EMPTY = "text_empty"
NON_FINITE = "non_finite_output"


class RowError(Exception):
    """A payload this operator cannot take; the row records ``code`` and the message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Encoded:
    """Output of an operator over a batch: float32 [n, dim] (rows with an error are zeros) and, per
    row, None or (error code, message)."""

    embeddings: np.ndarray
    errors: list[tuple[str, str] | None]


class Operator:
    """Base class: owns the ONNX sessions of one operator's models."""

    def __init__(self, spec: OperatorSpec, registry: Registry, options: RuntimeOptions) -> None:
        self.spec = spec
        self.options = options
        blobs = [registry.model_bytes(m) for m in spec.models]  # each checked against its recorded hash
        self.model_shas = [sha256_hex(b) for b in blobs]
        self.sessions = [session(b, options, cpu_only=not m.encoder) for b, m in zip(blobs, spec.models)]
        self.providers = [s.get_providers()[0] for s in self.sessions]

    @property
    def execution_provider(self) -> str:
        return self.providers[-1]  # the encoder's; preprocessing graphs run on CPU (see runtime.py)

    def prepare(self, payload: bytes) -> Any:
        raise NotImplementedError

    def encode_prepared(self, items: list[Any]) -> np.ndarray:
        raise NotImplementedError

    def encode(self, payloads: list[bytes], batch_size: int = 32) -> Encoded:
        """Embeddings of ``payloads``. Batches are pipelined: while the encoder runs on one batch (ONNX
        Runtime releases the GIL), the next is decoded and prepared. The result does not depend on it."""
        from concurrent.futures import Future, ThreadPoolExecutor

        errors: list[tuple[str, str] | None] = [None] * len(payloads)
        out = np.zeros((len(payloads), self.dim), dtype=np.float32)
        good: list[int] = []
        pending: list[tuple[list[int], Future[np.ndarray]]] = []
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmlake-encoder") as encoder:
            items: list[Any] = []
            rows: list[int] = []
            for i, payload in enumerate(payloads):
                try:
                    items.append(self.prepare(payload))
                    rows.append(i)
                except RowError as err:
                    errors[i] = (err.code, str(err))
                if len(items) == batch_size or (i == len(payloads) - 1 and items):
                    pending.append((rows, encoder.submit(self.encode_prepared, items)))
                    good.extend(rows)
                    items, rows = [], []
            for rows, future in pending:
                out[rows] = future.result()
        for i in good:
            if not np.all(np.isfinite(out[i])):
                errors[i] = (NON_FINITE, "the operator produced NaN or infinite values")
                out[i] = 0
        return Encoded(out, errors)

    @property
    def dim(self) -> int:
        shape = self.sessions[-1].get_outputs()[0].shape
        return int(shape[-1])


class ImageOperator(Operator):
    """Pillow decode to uint8 RGB, the ONNX resize/crop/normalise graph, then the image tower."""

    def prepare(self, payload: bytes) -> np.ndarray:
        from PIL import Image

        limit = int(self.spec.params.get("max_pixels", 50_000_000))
        try:
            with Image.open(io.BytesIO(payload)) as img:
                if img.width * img.height > limit:
                    raise RowError(
                        IMAGE_TOO_LARGE,
                        f"image of {img.width}x{img.height} pixels is over the operator's limit of {limit}",
                    )
                pixels = np.asarray(img.convert("RGB"), dtype=np.uint8)
        except RowError:
            raise
        except Exception as err:  # Pillow raises many types for broken files
            raise RowError(IMAGE_UNDECODABLE, f"Pillow cannot decode the image: {err}") from None
        out = self.sessions[0].run(None, {"image": pixels})[0]
        return out[0]

    def encode_prepared(self, items: list[np.ndarray]) -> np.ndarray:
        return self.sessions[-1].run(None, {"pixels": np.stack(items)})[0]


class TextOperator(Operator):
    """Unicode normalisation and CLIP's BPE tokeniser (vocabulary pinned by hash), then the text tower
    over tokens cut to the longest caption of the batch."""

    def __init__(self, spec: OperatorSpec, registry: Registry, options: RuntimeOptions) -> None:
        super().__init__(spec, registry, options)
        from open_clip.tokenizer import SimpleTokenizer

        from mmlake.preprocessing.errors import OperatorIntegrityError

        vocab = package_resource(str(spec.params["vocab"]))
        digest = sha256_hex(vocab.read_bytes())
        if digest != spec.params["vocab_sha256"]:
            raise OperatorIntegrityError(
                f"tokeniser vocabulary {vocab} has SHA-256 {digest[:16]}..., operator {spec.ref} pins "
                f"{str(spec.params['vocab_sha256'])[:16]}...: refusing to run it"
            )
        self.context = int(spec.params.get("context_length", 77))
        self.form: Any = str(spec.params.get("normalization", "NFC"))  # NFC, NFD, NFKC or NFKD
        self.tokenizer = SimpleTokenizer(bpe_path=str(vocab), context_length=self.context)
        self.sot = self.tokenizer.encoder["<start_of_text>"]
        self.eot = self.tokenizer.encoder["<end_of_text>"]

    def tokens(self, text: str) -> list[int]:
        ids = [self.sot, *self.tokenizer.encode(unicodedata.normalize(self.form, text)), self.eot]
        if len(ids) > self.context:
            ids = ids[: self.context]
            ids[-1] = self.eot
        return ids

    def prepare(self, payload: bytes) -> list[int]:
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError as err:
            raise RowError(TEXT_NOT_UTF8, f"text is not UTF-8: {err}") from None
        if not unicodedata.normalize(self.form, text).strip():
            raise RowError(TEXT_EMPTY, "text is empty (or only whitespace)")
        return self.tokens(text)

    def encode_prepared(self, items: list[list[int]]) -> np.ndarray:
        width = max(len(t) for t in items)
        tokens = np.zeros((len(items), width), dtype=np.int64)
        for row, ids in enumerate(items):
            tokens[row, : len(ids)] = ids
        return self.sessions[-1].run(None, {"tokens": tokens})[0]


class AudioOperator(Operator):
    """WAV decode (PCM 8/16/24/32-bit, any channel count, mixed to mono), band-limited resampling to the
    pinned rate, the ONNX log-mel graph, then the pinned audio embedding."""

    def prepare(self, payload: bytes) -> np.ndarray:
        rate = int(self.spec.params["sample_rate"])
        longest = float(self.spec.params.get("max_seconds", 600))
        samples, source_rate = decode_wav(payload)
        if samples.size == 0:
            raise RowError(AUDIO_EMPTY, "the WAV holds no samples")
        if samples.size / source_rate > longest:
            raise RowError(
                AUDIO_TOO_LONG,
                f"audio of {samples.size / source_rate:.1f} s is over the operator's limit of {longest:g} s",
            )
        signal = resample(samples, source_rate, rate)
        n_fft = int(self.spec.params["n_fft"])
        if signal.size < n_fft:
            signal = np.pad(signal, (0, n_fft - signal.size))
        logmel = self.sessions[0].run(None, {"waveform": signal[None, :]})[0]
        return self.sessions[1].run(None, {"logmel": logmel})[0][0]

    def encode_prepared(self, items: list[np.ndarray]) -> np.ndarray:
        return np.stack(items)


def decode_wav(payload: bytes) -> tuple[np.ndarray, int]:
    """float32 mono samples in -1..1 and the sample rate. Raises RowError for what it cannot read."""
    try:
        with wave.open(io.BytesIO(payload)) as wav:
            width, channels, rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    except wave.Error as err:
        text = str(err)
        if "unknown format" in text:
            raise RowError(AUDIO_UNSUPPORTED, f"unsupported WAV encoding ({text}); PCM integer only") from None
        raise RowError(AUDIO_UNDECODABLE, f"not a readable WAV file: {text}") from None
    except (EOFError, OSError, ValueError) as err:
        raise RowError(AUDIO_UNDECODABLE, f"not a readable WAV file: {err}") from None
    if rate <= 0 or channels <= 0:
        raise RowError(AUDIO_UNDECODABLE, f"WAV header has rate {rate} and {channels} channels")
    usable = len(frames) - len(frames) % (width * channels)
    raw = np.frombuffer(frames[:usable], dtype=np.uint8)
    if width == 1:
        data = (raw.astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        data = raw.view("<i2").astype(np.float32) / 32768.0
    elif width == 3:
        triples = raw.reshape(-1, 3).astype(np.int32)
        ints = triples[:, 0] | (triples[:, 1] << 8) | (triples[:, 2] << 16)
        data = (np.where(ints >= 1 << 23, ints - (1 << 24), ints)).astype(np.float32) / float(1 << 23)
    elif width == 4:
        data = raw.view("<i4").astype(np.float32) / float(1 << 31)
    else:
        raise RowError(AUDIO_UNSUPPORTED, f"unsupported WAV sample width of {width} bytes")
    return data.reshape(-1, channels).mean(axis=1, dtype=np.float32), rate


def resample(samples: np.ndarray, source_rate: int, target_rate: int) -> np.ndarray:
    """Band-limited resampling through the real FFT (spectrum cut or zero-padded), float32 out.
    Deterministic: numpy's pocketfft, no threads."""
    if source_rate == target_rate:
        return samples.astype(np.float32, copy=False)
    n_out = max(1, int(round(samples.size * target_rate / source_rate)))
    spectrum = np.fft.rfft(samples.astype(np.float64))
    bins = n_out // 2 + 1
    if bins <= spectrum.size:
        spectrum = spectrum[:bins]
    else:
        spectrum = np.concatenate([spectrum, np.zeros(bins - spectrum.size, dtype=spectrum.dtype)])
    return (np.fft.irfft(spectrum, n=n_out) * (n_out / samples.size)).astype(np.float32)


KINDS: dict[str, type[Operator]] = {"image": ImageOperator, "text": TextOperator, "audio": AudioOperator}


def load(spec: OperatorSpec, registry: Registry, options: RuntimeOptions) -> Operator:
    """The operator of ``spec`` with its sessions open (model bytes verified)."""
    return KINDS[spec.modality](spec, registry, options)
