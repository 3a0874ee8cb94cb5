// Writes tests/data/tokenizer/reference.json: the token ids of every corpus case, computed by
// @lenml/tokenizers (a JavaScript port of Hugging Face tokenizers, from transformers.js) on Qwen3's
// tokenizer.json, for two pre-tokenizer regexes (qwen2, qwen35) x two modes (special, plain).
//
//   node tools/tokenizer/make_reference.mjs [PATH/tokenizer.json]
//
// Without an argument it runs tools/tokenizer/fetch for the path. Needs `npm install` in
// tools/tokenizer first (see README.md). Every assumption the output rests on is asserted here;
// a failed one stops the script without writing anything.

import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(HERE, "../..");
const CORPUS = path.join(REPO, "tests/data/tokenizer/corpus.json");
const OUT = path.join(REPO, "tests/data/tokenizer/reference.json");
const MAX_PIECES_TEXT = 20000; // pieces are stored for every text case but the long mixed one

// Qwen3.5's Split regex (Rust/Oniguruma syntax, as HF tokenizers reads it). Qwen2's comes from the file.
const QWEN35_REGEX =
  "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}" +
  "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2_CONTRACTIONS = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
// The same alternatives without (?i:), which JS cannot scope to a group. Case-insensitive 's also
// matches U+017F LATIN SMALL LETTER LONG S (its simple case folding is 's'); no other letter folds
// onto t, r, e, v, m, l or d.
const QWEN2_CONTRACTIONS_JS = "(?:'[sS\\u017f]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";

function fail(message) {
  console.error(`make_reference: ${message}`);
  process.exit(1);
}

function check(condition, message) {
  if (!condition) fail(message);
}

async function loadLibrary() {
  try {
    return await import("@lenml/tokenizers");
  } catch (e) {
    fail(`cannot load @lenml/tokenizers (${e.code ?? e.message}); run: (cd tools/tokenizer && npm install --no-package-lock)`);
  }
}

function tokenizerJsonPath() {
  if (process.argv[2]) return path.resolve(process.argv[2]);
  return execFileSync(path.join(HERE, "fetch"), { encoding: "utf8" }).trim();
}

// ------------------------------------------------------------------------------------------------
// Regexes: HF tokenizers compiles the pattern with Oniguruma, whose \s is Unicode White_Space
// (U+0085 in, U+FEFF out); JS's \s differs on both. So the pattern handed to the library spells
// \s as \p{White_Space}, and (?i:...) as explicit alternatives: the same language, JS syntax.

function patternForJs(pattern) {
  let p = pattern.replace(QWEN2_CONTRACTIONS, QWEN2_CONTRACTIONS_JS);
  check(!p.includes("(?i"), `pattern has a (?i flag this script cannot translate: ${pattern}`);
  let out = "";
  let inClass = false;
  for (let i = 0; i < p.length; ++i) {
    const c = p[i];
    if (c === "\\") {
      const pair = p.slice(i, i + 2);
      ++i;
      if (pair === "\\s") out += inClass ? "\\p{White_Space}" : "[\\p{White_Space}]";
      else if (pair === "\\S") {
        check(!inClass, "\\S inside a character class is not translated");
        out += "\\P{White_Space}";
      } else out += pair;
      continue;
    }
    if (c === "[" && !inClass) inClass = true;
    else if (c === "]" && inClass) inClass = false;
    out += c;
  }
  return out;
}

function withSplitRegex(tokenizerJson, regex) {
  const copy = structuredClone(tokenizerJson);
  const splits = copy.pre_tokenizer.pretokenizers.filter((p) => p.type === "Split");
  check(splits.length === 1, "expected exactly one Split pre-tokenizer");
  splits[0].pattern = { Regex: regex };
  return copy;
}

function withoutSpecialAddedTokens(tokenizerJson) {
  const copy = structuredClone(tokenizerJson);
  copy.added_tokens = copy.added_tokens.filter((t) => !t.special);
  return copy;
}

// ------------------------------------------------------------------------------------------------
// Byte-level BPE maps each byte to a printable character (GPT-2's table: the printable Latin-1
// bytes map to themselves, the other 68 to U+0100 upwards in byte order); the vocab has a token
// for each of the 256.

function byteCharTable() {
  const printable = (b) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const table = [];
  let next = 0x100;
  for (let b = 0; b < 256; ++b) table.push(String.fromCodePoint(printable(b) ? b : next++));
  return table;
}

function byteTokenIds(vocab) {
  const ids = byteCharTable().map((ch) => vocab[ch]);
  check(ids.every(Number.isInteger), "the vocab lacks a byte-level token");
  check(new Set(ids).size === 256, "byte-level tokens are not 256 distinct ids");
  return ids;
}

// ------------------------------------------------------------------------------------------------
// Invalid UTF-8: the bytes are cut into valid runs and maximal invalid subparts (Unicode ch. 3,
// "U+FFFD substitution of maximal subparts", what WHATWG's TextDecoder does).

function sequenceEnd(bytes, i) {
  // Returns the end of a well-formed sequence starting at i, or -(end of its maximal subpart).
  const b = bytes[i];
  if (b < 0x80) return i + 1;
  let need, lo = 0x80, hi = 0xbf;
  if (b >= 0xc2 && b <= 0xdf) need = 1;
  else if (b >= 0xe0 && b <= 0xef) { need = 2; if (b === 0xe0) lo = 0xa0; if (b === 0xed) hi = 0x9f; }
  else if (b >= 0xf0 && b <= 0xf4) { need = 3; if (b === 0xf0) lo = 0x90; if (b === 0xf4) hi = 0x8f; }
  else return -(i + 1);
  let j = i + 1;
  for (let k = 0; k < need; ++k, ++j) {
    const c = bytes[j];
    const ok = j < bytes.length && (k === 0 ? c >= lo && c <= hi : c >= 0x80 && c <= 0xbf);
    if (!ok) return -j;
  }
  return j;
}

function utf8Parts(bytes) {
  const parts = [];
  let i = 0;
  while (i < bytes.length) {
    let j = i;
    while (j < bytes.length && sequenceEnd(bytes, j) > 0) j = sequenceEnd(bytes, j);
    if (j > i) parts.push({ valid: true, bytes: bytes.subarray(i, j) });
    if (j < bytes.length) {
      const end = -sequenceEnd(bytes, j);
      parts.push({ valid: false, bytes: bytes.subarray(j, end) });
      j = end;
    }
    i = j;
  }
  return parts;
}

const strictDecoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const replacingDecoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

// ------------------------------------------------------------------------------------------------
// The text a tokenizer's decode must give back: NFC is applied to each stretch between recognised
// added tokens, never across one (HF normalizes after cutting out added tokens).

function nfcAroundAddedTokens(text, addedContents) {
  let out = "", plain = "";
  for (let i = 0; i < text.length; ) {
    const match = addedContents.filter((c) => text.startsWith(c, i)).sort((a, b) => b.length - a.length)[0];
    if (match) {
      out += plain.normalize("NFC") + match;
      plain = "";
      i += match.length;
    } else {
      plain += text[i++];
    }
  }
  return out + plain.normalize("NFC");
}

// The pre-tokenizer's pieces (special mode): added tokens whole, NFC stretches cut by the Split regex.
function pieces(tokenizer, text, addedContents) {
  const out = [];
  const split = tokenizer.pre_tokenizer.tokenizers[0];
  for (const stretch of tokenizer.added_tokens_splitter.split(text)) {
    if (addedContents.includes(stretch)) out.push(stretch);
    else out.push(...split.pre_tokenize_text(stretch.normalize("NFC")));
  }
  check(out.join("") === nfcAroundAddedTokens(text, addedContents), "pieces do not add up to the text");
  return out;
}

function decode(tokenizer, ids) {
  if (ids.length === 0) return "";
  return tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
}

// ------------------------------------------------------------------------------------------------

function buildTokenizers(lib, tokenizerJson, tokenizerConfig) {
  const shippedRegex = tokenizerJson.pre_tokenizer.pretokenizers.find((p) => p.type === "Split").pattern.Regex;
  check(shippedRegex.startsWith(QWEN2_CONTRACTIONS), "the shipped regex is not Qwen2's");
  const regexes = { qwen2: shippedRegex, qwen35: QWEN35_REGEX };
  const tokenizers = {};
  const libraryAsIs = {};
  for (const [variant, regex] of Object.entries(regexes)) {
    const js = patternForJs(regex);
    const json = withSplitRegex(tokenizerJson, js);
    const make = (j) => lib.TokenizerLoader.fromPreTrained({ tokenizerJSON: j, tokenizerConfig });
    tokenizers[variant] = { special: make(json), plain: make(withoutSpecialAddedTokens(json)) };
    for (const mode of ["special", "plain"]) {
      const used = tokenizers[variant][mode].pre_tokenizer.tokenizers[0].pattern;
      check(used.source === js && used.flags === "gu", `${variant}: the library does not use the given regex (${used})`);
    }
    // The library's own translation of the Rust regex, for the report only.
    libraryAsIs[variant] = make(withSplitRegex(tokenizerJson, regex));
  }
  return { regexes, tokenizers, libraryAsIs };
}

function encode(tokenizer, text) {
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  check(ids.every(Number.isInteger), `non-integer id (unknown token) in ${JSON.stringify(text.slice(0, 40))}`);
  return ids;
}

function referenceForText(t, text, addedBySpecial) {
  const ids = {};
  let decodedOk = true;
  for (const variant of ["qwen2", "qwen35"]) {
    ids[variant] = {};
    for (const mode of ["special", "plain"]) {
      ids[variant][mode] = encode(t.tokenizers[variant][mode], text);
      const expected = nfcAroundAddedTokens(text, addedBySpecial[mode]);
      if (decode(t.tokenizers[variant][mode], ids[variant][mode]) !== expected) decodedOk = false;
    }
  }
  return { ids, decodedOk };
}

function referenceForBytes(t, bytes, byteIds, addedBySpecial) {
  const parts = utf8Parts(bytes);
  const asText = (p) => strictDecoder.decode(p.bytes);
  check(replacingDecoder.decode(bytes) === parts.map((p) => (p.valid ? asText(p) : "\ufffd")).join(""),
    "the maximal-subpart split disagrees with TextDecoder");
  const ids = {};
  let decodedOk = true;
  for (const variant of ["qwen2", "qwen35"]) {
    ids[variant] = {};
    for (const mode of ["special", "plain"]) {
      const tok = t.tokenizers[variant][mode];
      ids[variant][mode] = parts.flatMap((p) =>
        p.valid ? encode(tok, asText(p)) : Array.from(p.bytes, (b) => byteIds[b]));
      const expected = parts.map((p) => (p.valid ? nfcAroundAddedTokens(asText(p), addedBySpecial[mode]) : "\ufffd"));
      if (decode(tok, ids[variant][mode]) !== expected.join("")) decodedOk = false;
    }
  }
  return { ids, decodedOk };
}

function sameIds(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function selfChecks(t, byteIds, tokenizerJson, library) {
  const special = t.tokenizers.qwen2.special, plain = t.tokenizers.qwen2.plain;
  // Byte table: ours against the library's, and against the encoding of single ASCII characters.
  const libraryTable = special.pre_tokenizer.tokenizers[1].byte_encoder;
  const ours = byteCharTable();
  for (let b = 0; b < 256; ++b) check(libraryTable[b] === ours[b], `byte table differs at ${b}`);
  for (let b = 0; b < 128; ++b) {
    check(sameIds(encode(plain, String.fromCharCode(b)), [byteIds[b]]), `byte ${b} does not encode to its byte token`);
  }
  // Plain mode: special added tokens are ordinary text, non-special ones are still recognised.
  const imStart = tokenizerJson.added_tokens.find((a) => a.content === "<|im_start|>").id;
  const think = tokenizerJson.added_tokens.find((a) => a.content === "<think>").id;
  check(sameIds(encode(special, "<|im_start|>"), [imStart]), "special mode does not recognise <|im_start|>");
  const plainIds = encode(plain, "<|im_start|>");
  check(plainIds.length > 1 && plainIds.every((id) => id < 151643), `plain mode gives ${plainIds} for <|im_start|>`);
  check(sameIds(encode(plain, "<think>"), [think]), "plain mode does not recognise <think>");
  // No BOS/EOS or post-processor tokens, even when asked for.
  for (const text of ["Hello world", "", "<|im_start|>x"]) {
    check(sameIds(special.encode(text, { add_special_tokens: true }), encode(special, text)), "the library adds tokens");
  }
  console.error(`${library}: byte table, plain/special modes and no-added-tokens checks passed`);
}

async function main() {
  const lib = await loadLibrary();
  const jsonPath = tokenizerJsonPath();
  const raw = fs.readFileSync(jsonPath);
  const tokenizerJson = JSON.parse(raw.toString("utf8"));
  const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(path.dirname(jsonPath), "tokenizer_config.json"), "utf8"));
  const libVersion = JSON.parse(fs.readFileSync(path.join(HERE, "node_modules/@lenml/tokenizers/package.json"), "utf8")).version;
  const pkgJson = path.resolve(path.dirname(jsonPath), "../package.json");
  const pkg = fs.existsSync(pkgJson) ? JSON.parse(fs.readFileSync(pkgJson, "utf8")) : { name: "?", version: "?" };
  const sha = createHash("sha256").update(raw).digest("hex");

  const t = buildTokenizers(lib, tokenizerJson, tokenizerConfig);
  const byteIds = byteTokenIds(tokenizerJson.model.vocab);
  const library = `@lenml/tokenizers ${libVersion}`;
  selfChecks(t, byteIds, tokenizerJson, library);
  const addedBySpecial = {
    special: tokenizerJson.added_tokens.map((a) => a.content),
    plain: tokenizerJson.added_tokens.filter((a) => !a.special).map((a) => a.content),
  };

  const corpus = JSON.parse(fs.readFileSync(CORPUS, "utf8")).cases;
  const cases = [];
  const stats = { variants: [], modes: [], decodeMismatch: [], libraryAsIs: [], pieces: [] };
  const start = Date.now();
  for (const c of corpus) {
    let r;
    if ("hex" in c) {
      r = referenceForBytes(t, Uint8Array.from(Buffer.from(c.hex, "hex")), byteIds, addedBySpecial);
    } else {
      check(c.text.isWellFormed(), `case ${c.name} has a lone surrogate`);
      r = referenceForText(t, c.text, addedBySpecial);
      for (const variant of ["qwen2", "qwen35"]) {
        if (!sameIds(encode(t.libraryAsIs[variant], c.text), r.ids[variant].special)) stats.libraryAsIs.push(`${variant}:${c.name}`);
      }
    }
    const entry = { name: c.name, ...r.ids, decoded_equals_nfc: r.decodedOk };
    if ("hex" in c) entry.composed = true;
    else {
      const nfc = nfcAroundAddedTokens(c.text, addedBySpecial.special);
      if (nfc !== c.text) entry.nfc = nfc;
      if (c.text.length <= MAX_PIECES_TEXT) {
        entry.pieces = {};
        for (const v of ["qwen2", "qwen35"]) entry.pieces[v] = pieces(t.tokenizers[v].special, c.text, addedBySpecial.special);
        if (JSON.stringify(entry.pieces.qwen2) !== JSON.stringify(entry.pieces.qwen35)) stats.pieces.push(c.name);
      }
    }
    cases.push(entry);
    if (!sameIds(r.ids.qwen2.special, r.ids.qwen35.special) || !sameIds(r.ids.qwen2.plain, r.ids.qwen35.plain)) stats.variants.push(c.name);
    if (!sameIds(r.ids.qwen2.special, r.ids.qwen2.plain) || !sameIds(r.ids.qwen35.special, r.ids.qwen35.plain)) stats.modes.push(c.name);
    if (!r.decodedOk) stats.decodeMismatch.push(c.name);
  }
  check(stats.variants.length > 0, "qwen2 and qwen35 never differ: the replaced regex is not in use");
  check(stats.modes.length > 0, "special and plain modes never differ");

  const doc = {
    source: `${library} (JS port of HF tokenizers, via transformers.js) on Node ${process.version} ` +
      `(Unicode ${process.versions.unicode}); tokenizer.json from ${pkg.name}@${pkg.version}, sha256 ${sha}`,
    about: "Written by tools/tokenizer/make_reference.mjs from corpus.json (same names, same order). " +
      "variant qwen2: the shipped Split regex; qwen35: Qwen3.5's (both in 'regex', Oniguruma syntax). " +
      "mode special: every added token is recognised in the text; plain: only added tokens with " +
      "special=false are (like split_special_tokens=True). No BOS/EOS. " +
      "decoded_equals_nfc: the library decodes each id list back to the input with NFC applied between " +
      "recognised added tokens (never across one). nfc: that text (special mode), when it differs from the input. " +
      "pieces (special mode; absent for composed and very long cases): the pre-tokenizer's output before " +
      "the byte-level mapping, added tokens whole. byte_token_ids[b]: the id of the byte-level token of byte b. " +
      "composed: the input is not valid UTF-8; its ids are the concatenation, in order, of the ids of each " +
      "valid run (tokenized on its own) and, for each byte of each maximal invalid subpart, byte_token_ids[byte].",
    regex: t.regexes,
    byte_token_ids: byteIds,
    cases,
  };
  // One line per top-level field and per case: diffs of a regenerated file stay readable.
  const head = Object.entries(doc).filter(([k]) => k !== "cases").map(([k, v]) => `${JSON.stringify(k)}: ${JSON.stringify(v)}`);
  const lines = cases.map((c) => "  " + JSON.stringify(c));
  fs.writeFileSync(OUT, `{\n${head.join(",\n")},\n"cases": [\n${lines.join(",\n")}\n]}\n`);
  JSON.parse(fs.readFileSync(OUT, "utf8"));

  const ms = Date.now() - start;
  console.log(`${path.relative(REPO, OUT)}: ${cases.length} cases, ${fs.statSync(OUT).size} bytes, ${ms} ms`);
  console.log(`qwen2 != qwen35: ids in ${stats.variants.length} cases, pieces in ${stats.pieces.length} cases; ` +
    `special != plain: ${stats.modes.length} cases`);
  console.log(`decode != NFC text: ${stats.decodeMismatch.length} cases ${stats.decodeMismatch.join(" ")}`);
  console.log(`library's own regex translation would differ on: ${stats.libraryAsIs.join(" ") || "none"}`);
}

await main();
