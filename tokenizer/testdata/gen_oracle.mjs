// gen_oracle.mjs builds the synthetic tokenizer.json fixtures in this directory and records the
// ids that the reference JavaScript tokenizer (npm @huggingface/tokenizers 0.2.0) produces for a
// set of tricky strings. The Go tests compare package tokenizer against oracle.json.
//
// Regenerate (from the repository root; node_modules stay outside the repository):
//   npm install --prefix /tmp/tokoracle @huggingface/tokenizers@0.2.0
//   TOKENIZERS_JS=/tmp/tokoracle/node_modules/@huggingface/tokenizers/dist/tokenizers.mjs \
//     node tokenizer/testdata/gen_oracle.mjs
import { writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const { Tokenizer } = await import(process.env.TOKENIZERS_JS ?? "@huggingface/tokenizers");
const here = dirname(fileURLToPath(import.meta.url));

// Text the merges are learned from: prose, code, numbers, a little non-ASCII.
const corpus = `
The quick brown fox jumps over the lazy dog. It's a well-known sentence; they'll say it's the one
that uses every letter. We're going to tokenize it, and we'd better get the contractions right:
I'm, you've, she'd, they'll, it's, DON'T, WON'T, I'VE.
def tokenize(text):
    """Split text into tokens."""
    for word in text.split():
        if word.startswith("the"):
            yield word.lower()
        else:
            yield word  # keep it
class Model(object):
    def __init__(self, hidden_size=4096, num_layers=32):
        self.hidden_size = hidden_size
        self.layers = [Layer(i) for i in range(num_layers)]
In 2024 there were 1,234,567 downloads and 3.14159 percent of them were 100% reproducible.
Numbers like 42, 1000, 65536 and 2048 appear often; so do dates like 2026-11-21.
Le café était naïf; the résumé was über-long. Straße, façade, jalapeño, coöperate.
    indented lines		with tabs
and blank lines follow


The end. The end? The end!
`.repeat(3);

const tricky = [
  "Hello world",
  "Hello, world! How's it going? I'm fine; we'll see, they'd've known.",
  "DON'T SHOUT, IT'S RUDE. 'S 'T 'RE 'VE 'M 'LL 'D",
  "  two leading spaces",
  "trailing spaces   ",
  "multiple    inner     spaces",
  "\t\ttabs\tand\nnewlines\n\n\nblank lines\r\nwindows\r\n",
  "numbers 1234567 3.14159 1,000,000 2026-11-21 ٣٤٥ ①② ½",
  "unicode: café naïve résumé Ünïcödé Straße ﬁ ﬀ",
  "CJK: 日本語のテキスト 中文 한국어",
  "emoji: 👋🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🤖",
  "code: def f(x):\n    return x**2  # comment\n",
  "<|begin_of_text|>special<|end_of_text|> tokens <|eot_id|>\n",
  "<s>hello</s> <s> world",
  " ",
  "\n",
  "a",
  "nbsp\u00a0em\u2003ideographic\u3000space",
  "zero\u200bwidth\u200djoiner",
  "ΣΊΣΥΦΟΣ Όσος",
  "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ x² ³√",
  "hello <mask> world [SEP]   next HELLO there",
  "xyzzy is a magic word, xyzzy!",
  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "!!!???...---***   ",
  "control \u0001\u0002 chars \u007f end",
  "The quick brown fox jumps over the lazy dog.",
];

// GPT-2's map from bytes to printable characters.
function bytesToUnicode() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n);
      n++;
    }
  }
  const map = new Array(256);
  bs.forEach((b, i) => (map[b] = String.fromCodePoint(cs[i])));
  return map;
}
const byteChars = bytesToUnicode();
const byteLevel = (s) => Array.from(new TextEncoder().encode(s), (b) => byteChars[b]).join("");

// trainMerges learns BPE merges from weighted words (arrays of symbols): repeatedly merge the most
// frequent adjacent pair (ties broken by the pair's text, so the result is deterministic).
function trainMerges(words, count) {
  const merges = [];
  let ws = [...words.entries()].map(([w, n]) => ({ syms: Array.from(w), n }));
  for (let k = 0; k < count; k++) {
    const freq = new Map();
    for (const { syms, n } of ws)
      for (let i = 0; i + 1 < syms.length; i++) {
        const key = syms[i] + "\u0000" + syms[i + 1];
        freq.set(key, (freq.get(key) ?? 0) + n);
      }
    let best = null;
    for (const [key, n] of freq)
      if (best === null || n > best[1] || (n === best[1] && key < best[0])) best = [key, n];
    if (best === null || best[1] < 2) break;
    const [a, b] = best[0].split("\u0000");
    merges.push([a, b]);
    for (const w of ws) {
      const out = [];
      for (let i = 0; i < w.syms.length; i++) {
        if (i + 1 < w.syms.length && w.syms[i] === a && w.syms[i + 1] === b) {
          out.push(a + b);
          i++;
        } else out.push(w.syms[i]);
      }
      w.syms = out;
    }
  }
  return merges;
}

function countWords(pieces) {
  const words = new Map();
  for (const p of pieces) words.set(p, (words.get(p) ?? 0) + 1);
  return words;
}

const llama3Pattern =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// The same pattern in JavaScript syntax, for training only.
const llama3JS =
  /'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;

function byteLevelVocab(merges, extra) {
  const vocab = {};
  byteChars.forEach((c) => (vocab[c] = Object.keys(vocab).length));
  for (const [a, b] of merges) if (!(a + b in vocab)) vocab[a + b] = Object.keys(vocab).length;
  for (const t of extra) if (!(t in vocab)) vocab[t] = Object.keys(vocab).length;
  return vocab;
}

function addedToken(id, content, opts = {}) {
  return {
    id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true, ...opts,
  };
}

function bpeModel(vocab, merges, opts = {}) {
  return {
    type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges, ...opts,
  };
}

function template(bos, bosID) {
  return {
    type: "TemplateProcessing",
    single: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
    pair: [
      { SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
      { SpecialToken: { id: bos, type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } },
    ],
    special_tokens: { [bos]: { id: bos, ids: [bosID], tokens: [bos] } },
  };
}

// Llama-3 style: lookahead Split regex, then ByteLevel without its own regex; merges as pairs;
// ignore_merges; "Ġxyzzy" is in the vocab but no merge builds it.
const byteWords = countWords((corpus + tricky.join(" ")).match(llama3JS).map(byteLevel));
const byteMerges = trainMerges(byteWords, 400);
const llama3Vocab = byteLevelVocab(byteMerges, ["Ġxyzzy"]);
const n3 = Object.keys(llama3Vocab).length;
const llama3 = {
  version: "1.0", truncation: null, padding: null,
  added_tokens: [
    addedToken(n3, "<|begin_of_text|>"), addedToken(n3 + 1, "<|end_of_text|>"), addedToken(n3 + 2, "<|eot_id|>"),
  ],
  normalizer: null,
  pre_tokenizer: {
    type: "Sequence",
    pretokenizers: [
      { type: "Split", pattern: { Regex: llama3Pattern }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  },
  post_processor: {
    type: "Sequence",
    processors: [{ type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true }, template("<|begin_of_text|>", n3)],
  },
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: bpeModel(llama3Vocab, byteMerges, { ignore_merges: true }),
};

// GPT-2 style with extras: NFKC + Lowercase, individual digits, ByteLevel with its GPT-2 regex and
// a prefix space; merges as "a b" strings; added tokens with lstrip/rstrip and a normalized one.
const gpt2Vocab = byteLevelVocab(byteMerges, []);
const n2 = Object.keys(gpt2Vocab).length;
const gpt2 = {
  version: "1.0", truncation: null, padding: null,
  added_tokens: [
    addedToken(n2, "<|endoftext|>"),
    addedToken(n2 + 1, "<mask>", { lstrip: true }),
    addedToken(n2 + 2, "[SEP]", { rstrip: true }),
    addedToken(n2 + 3, "HELLO", { normalized: true, special: false }),
  ],
  normalizer: { type: "Sequence", normalizers: [{ type: "NFKC" }, { type: "Lowercase" }] },
  pre_tokenizer: {
    type: "Sequence",
    pretokenizers: [
      { type: "Digits", individual_digits: true },
      { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    ],
  },
  post_processor: template("<|endoftext|>", n2),
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: bpeModel(gpt2Vocab, byteMerges.map(([a, b]) => `${a} ${b}`)),
};

// SentencePiece-style BPE (Llama-2, Mistral): "▁" for spaces, byte fallback for characters outside
// the vocab (the corpus has no CJK or emoji), unk fused. The vocab holds the corpus characters.
const spmText = corpus.replaceAll(" ", "▁");
const spmWords = countWords(spmText.split(/(?=▁)/u));
const spmMerges = trainMerges(spmWords, 300);
const spmVocab = { "<unk>": 0, "<s>": 1, "</s>": 2 };
for (let b = 0; b < 256; b++) spmVocab[`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`] = 3 + b;
for (const c of [...new Set(Array.from(spmText))].sort()) if (!(c in spmVocab)) spmVocab[c] = Object.keys(spmVocab).length;
for (const [a, b] of spmMerges) if (!(a + b in spmVocab)) spmVocab[a + b] = Object.keys(spmVocab).length;
const spmAdded = [addedToken(0, "<unk>"), addedToken(1, "<s>"), addedToken(2, "</s>")];
const spmModel = bpeModel(spmVocab, spmMerges.map(([a, b]) => `${a} ${b}`), {
  unk_token: "<unk>", fuse_unk: true, byte_fallback: true,
});

// Llama-2 as converted by recent transformers: Prepend + Replace normalizer, no pre-tokenizer.
const spmPrepend = {
  version: "1.0", truncation: null, padding: null, added_tokens: spmAdded,
  normalizer: {
    type: "Sequence",
    normalizers: [{ type: "Prepend", prepend: "▁" }, { type: "Replace", pattern: { String: " " }, content: "▁" }],
  },
  pre_tokenizer: null,
  post_processor: template("<s>", 1),
  decoder: {
    type: "Sequence",
    decoders: [
      { type: "Replace", pattern: { String: "▁" }, content: " " },
      { type: "ByteFallback" }, { type: "Fuse" },
      { type: "Strip", content: " ", start: 1, stop: 0 },
    ],
  },
  model: spmModel,
};

// Mistral / legacy style: a Metaspace pre-tokenizer that prepends "▁" only at the start of the text.
const spmMetaspace = {
  ...spmPrepend,
  normalizer: null,
  pre_tokenizer: { type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: false },
  decoder: {
    type: "Sequence",
    decoders: [{ type: "ByteFallback" }, { type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: false }, { type: "Fuse" }],
  },
};

const fixtures = { llama3, gpt2_extras: gpt2, spm_prepend: spmPrepend, spm_metaspace: spmMetaspace };
const oracle = {
  generator: "npm @huggingface/tokenizers 0.2.0 via gen_oracle.mjs",
  fixtures: {},
};
for (const [name, json] of Object.entries(fixtures)) {
  writeFileSync(join(here, `${name}.json`), JSON.stringify(json, null, 1) + "\n");
  const tok = new Tokenizer(json, {});
  const cases = tricky.map((text) => {
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    const withSpecial = tok.encode(text, { add_special_tokens: true }).ids;
    const decoded = ids.length ? tok.decode(ids, { clean_up_tokenization_spaces: false }) : "";
    return { text, ids, ids_special: withSpecial, decoded };
  });
  oracle.fixtures[name] = cases;
  console.log(`${name}: vocab ${Object.keys(json.model.vocab).length}, merges ${json.model.merges.length}`);
}
writeFileSync(join(here, "oracle.json"), JSON.stringify(oracle, null, 1) + "\n");
