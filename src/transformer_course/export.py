"""The course's own models as ONNX files for the live views (onnxruntime-web in the page).

``export_minilm(encoder)`` (chapter 3) and ``export_translator(model, data)`` (chapter 6)
trace the library's modules, unchanged, with ``torch.onnx.export`` and write a folder the
book's Sphinx extension ``live_views`` copies into the site. Besides the usual output, every
graph returns each layer's attention weights (the softmax, as the layers keep them in
``self_attn_weights`` / ``cross_attn_weights`` with the "naive" backend) and the scores
before the softmax, q.k/sqrt(d_k), computed from the same module's projections by a forward
hook, so a heatmap cell in the page can show both.

Graphs (batch 1; sequence lengths dynamic; ids int64, everything else float32):

- MiniLM ``encoder.onnx``: ``input_ids`` (1, T) -> ``last_hidden_state`` (1, T, 384),
  ``attentions`` (L, H, T, T), ``scores`` (L, H, T, T).
- translator ``encoder.onnx``: ``src_ids`` (1, S) -> ``memory`` (1, S, D),
  ``enc_attentions`` (L, H, S, S), ``enc_scores`` (L, H, S, S).
- translator ``decoder.onnx``: ``src_ids`` (1, S) (for the padding mask), ``memory``
  (1, S, D), ``tgt_ids`` (1, T) starting with ``<bos>`` -> ``logits`` (1, T, V),
  ``self_attentions`` (L, H, T, T), ``self_scores`` (L, H, T, T) (masked entries hold
  the raw score; their weight is 0), ``cross_attentions`` (L, H, T, S), ``cross_scores``
  (L, H, T, S). Greedy decoding re-runs it on the growing prefix (no KV cache).

``vocab.json`` holds what a browser tokenizer needs:

- MiniLM: ``{"kind": "wordpiece", "vocab": [token of id 0, 1, ...], "do_lower_case",
  "strip_accents" (null: strip when lower-casing, as BERT), "tokenize_chinese_chars",
  "clean_text", "unk_token", "cls_token", "sep_token", "pad_token",
  "continuing_subword_prefix" ("##"), "max_input_chars_per_word" (100), "max_length"
  (128, [CLS] and [SEP] included), "added_tokens" ([{"content", "id"}]: special tokens
  matched verbatim in the text before normalisation), "examples": [{"text", "ids",
  "tokens"}]}``, read from the shipped ``tokenizer.json`` (the ``tokenizers`` BERT
  normaliser, pre-tokeniser and WordPiece model).
- translator: ``{"kind": "translator", "src": SRC, "tgt": TGT, "pad_id", "bos_id",
  "eos_id", "unk_id", "examples": [{"text", "ids", "tokens"}]}``. SRC encodes the reader's
  English; it is ``{"kind": "word", "tokens": [...], "replacement": "▁",
  "prepend_scheme": "always"}`` for ``HFTokenizer.train_words`` (every space becomes
  "▁", a "▁" goes in front of the text, the text is split before each "▁", then every
  punctuation character, ASCII punctuation or Unicode category P*, is its own piece; each
  piece is a token, and a piece not in ``tokens`` is an error, as ``encode`` raises) or
  ``{"kind": "char", "tokens": [...]}`` for ``CharTokenizer`` (one token a character). TGT
  only decodes: ``{"kind": "bpe"|"word"|"char", "tokens": [...], "replacement": "▁",
  "prepend_scheme": "never"|"always"}``: join the tokens of the ids above the special
  ones, replace "▁" by a space, strip a leading space (``decode`` of ``data``'s
  tokenizers).

The folder is ``<base>/<name>-<hash16>/`` where ``<hash16>`` is the first 16 hex digits of
the sha256 of the ONNX files' and vocab.json's bytes (so a cached chapter output and its
files match); ``<base>`` is ``$TRANSFORMER_COURSE_LIVE_DIR``, else ``<repository>/_build/.live``
(the repository holding this package, or the working directory for an installed
package). ``state_dict.pt`` and ``config.json`` lie beside for tests
(``load_exported_translator``, ``load_exported_minilm``); the site gets only the ``.onnx``
files and vocab.json.

The exporter is the TorchScript one (``dynamo=False``): about 1 s for the translator and a
few seconds for MiniLM, on every torch this package admits (>= 2.6). ``torch.export``
(``dynamo=True``) stops at the library's input checks, which read values (token ids
inside the vocabulary, positions inside the table); while tracing, the checks of
``_validation`` are switched off (a graph holds no Python checks; the ids the page feeds
come from its own tokenizer). Opset 17 (onnxruntime-web 1.30 runs it).

Sources: the ONNX operator set (onnx.ai, opset 17); PyTorch's ``torch.onnx.export``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import inspect
import json
import math
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from transformer_course import _validation
from transformer_course.attention import MultiHeadAttention, repeat_kv

Tensor = torch.Tensor

LIVE_DIR_ENV = "TRANSFORMER_COURSE_LIVE_DIR"
OPSET = 17
MINILM_EXAMPLE = "The cat sat on the mat."
TRANSLATOR_EXAMPLE = "three hundred and forty-two"
SITE_FILES = (".onnx", "vocab.json")  # what the site serves of a folder


@dataclass(frozen=True)
class Exported:
    """What an export wrote.

    Attributes:
        kind: "minilm" or "translator" (the live view's ``data-live-kind``).
        folder: the folder ``<base>/<name>-<hash16>``.
        files: role -> path ("encoder", "decoder", "vocab", "state_dict", "config").
        config: the live view's ``data-live-config`` (paths relative to the site's
            ``_static/live/``, e.g. ``"minilm-0123456789abcdef/encoder.onnx"``).
        seconds: the export's wall time.
    """

    kind: str
    folder: Path
    files: dict
    config: dict
    seconds: float

    def sizes_mb(self) -> dict:
        """Role -> size in MB (10^6 bytes) of each file the site serves."""
        return {
            role: path.stat().st_size / 1e6
            for role, path in self.files.items()
            if path.name.endswith(SITE_FILES)
        }


def live_dir() -> Path:
    """The base folder of the exports (see the module docstring)."""
    env = os.environ.get(LIVE_DIR_ENV)
    if env:
        return Path(env)
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").exists():  # an installed package: no repository
        root = Path.cwd()
    return root / "_build" / ".live"


# ------------------------------------------------------------------- tracing helpers


@contextlib.contextmanager
def _checks_off():
    """Switch the library's input checks off while a graph is traced: they read values
    (ids, positions) that a symbolic trace does not have, and a graph holds no Python
    checks anyway. Restored on exit, also on an error."""
    saved = {
        name: fn
        for name, fn in vars(_validation).items()
        if inspect.isfunction(fn) and fn.__module__ == _validation.__name__
    }
    for name in saved:
        setattr(_validation, name, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(_validation, name, fn)


class _Scores:
    """Forward hooks that keep each attention module's scores q.k/sqrt(d_k) (B, H, T, S),
    computed from the module's own projections, in call order."""

    def __init__(self, modules):
        self.kept: dict[int, list[Tensor]] = {}
        self.modules = list(modules)
        for i, mod in enumerate(self.modules):
            mod.register_forward_hook(self._hook(i), with_kwargs=True)

    def _hook(self, i):
        def hook(mod: MultiHeadAttention, args, kwargs, out):
            query, key = args[0], args[1]
            q = mod.split_heads(mod.q_proj(query))  # (B, H, T, d_k)
            k = mod.split_heads(mod.k_proj(key))  # (B, H_kv, S, d_k)
            k = repeat_kv(k, q.shape[1] // k.shape[1])  # (B, H, S, d_k)
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(mod.d_k))
            self.kept[i] = scores

        return hook

    def stacked(self, indices) -> Tensor:
        """(L, H, T, S): batch row 0 of the modules ``indices``."""
        return torch.stack([self.kept[i][0] for i in indices])


def _attention_modules_plain(model: nn.Module, what: str) -> None:
    """Reject what the hooks' scores would not match: rotary positions, ALiBi biases,
    a backend other than "naive" is set by the caller."""
    for name, mod in model.named_modules():
        if isinstance(mod, MultiHeadAttention) and mod.rotary is not None:
            raise ValueError(
                f"{what}: expected attention without rotary positions, got rotary in {name}"
            )


def _prepared(model: nn.Module) -> nn.Module:
    """A CPU float32 eval-mode copy with the "naive" backend (keeps the weights)."""
    from transformer_course.model import set_attention_backend

    copied = copy.deepcopy(model).cpu().float().eval()
    return set_attention_backend(copied, "naive")


def _onnx_export(module, args, path, inputs, outputs, dynamic) -> None:
    try:
        import onnx  # noqa: F401 (torch.onnx needs it)
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "Exporting a live view needs the package onnx: "
            "run `pip install onnx==1.23.1 onnxscript==0.7.2` "
            "(or `pip install transformer-course[live]`)"
        ) from err
    with warnings.catch_warnings(), torch.no_grad(), _checks_off():
        warnings.simplefilter("ignore")  # TracerWarnings on the switched-off checks
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=dynamic,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )


def _write_folder(name: str, out_dir, write) -> tuple[Path, float]:
    """Run ``write(tmp)`` in a fresh folder, then move it to ``<base>/<name>-<hash16>``
    (kept if one with the same hash is there already)."""
    import time

    base = Path(out_dir) if out_dir is not None else live_dir()
    base.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=base))
    try:
        write(tmp)
        digest = hashlib.sha256()
        for path in sorted(tmp.iterdir()):
            if path.name.endswith(SITE_FILES):
                digest.update(path.name.encode() + b"\0" + path.read_bytes())
        folder = base / f"{name}-{digest.hexdigest()[:16]}"
        if folder.exists():
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder, time.perf_counter() - start


def _dump(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, ensure_ascii=False, separators=(",", ":")), "utf-8")


# ------------------------------------------------------------------------------ MiniLM


class _MiniLMGraph(nn.Module):
    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder
        self.scores = _Scores(layer.self_attn for layer in encoder.layers)

    def forward(self, input_ids: Tensor):
        out = self.encoder(input_ids)
        n = len(self.encoder.layers)
        return out.hidden_states, out.attentions[:, 0], self.scores.stacked(range(n))


MINILM_OUTPUTS = ("last_hidden_state", "attentions", "scores")


def _minilm_tokenizer(tokenizer_or_path):
    from tokenizers import Tokenizer

    if tokenizer_or_path is None:
        from transformer_course.pretrained import load_minilm_tokenizer

        return load_minilm_tokenizer()
    if isinstance(tokenizer_or_path, Tokenizer):
        return tokenizer_or_path
    if isinstance(tokenizer_or_path, (str, os.PathLike)):
        path = Path(tokenizer_or_path)
        path = path / "tokenizer.json" if path.is_dir() else path
        if not path.is_file():
            raise ValueError(
                f"tokenizer_or_path: expected a tokenizer.json file or a folder holding "
                f"one, got {str(tokenizer_or_path)!r} (no such file)"
            )
        tok = Tokenizer.from_file(str(path))
        tok.no_padding()
        return tok
    raise TypeError(
        "tokenizer_or_path: expected a tokenizers.Tokenizer, a path or None, "
        f"got {type(tokenizer_or_path).__name__}"
    )


def minilm_vocab(tokenizer) -> dict:
    """vocab.json of MiniLM's WordPiece tokenizer (format in the module docstring).

    Raises:
        ValueError: if the tokenizer is not a BERT WordPiece one (another normaliser,
            pre-tokeniser or model).
    """
    spec = json.loads(tokenizer.to_str())
    model, norm = spec["model"], spec.get("normalizer") or {}
    if model.get("type") != "WordPiece" or norm.get("type") != "BertNormalizer":
        raise ValueError(
            "tokenizer: expected a BERT WordPiece tokenizer (BertNormalizer + WordPiece), "
            f"got normalizer {norm.get('type')!r}, model {model.get('type')!r}"
        )
    if (spec.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer":
        raise ValueError(
            "tokenizer: expected the BertPreTokenizer, got "
            f"{(spec.get('pre_tokenizer') or {}).get('type')!r}"
        )
    vocab = [None] * len(model["vocab"])
    for token, i in model["vocab"].items():
        vocab[i] = token
    truncation = spec.get("truncation") or {}
    return {
        "kind": "wordpiece",
        "vocab": vocab,
        "do_lower_case": norm["lowercase"],
        "strip_accents": norm["strip_accents"],
        "tokenize_chinese_chars": norm["handle_chinese_chars"],
        "clean_text": norm["clean_text"],
        "unk_token": model["unk_token"],
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "continuing_subword_prefix": model["continuing_subword_prefix"],
        "max_input_chars_per_word": model["max_input_chars_per_word"],
        "max_length": truncation.get("max_length"),
        "added_tokens": [
            {"content": t["content"], "id": t["id"]}
            for t in spec.get("added_tokens", [])
        ],
    }


def export_minilm(
    encoder,
    tokenizer_or_path=None,
    out_dir=None,
    *,
    example: str = MINILM_EXAMPLE,
) -> Exported:
    """Export chapter 3's ``MiniLMEncoder`` with every layer's attention and scores.

    Args:
        encoder: a ``pretrained.MiniLMEncoder`` (the real weights from
            ``load_minilm_encoder()``, or any weights of that shape; not modified: a CPU
            copy is traced).
        tokenizer_or_path: a ``tokenizers.Tokenizer``, a ``tokenizer.json`` file or a
            folder holding one; None: the shipped all-MiniLM-L6-v2 tokenizer.
        out_dir: the base folder (default ``live_dir()``).
        example: the sentence first shown in the page (also the traced input).

    Returns:
        ``Exported`` with files ``encoder`` (``encoder.onnx``: ``input_ids`` (1, T)
        int64 -> ``last_hidden_state`` (1, T, D), ``attentions`` (L, H, T, T),
        ``scores`` (L, H, T, T), float32), ``vocab``, ``state_dict``, ``config``.

    Raises:
        TypeError: if ``encoder`` is not a ``MiniLMEncoder`` or the tokenizer argument
            of another type. ValueError: a missing tokenizer file, a non-WordPiece
            tokenizer, an empty example. ImportError: without the package ``onnx``.
    """
    from transformer_course.pretrained import MiniLMEncoder

    if not isinstance(encoder, MiniLMEncoder):
        raise TypeError(
            f"encoder: expected a pretrained.MiniLMEncoder, got {type(encoder).__name__}"
        )
    if not isinstance(example, str) or not example.strip():
        raise ValueError(f"example: expected a non-empty str, got {example!r}")
    tokenizer = _minilm_tokenizer(tokenizer_or_path)
    vocab = minilm_vocab(tokenizer)
    if len(vocab["vocab"]) != encoder.cfg["vocab_size"]:
        raise ValueError(
            f"tokenizer_or_path: expected a vocabulary of the encoder's vocab_size = "
            f"{encoder.cfg['vocab_size']} tokens, got {len(vocab['vocab'])}"
        )
    enc = tokenizer.encode(example)
    vocab["examples"] = [{"text": example, "ids": enc.ids, "tokens": enc.tokens}]
    cfg = encoder.cfg
    graph = _MiniLMGraph(_prepared(encoder))
    ids = torch.tensor([enc.ids], dtype=torch.long)

    def write(tmp: Path) -> None:
        _onnx_export(
            graph,
            (ids,),
            tmp / "encoder.onnx",
            ["input_ids"],
            list(MINILM_OUTPUTS),
            {
                "input_ids": {1: "T"},
                "last_hidden_state": {1: "T"},
                "attentions": {2: "T", 3: "T"},
                "scores": {2: "T", 3: "T"},
            },
        )
        _dump(tmp / "vocab.json", vocab)
        torch.save(graph.encoder.state_dict(), tmp / "state_dict.pt")
        _dump(tmp / "config.json", {"kind": "minilm", "cfg": cfg})

    folder, seconds = _write_folder("minilm", out_dir, write)
    max_len = min(vocab["max_length"] or cfg["max_len"], cfg["max_len"])
    config = {
        "model": f"{folder.name}/encoder.onnx",
        "vocab": f"{folder.name}/vocab.json",
        "n_layers": cfg["n_layers"],
        "n_heads": cfg["n_heads"],
        "d_k": cfg["d_k"],
        "max_len": max_len,
        "example": example,
        "bytes": _served_bytes(folder),
    }
    return Exported("minilm", folder, _files(folder), config, seconds)


def load_exported_minilm(folder):
    """The ``MiniLMEncoder`` an ``export_minilm`` folder was made from (eval, CPU).

    Raises:
        ValueError: if ``folder`` holds no MiniLM export (config.json's kind).
    """
    from transformer_course.pretrained import MiniLMEncoder

    meta = _meta(folder, "minilm")
    model = MiniLMEncoder(meta["cfg"])
    model.load_state_dict(torch.load(Path(folder) / "state_dict.pt", weights_only=True))
    return model.eval()


# -------------------------------------------------------------------------- translator


class _TranslatorEncoder(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.scores = _Scores(layer.self_attn for layer in model.encoder.layers)

    def forward(self, src_ids: Tensor):
        memory, _ = self.model.encode(src_ids)
        layers = self.model.encoder.layers
        weights = torch.stack([layer.self_attn_weights[0] for layer in layers])
        return memory, weights, self.scores.stacked(range(len(layers)))


class _TranslatorDecoder(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
        mods = []
        for layer in model.decoder.layers:
            mods += [layer.self_attn, layer.cross_attn]
        self.scores = _Scores(mods)

    def forward(self, src_ids: Tensor, memory: Tensor, tgt_ids: Tensor):
        from transformer_course.masks import padding_mask

        src_mask = padding_mask(src_ids, self.model.cfg.pad_id)  # (1, 1, 1, S)
        logits = self.model.decode(tgt_ids, memory, src_mask)
        layers = self.model.decoder.layers
        n = len(layers)
        self_w = torch.stack([layer.self_attn_weights[0] for layer in layers])
        cross_w = torch.stack([layer.cross_attn_weights[0] for layer in layers])
        self_s = self.scores.stacked(range(0, 2 * n, 2))
        cross_s = self.scores.stacked(range(1, 2 * n, 2))
        return logits, self_w, self_s, cross_w, cross_s


ENCODER_OUTPUTS = ("memory", "enc_attentions", "enc_scores")
DECODER_OUTPUTS = (
    "logits",
    "self_attentions",
    "self_scores",
    "cross_attentions",
    "cross_scores",
)


def _tokenizer_spec(tok, role: str) -> dict:
    from transformer_course.data import CharTokenizer, HFTokenizer

    if isinstance(tok, CharTokenizer):
        return {"kind": "char", "tokens": list(tok.itos)}
    if not isinstance(tok, HFTokenizer):
        raise TypeError(
            f"data.{role}_tok: expected a CharTokenizer or HFTokenizer, "
            f"got {type(tok).__name__}"
        )
    spec = json.loads(tok.tokenizer.to_str())
    kind = {"WordLevel": "word", "BPE": "bpe"}.get(spec["model"]["type"])
    tokens = [tok.tokenizer.id_to_token(i) for i in range(tok.vocab_size)]
    text = json.dumps(spec.get("pre_tokenizer"))
    prepend = "always" if '"prepend_scheme": "always"' in text else "never"
    if kind is None or (role == "src" and kind != "word"):
        raise ValueError(
            f"data.{role}_tok: expected a word-level "
            f"{'' if role == 'src' else 'or BPE '}tokenizer (or CharTokenizer) that the "
            f"browser can run, got a {spec['model']['type']} one"
        )
    return {
        "kind": kind,
        "tokens": tokens,
        "replacement": "▁",
        "prepend_scheme": prepend,
    }


def translator_vocab(data) -> dict:
    """vocab.json of the translator's tokenizers (format in the module docstring).

    Raises:
        TypeError: if ``data`` has no ``src_tok``/``tgt_tok`` of the library's kinds.
        ValueError: for a source tokenizer the browser cannot run (BPE).
    """
    from transformer_course.data import BOS_ID, EOS_ID, PAD_ID, UNK_ID

    for role in ("src", "tgt"):
        if not hasattr(data, f"{role}_tok"):
            raise TypeError(
                "data: expected a translation_data.TranslationData (with src_tok and "
                f"tgt_tok), got {type(data).__name__}"
            )
    return {
        "kind": "translator",
        "src": _tokenizer_spec(data.src_tok, "src"),
        "tgt": _tokenizer_spec(data.tgt_tok, "tgt"),
        "pad_id": PAD_ID,
        "bos_id": BOS_ID,
        "eos_id": EOS_ID,
        "unk_id": UNK_ID,
    }


def export_translator(
    model,
    data,
    out_dir=None,
    *,
    example: str = TRANSLATOR_EXAMPLE,
    max_new_tokens: int = 24,
) -> Exported:
    """Export chapter 6's translator: an encoder graph and a decoder graph with the self-
    and cross-attention weights and scores of every layer.

    Args:
        model: a ``model.Transformer`` (not modified: a CPU copy is traced), with
            sinusoidal, learned or no positions (not rotary or ALiBi).
        data: its ``translation_data.TranslationData`` (``src_tok`` word-level or
            characters; ``tgt_tok`` word-level, BPE or characters).
        out_dir: the base folder (default ``live_dir()``).
        example: the English first shown in the page; must tokenize.
        max_new_tokens: the longest German the page decodes (the chapter's 24), capped
            by ``model.cfg.max_len`` - 1.

    Returns:
        ``Exported`` with files ``encoder``, ``decoder`` (graphs in the module
        docstring), ``vocab``, ``state_dict``, ``config``; ``config`` holds the paths,
        ``n_layers``, ``n_heads``, ``bos_id``, ``eos_id``, ``pad_id``, ``max_len``,
        ``example``.

    Raises:
        TypeError: if ``model`` is not a ``Transformer`` or ``data`` no translation data.
        ValueError: vocabularies whose sizes differ from the model's, a rotary/ALiBi
            model, an example with a word outside the vocabulary. ImportError: without
            the package ``onnx``.
    """
    from transformer_course.data import BOS_ID
    from transformer_course.model import Transformer

    if not isinstance(model, Transformer):
        raise TypeError(
            f"model: expected a model.Transformer (encoder-decoder), got "
            f"{type(model).__name__}"
        )
    _validation.positive_int("max_new_tokens", max_new_tokens)
    cfg = model.cfg
    if cfg.positional in ("rope", "alibi"):
        raise ValueError(
            f"model: expected sinusoidal, learned or no positions, got {cfg.positional!r}"
        )
    _attention_modules_plain(model, "model")
    vocab = translator_vocab(data)
    for role, size in (("src", cfg.src_vocab_size), ("tgt", cfg.tgt_vocab_size)):
        if len(vocab[role]["tokens"]) != size:
            raise ValueError(
                f"data.{role}_tok: expected {size} tokens (model.cfg.{role}_vocab_size), "
                f"got {len(vocab[role]['tokens'])}"
            )
    src = data.src_tok.encode(example)  # ValueError naming an unknown word
    vocab["examples"] = [
        {"text": t, "ids": data.src_tok.encode(t), "tokens": data.src_tok.tokens(ids)}
        for t in dict.fromkeys([example, *_sample_texts(data)])
        for ids in [data.src_tok.encode(t)]
    ]
    prepared = _prepared(model)
    enc_graph, dec_graph = _TranslatorEncoder(prepared), _TranslatorDecoder(prepared)
    src_ids = torch.tensor([src], dtype=torch.long)
    with torch.no_grad(), _checks_off():
        memory = enc_graph(src_ids)[0]
    # a target length other than the source's, so the two axes stay apart
    t_len = min(cfg.max_len, len(src) + 2)
    tgt_ids = torch.tensor([[BOS_ID] + [4 % cfg.tgt_vocab_size] * (t_len - 1)])

    def write(tmp: Path) -> None:
        _onnx_export(
            enc_graph,
            (src_ids,),
            tmp / "encoder.onnx",
            ["src_ids"],
            list(ENCODER_OUTPUTS),
            {
                "src_ids": {1: "S"},
                "memory": {1: "S"},
                "enc_attentions": {2: "S", 3: "S"},
                "enc_scores": {2: "S", 3: "S"},
            },
        )
        _onnx_export(
            dec_graph,
            (src_ids, memory, tgt_ids),
            tmp / "decoder.onnx",
            ["src_ids", "memory", "tgt_ids"],
            list(DECODER_OUTPUTS),
            {
                "src_ids": {1: "S"},
                "memory": {1: "S"},
                "tgt_ids": {1: "T"},
                "logits": {1: "T"},
                "self_attentions": {2: "T", 3: "T"},
                "self_scores": {2: "T", 3: "T"},
                "cross_attentions": {2: "T", 3: "S"},
                "cross_scores": {2: "T", 3: "S"},
            },
        )
        _dump(tmp / "vocab.json", vocab)
        torch.save(prepared.state_dict(), tmp / "state_dict.pt")
        _dump(
            tmp / "config.json", {"kind": "translator", "cfg": dataclasses.asdict(cfg)}
        )

    folder, seconds = _write_folder("translator", out_dir, write)
    config = {
        "encoder": f"{folder.name}/encoder.onnx",
        "decoder": f"{folder.name}/decoder.onnx",
        "vocab": f"{folder.name}/vocab.json",
        "n_layers": cfg.decoder_layers,
        "n_encoder_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "bos_id": vocab["bos_id"],
        "eos_id": vocab["eos_id"],
        "pad_id": vocab["pad_id"],
        "max_len": min(max_new_tokens, cfg.max_len - 1),
        "max_src_len": cfg.max_len,
        "example": example,
        "bytes": _served_bytes(folder),
    }
    return Exported("translator", folder, _files(folder), config, seconds)


def _sample_texts(data, n: int = 8) -> list[str]:
    texts = getattr(data, "src_texts", {}).get("test", [])
    return texts[:: max(1, len(texts) // n)][:n]


def load_exported_translator(folder):
    """The ``model.Transformer`` an ``export_translator`` folder was made from (eval,
    CPU, "naive" backend).

    Raises:
        ValueError: if ``folder`` holds no translator export (config.json's kind).
    """
    from transformer_course.model import (
        Transformer,
        TransformerConfig,
        set_attention_backend,
    )

    meta = _meta(folder, "translator")
    fields = dict(meta["cfg"])
    if fields.get("rope_freq_factors") is not None:
        fields["rope_freq_factors"] = tuple(fields["rope_freq_factors"])
    model = Transformer(TransformerConfig(**fields))
    model.load_state_dict(torch.load(Path(folder) / "state_dict.pt", weights_only=True))
    return set_attention_backend(model, "naive").eval()


# ------------------------------------------------------------------------------ shared


def _served_bytes(folder: Path) -> int:
    """Bytes the page fetches from ``folder`` (its .onnx files and vocab.json): the
    size the live view's button states."""
    return sum(
        p.stat().st_size
        for p in folder.iterdir()
        if p.suffix == ".onnx" or p.name == "vocab.json"
    )


def _files(folder: Path) -> dict:
    roles = {
        "encoder.onnx": "encoder",
        "decoder.onnx": "decoder",
        "vocab.json": "vocab",
        "state_dict.pt": "state_dict",
        "config.json": "config",
    }
    return {roles[p.name]: p for p in sorted(folder.iterdir()) if p.name in roles}


def _meta(folder, kind: str) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ValueError(
            f"folder: expected an export folder with config.json, got {folder}"
        )
    meta = json.loads(path.read_text("utf-8"))
    if meta.get("kind") != kind:
        raise ValueError(
            f"folder: expected a {kind} export, got a {meta.get('kind')!r} one ({folder})"
        )
    return meta


def export(module, tokenizer_or_data=None, out_dir=None, **kwargs) -> Exported:
    """``export_minilm`` or ``export_translator``, chosen by the type of ``module``.

    Raises:
        TypeError: if ``module`` is neither a ``MiniLMEncoder`` nor a ``Transformer``.
    """
    from transformer_course.model import Transformer
    from transformer_course.pretrained import MiniLMEncoder

    if isinstance(module, MiniLMEncoder):
        return export_minilm(module, tokenizer_or_data, out_dir, **kwargs)
    if isinstance(module, Transformer):
        return export_translator(module, tokenizer_or_data, out_dir, **kwargs)
    raise TypeError(
        "module: expected a pretrained.MiniLMEncoder or a model.Transformer, "
        f"got {type(module).__name__}"
    )
