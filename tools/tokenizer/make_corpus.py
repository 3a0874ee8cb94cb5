#!/usr/bin/env python3
"""Write tests/data/tokenizer/corpus.json: the texts the tokenizer is checked on.

Every text is written here by hand (or built from the hand-written ones, for the long mixed case);
nothing is downloaded. Each case is {"name", "text"} or, for bytes that are not valid UTF-8,
{"name", "hex"}. Run:  python3 tools/tokenizer/make_corpus.py  (rewrites the same bytes every time).

Characters are kept to Unicode 14 or older: the C++ tokenizer, the JS reference and HF tokenizers
ship different Unicode versions, and a newer letter would be a letter to one and unassigned to another.
"""

import json
import pathlib
import sys
import unicodedata

REPO = pathlib.Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "data" / "tokenizer" / "corpus.json"
MIXED_TARGET_BYTES = 100_000


# ----------------------------------------------------------------------------------------------
# Prose and contractions

ENGLISH = [
    ("en_short", "Hello world"),
    ("en_sentence", "The quick brown fox jumps over the lazy dog."),
    ("en_paragraph",
     "When the engine loads a model, it reads the header first, then maps the tensors it needs. "
     "Nothing is copied until a layer asks for it; experts that are never routed to stay on disk. "
     "A well-behaved tokenizer, on the other hand, must be exact: one wrong merge and every logit "
     "after it is computed for a different prompt."),
    ("en_punctuation",
     "Wait... what?! \"Quoted,\" she said -- (parenthetical) [bracketed] {braced}; semi: colon. "
     "Ellipsis\u2026 em\u2014dash en\u2013dash \u201ccurly\u201d \u2018single\u2019 \u00abguillemets\u00bb "
     "#hashtag @mention $5 100% a&b a*b ~tilde~ `code` ^caret_ under_score back\\slash pipe|bar"),
    ("en_mixed_case", "iPhone eBay McDonald's NASA's GPU CUDA cuBLAS camelCaseWord snake_case_word SCREAMING_CASE"),
    ("en_leading_trailing_space", "  leading and trailing spaces   "),
    ("en_single_letters", "a b c d e f g h i j k l m n o p q r s t u v w x y z A B C X Y Z"),
    ("en_long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis " + "a" * 1000 + " " + "ab" * 300),
    ("en_repeated_punct", "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!! ????????? ........................ "
     + "-" * 120 + "\n" + "=" * 80 + "\n" + "*" * 33),
]

CONTRACTIONS = [
    ("contractions_lower", "I'm sure it's fine: we're here, you've seen it, they'll come, he'd know, don't worry."),
    ("contractions_upper", "I'M SURE IT'S FINE: WE'RE HERE, YOU'VE SEEN IT, THEY'LL COME, HE'D KNOW, DON'T WORRY."),
    ("contractions_mixed_case",
     "'s 'S 't 'T 're 'Re 'rE 'RE 've 'Ve 'vE 'VE 'm 'M 'll 'Ll 'lL 'LL 'd 'D"),
    ("contractions_glued",
     "it'sn't y'all'd've O'Neil rock'n'roll 'tis '90s 1990's x's 'sorry 'llama 'dance 'red 'vex 'mom "
     "'S' 'T' ''s '''ll can't'"),
    ("contractions_long_s", "it'\u017f it'ſtreet 'ſtreet' WHAT'ſUP x'ſs"),  # U+017F folds to s case-insensitively
    ("contractions_not_ascii_apostrophe", "it\u2019s we\u2019re I\u2019LL it\u02bcs it\uff07s"),
    ("contractions_after_space_digit", "the 's and 3'd and _'re and \n'll and \t've"),
]


# ----------------------------------------------------------------------------------------------
# Code

CODE = [
    ("code_cpp", r'''#include <cstdio>
#include <vector>

namespace lode::demo {

// Sums the squares of the values; empty input gives 0.
template <typename T>
T sum_of_squares(const std::vector<T>& values) {
    T total{};
    for (const T& v : values) total += v * v;
    return total;
}

}  // namespace lode::demo

int main(int argc, char** argv) {
    std::vector<double> xs{1.5, -2.25, 3e-4, 0x1p-3};
    if (argc > 1 && argv[1][0] == '-') return 1;
    std::printf("%.6f\n", lode::demo::sum_of_squares(xs));
    auto lambda = [&](int i) -> bool { return i % 2 == 0 && i != 0x7fffffff; };
    return lambda(argc) ? 0 : 2;
}
'''),
    ("code_python", '''#!/usr/bin/env python3
"""Count words in files given on the command line."""
import collections, sys


def count(paths: list[str]) -> collections.Counter:
    counts = collections.Counter()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                counts.update(w.lower() for w in line.split() if w.isalpha())
    return counts


if __name__ == "__main__":
    for word, n in count(sys.argv[1:]).most_common(10):
        print(f"{word:>20} {n:6d}")
\tprint('tab-indented line')  # not valid Python, but text is text
'''),
    ("code_rust", '''use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq)]
pub struct Token<'a> {
    pub text: &'a str,
    pub id: u32,
}

impl<'a> Token<'a> {
    pub fn new(text: &'a str, id: u32) -> Self { Self { text, id } }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut vocab: HashMap<&str, u32> = HashMap::new();
    vocab.insert("hello", 14990);
    let t = Token::new("hello", *vocab.get("hello").ok_or("missing")?);
    println!("{:?} {}", t, u64::MAX >> 3);
    Ok(())
}
'''),
    ("code_javascript", '''// @ts-check
'use strict';
const fs = require('node:fs');

async function* lines(path) {
  const text = await fs.promises.readFile(path, 'utf8');
  for (const line of text.split(/\\r?\\n/)) yield line.trimEnd();
}

export default class Cache extends Map {
  #limit = 128;
  get(key) { const v = super.get(key); if (v !== undefined) { super.delete(key); super.set(key, v); } return v; }
}

const arrow = (a, b = 2, ...rest) => a ?? b ?? rest?.[0] ?? `none: ${a}/${b}`;
console.log(arrow(null), 0.1 + 0.2 === 0.3, [1, 2, 3].map((x) => x ** 2));
'''),
    ("code_shell", '''#!/usr/bin/env bash
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
for f in "$here"/*.gguf; do
  [ -e "$f" ] || continue
  size=$(stat -c %s "$f")
  printf '%-40s %12d\\n' "$(basename "$f")" "$size"
done | sort -k2 -n >"${TMPDIR:-/tmp}/sizes.txt" 2>&1 && echo "ok: $?" || exit 3
cat <<'EOF' | grep -v '^#' | awk '{print $1}'
# comment
value  other
EOF
'''),
    ("code_json", '''{
  "name": "qwen3",
  "vocab_size": 151669,
  "rope_theta": 1e7,
  "layers": [ { "type": "linear_attention", "heads": 16 }, { "type": "full_attention", "heads": 32 } ],
  "tie_word_embeddings": false,
  "eos": null,
  "unicode": "caf\\u00e9 \\ud83d\\ude00",
  "nested": {"a": {"b": {"c": [[], {}, [[[]]]]}}}
}'''),
    ("code_html", '''<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>Test &amp; check</title>
<style>body { font: 14px/1.4 sans-serif; } .x::after { content: "\\201C"; }</style></head>
<body>
  <p class="note" data-id='42'>Hello&nbsp;world &lt;tag&gt; &#x1F600; &copy; 2024</p>
  <!-- a comment -->
  <script>document.querySelector("p").textContent += " <b>not bold</b>";</script>
</body>
</html>
'''),
    ("code_makefile_tabs", "all: lode\n\nlode: main.o util.o\n\t$(CXX) $(LDFLAGS) -o $@ $^\n\n%.o: %.cpp\n\t$(CXX) -c $(CXXFLAGS) $< -o $@\n\t\t@echo \"done\"\n"),
    ("code_diff",
     "diff --git a/src/x.cpp b/src/x.cpp\n--- a/src/x.cpp\n+++ b/src/x.cpp\n@@ -1,3 +1,4 @@\n"
     " int f() {\n-    return 1;\n+    // changed\n+    return 2;\n }\n"),
    ("code_sql_markdown",
     "| id | name  | score |\n|---:|:------|------:|\n|  1 | alice |  9.50 |\n\n"
     "```sql\nSELECT name, AVG(score) AS s FROM t WHERE id <> 3 GROUP BY name HAVING s >= 1.0e2;\n```\n"
     "$$\\sum_{i=1}^{n} x_i^2 \\leq \\frac{\\alpha}{\\beta}$$\n"),
    ("code_urls_ids",
     "https://example.com/path/to/file.tar.gz?query=1&x=%20y#frag user.name+tag@example.co.uk "
     "550e8400-e29b-41d4-a716-446655440000 sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 "
     "SGVsbG8sIFdvcmxkIQ== 0xDEADBEEF 127.0.0.1:8080 C:\\Users\\me\\file.txt ~/.config/lode/"),
]


# ----------------------------------------------------------------------------------------------
# Scripts other than Latin. Combining marks (\p{M}) matter: the qwen35 regex joins them to letters,
# the qwen2 regex does not.

SCRIPTS = [
    ("zh_simplified", "我们的模型在一张显卡上运行。每个词元只用到三十亿个参数，其余的专家留在内存里。今天天气很好，我们去公园散步吧！"),
    ("zh_traditional", "機器學習與自然語言處理：繁體中文測試，包括標點「引號」、『雙引號』和（括號）。"),
    ("zh_mixed_ascii", "Qwen3.5是一个混合专家模型（MoE），有256个专家，每次激活8个。GPU显存24GB就够了。"),
    ("ja_kana_kanji", "日本語のテキストです。ひらがな、カタカナ、漢字が混ざっています。東京都は晴れ、ｶﾀｶﾅ（半角）もあります。"),
    ("ja_dakuten_decomposed", "\u304b\u3099\u304d\u3099 \u30cf\u309a \u30db\u309a\u30fc\u30eb"),  # NFC composes to が ぎ パ ポ
    ("ko_hangul", "안녕하세요. 한국어 문장입니다. 토크나이저가 잘 작동하는지 확인합니다!"),
    ("ko_jamo_decomposed", "\u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af \u110b\u1175 \u1100\u1161"),  # NFC: 각 한글 이 가
    ("ar_harakat", "السَّلَامُ عَلَيْكُمْ وَرَحْمَةُ اللهِ. العربية تكتب من اليمين إلى اليسار، ١٢٣ ٤٥٦."),
    ("ar_plain", "مرحبا بالعالم! هذا نص عربي بدون تشكيل، مع أرقام 2024 وعلامات ترقيم؟"),
    ("he_niqqud", "שָׁלוֹם עוֹלָם! בְּרֵאשִׁית בָּרָא. עברית בלי ניקוד גם כן."),
    ("hi_devanagari", "नमस्ते दुनिया! हिन्दी में लिखा गया वाक्य। क्षत्रिय, प्रार्थना, द्वार, ज़िंदगी। १२३४५"),
    ("th_thai", "สวัสดีครับ ภาษาไทยไม่มีช่องว่างระหว่างคำ น้ำใจ ผู้ใหญ่ ที่นี่ ๑๒๓"),
    ("ta_tamil", "வணக்கம் உலகம்! தமிழ் எழுத்துக்கள் கூட்டெழுத்து."),
    ("vi_precomposed", "Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ, ế ề ể ễ ệ, ố ồ ổ ỗ ộ. Người Việt Nam rất thân thiện."),
    ("vi_decomposed", "Tie\u0302\u0301ng Vie\u0323\u0302t ngu\u031bo\u031b\u0300i"),  # NFC composes (and reorders)
    ("ru_cyrillic", "Съешь же ещё этих мягких французских булок, да выпей чаю. ЁЖИК в ТУМАНЕ; Й и\u0306."),
    ("uk_sr_cyrillic", "Ґанок, їжак, є; Ђорђе, Љубав, Њива, Џеп."),
    ("el_greek", "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. ΑΒΓΔ αβγδ ά έ ή ί ό ύ ώ ΐ ΰ; ς σ Σ. \u03b1\u0301 \u0386"),
    ("de_fr_es_pl_tr",
     "Grüße aus Köln, Straße. Ça va, garçon ? ¿Qué tal? ¡Olé! Zażółć gęślą jaźń. İstanbul ılık; ŞĞÇ."),
    ("my_burmese", "မြန်မာဘာသာစကား သည် မြန်မာနိုင်ငံ၏ ရုံးသုံးဘာသာစကား ဖြစ်သည်။"),
    ("km_khmer", "ភាសាខ្មែរ គឺជាភាសាកំណើតរបស់ជនជាតិខ្មែរ។"),
    ("bn_bengali", "আমি বাংলায় গান গাই। বাংলা ভাষা, ক্ষুদ্র।"),
    ("te_telugu", "తెలుగు భాష దక్షిణ భారతదేశంలో మాట్లాడతారు."),
    ("bo_tibetan", "བོད་ཡིག་ནི་བོད་ཀྱི་ཡི་གེ་ཡིན། སྒྲ་"),
    ("math_letters_astral", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐁𝐨𝐥𝐝 𝟏𝟐𝟑 𠀀𠀁 𐌰𐌱𐌲 (Gothic) 𓀀 𝄞"),
]

MARKS = [
    ("marks_zalgo", "Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0307l\u036e\u0312\u036bg\u030c\u0317"
     "\u035a\u031ao\u0319\u0314\u036e\u0307\u0350\u0307 t\u0336e\u0336x\u0336t\u0336 u\u0332n\u0332d\u0332"),
    ("marks_ipa", "t\u032a\u02b0 d\u032a n\u0329 \u014b\u030a \u0251\u0303 e\u031e \u0283\u02b7 k\u0361p"),
    ("marks_after_punct", "(\u0301abc) !\u0301\u0302x \"\u0300quoted\u0300\" 1\u0301\u03012 \u20dd\u20e0 _\u0301_"),
]

NFC = [
    ("nfc_e_acute", "cafe\u0301 re\u0301sume\u0301 E\u0301COLE"),
    ("nfc_reorder_marks", "q\u0307\u0323 a\u0301\u0323 a\u0323\u0301 o\u0308\u0304"),  # canonical reordering
    ("nfc_singletons", "\u212b \u2126 \u212a \u1fef"),  # Angstrom, Ohm, Kelvin, Greek varia: NFC replaces them
    ("nfc_cjk_compat", "\uf900\uf901 \ufa10 \U0002f800 \U0002fa1d"),  # CJK compatibility ideographs: NFC maps them
    ("nfc_not_nfkc", "\ufb01ne \u2460 \uff21\uff22\uff23 x\u00b2 \u00bd \u2163 \u3371"),  # NFC keeps these; NFKC would not
    ("nfc_mark_after_space", "a \u0301b \u0301 \u0300\u0300 !\u0301 1\u0301 \n\u0301x"),  # marks with no base letter
    ("nfc_mark_start", "\u0301\u0302abc"),
    ("nfc_hangul_mixed", "\uac00\u11a8 \u1100\u1161 \u1100\u1161\u11a8\u11a8 \u1100\u1100\u1161"),  # partly composable
]


# ----------------------------------------------------------------------------------------------
# Emoji (all from Unicode 13 or older)

EMOJI = [
    ("emoji_simple", "I love it 😀😂🤖🚀🔥 and 🍕!"),
    ("emoji_zwj", "family 👨\u200d👩\u200d👧\u200d👦 couple 👩\u200d❤\ufe0f\u200d👨 tech 👩\u200d💻 rainbow 🏳\ufe0f\u200d🌈"),
    ("emoji_skin_tones", "👍🏻 👍🏼 👍🏽 👍🏾 👍🏿 👋🏽hello 🧑🏾\u200d🚀"),
    ("emoji_flags", "🇯🇵🇺🇸🇩🇪🇫🇷 🇨🇳 🇰🇷 🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f"),
    ("emoji_keycaps", "1\ufe0f\u20e3 2\ufe0f\u20e3 #\ufe0f\u20e3 *\ufe0f\u20e3 0\u20e3 \u2764\ufe0f \u263a\ufe0e \u00a9\ufe0f"),
    ("emoji_in_words", "go🚀go 🚀123 abc😀def 😀's"),
]


# ----------------------------------------------------------------------------------------------
# Numbers

NUMBERS = [
    ("num_long_digits", "12345678901234567890 3141592653589793238462643383279502884197169399375105820974944"),
    ("num_formats", "3.14159 -2.5e-10 1,000,000 1.000.000,50 0.1+0.2=0.30000000000000004 $1,234.56 50% v1.2.3 2024-06-01T12:34:56Z"),
    ("num_other_scripts", "٠١٢٣٤٥٦٧٨٩ ۰۱۲۳ ०१२३४ ๐๑๒ １２３ ² ³ ½ ¾ Ⅻ ⅷ ① 〇 𝟗"),
    ("num_mixed_letters", "abc123def 4K 1080p x86_64 H200 sm_90a 0b1010 1st 2nd 3rd 42nd"),
]


# ----------------------------------------------------------------------------------------------
# Whitespace. Oniguruma's (HF tokenizers') \s is Unicode White_Space: it includes U+0085 and
# excludes U+FEFF, U+200B and U+001C..U+001F (JS's \s and Python's isspace differ on these).

WHITESPACE = [
    ("ws_spaces_runs", "a  b   c    d" + " " * 40 + "e" + " " * 7),
    ("ws_tabs", "\ta\t\tb\t\t\t\tc \t d\t \t"),
    ("ws_newlines", "line1\nline2\n\nline4\n\n\n\n\nline9\n"),
    ("ws_crlf", "line1\r\nline2\r\n\r\nline4\r\n\r\n\r\n\r\r\n\n\r end\r\n"),
    ("ws_mixed_runs", "x \n \n\n  \t\n\t  y   \n\n  z \t \r\n \t"),
    ("ws_only_spaces", "     "),
    ("ws_only_newline", "\n"),
    ("ws_only_crlf", "\r\n\r\n"),
    ("ws_only_mixed", " \t \n \t "),
    ("ws_trailing_newlines", "end of file\n\n\n"),
    ("ws_unicode_spaces", "a\u00a0b\u00a0\u00a0c \u00a0d\u3000e\u3000\u3000f\u2009g\u2003h\u202fi\u205fj\u1680k\u2028l\u2029m"),
    ("ws_nel_bom_zwsp", "a\u0085b \u0085\u0085c\ufeffd\ufeff\ufeff e\u200bf\u200b\u200b g\ufeff  \u0085  x \u0085\u0085\u0085 y."),
    ("ws_vt_ff_fs", "a\vb\fc\v\v d\x1ce\x1d\x1e\x1ff \x0b\x0c"),
    ("ws_indent_code", "def f():\n    if x:\n        return [\n            1,\n        ]\n    \n\n"),
]

CONTROL = [
    ("ctrl_chars", "nul\x00byte bell\x07 esc\x1b[31mred\x1b[0m del\x7f c1\x80\x9f"),
    ("ctrl_format_chars", "soft\u00adhyphen zw\u200cnj\u200djoin lrm\u200e rlm\u200f bidi\u202eoverride\u202c word\u2060joiner"),
    ("ctrl_private_replacement", "pua\ue000\uf8ff \U000f0000 repl\ufffd\ufffd"),
]


# ----------------------------------------------------------------------------------------------
# Text that looks like added tokens. Special ones (<|im_start|>, <|endoftext|>, ...) are
# recognised only in "special" mode; non-special ones (<think>, <tool_call>, ...) in both modes.

SPECIAL = [
    ("special_chat", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
    ("special_think", "<think>\nLet me think about it.\n</think>\n\nThe answer is 42."),
    ("special_tool_call",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
     "<tool_response>sunny</tool_response>"),
    ("special_glued", "word<|endoftext|>word end.<|endoftext|><|endoftext|>x<think>y</think>z</tool_call>tail"),
    ("special_near_misses", "<|im_start| <|im_start|| |im_start|> <|IM_START|> < think> <think > <|endoftext|"
     " <<|im_end|>> <|<|im_end|>|>"),
    ("special_all_added",
     "<|endoftext|><|im_start|><|im_end|><|object_ref_start|><|object_ref_end|><|box_start|><|box_end|>"
     "<|quad_start|><|quad_end|><|vision_start|><|vision_end|><|vision_pad|><|image_pad|><|video_pad|>"
     "<tool_call></tool_call><|fim_prefix|><|fim_middle|><|fim_suffix|><|fim_pad|><|repo_name|>"
     "<|file_sep|><tool_response></tool_response><think></think>"),
    ("special_with_spaces", " <|im_start|> system \n You are helpful. <|im_end|> \n <think> </think> "),
    ("special_with_nfc", "cafe\u0301<|im_end|>e\u0301<think>\u0301x"),  # NFC must not cross an added token
    # NFC would turn ">" + U+0338 into U+226F, but HF normalizes only between recognised added tokens.
    ("special_nfc_across_added", "a<think>\u0338b</think>\u0338 <|im_end|>\u0338 x>\u0338 =\u0338 <\u0338"),
    ("special_full_conversation",
     "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
     "<|im_start|>user\nWhat's 2+2? Answer in 中文 please 🙂<|im_end|>\n"
     "<|im_start|>assistant\n<think>\nThe user asks 2+2 = 4, answer in Chinese.\n</think>\n\n"
     "二加二等于四。<|im_end|>\n<|im_start|>user\n<tool_response>\n{\"ok\": true}\n</tool_response><|im_end|>\n"),
]


# ----------------------------------------------------------------------------------------------
# Invalid UTF-8: stored as exact bytes. The reference tokenizes the valid runs between invalid
# bytes and gives each invalid byte its byte-level token (see README).

INVALID = [
    ("invalid_lone_ff", b"abc\xffdef \xff\xfe"),
    ("invalid_truncated_3byte", "中文".encode() + b"\xe4\xb8" + b" abc \xe4\xb8" + "中".encode() + b"\xe4"),
    ("invalid_overlong", b"slash \xc0\xaf and nul \xc0\x80 and \xe0\x80\xaf end"),
    ("invalid_lone_continuation", b"\x80start mid\x80\x81\xbfdle end\xbf"),
    ("invalid_surrogate", b"high \xed\xa0\x80 low \xed\xbf\xbf pair \xed\xa0\xbd\xed\xb8\x80 ok \xed\x9f\xbf"),
    ("invalid_mixed_special", b"<|im_start|>user\n\xf0\x9f\x98<|im_end|>\xf4\x90\x80\x80 \xf8\x88\x80\x80\x80 cafe\xcc"),
]


# ----------------------------------------------------------------------------------------------

def mixed_text(cases, target_bytes):
    """Concatenates the other texts in a fixed pseudo-random order until target_bytes is reached."""
    texts = [c["text"] for c in cases if "text" in c and c["text"]]
    state = 20240601
    parts, size = [], 0
    while size < target_bytes:
        state = (state * 1103515245 + 12345) % (1 << 31)  # a plain LCG: the same on every Python
        text = texts[state % len(texts)]
        sep = ["\n\n", " ", "\n", "\t", ""][(state >> 8) % 5]
        parts.append(text + sep)
        size += len((text + sep).encode())
    return "".join(parts)


def check_unicode_age(name, text):
    for ch in text:
        if unicodedata.category(ch) == "Cn":
            sys.exit(f"make_corpus: case {name} has U+{ord(ch):04X}, unassigned in Python's Unicode "
                     f"{unicodedata.unidata_version}; use an older character")


def all_cases():
    groups = [ENGLISH, CONTRACTIONS, CODE, SCRIPTS, MARKS, NFC, EMOJI, NUMBERS, WHITESPACE, CONTROL, SPECIAL]
    cases = [{"name": "empty", "text": ""}]
    for group in groups:
        cases += [{"name": n, "text": t} for n, t in group]
    for name, text in [(c["name"], c["text"]) for c in cases]:
        check_unicode_age(name, text)
    cases.append({"name": "mixed_100k", "text": mixed_text(cases, MIXED_TARGET_BYTES)})
    for name, raw in INVALID:
        try:
            raw.decode("utf-8")
            sys.exit(f"make_corpus: case {name} is valid UTF-8; invalid cases must not be")
        except UnicodeDecodeError:
            pass
        cases.append({"name": name, "hex": raw.hex()})
    names = [c["name"] for c in cases]
    if len(set(names)) != len(names):
        sys.exit("make_corpus: duplicate case names")
    return cases


# Characters written as \u escapes in the file, so that an editor cannot drop, change or
# normalize them: invisible ones, U+FFFD, ones NFC would change, and combining marks that do not
# sit on a plain visible letter.
def needs_escape(ch, prev, prev_escaped):
    cat = unicodedata.category(ch)
    if ch == " ":
        return False
    if cat in ("Cc", "Cf", "Co", "Cs", "Zs", "Zl", "Zp") or ch == "\ufffd":
        return True
    if 0x1100 <= ord(ch) <= 0x11FF:  # conjoining Hangul jamo
        return True
    if unicodedata.normalize("NFC", ch) != ch:
        return True
    if cat.startswith("M"):
        if prev is None or prev_escaped or prev.isascii() or prev.isspace():
            return True
        return unicodedata.normalize("NFC", prev + ch) != prev + ch
    return False


def json_string(s):
    out, prev, prev_escaped = [], None, False
    for ch in json.dumps(s, ensure_ascii=False)[1:-1]:
        escaped = needs_escape(ch, prev, prev_escaped)
        if escaped:
            cp = ord(ch)
            if cp > 0xFFFF:
                cp -= 0x10000
                out.append(f"\\u{0xD800 + (cp >> 10):04x}\\u{0xDC00 + (cp & 0x3FF):04x}")
            else:
                out.append(f"\\u{cp:04x}")
        else:
            out.append(ch)
        prev, prev_escaped = ch, escaped
    return '"' + "".join(out) + '"'


def main():
    cases = all_cases()
    lines = []
    for c in cases:
        if "text" in c:
            lines.append(f'  {{"name": {json.dumps(c["name"])}, "text": {json_string(c["text"])}}}')
        else:
            lines.append(f'  {{"name": {json.dumps(c["name"])}, "hex": "{c["hex"]}"}}')
    about = ("Tokenizer test texts, written by tools/tokenizer/make_corpus.py. A case has 'text' "
             "or, for bytes that are not valid UTF-8, 'hex'. Their ids: reference.json.")
    doc = '{\n"about": ' + json.dumps(about) + ',\n"cases": [\n' + ",\n".join(lines) + "\n]}\n"
    parsed = json.loads(doc)
    assert [c["name"] for c in parsed["cases"]] == [c["name"] for c in cases]
    assert all(p.get("text") == c.get("text") for p, c in zip(parsed["cases"], cases)), "escaping broke a text"
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(doc, encoding="utf-8")
    print(f"{OUT.relative_to(REPO)}: {len(cases)} cases, {len(doc.encode())} bytes")


if __name__ == "__main__":
    main()
