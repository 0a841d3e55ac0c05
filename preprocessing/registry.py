"""The operator registry: which ONNX models exist, their pinned bytes, and the operators built from them.

Two levels, both in ``preprocessing/operators.json``:

* **models** (``name@version``): one ONNX file each, with its opset, builder parameters and the SHA-256
  of its bytes. Small graphs are committed under ``preprocessing/models/``; the CLIP towers (90-160 MB)
  are generated on first use into a cache folder and checked against the recorded hash before use.
* **operators** (``name@version``): what a features row names. One per modality, a chain of models
  plus the pinned parameters of the Python steps around them (decoding, resampling, tokenisation).
  An operator's SHA-256 is a digest over its name, version, modality, parameters and every model's
  hash, so it changes when any byte that shapes its output changes.

Every model's bytes are hashed each time a session is made from them, from the very bytes handed to
ONNX Runtime: a tampered or stale file is refused, naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmlake.preprocessing.errors import OperatorIntegrityError, OperatorNotFoundError
from mmlake.preprocessing.hashing import file_sha256

if TYPE_CHECKING:
    from mmlake.preprocessing.settings import PreprocessSettings

# Resolved: under an editable install this file is a link, and the manifest and models it names are
# the repository's, not the link tree's.
PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_MANIFEST = PACKAGE_DIR / "operators.json"
#: Hashes recorded for generated models the repository cannot know (a user's checkpoint): trust on
#: first export, checked on every later use.
LOCAL_RECORD = "recorded-models.json"
#: Builders of encoder networks (exported from torch); the others build small preprocessing graphs.
ENCODER_BUILDERS = frozenset({"clip", "efficientnet_lite0"})


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split_ref(ref: str) -> tuple[str, str]:
    name, sep, version = ref.partition("@")
    if not sep or not name or not version:
        raise OperatorNotFoundError(f"expected NAME@VERSION, got {ref!r}")
    return name, version


class _Ref:
    """NAME@VERSION accessors for a spec's ``ref``."""

    ref: str

    @property
    def name(self) -> str:
        return split_ref(self.ref)[0]

    @property
    def version(self) -> str:
        return split_ref(self.ref)[1]


@dataclass(frozen=True)
class ModelSpec(_Ref):
    """One ONNX model of the registry."""

    ref: str
    builder: str
    opset: int
    params: dict[str, Any]
    sha256: str | None  # None only for local models not exported yet
    file: str | None = None  # committed file, relative to the manifest
    generated: bool = False  # generated into the cache folder on first use
    weights: str | None = None  # local checkpoint path (generated CLIP towers only)

    @property
    def encoder(self) -> bool:
        """An encoder network (the part that may run on a GPU), not a preprocessing graph."""
        return self.builder in ENCODER_BUILDERS


@dataclass(frozen=True)
class OperatorSpec(_Ref):
    """One operator: a modality's chain of models and the pinned parameters of its Python steps."""

    ref: str
    modality: str
    models: tuple[ModelSpec, ...]
    params: dict[str, Any] = field(default_factory=dict)
    trained: bool = False

    @property
    def sha256(self) -> str:
        """Digest of everything that shapes this operator's output (see the module docstring)."""
        doc = {
            "name": self.name,
            "version": self.version,
            "modality": self.modality,
            "params": self.params,
            "models": [[m.ref, m.sha256] for m in self.models],
            "trained": self.trained,
        }
        return sha256_hex(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


class Registry:
    """The models and operators of one manifest, and where generated models are cached."""

    def __init__(self, manifest: dict[str, Any], root: Path, cache_dir: Path) -> None:
        self.manifest = manifest
        self.root = root
        self.cache_dir = cache_dir
        self.toolchain: dict[str, str] = dict(manifest.get("toolchain", {}))
        self.models: dict[str, ModelSpec] = {
            ref: ModelSpec(
                ref=ref,
                builder=m["builder"],
                opset=int(m["opset"]),
                params=dict(m.get("params", {})),
                sha256=m.get("sha256"),
                file=m.get("file"),
                generated=bool(m.get("generated")),
                weights=m.get("weights"),
            )
            for ref, m in manifest["models"].items()
        }
        self.operators: dict[str, OperatorSpec] = {}
        for ref, op in manifest["operators"].items():
            missing = [m for m in op["models"] if m not in self.models]
            if missing:
                raise OperatorNotFoundError(f"operator {ref} names unknown models {missing}")
            self.operators[ref] = OperatorSpec(
                ref=ref,
                modality=op["modality"],
                models=tuple(self.models[m] for m in op["models"]),
                params=dict(op.get("params", {})),
                trained=bool(op.get("trained", False)),
            )
        self.defaults: dict[str, str] = dict(manifest.get("defaults", {}))
        for modality, ref in self.defaults.items():
            if ref not in self.operators or self.operators[ref].modality != modality:
                raise OperatorNotFoundError(
                    f"default {modality} operator {ref} is not a registered {modality} operator"
                )

    @classmethod
    def load(cls, manifest: str | Path | None = None, cache_dir: str | Path | None = None) -> Registry:
        """The registry of ``manifest`` (default: the one shipped in this package)."""
        path = Path(manifest) if manifest else DEFAULT_MANIFEST
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise OperatorNotFoundError(f"cannot read the operator manifest {path}: {err}") from None
        cache = Path(os.path.expanduser(str(cache_dir))) if cache_dir else default_cache_dir()
        return cls(doc, path.parent, cache)

    # -- lookup -----------------------------------------------------------------------------------

    def operator(self, ref: str) -> OperatorSpec:
        if ref not in self.operators:
            name = split_ref(ref)[0]
            known = sorted(r for r in self.operators if r.startswith(name + "@")) or sorted(self.operators)
            raise OperatorNotFoundError(f"no operator {ref}; registered: {', '.join(known)}")
        return self.operators[ref]

    def default_operators(self) -> dict[str, OperatorSpec]:
        """modality -> the operator that preprocesses it by default."""
        return {modality: self.operators[ref] for modality, ref in sorted(self.defaults.items())}

    def model_path(self, spec: ModelSpec) -> Path:
        if spec.generated:
            return self.cache_dir / f"{spec.name}-{spec.version}.onnx"
        if not spec.file:
            raise OperatorNotFoundError(f"model {spec.ref} has neither a file nor a generator")
        return self.root / spec.file

    # -- bytes ------------------------------------------------------------------------------------

    def build(self, spec: ModelSpec) -> bytes:
        """Regenerate a model's bytes from its builder (the CLIP towers take a few seconds each)."""
        if spec.builder == "clip":
            from mmlake.preprocessing.clip import export_tower

            return export_tower({**spec.params, "opset": spec.opset}, spec.weights)
        if spec.builder == "efficientnet_lite0":
            from mmlake.preprocessing.efficientnet import export

            return export({**spec.params, "opset": spec.opset})
        from mmlake.preprocessing.graphs import BUILDERS

        if spec.builder not in BUILDERS:
            raise OperatorNotFoundError(f"model {spec.ref}: unknown builder {spec.builder!r}")
        return BUILDERS[spec.builder]({**spec.params, "version": spec.version})

    def expected_sha256(self, spec: ModelSpec) -> str | None:
        if spec.sha256:
            return spec.sha256
        return self._local_record().get(spec.ref)

    def regenerate(self, spec: ModelSpec) -> bytes:
        """Build a generated model's bytes and put them in the cache folder (replacing any cached copy).
        The bytes must reproduce the recorded SHA-256; a model with none recorded yet (a local
        checkpoint) has its hash recorded now, and checked on every later use."""
        data = self.build(spec)
        actual = sha256_hex(data)
        expected = self.expected_sha256(spec)
        if expected is None:
            self._record_local(spec.ref, actual)  # a local checkpoint: first export pins its hash
        elif actual != expected:
            raise OperatorIntegrityError(
                f"regenerating {spec.ref} gave SHA-256 {actual[:16]}..., the manifest records "
                f"{expected[:16]}...: the toolchain differs from the pinned one ({self._toolchain_text()})"
            )
        _atomic_write(self.model_path(spec), data)
        return data

    def model_bytes(self, spec: ModelSpec) -> bytes:
        """The model's bytes, verified against its recorded SHA-256. A generated model that is not in
        the cache yet is built first (and refused if the build does not reproduce the recorded hash)."""
        path = self.model_path(spec)
        if spec.generated and not path.exists():
            return self.regenerate(spec)
        expected = self.expected_sha256(spec)
        try:
            data = path.read_bytes()
        except OSError as err:
            raise OperatorNotFoundError(f"operator file {path} of {spec.ref} cannot be read: {err}") from None
        actual = sha256_hex(data)
        if expected is None:
            raise OperatorIntegrityError(
                f"operator file {path} ({spec.ref}) has no recorded SHA-256: refusing to run it"
            )
        if actual != expected:
            raise OperatorIntegrityError(
                f"operator file {path} ({spec.ref}) has SHA-256 {actual[:16]}..., the registry records "
                f"{expected[:16]}...: refusing to run it"
            )
        return data

    def _toolchain_text(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.toolchain.items())) or "unrecorded"

    def _local_record(self) -> dict[str, str]:
        try:
            return dict(json.loads((self.cache_dir / LOCAL_RECORD).read_text()))
        except (OSError, ValueError):
            return {}

    def _record_local(self, ref: str, sha: str) -> None:
        record = self._local_record()
        record[ref] = sha
        _atomic_write(self.cache_dir / LOCAL_RECORD, json.dumps(record, indent=1, sort_keys=True).encode())

    # -- local CLIP encoders -----------------------------------------------------------------------

    def with_clip(self, arch: str, weights: str | None, seed: int = 0) -> Registry:
        """A registry whose default image and text operators use ``arch`` with the checkpoint at
        ``weights`` (or a seeded initialisation when None), built on the registered CLIP operators
        (``image_clip``, ``text_clip``: their latest versions). Versions get a ``+<tag>`` suffix naming
        the checkpoint's hash (or the seed); hashes of these models are pinned on their first export."""
        import open_clip

        if open_clip.get_model_config(arch) is None:
            raise OperatorNotFoundError(f"unknown open_clip architecture {arch!r}")
        if weights:
            try:
                ckpt = file_sha256(Path(weights))
            except OSError as err:
                raise OperatorNotFoundError(f"cannot read --clip-weights {weights}: {err}") from None
            tag = f"{arch.lower()}-{ckpt[:12]}"
        else:
            tag = f"{arch.lower()}-seed{seed}"
        doc = json.loads(json.dumps(self.manifest))
        for modality in ("image", "text"):
            base = self._clip_operator(modality)
            models = []
            for m in base.models:
                if m.builder != "clip":
                    models.append(m.ref)
                    continue
                ref = f"{m.name}@{tag}"
                if ref not in doc["models"]:
                    params = {**m.params, "arch": arch, "seed": seed}
                    entry: dict[str, Any] = {"builder": "clip", "opset": m.opset, "generated": True, "params": params}
                    if weights:
                        entry.update(weights=str(Path(weights).resolve()), params={**params, "weights_sha256": ckpt})
                    doc["models"][ref] = entry
                models.append(ref)
            op_ref = f"{base.name}@{base.version}+{tag}"
            doc["operators"][op_ref] = {
                "modality": modality,
                "models": models,
                "trained": bool(weights),
                "params": {**base.params, "arch": arch},
            }
            doc["defaults"][modality] = op_ref
        return Registry(doc, self.root, self.cache_dir)

    def _clip_operator(self, modality: str) -> OperatorSpec:
        """The modality's default operator if it is a CLIP one, else the latest registered CLIP operator."""
        default = self.operators[self.defaults[modality]]
        if any(m.builder == "clip" for m in default.models):
            return default
        clip = [
            s
            for s in self.operators.values()
            if s.modality == modality and "+" not in s.version and any(m.builder == "clip" for m in s.models)
        ]
        if not clip:
            raise OperatorNotFoundError(f"no CLIP {modality} operator is registered")
        return max(clip, key=lambda s: (s.name, _version_key(s.version)))


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (-1, version)


def load_registry(settings: PreprocessSettings) -> Registry:
    """The registry the settings describe: the manifest, the cache folder, and a CLIP checkpoint or
    architecture other than the default where one is configured."""
    registry = Registry.load(settings.manifest, settings.cache_dir)
    if settings.clip_weights or settings.clip_model != "ViT-S-32":
        registry = registry.with_clip(settings.clip_model, settings.clip_weights)
    return registry


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mmlake" / "operators"


def _atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file and a rename, so a reader never sees half a model."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def package_resource(name: str) -> Path:
    """A file shipped with a package, e.g. open_clip's BPE vocabulary."""
    package, _, file = name.partition("/")
    return Path(str(resources.files(package).joinpath(file)))
