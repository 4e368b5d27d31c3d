// Live views (issue 45): the reader's own input through the course's real models, computed
// in the page. transformer_course.viz.live.live_view writes the markup
//   <div class="live-view" data-live-kind="lookup|minilm|translator" data-live-config="{json}">
//     <div class="live-fallback"> the pre-rendered view </div></div>
// and this script (added to every page by book/_ext/course_site.py) turns each one into a
// view the reader drives:
// - "lookup" (chapters 1-2): the query and keys as number inputs; the scores q.k/sqrt(d_k),
//   the softmax weights and the weighted sum of the values update as the reader types.
// - "minilm" (chapter 3): a button loads onnxruntime-web (the site's own copy, imported only
//   then) and the exported encoder; a text box, layer and head menus, the attention heatmap.
// - "translator" (chapter 6): the same for the number translator; the German comes out
//   token by token (greedy decoding, the decoder re-run on the growing prefix) with the
//   cross-attention of the chosen layer and head.
// Heatmaps are SVG drawn from the numbers; hovering (or moving with the arrow keys in) a cell
// shows its score, weight and its row's sum and marks the matching term of the formula.
// For the tests: each view sets data-live-state (idle|loading|ready|error) and, after each
// run, data-live-result (JSON); window.courseLive = {tokenize, run}. No request leaves the
// site: the models are under <meta name="course-live-root">, the runtime beside them.
(() => {
  "use strict";

  // ---------------------------------------------------------------- messages (one table)
  const MESSAGES = {
    en: {
      load: "Load the model ({mb} MB)",
      loadPlain: "Load the model",
      loading: "Loading: {done} of {total} MB",
      loadingSome: "Loading: {done} MB",
      starting: "Starting the model\u2026",
      failed: "The model could not be loaded: {error}",
      retry: "Try again",
      progress: "Download of the model",
      sentence: "Your sentence",
      number: "An English number in words",
      layer: "Layer",
      head: "Head",
      computing: "Computing\u2026",
      ready: "Done: {n} tokens.",
      readyTranslator: "Done: {n} German tokens.",
      truncated: "Only the first {n} tokens are used.",
      empty: "Type a sentence first.",
      unknown: "Not in the translator's vocabulary: {words}. Use English number words.",
      tooLong: "{n} tokens: the translator reads at most {max}.",
      german: "German",
      tokens: "Tokens",
      query: "query q",
      key: "key",
      component: "component {i}",
      score: "score q\u00b7k/\u221ad_k",
      weight: "weight",
      value: "value v",
      output: "The weighted sum \u03a3 weight \u00d7 v = {out}",
      lookupHint:
        "Change the query or a key: the scores, the softmax weights and the weighted sum update as you type.",
      mapHint:
        "Point at a cell, or focus the map and use the arrow keys, to read its numbers.",
      selfMap: "Attention weights of layer {l}, head {h}: a row per query token, a column per key token",
      crossMap:
        "Cross-attention of layer {l}, head {h}: a row per German token written, a column per English token read",
      lookupMap: "The query's weights over the keys",
      cell: "{row} \u2192 {col}: score q\u00b7k/\u221ad_k = {score}, weight = {weight}, the row's sum = {sum}",
      formulaScore: "score = q\u00b7k/\u221ad_k",
      formulaSoftmax: "weight = softmax(score)",
      formulaSum: "\u03a3 weights of the row = 1",
      badNumber: "{label}: expected a number",
    },
    zh: {
      load: "\u52a0\u8f7d\u6a21\u578b\uff08{mb} MB\uff09",
      loadPlain: "\u52a0\u8f7d\u6a21\u578b",
      loading: "\u6b63\u5728\u52a0\u8f7d\uff1a{done} / {total} MB",
      loadingSome: "\u6b63\u5728\u52a0\u8f7d\uff1a{done} MB",
      starting: "\u6b63\u5728\u542f\u52a8\u6a21\u578b\u2026\u2026",
      failed: "\u6a21\u578b\u52a0\u8f7d\u5931\u8d25\uff1a{error}",
      retry: "\u91cd\u8bd5",
      progress: "\u6a21\u578b\u4e0b\u8f7d\u8fdb\u5ea6",
      sentence: "\u4f60\u7684\u53e5\u5b50\uff08\u82f1\u6587\uff09",
      number: "\u7528\u82f1\u6587\u5355\u8bcd\u5199\u7684\u6570\u5b57",
      layer: "\u5c42",
      head: "\u5934",
      computing: "\u6b63\u5728\u8ba1\u7b97\u2026\u2026",
      ready: "\u5b8c\u6210\uff1a{n} \u4e2a\u8bcd\u5143\u3002",
      readyTranslator: "\u5b8c\u6210\uff1a{n} \u4e2a\u5fb7\u8bed\u8bcd\u5143\u3002",
      truncated: "\u53ea\u4f7f\u7528\u524d {n} \u4e2a\u8bcd\u5143\u3002",
      empty: "\u8bf7\u5148\u8f93\u5165\u4e00\u4e2a\u53e5\u5b50\u3002",
      unknown:
        "\u4e0d\u5728\u7ffb\u8bd1\u6a21\u578b\u7684\u8bcd\u8868\u4e2d\uff1a{words}\u3002\u8bf7\u7528\u82f1\u6587\u6570\u5b57\u5355\u8bcd\u3002",
      tooLong: "{n} \u4e2a\u8bcd\u5143\uff1a\u7ffb\u8bd1\u6a21\u578b\u6700\u591a\u8bfb {max} \u4e2a\u3002",
      german: "\u5fb7\u8bed",
      tokens: "\u8bcd\u5143",
      query: "\u67e5\u8be2 q",
      key: "\u952e",
      component: "\u7b2c {i} \u4e2a\u5206\u91cf",
      score: "\u5f97\u5206 q\u00b7k/\u221ad_k",
      weight: "\u6743\u91cd",
      value: "\u503c v",
      output: "\u52a0\u6743\u548c \u03a3 \u6743\u91cd \u00d7 v = {out}",
      lookupHint:
        "\u4fee\u6539\u67e5\u8be2\u6216\u67d0\u4e2a\u952e\uff1a\u5f97\u5206\u3001softmax \u6743\u91cd\u548c\u52a0\u6743\u548c\u968f\u8f93\u5165\u5373\u65f6\u66f4\u65b0\u3002",
      mapHint:
        "\u5c06\u6307\u9488\u79fb\u5230\u67d0\u4e2a\u683c\u5b50\u4e0a\uff0c\u6216\u805a\u7126\u70ed\u529b\u56fe\u540e\u7528\u65b9\u5411\u952e\uff0c\u67e5\u770b\u5b83\u7684\u6570\u503c\u3002",
      selfMap:
        "\u7b2c {l} \u5c42\u7b2c {h} \u4e2a\u5934\u7684\u6ce8\u610f\u529b\u6743\u91cd\uff1a\u6bcf\u884c\u4e00\u4e2a\u67e5\u8be2\u8bcd\u5143\uff0c\u6bcf\u5217\u4e00\u4e2a\u952e\u8bcd\u5143",
      crossMap:
        "\u7b2c {l} \u5c42\u7b2c {h} \u4e2a\u5934\u7684\u4ea4\u53c9\u6ce8\u610f\u529b\uff1a\u6bcf\u884c\u4e00\u4e2a\u5199\u51fa\u7684\u5fb7\u8bed\u8bcd\u5143\uff0c\u6bcf\u5217\u4e00\u4e2a\u8bfb\u5165\u7684\u82f1\u6587\u8bcd\u5143",
      lookupMap: "\u67e5\u8be2\u5728\u5404\u4e2a\u952e\u4e0a\u7684\u6743\u91cd",
      cell:
        "{row} \u2192 {col}\uff1a\u5f97\u5206 q\u00b7k/\u221ad_k = {score}\uff0c\u6743\u91cd = {weight}\uff0c\u8be5\u884c\u4e4b\u548c = {sum}",
      formulaScore: "\u5f97\u5206 = q\u00b7k/\u221ad_k",
      formulaSoftmax: "\u6743\u91cd = softmax(\u5f97\u5206)",
      formulaSum: "\u4e00\u884c\u6743\u91cd\u4e4b\u548c = 1",
      badNumber: "{label}\uff1a\u9700\u8981\u4e00\u4e2a\u6570",
    },
  };

  const hasDOM = typeof document !== "undefined";
  const language = () =>
    hasDOM && /^zh/i.test(document.documentElement.lang || "") ? "zh" : "en";
  const say = (key, args = {}) => {
    const text = MESSAGES[language()][key] ?? MESSAGES.en[key] ?? key;
    return text.replace(/\{(\w+)\}/g, (m, name) => (name in args ? String(args[name]) : m));
  };

  // ------------------------------------------------------------------ tokenizers
  // MiniLM: BERT's tokenizer as Hugging Face `tokenizers` runs it from tokenizer.json:
  // the added (special) tokens are matched in the raw text first; BertNormalizer (clean
  // the text, space around CJK ideographs, strip accents, lower case); BertPreTokenizer
  // (split on whitespace and punctuation); WordPiece (greedy longest match, "##" for a
  // piece inside a word, [UNK] for a word that cannot be covered); [CLS] ... [SEP]; at
  // most max_len tokens.

  const CONTROL_OK = new Set(["\t", "\n", "\r"]);
  const isOther = (c) => /\p{C}/u.test(c); // Cc, Cf, Cs, Co, Cn (Rust's char::is_other)
  const WHITE = /^[\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]$/;
  const isWhite = (c) => WHITE.test(c); // Unicode White_Space (Rust's char::is_whitespace)
  const isControl = (c) => !CONTROL_OK.has(c) && isOther(c);
  const isPunct = (c) => /^[!-/:-@[-`{-~]$/.test(c) || /^\p{P}$/u.test(c);
  const isChinese = (c) => {
    const x = c.codePointAt(0);
    return (
      (x >= 0x4e00 && x <= 0x9fff) ||
      (x >= 0x3400 && x <= 0x4dbf) ||
      (x >= 0x20000 && x <= 0x2a6df) ||
      (x >= 0x2a700 && x <= 0x2b73f) ||
      (x >= 0x2b740 && x <= 0x2b81f) ||
      (x >= 0x2b920 && x <= 0x2ceaf) ||
      (x >= 0xf900 && x <= 0xfaff) ||
      (x >= 0x2f800 && x <= 0x2fa1f)
    );
  };

  function bertNormalize(text, cfg) {
    let out = [];
    for (const c of text) {
      const x = c.codePointAt(0);
      if (x === 0 || x === 0xfffd || isControl(c)) continue;
      out.push(isWhite(c) ? " " : c);
    }
    if (cfg.tokenize_chinese_chars !== false) {
      out = out.flatMap((c) => (isChinese(c) ? [" ", c, " "] : [c]));
    }
    let s = out.join("");
    const lower = cfg.do_lower_case !== false;
    const strip = cfg.strip_accents === null || cfg.strip_accents === undefined ? lower : cfg.strip_accents;
    if (strip) s = s.normalize("NFD").replace(/\p{Mn}/gu, "");
    if (lower) s = Array.from(s, (c) => c.toLowerCase()).join("");
    return s;
  }

  function bertPreTokenize(s) {
    const words = [];
    let word = "";
    for (const c of s) {
      if (isWhite(c)) {
        if (word) words.push(word);
        word = "";
      } else if (isPunct(c)) {
        if (word) words.push(word);
        words.push(c);
        word = "";
      } else word += c;
    }
    if (word) words.push(word);
    return words;
  }

  const vocabIndex = new WeakMap(); // vocab array -> Map(token -> id)
  const tokensOf = (v) => v.vocab || v.tokens; // export.py writes "vocab" (MiniLM), "tokens"
  function indexOf(vocab) {
    let map = vocabIndex.get(vocab);
    if (!map) {
      map = new Map();
      vocab.forEach((tok, i) => {
        if (!map.has(tok)) map.set(tok, i);
      });
      vocabIndex.set(vocab, map);
    }
    return map;
  }

  function wordPiece(word, map, cfg) {
    const unk = cfg.unk_token || "[UNK]";
    const prefix = cfg.continuing_subword_prefix ?? "##";
    const chars = Array.from(word);
    if (chars.length > (cfg.max_input_chars_per_word || 100)) return [unk];
    const pieces = [];
    let start = 0;
    while (start < chars.length) {
      let end = chars.length;
      let found = null;
      while (start < end) {
        let piece = chars.slice(start, end).join("");
        if (start > 0) piece = prefix + piece;
        if (map.has(piece)) {
          found = piece;
          break;
        }
        end -= 1;
      }
      if (found === null) return [unk];
      pieces.push(found);
      start = end;
    }
    return pieces;
  }

  const DEFAULT_ADDED = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];

  function tokenizeWordPiece(text, v) {
    const map = indexOf(tokensOf(v));
    const added = (v.added_tokens || DEFAULT_ADDED)
      .map((t) => (typeof t === "string" ? t : t.content))
      .filter((t) => map.has(t))
      .sort((a, b) => b.length - a.length);
    const tokens = [];
    // the added tokens, matched in the raw text (leftmost, longest first)
    let rest = text;
    while (rest.length) {
      let at = -1;
      let hit = null;
      for (const t of added) {
        const i = rest.indexOf(t);
        if (i >= 0 && (at < 0 || i < at)) {
          at = i;
          hit = t;
        }
      }
      const plain = at < 0 ? rest : rest.slice(0, at);
      for (const w of bertPreTokenize(bertNormalize(plain, v))) tokens.push(...wordPiece(w, map, v));
      if (at < 0) break;
      tokens.push(hit);
      rest = rest.slice(at + hit.length);
    }
    const cls = v.cls_token || "[CLS]";
    const sep = v.sep_token || "[SEP]";
    const most = (v.max_length || v.max_len || 128) - 2;
    const truncated = tokens.length > most;
    const all = [cls, ...tokens.slice(0, most), sep];
    return { tokens: all, ids: all.map((t) => map.get(t)), truncated };
  }

  // The translator's source tokenizer (transformer_course.data.HFTokenizer.train_words):
  // Metaspace (every space becomes "\u2581", one is put in front, the text splits before each
  // "\u2581"), then Punctuation (each punctuation mark a piece of its own), then one id per
  // piece, <unk> for a piece outside the vocabulary. No special tokens are added.
  const SPACE_MARK = "\u2581";
  function tokenizeWords(text, v) {
    if (!text) return lookupTokens([], v);
    let s = text.replace(/ /g, SPACE_MARK);
    if (!s.startsWith(SPACE_MARK)) s = SPACE_MARK + s;
    const pieces = [];
    let cur = "";
    for (const c of s) {
      if (c === SPACE_MARK && cur) {
        pieces.push(cur);
        cur = "";
      }
      cur += c;
    }
    if (cur) pieces.push(cur);
    const tokens = [];
    for (const piece of pieces) {
      let word = "";
      for (const c of piece) {
        if (isPunct(c)) {
          if (word) tokens.push(word);
          tokens.push(c);
          word = "";
        } else word += c;
      }
      if (word) tokens.push(word);
    }
    return lookupTokens(tokens, v);
  }

  function tokenizeChars(text, v) {
    return lookupTokens(Array.from(text), v);
  }

  function lookupTokens(tokens, v) {
    const map = indexOf(tokensOf(v));
    const unkId = v.unk_id ?? 3;
    const ids = tokens.map((t) => (map.has(t) ? map.get(t) : unkId));
    const unknown = tokens.filter((t, i) => ids[i] === unkId && !map.has(t));
    return { tokens, ids, unknown };
  }

  function tokenizeTranslator(text, vocabJson) {
    const src = vocabJson.src || vocabJson;
    const kind = src.kind || "word";
    if (kind === "char") return tokenizeChars(text, src);
    if (kind === "word") return tokenizeWords(text, src);
    throw new Error(`source tokenizer: expected "word" or "char", got ${JSON.stringify(kind)}`);
  }

  // German out of the target ids: HFTokenizer.decode (special tokens dropped; the BPE and
  // word tokenizers mark a space with "\u2581"; a character tokenizer joins characters).
  function decodeTarget(ids, vocabJson) {
    const tgt = vocabJson.tgt || vocabJson;
    const specials = tgt.n_special ?? 4;
    const text = ids
      .filter((i) => i >= specials)
      .map((i) => tokensOf(tgt)[i])
      .join("");
    if ((tgt.kind || "bpe") === "char") return text;
    let out = text.replace(new RegExp(SPACE_MARK, "g"), " ");
    if (tgt.prepend_scheme === "always" || tgt.prepend_scheme === "first") out = out.replace(/^ /, "");
    return out;
  }

  /** Token ids of `text` for a live view's tokenizer: kind "minilm" (or "wordpiece") with
   * the minilm vocab.json, "translator" (the source side) with the translator's. */
  function tokenizeFull(kind, text, vocabJson) {
    if (typeof text !== "string") throw new TypeError(`text: expected a string, got ${typeof text}`);
    if (kind === "minilm" || kind === "wordpiece") return tokenizeWordPiece(text, vocabJson);
    if (kind === "translator") return tokenizeTranslator(text, vocabJson);
    throw new Error(`kind: expected "minilm" or "translator", got ${JSON.stringify(kind)}`);
  }
  const tokenize = (kind, text, vocabJson) => tokenizeFull(kind, text, vocabJson).ids;

  // ------------------------------------------------------------------ numbers
  function softmax(xs) {
    const m = Math.max(...xs);
    const e = xs.map((x) => Math.exp(x - m));
    const z = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / z);
  }

  function lookup(query, keys, values, scale) {
    const scores = keys.map((k) => k.reduce((acc, kj, j) => acc + kj * query[j], 0) * scale);
    const weights = softmax(scores);
    const dv = values[0].length;
    const output = Array.from({ length: dv }, (_, c) =>
      values.reduce((acc, v, i) => acc + weights[i] * v[c], 0),
    );
    return { scores, weights, output };
  }

  // (L, H, A, B) float32 data -> the (A, B) matrix of layer l, head h as arrays
  function headMatrix(tensor, l, h) {
    const [, H, A, B] = tensor.dims;
    const off = (l * H + h) * A * B;
    return Array.from({ length: A }, (_, i) =>
      Array.from(tensor.data.subarray(off + i * B, off + (i + 1) * B)),
    );
  }

  const fmt = (x) => (Number.isFinite(x) ? x.toFixed(3) : String(x));

  // ------------------------------------------------------------------ DOM helpers
  let uid = 0;
  const nextId = (stem) => `live-${stem}-${++uid}`;
  function h(tag, attrs = {}, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) if (c !== null && c !== undefined) el.append(c);
    return el;
  }
  const SVG = "http://www.w3.org/2000/svg";
  function s(tag, attrs = {}) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
    return el;
  }

  // white -> the course's attention blue, by weight in [0, 1]
  function colour(w) {
    const t = Math.max(0, Math.min(1, w));
    const a = [247, 251, 255];
    const b = [8, 48, 107];
    const c = a.map((x, i) => Math.round(x + (b[i] - x) * Math.sqrt(t)));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  function formulaElement() {
    return h(
      "p",
      { class: "live-formula", "aria-hidden": "true" },
      h("span", { "data-term": "score", text: say("formulaScore") }),
      h("span", { class: "live-arrow", text: " \u2192 " }),
      h("span", { "data-term": "softmax", text: say("formulaSoftmax") }),
      h("span", { class: "live-arrow", text: " \u2192 " }),
      h("span", { "data-term": "sum", text: say("formulaSum") }),
    );
  }

  /** An SVG heatmap of `weights` (rows x cols) with hover and arrow-key read-outs. */
  function heatmap(box, { rows: rowLabels, cols: colLabels, weights, scores, label }) {
    box.replaceChildren();
    let rows = rowLabels;
    let cols = colLabels;
    const nr = rows.length;
    const nc = cols.length;
    const width = Math.max(240, Math.min(680, box.clientWidth || 680));
    const short = (t) => (t.length > 14 ? `${t.slice(0, 13)}\u2026` : t);
    rows = rows.map(short);
    cols = cols.map(short);
    const longest = (xs) => Math.max(1, ...xs.map((x) => x.length));
    const left = 16 + 7 * longest(rows);
    const top = 18 + 6 * longest(cols);
    const cell = Math.max(6, Math.min(34, Math.floor((width - left - 4) / nc)));
    const W = left + cell * nc + 4;
    const Hh = top + cell * nr + 4;
    const svg = s("svg", { viewBox: `0 0 ${W} ${Hh}`, width: W, height: Hh, role: "img", "aria-label": label });
    svg.classList.add("live-heatmap");
    const font = Math.min(12, Math.max(8, cell * 0.6));
    cols.forEach((c, j) => {
      const x = left + j * cell + cell / 2;
      const t = s("text", {
        x,
        y: top - 4,
        transform: `rotate(-55 ${x} ${top - 4})`,
        "font-size": font,
        class: "live-label",
      });
      t.textContent = c;
      svg.append(t);
    });
    rows.forEach((r, i) => {
      const t = s("text", {
        x: left - 4,
        y: top + i * cell + cell / 2 + font / 3,
        "text-anchor": "end",
        "font-size": font,
        class: "live-label",
      });
      t.textContent = r;
      svg.append(t);
    });
    const cells = s("g");
    weights.forEach((row, i) =>
      row.forEach((w, j) => {
        cells.append(
          s("rect", {
            x: left + j * cell,
            y: top + i * cell,
            width: cell,
            height: cell,
            fill: colour(w),
            "data-i": i,
            "data-j": j,
          }),
        );
      }),
    );
    svg.append(cells);
    const mark = s("rect", { width: cell, height: cell, class: "live-mark", visibility: "hidden" });
    svg.append(mark);
    const tipId = nextId("tip");
    const tip = h("p", { class: "live-tooltip", id: tipId, role: "status", "aria-live": "polite" });
    const frame = h("div", {
      class: "live-map",
      tabindex: 0,
      role: "group",
      "aria-label": `${label}. ${say("mapHint")}`,
      "aria-describedby": tipId,
    });
    frame.append(svg);
    const formula = box.closest(".live-view")?.querySelector(".live-formula");
    let at = null;
    const show = (i, j) => {
      at = [i, j];
      const sum = weights[i].reduce((a, b) => a + b, 0);
      tip.textContent = say("cell", {
        row: rows[i],
        col: cols[j],
        score: fmt(scores[i][j]),
        weight: fmt(weights[i][j]),
        sum: fmt(sum),
      });
      mark.setAttribute("x", left + j * cell);
      mark.setAttribute("y", top + i * cell);
      mark.setAttribute("visibility", "visible");
      if (formula) {
        const values = { score: fmt(scores[i][j]), softmax: fmt(weights[i][j]), sum: fmt(sum) };
        for (const span of formula.querySelectorAll("[data-term]")) {
          span.classList.add("live-term-active");
          span.dataset.value = values[span.dataset.term] ?? "";
        }
      }
    };
    const hide = () => {
      mark.setAttribute("visibility", "hidden");
      if (formula)
        for (const span of formula.querySelectorAll("[data-term]")) {
          span.classList.remove("live-term-active");
          delete span.dataset.value;
        }
    };
    svg.addEventListener("mousemove", (e) => {
      const r = e.target.closest?.("rect[data-i]");
      if (r) show(Number(r.dataset.i), Number(r.dataset.j));
    });
    svg.addEventListener("mouseleave", hide);
    frame.addEventListener("focus", () => show(...(at || [0, 0])));
    frame.addEventListener("blur", hide);
    frame.addEventListener("keydown", (e) => {
      const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
      const d = moves[e.key];
      if (!d) return;
      e.preventDefault();
      const [i, j] = at || [0, 0];
      show(Math.max(0, Math.min(nr - 1, i + d[0])), Math.max(0, Math.min(nc - 1, j + d[1])));
    });
    box.append(frame, tip);
  }

  function setResult(el, result) {
    el.dataset.liveResult = JSON.stringify(result);
    el.dataset.liveState = "ready";
  }

  // ------------------------------------------------------------------ runtime and files
  function liveRoot() {
    const meta = hasDOM && document.querySelector('meta[name="course-live-root"]');
    return new URL(meta ? meta.content : "_static/live/", document.baseURI).href;
  }
  const runtimeFolder = () => new URL("../vendor/onnxruntime/", liveRoot()).href;
  const RUNTIME_JS = "ort.wasm.bundle.min.mjs";
  const RUNTIME_WASM = "ort-wasm-simd-threaded.wasm";

  class Progress {
    constructor(onChange) {
      this.files = new Map();
      this.onChange = onChange;
    }
    start(url, total) {
      this.files.set(url, { loaded: 0, total });
      this.onChange(this);
    }
    add(url, n) {
      this.files.get(url).loaded += n;
      this.onChange(this);
    }
    get loaded() {
      return [...this.files.values()].reduce((a, f) => a + f.loaded, 0);
    }
    get total() {
      const fs = [...this.files.values()];
      if (fs.some((f) => !f.total || f.loaded > f.total)) return 0; // unknown (compressed)
      return fs.reduce((a, f) => a + f.total, 0);
    }
  }

  async function fetchBytes(url, progress) {
    const response = await fetch(url);
    if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
    const total = Number(response.headers.get("content-length")) || 0;
    progress.start(url, total);
    if (!response.body) {
      const bytes = new Uint8Array(await response.arrayBuffer());
      progress.add(url, bytes.length);
      return bytes;
    }
    const reader = response.body.getReader();
    const chunks = [];
    let n = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      chunks.push(value);
      n += value.length;
      progress.add(url, value.length);
    }
    const bytes = new Uint8Array(n);
    let o = 0;
    for (const c of chunks) {
      bytes.set(c, o);
      o += c.length;
    }
    return bytes;
  }

  let runtime = null; // Promise of the onnxruntime-web module, set up once a page
  function loadRuntime(progress) {
    if (!runtime) {
      runtime = (async () => {
        const folder = runtimeFolder();
        const [ort, wasm] = await Promise.all([
          import(folder + RUNTIME_JS),
          fetchBytes(folder + RUNTIME_WASM, progress),
        ]);
        ort.env.wasm.numThreads = 1; // no SharedArrayBuffer without COOP/COEP headers
        ort.env.wasm.proxy = false;
        // no wasmPaths: with it the bundle would fetch its (embedded) loader again; the
        // binary is handed over as bytes, fetched above with progress
        ort.env.wasm.wasmBinary = wasm;
        return ort;
      })();
      runtime.catch(() => {
        runtime = null; // a failed load can be tried again
      });
    }
    return runtime;
  }

  // ------------------------------------------------------------------ views
  const views = new WeakMap(); // container -> view object

  class LookupView {
    constructor(el, cfg) {
      this.el = el;
      this.cfg = cfg;
      // float32 numbers from the chapter (0.949999988...) shown and used as typed (0.95)
      const tidy = (x) => Number(Number(x).toPrecision(6));
      this.query = cfg.query.map(tidy);
      this.keys = cfg.keys.map((k) => k.map(tidy));
      this.build();
      this.compute();
    }

    numberInput(value, label, onInput) {
      const input = h("input", {
        type: "number",
        step: "0.1",
        value: String(value),
        "aria-label": label,
        class: "live-number",
      });
      input.addEventListener("input", () => {
        const x = input.valueAsNumber;
        input.setAttribute("aria-invalid", Number.isFinite(x) ? "false" : "true");
        if (Number.isFinite(x)) {
          onInput(x);
          this.compute();
        }
      });
      return input;
    }

    build() {
      const { cfg } = this;
      const d = cfg.query.length;
      const panel = h("div", { class: "live-panel" });
      panel.append(h("p", { class: "live-hint", text: say("lookupHint") }));
      panel.append(formulaElement());
      const table = h("table", { class: "live-lookup" });
      const head = h("tr", {}, h("td"));
      for (let j = 0; j < d; j++) head.append(h("th", { scope: "col", text: `d${j + 1}` }));
      head.append(
        h("th", { scope: "col", text: say("score") }),
        h("th", { scope: "col", text: say("weight") }),
        h("th", { scope: "col", text: say("value") }),
      );
      table.append(h("thead", {}, head));
      const body = h("tbody");
      const qrow = h("tr", { class: "live-query" }, h("th", { scope: "row", text: say("query") }));
      this.queryInputs = this.query.map((x, j) => {
        const input = this.numberInput(x, `${say("query")}, ${say("component", { i: j + 1 })}`, (v) => {
          this.query[j] = v;
        });
        qrow.append(h("td", {}, input));
        return input;
      });
      qrow.append(h("td"), h("td"), h("td"));
      body.append(qrow);
      this.cells = [];
      this.keyInputs = this.keys.map((k, i) => {
        const name = `${say("key")} ${cfg.key_labels[i]}`;
        const row = h("tr", {}, h("th", { scope: "row", text: name }));
        const inputs = k.map((x, j) => {
          const input = this.numberInput(x, `${name}, ${say("component", { i: j + 1 })}`, (v) => {
            this.keys[i][j] = v;
          });
          row.append(h("td", {}, input));
          return input;
        });
        const score = h("td", { class: "live-score" });
        const weight = h("td", { class: "live-weight" });
        const value = h("td", { class: "live-value", text: cfg.values[i].map(fmt).join(", ") });
        row.append(score, weight, value);
        this.cells.push({ score, weight });
        body.append(row);
        return inputs;
      });
      table.append(body);
      panel.append(h("div", { class: "live-table" }, table));
      this.outputEl = h("p", { class: "live-output", role: "status", "aria-live": "polite" });
      panel.append(this.outputEl);
      this.mapBox = h("div", { class: "live-map-box" });
      panel.append(this.mapBox);
      this.el.append(panel);
      this.el.classList.add("live-active");
    }

    compute() {
      const { cfg } = this;
      const r = lookup(this.query, this.keys, cfg.values, cfg.scale);
      r.scores.forEach((sc, i) => {
        this.cells[i].score.textContent = fmt(sc);
        this.cells[i].weight.textContent = fmt(r.weights[i]);
      });
      this.outputEl.textContent = say("output", { out: r.output.map(fmt).join(", ") });
      heatmap(this.mapBox, {
        rows: [say("query")],
        cols: cfg.key_labels.map(String),
        weights: [r.weights],
        scores: [r.scores],
        label: say("lookupMap"),
      });
      const result = {
        query: this.query.slice(),
        keys: this.keys.map((k) => k.slice()),
        values: cfg.values,
        scale: cfg.scale,
        tokens: cfg.key_labels,
        weights: [r.weights],
        scores: [r.scores],
        output: r.output,
      };
      setResult(this.el, result);
      return result;
    }

    async run(input) {
      const given = typeof input === "string" ? JSON.parse(input) : input || {};
      if (given.query) {
        given.query.forEach((x, j) => {
          this.query[j] = x;
          this.queryInputs[j].value = String(x);
        });
      }
      if (given.keys) {
        given.keys.forEach((k, i) =>
          k.forEach((x, j) => {
            this.keys[i][j] = x;
            this.keyInputs[i][j].value = String(x);
          }),
        );
      }
      return this.compute();
    }
  }

  class ModelView {
    constructor(el, cfg, kind) {
      this.el = el;
      this.cfg = cfg;
      this.kind = kind;
      this.sessions = null;
      this.queue = Promise.resolve();
      this.last = null;
      this.buildLoader();
      el.dataset.liveState = "idle";
    }

    files() {
      const c = this.cfg;
      return this.kind === "minilm" ? { encoder: c.model, vocab: c.vocab } : { encoder: c.encoder, decoder: c.decoder, vocab: c.vocab };
    }

    buildLoader() {
      const bytes = this.cfg.bytes;
      const label = bytes ? say("load", { mb: (bytes / 1e6).toFixed(1) }) : say("loadPlain");
      this.button = h("button", { type: "button", class: "live-load", text: label });
      this.progressEl = h("progress", { class: "live-progress", max: 1, value: 0, "aria-label": say("progress"), hidden: true });
      this.statusEl = h("p", { class: "live-status", role: "status", "aria-live": "polite" });
      this.loader = h("div", { class: "live-loader" }, this.button, this.progressEl, this.statusEl);
      this.button.addEventListener("click", () => this.load().catch(() => {}));
      this.el.append(this.loader);
    }

    async load() {
      if (this.sessions) return this.sessions;
      if (this.loading) return this.loading;
      this.loading = this.doLoad();
      try {
        return await this.loading;
      } finally {
        this.loading = null;
      }
    }

    async doLoad() {
      const el = this.el;
      el.dataset.liveState = "loading";
      this.button.disabled = true;
      this.progressEl.hidden = false;
      this.progressEl.removeAttribute("value");
      const started = performance.now();
      const progress = new Progress((p) => {
        const mb = (x) => (x / 1e6).toFixed(1);
        if (p.total) {
          this.progressEl.max = p.total;
          this.progressEl.value = p.loaded;
          this.statusEl.textContent = say("loading", { done: mb(p.loaded), total: mb(p.total) });
        } else {
          this.progressEl.removeAttribute("value");
          this.statusEl.textContent = say("loadingSome", { done: mb(p.loaded) });
        }
      });
      try {
        const root = liveRoot();
        const files = this.files();
        const names = Object.keys(files);
        const [ort, ...blobs] = await Promise.all([
          loadRuntime(progress),
          ...names.map((n) => fetchBytes(new URL(files[n], root).href, progress)),
        ]);
        const got = Object.fromEntries(names.map((n, i) => [n, blobs[i]]));
        this.vocab = JSON.parse(new TextDecoder().decode(got.vocab));
        this.statusEl.textContent = say("starting");
        const options = { executionProviders: ["wasm"], graphOptimizationLevel: "all" };
        const sessions = { ort };
        for (const n of names) if (n !== "vocab") sessions[n] = await ort.InferenceSession.create(got[n], options);
        this.sessions = sessions;
        this.loadSeconds = (performance.now() - started) / 1000;
        this.bytesLoaded = progress.loaded;
        el.dataset.liveLoadSeconds = this.loadSeconds.toFixed(3);
        el.dataset.liveBytes = String(progress.loaded);
        this.loader.hidden = true;
        this.buildControls();
        await this.enqueue(this.input.value);
        return sessions;
      } catch (err) {
        el.dataset.liveState = "error";
        this.button.disabled = false;
        this.button.textContent = say("retry");
        this.progressEl.hidden = true;
        this.statusEl.textContent = say("failed", { error: err && err.message ? err.message : String(err) });
        throw err;
      }
    }

    buildControls() {
      const c = this.cfg;
      const panel = h("div", { class: "live-panel" });
      const inputId = nextId("text");
      this.input = h("input", {
        type: "text",
        id: inputId,
        class: "live-text",
        value: c.example || "",
        autocomplete: "off",
        spellcheck: "false",
      });
      const select = (key, n) => {
        const id = nextId(key);
        const sel = h("select", { id, class: "live-select" });
        for (let i = 0; i < n; i++) sel.append(h("option", { value: i, text: String(i) }));
        return [h("label", { for: id, text: say(key) }), sel];
      };
      const [layerLabel, layer] = select("layer", c.n_layers);
      const [headLabel, headSel] = select("head", c.n_heads);
      layer.value = String(c.n_layers - 1);
      this.layerSel = layer;
      this.headSel = headSel;
      const row = h(
        "div",
        { class: "live-controls" },
        h("label", { for: inputId, text: say(this.kind === "minilm" ? "sentence" : "number") }),
        this.input,
        h("span", { class: "live-pick" }, layerLabel, layer),
        h("span", { class: "live-pick" }, headLabel, headSel),
      );
      panel.append(row);
      this.messageEl = h("p", { class: "live-status", role: "status", "aria-live": "polite" });
      panel.append(this.messageEl);
      if (this.kind === "translator") {
        this.germanEl = h("output", { class: "live-german", for: inputId });
        panel.append(h("p", { class: "live-german-line" }, h("span", { text: `${say("german")}: ` }), this.germanEl));
      }
      panel.append(formulaElement());
      this.mapBox = h("div", { class: "live-map-box" });
      panel.append(this.mapBox);
      this.el.append(panel);
      this.el.classList.add("live-active");
      let timer = null;
      this.input.addEventListener("input", () => {
        clearTimeout(timer);
        timer = setTimeout(() => this.enqueue(this.input.value).catch(() => {}), 250);
      });
      const redraw = () => this.redraw();
      layer.addEventListener("change", redraw);
      headSel.addEventListener("change", redraw);
    }

    pick() {
      return [Number(this.layerSel.value), Number(this.headSel.value)];
    }

    enqueue(text, options = {}) {
      const job = this.queue.then(() => this.compute(text, options));
      this.queue = job.catch(() => {});
      return job;
    }

    async compute(text, options) {
      if (options.layer !== undefined) this.layerSel.value = String(options.layer);
      if (options.head !== undefined) this.headSel.value = String(options.head);
      this.el.dataset.liveState = "loading";
      this.messageEl.textContent = say("computing");
      const t0 = performance.now();
      const result = this.kind === "minilm" ? await this.runMiniLM(text) : await this.runTranslator(text);
      result.seconds = (performance.now() - t0) / 1000;
      this.last = result;
      return this.redraw();
    }

    tensor(ids) {
      const { ort } = this.sessions;
      return new ort.Tensor("int64", BigInt64Array.from(ids, (i) => BigInt(i)), [1, ids.length]);
    }

    async runMiniLM(text) {
      if (!text.trim()) return { text, error: say("empty"), tokens: [], ids: [] };
      const tok = tokenizeWordPiece(text, { ...this.vocab, max_length: this.cfg.max_len });
      const out = await this.sessions.encoder.run({ input_ids: this.tensor(tok.ids) });
      return {
        text,
        tokens: tok.tokens,
        ids: tok.ids,
        truncated: tok.truncated,
        maps: { weights: out.attentions, scores: out.scores },
        rows: tok.tokens,
        cols: tok.tokens,
      };
    }

    async runTranslator(text) {
      const c = this.cfg;
      const { encoder, decoder } = this.sessions;
      const tok = tokenizeTranslator(text, this.vocab);
      const base = { text, tokens: tok.tokens, ids: tok.ids };
      if (!text.trim()) return { ...base, error: say("empty") };
      if (tok.unknown.length) return { ...base, error: say("unknown", { words: tok.unknown.map((w) => `\u201c${w.replace(/^\u2581/, "")}\u201d`).join(", ") }) };
      const most = c.max_src_len || c.max_len;
      if (tok.ids.length > most) return { ...base, error: say("tooLong", { n: tok.ids.length, max: most }) };
      const src = this.tensor(tok.ids);
      const feeds = (names, all) => Object.fromEntries(names.filter((n) => n in all).map((n) => [n, all[n]]));
      const enc = await encoder.run(feeds(encoder.inputNames, { src_ids: src }));
      const memory = enc.memory;
      const prefix = [c.bos_id];
      const outputIds = [];
      const steps = [];
      let last = null;
      const tgtVocab = tokensOf(this.vocab.tgt || this.vocab);
      const stepTimes = [];
      for (let step = 0; step < c.max_len; step++) { // max_len: the most new tokens
        const t0 = performance.now();
        const out = await decoder.run(feeds(decoder.inputNames, { src_ids: src, memory, tgt_ids: this.tensor(prefix) }));
        const [, T, V] = out.logits.dims;
        const row = out.logits.data.subarray((T - 1) * V, T * V);
        let best = -1;
        let bestValue = -Infinity;
        for (let v = 0; v < V; v++) {
          if (v === c.pad_id) continue; // padding is never a next token (decoding.greedy_decode)
          if (row[v] > bestValue) {
            bestValue = row[v];
            best = v;
          }
        }
        stepTimes.push((performance.now() - t0) / 1000);
        last = { out, prefix: prefix.slice() };
        steps.push(tgtVocab[best] ?? String(best));
        if (best === c.eos_id) break;
        outputIds.push(best);
        prefix.push(best);
        // show the German so far, one token a frame
        this.germanEl.textContent = decodeTarget(outputIds, this.vocab);
        await new Promise((r) => setTimeout(r, 0));
      }
      const output = decodeTarget(outputIds, this.vocab);
      this.germanEl.textContent = output;
      return {
        ...base,
        output,
        output_ids: outputIds,
        prefix: last.prefix,
        step_seconds: stepTimes,
        maps: { weights: last.out.cross_attentions, scores: last.out.cross_scores },
        rows: steps,
        cols: tok.tokens,
      };
    }

    redraw() {
      const r = this.last;
      if (!r) return null;
      const [l, hd] = this.pick();
      const result = { ...r, layer: l, head: hd };
      delete result.maps;
      delete result.rows;
      delete result.cols;
      if (r.error) {
        this.messageEl.textContent = r.error;
        this.mapBox.replaceChildren();
        if (this.germanEl) this.germanEl.textContent = "";
        this.el.dataset.liveResult = JSON.stringify(result);
        this.el.dataset.liveState = "error";
        return result;
      }
      result.weights = headMatrix(r.maps.weights, l, hd);
      result.scores = r.maps.scores ? headMatrix(r.maps.scores, l, hd) : null;
      const n = this.kind === "minilm" ? r.tokens.length : r.output_ids.length;
      let msg = say(this.kind === "minilm" ? "ready" : "readyTranslator", { n });
      if (r.truncated) msg += ` ${say("truncated", { n: r.tokens.length })}`;
      this.messageEl.textContent = msg;
      heatmap(this.mapBox, {
        rows: r.rows,
        cols: r.cols,
        weights: result.weights,
        scores: result.scores || result.weights.map((row) => row.map(() => NaN)),
        label: say(this.kind === "minilm" ? "selfMap" : "crossMap", { l, h: hd }),
      });
      setResult(this.el, result);
      return result;
    }

    async run(text, options = {}) {
      await this.load();
      this.input.value = text;
      return this.enqueue(text, options);
    }
  }

  function setUp(el) {
    if (views.has(el)) return views.get(el);
    const kind = el.dataset.liveKind;
    let view = null;
    try {
      const cfg = JSON.parse(el.dataset.liveConfig || "{}");
      if (kind === "lookup") view = new LookupView(el, cfg);
      else if (kind === "minilm" || kind === "translator") view = new ModelView(el, cfg, kind);
    } catch (err) {
      el.dataset.liveState = "error";
      console.warn("live view:", err);
      return null;
    }
    if (view) views.set(el, view);
    return view;
  }

  /** Run a live view on `input` (a sentence; for "lookup", {query, keys}); loads the model
   * first if needed. Resolves to the result also written to data-live-result. */
  async function run(el, input, options) {
    const view = setUp(el);
    if (!view) throw new Error("run: not a live view");
    return view.run(input, options);
  }

  const api = { tokenize, tokenizeFull, decodeTarget, lookup, softmax, run, messages: MESSAGES };
  if (typeof module === "object" && module.exports) module.exports = api; // node unit checks
  if (!hasDOM) return;
  window.courseLive = api;
  const start = () => document.querySelectorAll(".live-view").forEach(setUp);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
