"""The live views (issue 45) on the built site, in both editions: the reader's own input
through the course's real models, computed in the page by book/_ext/static/live.js.

Each view's numbers are read from the page (``data-live-result``, ``window.courseLive``)
and compared with the library's, for inputs this file makes up:

- the soft lookup (chapter 1): the reader's edited query and keys give the scores,
  weights and weighted sum of ``attention.scaled_dot_product_attention``;
- MiniLM (chapter 3): the attention weights of the chosen layer and head within 1e-3 of
  the PyTorch encoder rebuilt from the export folder (``export.load_exported_minilm``);
- the translator (chapter 6): the German ids equal to ``decoding.greedy_decode`` of the
  rebuilt model (``export.load_exported_translator``), the text equal to the
  ``tokenizers`` decoder's, the cross-attention weights within 1e-3 of PyTorch's;
- the tokenizers: 100 sentences with punctuation, accents, digits, Chinese and emoji give
  the ids of the Python tokenizers (``courseLive.tokenize``, one evaluate for all 100);
  the same port also checked without a browser, in node, against the shipped tokenizer;
- no request leaves the site while the models load and run; with JavaScript off, the
  pre-rendered fallback is what shows; the Chinese page's labels are in Chinese.

Each check is a helper returning the problems it found, shown rejecting a known-wrong
input at the end of the file (a perturbed weight matrix, another head, a wrong id).
"""

from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from browsing import ROOT, Visit, short

pytestmark = pytest.mark.browser

LIVE_JS = ROOT / "book" / "_ext" / "static" / "live.js"
TOLERANCE = 1e-3
# The live views of the chapters (kind per page); the Chinese edition has the same cells.
LIVE_PAGES = {
    "book/01_qkv": ["lookup"],
    "book/03_multi_head": ["minilm"],
    "book/06_transformer": ["translator"],
}
# the Chinese pages are served as zh/01_qkv.html (book/zh/_toc.yml), not zh/book/...
PAGES = [*LIVE_PAGES, *(f"zh/{Path(p).name}" for p in LIVE_PAGES)]
READY = "el => el.dataset.liveState === 'ready' || el.dataset.liveState === 'error'"


def kinds_of(page: str) -> list[str]:
    return LIVE_PAGES[f"book/{Path(page).name}"]


# -- inputs of this file's own ------------------------------------------------------

PIECES = (
    "The cat sat on the mat.",
    "naïve café",
    "ÅNGSTRÖM über-cool",
    "3.14159",
    "in 2026,",
    "注意力机制很有趣！",
    "中文分词",
    "😀",
    "👍🏽",
    "👨‍👩‍👧",
    "e-mail: a@b.co",
    "(parentheses)",
    "x[MASK]y",
    "«guillemets»",
    "¿Qué?",
    "Σίσυφος",
    "İstanbul",
    "straße",
    "ﬁnance",
    "tab\there",
    "zero\u200bwidth",
    "nbsp\u00a0space",
    "don't",
    "U.S.A.",
    "$100 50%",
    "a+b=c",
    "Русский текст",
    "日本語のテキスト",
    "한국어",
    "antidisestablishmentarianism",
    "e\u0301",
    "fullwidth ＡＢＣ１２３",
    "emoji🚀rocket",
    "forty-two",
)


def sentences(n: int = 100, seed: int = 45) -> list[str]:
    """``n`` sentences of 1 to 5 pieces: punctuation, accents, digits, Chinese, emoji."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(PIECES) for _ in range(rng.randint(1, 5))) for _ in range(n)
    ]


def number_texts(n: int = 3, seed: int = 45) -> list[str]:
    """English number words the translator reads (numbers the test picks)."""
    from transformer_course.translation_data import number_words

    rng = random.Random(seed)
    return [number_words(rng.randrange(1, 100_000), "en") for _ in range(n)]


# -- the Python side ------------------------------------------------------------------


def export_folder(config: dict, key: str) -> Path:
    """The export folder (under export.live_dir()) of a view's model file."""
    from transformer_course.export import live_dir

    return live_dir() / Path(config[key]).parent


def minilm_ids(text: str) -> list[int]:
    from transformer_course.pretrained import load_minilm_tokenizer

    return load_minilm_tokenizer().encode(text).ids


def translator_source_tokenizer(vocab: dict):
    """The translator's source tokenizer rebuilt with ``tokenizers`` from vocab.json, as
    ``data.HFTokenizer.train_words`` builds it (WordLevel, Metaspace, Punctuation)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    src = vocab["src"]
    tok = Tokenizer(
        models.WordLevel(
            {t: i for i, t in enumerate(src["tokens"])},
            unk_token=src["tokens"][vocab["unk_id"]],
        )
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(
                prepend_scheme=src.get("prepend_scheme", "always")
            ),
            pre_tokenizers.Punctuation(),
        ]
    )
    return tok


def german(vocab: dict, ids: list[int]) -> str:
    """``tokenizers``' Metaspace decoder on the target tokens of ``ids``, specials out."""
    from tokenizers import decoders

    tgt = vocab["tgt"]
    tokens = [tgt["tokens"][i] for i in ids if i >= 4]
    return decoders.Metaspace(prepend_scheme=tgt.get("prepend_scheme", "never")).decode(
        tokens
    )


# -- checks: each returns a list of problems (empty = fine) ---------------------------


def close_problems(name: str, got, want, tol: float = TOLERANCE) -> list[str]:
    """``got`` and ``want`` (nested lists) of one shape, every entry within ``tol``."""
    import torch

    a = torch.tensor(got, dtype=torch.float64)
    b = torch.as_tensor(want, dtype=torch.float64)
    if a.shape != b.shape:
        return [f"{name}: shape {tuple(a.shape)}, expected {tuple(b.shape)}"]
    err = (a - b).abs().max().item() if a.numel() else 0.0
    return [] if err <= tol else [f"{name}: off by {err:.2e} (tolerance {tol:g})"]


def lookup_expected(result: dict) -> dict:
    """The library's soft lookup of a result's query, keys, values and scale."""
    import torch

    from transformer_course.attention import scaled_dot_product_attention

    q = torch.tensor([result["query"]], dtype=torch.float64)  # (1, d_k)
    k = torch.tensor(result["keys"], dtype=torch.float64)  # (S, d_k)
    v = torch.tensor(result["values"], dtype=torch.float64)  # (S, d_v)
    out, weights = scaled_dot_product_attention(q, k, v, scale=result["scale"])
    return {
        "scores": (q @ k.T * result["scale"]).tolist(),
        "weights": weights.tolist(),
        "output": out[0].tolist(),
    }


def lookup_problems(result: dict, query, keys) -> list[str]:
    problems = []
    if result["query"] != query or result["keys"] != keys:
        problems.append(
            f"the view computed {result['query']}, {result['keys']}, "
            f"not the typed {query}, {keys}"
        )
    want = lookup_expected({**result, "query": query, "keys": keys})
    for name in ("scores", "weights", "output"):
        problems += close_problems(f"lookup {name}", result[name], want[name], 1e-9)
    return problems


def minilm_expected(folder: Path, ids: list[int], layer: int, head: int):
    import torch

    from transformer_course.export import load_exported_minilm

    model = load_exported_minilm(folder)
    with torch.no_grad():
        out = model(torch.tensor([ids]))
    return out.attentions[layer, 0, head].tolist()  # (T, T)


def minilm_problems(result: dict, folder: Path) -> list[str]:
    problems = []
    want_ids = minilm_ids(result["text"])
    if result["ids"] != want_ids:
        problems.append(f"{result['text']!r}: ids {result['ids']}, Python {want_ids}")
        return problems
    want = minilm_expected(folder, want_ids, result["layer"], result["head"])
    problems += close_problems(f"{result['text']!r} weights", result["weights"], want)
    return problems


def translator_expected(folder: Path, src_ids: list[int], prefix: list[int], max_new):
    """(greedy ids, cross-attention (L, H, T, S) of the decoder on ``prefix``)."""
    import torch

    from transformer_course.decoding import greedy_decode
    from transformer_course.export import load_exported_translator
    from transformer_course.model import set_attention_backend

    # the "naive" backend keeps each layer's weights (cross_attn_weights)
    model = set_attention_backend(load_exported_translator(folder), "naive")
    src = torch.tensor([src_ids])
    with torch.no_grad():
        ids = greedy_decode(model, src, max_new_tokens=max_new, use_cache=False)[0]
        memory, mask = model.encode(src)
        model.decode(torch.tensor([prefix]), memory, mask)
    cross = torch.stack([layer.cross_attn_weights[0] for layer in model.decoder.layers])
    return ids, cross


def translator_problems(result: dict, folder: Path, vocab: dict, config: dict):
    problems = []
    want_src = translator_source_tokenizer(vocab).encode(result["text"]).ids
    if result["ids"] != want_src:
        problems.append(f"{result['text']!r}: ids {result['ids']}, Python {want_src}")
        return problems
    ids, cross = translator_expected(
        folder, want_src, result["prefix"], config["max_len"]
    )
    if result["output_ids"] != ids:
        problems.append(
            f"{result['text']!r}: German ids {result['output_ids']}, greedy_decode {ids}"
        )
    if result["output"] != german(vocab, ids):
        problems.append(
            f"{result['text']!r}: {result['output']!r}, Python {german(vocab, ids)!r}"
        )
    want = cross[result["layer"], result["head"]].tolist()
    problems += close_problems(
        f"{result['text']!r} cross-attention", result["weights"], want
    )
    return problems


def tokenizer_problems(texts, got, want) -> list[str]:
    return [
        f"{t!r}: {g}, Python {w}" for t, g, w in zip(texts, got, want) if g != w
    ] + ([f"{len(got)} results for {len(want)} texts"] if len(got) != len(want) else [])


# -- the page ---------------------------------------------------------------------------


def view(visit: Visit, kind: str):
    loc = visit.page.locator(f'.live-view[data-live-kind="{kind}"]')
    assert loc.count() >= 1, f"no live view of kind {kind!r} on the page"
    return loc.first


def load(visit: Visit, kind: str):
    """Press the view's button as a reader would; wait until it has run once."""
    el = view(visit, kind)
    if el.get_attribute("data-live-state") != "ready":
        el.locator("button.live-load").click()
        visit.page.wait_for_function(READY, arg=el.element_handle(), timeout=180_000)
    assert el.get_attribute("data-live-state") == "ready", el.locator(
        ".live-status"
    ).first.text_content()
    return el


def run(visit: Visit, el, text: str, layer: int, head: int) -> dict:
    return visit.page.evaluate(
        "([el, text, layer, head]) => courseLive.run(el, text, {layer, head})",
        [el.element_handle(), text, layer, head],
    )


def fetch_json(visit: Visit, el, key: str) -> dict:
    """A view's vocab.json as the page fetches it (from course-live-root)."""
    return visit.page.evaluate(
        """async ([el, key]) => {
          const root = document.querySelector('meta[name="course-live-root"]');
          const cfg = JSON.parse(el.dataset.liveConfig);
          const base = new URL(root ? root.content : '_static/live/', document.baseURI);
          return (await fetch(new URL(cfg[key], base))).json();
        }""",
        [el.element_handle(), key],
    )


def page_tokenize(visit: Visit, kind: str, texts: list[str], vocab: dict) -> list:
    return visit.page.evaluate(
        "([kind, texts, vocab]) => texts.map(t => courseLive.tokenize(kind, t, vocab))",
        [kind, texts, vocab],
    )


# -- the tests --------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=short)
def test_live_views_match_the_library(pages, page):
    visit = pages.open(page, changes="live")
    problems = []
    config = {}
    for kind in kinds_of(page):
        el = view(visit, kind)
        config = json.loads(el.get_attribute("data-live-config"))
        if kind == "lookup":
            rng = random.Random(45)
            query = [round(rng.uniform(-3, 3), 2) for _ in config["query"]]
            keys = [[round(rng.uniform(-3, 3), 2) for _ in k] for k in config["keys"]]
            inputs = el.locator("input.live-number")
            for i, x in enumerate([*query, *(x for k in keys for x in k)]):
                inputs.nth(i).fill(str(x))  # typed, as a reader would
            result = json.loads(el.get_attribute("data-live-result"))
            problems += lookup_problems(result, query, keys)
        elif kind == "minilm":
            el = load(visit, kind)
            folder = export_folder(config, "model")
            for i, text in enumerate(sentences(3, seed=7)):
                layer, head = i % config["n_layers"], (5 * i) % config["n_heads"]
                problems += minilm_problems(run(visit, el, text, layer, head), folder)
        else:
            el = load(visit, kind)
            folder = export_folder(config, "encoder")
            vocab = fetch_json(visit, el, "vocab")
            for i, text in enumerate(number_texts(3)):
                layer, head = i % config["n_layers"], i % config["n_heads"]
                result = run(visit, el, text, layer, head)
                problems += translator_problems(result, folder, vocab, config)
    assert visit.outside == [], f"requests left the site: {visit.outside}"
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "page", [p for p in PAGES if set(kinds_of(p)) & {"minilm", "translator"}], ids=short
)
def test_live_tokenizers_match_python_on_100_sentences(pages, page):
    visit = pages.open(page, changes="live")
    texts = sentences(100)
    problems = []
    for kind in set(kinds_of(page)) & {"minilm", "translator"}:
        el = view(visit, kind)
        vocab = fetch_json(visit, el, "vocab")
        got = page_tokenize(visit, kind, texts, vocab)
        if kind == "minilm":
            want = [minilm_ids(t) for t in texts]
        else:
            tok = translator_source_tokenizer(vocab)
            want = [tok.encode(t).ids for t in texts]
        problems += tokenizer_problems(texts, got, want)
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("page", PAGES, ids=short)
def test_live_views_show_the_fallback_without_javascript(browser, server, page):
    context = browser.new_context(java_script_enabled=False)
    try:
        tab = context.new_page()
        tab.goto(f"{server}/{page}.html")
        views = tab.locator(".live-view")
        assert views.count() >= len(kinds_of(page))
        for i in range(views.count()):
            fallback = views.nth(i).locator(".live-fallback")
            assert fallback.is_visible(), f"view {i}: the fallback is hidden"
            assert fallback.locator("img, svg, video, .tc-interactive, table").count()
            assert views.nth(i).locator(".live-panel, button.live-load").count() == 0
    finally:
        context.close()


@pytest.mark.parametrize("page", [p for p in PAGES if p.startswith("zh/")], ids=short)
def test_live_views_speak_the_pages_language(pages, page):
    visit = pages.open(page)
    for kind in kinds_of(page):
        el = view(visit, kind)
        want = visit.page.evaluate(
            "k => courseLive.messages.zh[k === 'lookup' ? 'lookupHint' : 'loadPlain']",
            kind,
        )
        text = el.text_content()
        assert want.split("（")[0] in text, f"{kind}: no Chinese label ({want!r})"


# -- the tokenizer port without a browser (node) --------------------------------------


def node_tokenize(kind: str, texts: list[str], vocab: dict) -> list[list[int]]:
    script = (
        f"const live = require({json.dumps(str(LIVE_JS))});"
        "const [kind, texts, vocab] = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "console.log(JSON.stringify(texts.map(t => live.tokenize(kind, t, vocab))));"
    )
    out = subprocess.run(
        ["node", "-e", script],
        input=json.dumps([kind, texts, vocab]),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def shipped_minilm_vocab() -> dict:
    from transformer_course.export import minilm_vocab
    from transformer_course.pretrained import load_minilm_tokenizer

    return minilm_vocab(load_minilm_tokenizer())


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node (npm ci)")
def test_wordpiece_port_matches_the_shipped_tokenizer_in_node():
    texts = sentences(100, seed=3) + ["word " * 200, "a" * 101, "", "[CLS][SEP]"]
    vocab = shipped_minilm_vocab()
    got = node_tokenize("minilm", texts, vocab)
    problems = tokenizer_problems(texts, got, [minilm_ids(t) for t in texts])
    assert not problems, "\n".join(problems[:10])


# -- each check rejects a known-wrong input -------------------------------------------


def test_the_checks_reject_known_wrong_numbers():
    query, keys = [0.5, -1.0], [[1.0, 0.0], [0.2, 0.3], [-1.0, 2.0]]
    values = [[1.0], [2.0], [10.0]]
    good = {"query": query, "keys": keys, "values": values, "scale": 1 / math.sqrt(2)}
    good |= lookup_expected(good)
    assert lookup_problems(good, query, keys) == []
    wrong_weights = [
        [w + (0.01 if j == 0 else 0) for j, w in enumerate(good["weights"][0])]
    ]
    assert lookup_problems({**good, "weights": wrong_weights}, query, keys)
    assert lookup_problems(good, [0.6, -1.0], keys)  # not what was typed
    # a weight matrix perturbed by 2e-3 is not within tolerance; by 1e-4 it is
    matrix = [[0.25, 0.75], [0.5, 0.5]]
    assert close_problems("m", [[0.25 + 2e-3, 0.75], [0.5, 0.5]], matrix)
    assert close_problems("m", [[0.25 + 1e-4, 0.75], [0.5, 0.5]], matrix) == []
    assert close_problems("m", [[0.25, 0.75]], matrix)  # a row missing
    assert tokenizer_problems(["a"], [[101, 1037, 102]], [[101, 1037, 102]]) == []
    assert tokenizer_problems(["a"], [[101, 1038, 102]], [[101, 1037, 102]])


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node (npm ci)")
def test_the_tokenizer_check_rejects_a_wrong_port():
    # the port without stripping accents is wrong for the uncased model: caught
    texts = ["naïve café", "ÅNGSTRÖM", "plain text"]
    vocab = shipped_minilm_vocab() | {"strip_accents": False}
    got = node_tokenize("minilm", texts, vocab)
    problems = tokenizer_problems(texts, got, [minilm_ids(t) for t in texts])
    assert len(problems) == 2, problems


def built_config(site: Path, page: str, kind: str) -> dict:
    """The data-live-config of the first view of ``kind`` on a built page."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup((site / f"{page}.html").read_text("utf-8"), "html.parser")
    el = soup.select_one(f'.live-view[data-live-kind="{kind}"]')
    assert el is not None, f"{page}: no live view of kind {kind!r}"
    return json.loads(el["data-live-config"])


def test_the_minilm_check_rejects_another_head(site):
    """minilm_problems on the weights of a head other than the result names: caught."""
    import torch

    folder = export_folder(built_config(site, "book/03_multi_head", "minilm"), "model")
    text = "The cat sat on the mat."
    ids = minilm_ids(text)
    right = minilm_expected(folder, ids, 2, 3)
    result = {"text": text, "ids": ids, "layer": 2, "head": 3, "weights": right}
    assert minilm_problems(result, folder) == []
    assert minilm_problems({**result, "head": 4}, folder)
    assert minilm_problems({**result, "ids": ids[:-1]}, folder)
    noisy = (torch.tensor(right) + 5e-3).tolist()
    assert minilm_problems({**result, "weights": noisy}, folder)


def test_the_translator_check_rejects_a_wrong_token(site):
    """translator_problems on a German id sequence with one token changed: caught."""
    config = built_config(site, "book/06_transformer", "translator")
    folder = export_folder(config, "encoder")
    vocab = json.loads((folder / "vocab.json").read_text("utf-8"))
    text = number_texts(1, seed=9)[0]
    src = translator_source_tokenizer(vocab).encode(text).ids
    ids, _ = translator_expected(folder, src, [config["bos_id"]], config["max_len"])
    prefix = [config["bos_id"], *ids][: config["max_len"]]
    _, cross = translator_expected(folder, src, prefix, config["max_len"])
    result = {
        "text": text,
        "ids": src,
        "output_ids": ids,
        "output": german(vocab, ids),
        "prefix": prefix,
        "layer": 0,
        "head": 0,
        "weights": cross[0, 0].tolist(),
    }
    assert translator_problems(result, folder, vocab, config) == []
    other = 4 + (ids[0] - 3) % (len(vocab["tgt"]["tokens"]) - 4)  # another real token
    wrong = {**result, "output_ids": [other, *ids[1:]]}
    assert translator_problems(wrong, folder, vocab, config)
    assert translator_problems({**result, "head": 1}, folder, vocab, config)
