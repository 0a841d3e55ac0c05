"""An inference server for a vision-language model (transformers' LLaVA) that reuses prefix KV from SafeCache.

``python -m examples.vlm_server`` starts ``mmlake cache serve`` (or uses ``--cache-url`` and
``--token``), serves ``POST /v1/generate`` on loopback, sends it a few requests (an image, the same
image again, a JPEG re-encoding of it, another image) and prints each answer's time to first token.

The model is ``LlavaForConditionalGeneration`` built from a small config (a CLIP vision tower, a Llama
language model) with **seeded weights**: the architecture and the engine are transformers' own, the
weights are not trained, so the generated text is noise; the timings and the reuse are what it shows.
The cache key is the image's embedding by mmlake's default image operator (the trained EfficientNet-Lite0),
so another image misses and a near-duplicate may hit.

A request's prefix is ``<bos> <image> x N`` and the system prompt; its KV is looked up by the image's
embedding among entries of this model with the same prefix token ids (:mod:`mmlake.cache.hf`). On a
miss the prefix is computed, the first token answered, and only then the KV stored.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import torch

from mmlake.cache.hf import compute_prefix, greedy, reuse_prefix, store_prefix, to_tensors
from mmlake.preprocessing.graphs import CLIP_MEAN, CLIP_STD

SYSTEM_PROMPT = "You are a careful assistant. Describe what the image shows."
#: Token ids: 0 padding, 1 beginning of text, 2 the image placeholder, 3.. the UTF-8 bytes.
PAD, BOS, IMAGE = 0, 1, 2
VOCAB = 320
#: Image side for the vision tower (patch 14): 224 -> 256 image tokens, 336 -> 576.
SIDES = {256: 224, 576: 336}
MAX_BODY = 32 << 20
#: Longest a request may take to arrive (a client that declares more bytes than it sends is cut off).
BODY_TIMEOUT_S = 10.0


def encode_text(text: str) -> list[int]:
    return [b + 3 for b in text.encode()]


def decode_text(ids: list[int]) -> str:
    return bytes(i - 3 for i in ids if 3 <= i < 259).decode("utf-8", errors="replace")


def build_model(image_tokens: int = 256, seed: int = 0, *, text_layers: int = 8, width: int = 512) -> Any:
    """LLaVA with a CLIP vision tower and a Llama language model, seeded (untrained) weights."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    if image_tokens not in SIDES:
        raise ValueError(f"image_tokens must be one of {sorted(SIDES)}")
    vision = CLIPVisionConfig(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        image_size=SIDES[image_tokens],
        patch_size=14,
    )
    text = LlamaConfig(
        hidden_size=width,
        intermediate_size=width * 3,
        num_hidden_layers=text_layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=2048,
        bos_token_id=BOS,
        pad_token_id=PAD,
        eos_token_id=None,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=IMAGE,
        image_seq_length=image_tokens,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    model.name_or_path = f"llava-tiny-{image_tokens}-seed{seed}"
    return model


def model_id(model: Any) -> str:
    """What the cache keys KV of this model under: its name and a digest of its weights' first bytes."""
    import hashlib

    digest = hashlib.sha256()
    for _, tensor in sorted(model.state_dict().items())[:8]:
        digest.update(tensor.detach().cpu().numpy().tobytes()[:4096])
    return f"{model.name_or_path}-{digest.hexdigest()[:12]}"


def pixel_values(image_bytes: bytes, side: int) -> torch.Tensor:
    """The vision tower's input: RGB, resized to side x side, CLIP-normalised, [1, 3, side, side]."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(image_bytes)) as img:
        rgb = np.asarray(img.convert("RGB").resize((side, side), Image.BICUBIC), dtype=np.float32) / 255
    mean, std = np.asarray(CLIP_MEAN, np.float32), np.asarray(CLIP_STD, np.float32)
    return torch.from_numpy(((rgb - mean) / std).transpose(2, 0, 1).copy()).unsqueeze(0)


class ImageEmbedder:
    """Cache keys: the image embedding by mmlake's default image operator (ONNX Runtime)."""

    def __init__(self) -> None:
        from mmlake.preprocessing.operators import load
        from mmlake.preprocessing.registry import load_registry
        from mmlake.preprocessing.runtime import resolve
        from mmlake.preprocessing.settings import PreprocessSettings

        settings = PreprocessSettings()
        registry = load_registry(settings)
        spec = registry.default_operators()["image"]
        options = resolve(settings.provider, settings.threads, settings.graph_optimization)
        # No spinning: between two lookups the cores belong to the language model.
        self.operator = load(spec, registry, dataclasses.replace(options, spin=False))
        self.name, self.trained = spec.ref, spec.trained

    def __call__(self, image_bytes: bytes) -> np.ndarray:
        encoded = self.operator.encode([image_bytes], batch_size=1)
        if encoded.errors[0] is not None:
            raise ValueError(encoded.errors[0][1])
        return encoded.embeddings[0]


@dataclass
class Answer:
    tokens: list[int]
    hit: bool
    similarity: float | None
    reason: str
    ttft_s: float
    total_s: float
    first_logits: torch.Tensor

    def as_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "text": decode_text(self.tokens),
            "cache_hit": self.hit,
            "similarity": self.similarity,
            "reason": self.reason,
            "ttft_ms": round(self.ttft_s * 1000, 2),
            "total_ms": round(self.total_s * 1000, 2),
        }


class VisionLanguageServer:
    """Answers an image and a prompt, the prefix KV reused from ``store`` (a SafeCache or a client)."""

    def __init__(
        self,
        model: Any,
        store: Any,
        embedder: Any,
        *,
        tenant: str | None = None,
        system_prompt: str = SYSTEM_PROMPT,
        use_cache: bool = True,
    ) -> None:
        self.model, self.store, self.embed, self.tenant = model, store, embedder, tenant
        self.model_id = model_id(model)
        self.image_tokens = int(model.config.image_seq_length)
        self.side = int(model.config.vision_config.image_size)
        self.prefix_ids = torch.tensor([[BOS] + [IMAGE] * self.image_tokens + encode_text(system_prompt)])
        self.use_cache = use_cache
        self._lock = threading.Lock()  # one request at a time on the model

    def prompt_ids(self, prompt: str) -> torch.Tensor:
        return torch.tensor([encode_text(f"\nUSER: {prompt}\nASSISTANT:")])

    def answer(self, image_bytes: bytes, prompt: str, max_new_tokens: int = 8) -> Answer:
        prompt_ids = self.prompt_ids(prompt)
        room = int(self.model.config.text_config.max_position_embeddings) - self.prefix_ids.shape[1] - max_new_tokens
        if prompt_ids.shape[1] > room:
            raise ValueError(
                f"the prompt is {prompt_ids.shape[1]} tokens; at most {room} fit after the image prefix "
                f"and {max_new_tokens} new tokens"
            )
        with self._lock:
            started = time.perf_counter()
            embedding = self.embed(image_bytes)
            inputs = {"input_ids": self.prefix_ids, "pixel_values": pixel_values(image_bytes, self.side)}
            if self.use_cache:
                reused = reuse_prefix(
                    self.model,
                    inputs,
                    embedding,
                    self.store,
                    model_id=self.model_id,
                    tenant=self.tenant,
                    store_on_miss=False,
                )
                cache, hit, similarity, reason = reused.cache, reused.hit, reused.similarity, reused.reason
            else:
                cache, hit, similarity, reason = compute_prefix(self.model, inputs), False, None, "no cache"
            prefix_kv = None if hit or not self.use_cache else to_tensors(cache)  # before the cache grows
            first_at: list[float] = []
            tokens, first = greedy(
                self.model, cache, prompt_ids, max_new_tokens, on_first=lambda: first_at.append(time.perf_counter())
            )
            ttft = first_at[0] - started
            if prefix_kv is not None:  # a miss: the KV is stored after the answer, off the first token's path
                store_prefix(
                    self.store, prefix_kv, self.prefix_ids, embedding, model_id=self.model_id, tenant=self.tenant
                )
            return Answer(tokens, hit, similarity, reason, ttft, time.perf_counter() - started, first)


def make_handler(server: VisionLanguageServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = BODY_TIMEOUT_S  # socket timeout of every read

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            if self.path != "/v1/generate":
                self._reply(404, {"error": f"no route {self.path}"})
                return
            try:
                size = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._reply(411, {"error": "a Content-Length is required"})
                return
            if size < 0 or size > MAX_BODY:
                self._reply(413, {"error": f"the body is over {MAX_BODY} bytes"})
                return
            try:
                request = json.loads(self.rfile.read(size))
                image = base64.b64decode(request["image"], validate=True)
                prompt = str(request.get("prompt", ""))
                max_new = int(request.get("max_new_tokens", 8))
                if not 1 <= max_new <= 64:
                    raise ValueError("max_new_tokens must be in 1..64")
                answer = server.answer(image, prompt, max_new)
            except (ValueError, KeyError, TypeError) as err:
                self._reply(400, {"error": str(err).splitlines()[0] if str(err) else type(err).__name__})
                return
            except Exception as err:  # the image did not decode, ...: the request's fault, one line
                self._reply(400, {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"})
                return
            self._reply(200, answer.as_json())

    return Handler


def serve(server: VisionLanguageServer, port: int = 0) -> ThreadingHTTPServer:
    """Serve ``POST /v1/generate`` on 127.0.0.1 in a background thread; the HTTP server."""
    http = ThreadingHTTPServer(("127.0.0.1", port), make_handler(server))
    threading.Thread(target=http.serve_forever, daemon=True).start()
    return http


def post(url: str, image: bytes, prompt: str, max_new_tokens: int = 8) -> dict[str, Any]:
    import httpx

    body = {"image": base64.b64encode(image).decode(), "prompt": prompt, "max_new_tokens": max_new_tokens}
    response = httpx.post(f"{url}/v1/generate", json=body, timeout=120)
    response.raise_for_status()
    return dict(response.json())


class CacheServer:
    """``mmlake cache serve`` on a free loopback port with one tenant's token, for the example."""

    def __init__(self, token: str = "vlm-token", tenant: str = "vlm") -> None:
        from mmlake.ingest.broker import free_port

        self.token, self.dir, self.port = token, tempfile.mkdtemp(prefix="mmlake-vlm-"), free_port()
        tokens = os.path.join(self.dir, "tokens.json")
        with open(tokens, "w") as handle:
            json.dump({token: tenant}, handle)
        exe = shutil.which("mmlake", path=os.path.dirname(sys.executable)) or "mmlake"
        self.process = subprocess.Popen(
            [exe, "cache", "serve", "--port", str(self.port), "--tokens", tokens],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> CacheServer:
        from mmlake.cache.client import wait_for_server

        wait_for_server(self.url, process=self.process)
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def demo_images() -> dict[str, bytes]:
    """Two generated scenes, a 5-pixel crop of the first and a JPEG re-encoding of it."""
    from mmlake.ingest.synth import augment, png_bytes, scene

    rng = np.random.default_rng(3)
    first, second = scene(rng), scene(rng)
    return {
        "image A": png_bytes(first),
        "image A, cropped": png_bytes(augment(first, 1, rng)),
        "image A, JPEG q75": png_bytes(augment(first, 0, rng)),
        "image B": png_bytes(second),
    }


def run_requests(
    url: str, prompt: str = "What is in the picture?", max_new_tokens: int = 8
) -> list[tuple[str, dict[str, Any]]]:
    images = demo_images()
    plan = [
        ("image A", "image A"),
        ("image A again", "image A"),
        ("image A, cropped", "image A, cropped"),
        ("image A, JPEG q75", "image A, JPEG q75"),
        ("image B", "image B"),
        ("image B again", "image B"),
    ]
    return [(label, post(url, images[key], prompt, max_new_tokens)) for label, key in plan]


def main(argv: list[str] | None = None) -> int:
    from mmlake.cache.client import SafeCacheClient

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-url", help="a running `mmlake cache serve` (default: start one)")
    parser.add_argument("--token", help="the tenant's bearer token for --cache-url")
    parser.add_argument("--image-tokens", type=int, choices=sorted(SIDES), default=576)
    parser.add_argument("--port", type=int, default=0, help="port of /v1/generate (default: a free one)")
    parser.add_argument("--serve", action="store_true", help="keep serving after the example requests")
    args = parser.parse_args(argv)
    if args.cache_url and not args.token:
        parser.error("--cache-url needs --token")

    local = None if args.cache_url else CacheServer().__enter__()
    try:
        url, token = (args.cache_url, args.token) if local is None else (local.url, local.token)
        with SafeCacheClient(url, token) as client:
            embedder = ImageEmbedder()
            model = build_model(args.image_tokens)
            server = VisionLanguageServer(model, client, embedder)
            http = serve(server, args.port)
            endpoint = f"http://127.0.0.1:{http.server_address[1]}"
            print(
                f"{model.name_or_path}: transformers LlavaForConditionalGeneration, SEEDED weights (untrained: "
                "the text is noise; the architecture, the engine and the timings are real)"
            )
            print(
                f"cache keys: {embedder.name} embeddings ({'trained' if embedder.trained else 'UNTRAINED'}); "
                f"KV from {url}; serving {endpoint}/v1/generate; prefix {server.prefix_ids.shape[1]} tokens "
                f"({server.image_tokens} image tokens)"
            )
            server.use_cache = False  # a warm-up request: first-call costs out of the figures, nothing stored
            post(endpoint, demo_images()["image B"], "warm-up", 1)
            server.use_cache = True
            for label, reply in run_requests(endpoint):
                state = (
                    f"hit at similarity {reply['similarity']:.4f}"
                    if reply["cache_hit"]
                    else f"miss ({reply['reason']})"
                )
                print(f"  {label:20} time to first token {reply['ttft_ms']:8.1f} ms  {state}")
            if args.serve:
                print("serving; Ctrl-C stops")
                threading.Event().wait()
            http.shutdown()
    except KeyboardInterrupt:
        pass
    finally:
        if local is not None:
            local.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
