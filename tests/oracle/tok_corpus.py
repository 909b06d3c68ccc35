#!/usr/bin/python3
"""tok_corpus.py: the tokenizer's test corpus, deterministic from a seed.

    /usr/bin/python3 tok_corpus.py [--seed N] [--count N] > corpus.jsonl

One JSON line per string: {"text": ...}, plus "bytes_hex" for the strings made from invalid
UTF-8: the bytes a C caller passes, while "text" is what HF sees after the same repair
(Python's errors="replace": each maximal invalid subsequence -> U+FFFD, as Rust's
from_utf8_lossy). The oracle (tok_oracle.js) reads "text"; `kvrouter tokenize --json` reads
"bytes_hex" when present, so the C library's own repair is what is compared.

Kinds: multilingual prose (accented Latin, CJK, Cyrillic, Arabic, Hebrew, Devanagari, Thai,
Korean, Greek), code (C, Python, JSON; indentation, tabs), emoji (skin tones, ZWJ, flags),
whitespace runs (spaces, tabs, newlines, CRLF, trailing, Unicode spaces), digits and long
numbers, English contractions in any case, special-token text inside content, very long
words (5000+ characters), punctuation runs, combining marks (NFC: runs of marks of every
class), invalid UTF-8, random code points, and mixes of all of them.
"""
import argparse
import json
import random
import sys

WORDS = {
    "en": "the quick brown fox jumps over lazy dog while routers cache tokens and workers serve requests".split(),
    "fr": "café naïve façade élève où déjà très garçon cœur Noël être hôpital".split(),
    "de": "Größe Straße Übung Mädchen schön für Brücke Käse".split(),
    "es": "niño señor mañana corazón canción pingüino acción".split(),
    "zh": ["我们", "今天", "天气", "很好", "机器", "学习", "模型", "路由", "缓存", "中文", "测试"],
    "ja": ["こんにちは", "カタカナ", "ひらがな", "東京", "日本語", "テスト", "トークン"],
    "ko": ["안녕하세요", "한국어", "토큰", "서울", "감사합니다"],
    "ru": "привет мир это тест токенизатора Москва ёжик Съешь".split(),
    "ar": "مرحبا بالعالم هذا اختبار اللغة العربية".split(),
    "he": "שלום עולם זה מבחן בעברית".split(),
    "hi": "नमस्ते दुनिया यह परीक्षण हिंदी भाषा".split(),
    "th": ["สวัสดี", "ภาษาไทย", "ทดสอบ", "โลก"],
    "el": "Καλημέρα κόσμε αυτό είναι δοκιμή".split(),
}
EMOJI = ["😀", "👍", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "❤️", "✨", "🤖", "🧑🏿‍🚀", "1️⃣", "🫠"]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<|begin_of_text|>",
            "<|eot_id|>", "<|start_header_id|>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>",
            "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<|startoftext|>", "<|return|>",
            "<|channel|>", "<think>", "</think>", "<tool_call>", "<mask>", "<unused0>", "[multimodal]",
            "<|reserved_special_token_5|>", "<|im_start", "im_end|>", "<s", "<<s>>", "<pad>"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D", "'Ll"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["…", "—", "«", "»", "¿", "¡", "•", "、", "。", "「", "」", "！"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "   ", "\u00a0", "\u3000", "\u2009", " \n ", "\t\t", "\u200b", "\u2028"]
COMBINING = ["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "\u1100\u1161\u11a8", "A\u030a", "\u0915\u093c", "c\u0327",
             # the normalizer's stable ranges (Cyrillic, kana, CJK, Hangul syllables) before marks
             # that compose with them or not: ё й が ピ 각, and marks after an ideograph
             "\u0435\u0308", "\u0438\u0306", "\u304b\u3099", "\u30d2\u309a", "\uac00\u11a8",
             "\u4e2d\u0301\u0316", "\u0416\u0483"]

C_CODE = """#include <stdio.h>

int main(int argc, char **argv)
{
\tfor (int i = 0; i < argc; i++) {
\t\tprintf("%d: %s\\n", i, argv[i]);
\t}
\treturn 0;
}
"""
PY_CODE = '''def tokenize(text: str) -> list[int]:
    """Split text into ids."""
    ids = []
    for word in text.split():
        if word in VOCAB:
            ids.append(VOCAB[word])  # known
        else:
            ids.extend(fallback(word))
    return ids
'''


def word(r):
    lang = r.choice(list(WORDS))
    w = r.choice(WORDS[lang])
    k = r.random()
    if k < 0.1:
        w = w.upper()
    elif k < 0.2:
        w = w.capitalize()
    return w


def prose(r):
    n = r.randint(1, 30)
    out = []
    for _ in range(n):
        out.append(word(r))
        k = r.random()
        if k < 0.1:
            out.append(r.choice(PUNCT))
        elif k < 0.15:
            out.append(r.choice(CONTRACTIONS))
    sep = r.choice([" ", " ", " ", "", "  "])
    return sep.join(out)


def code(r):
    base = r.choice([C_CODE, PY_CODE, json.dumps({"a": [1, 2.5, None, True], "b": {"c": "d é"}}, indent=r.choice([None, 2, 4, "\t"]))])
    lines = base.split("\n")
    i = r.randint(0, len(lines) - 1)
    j = r.randint(i, len(lines))
    s = "\n".join(lines[i:j + 1])
    if r.random() < 0.3:
        s = s.replace("    ", "\t")
    return s


def emoji(r):
    return "".join(r.choice(EMOJI + [" ", "a", "x", word(r)]) for _ in range(r.randint(1, 10)))


def spaces(r):
    s = "".join(r.choice(SPACES + ["a", "b", word(r), "1"]) for _ in range(r.randint(1, 12)))
    if r.random() < 0.5:
        s += r.choice(SPACES) * r.randint(1, 5)
    return s


def digits(r):
    k = r.random()
    if k < 0.3:
        return str(r.randint(0, 10 ** r.randint(1, 40)))
    if k < 0.6:
        return "".join(r.choice("0123456789.,-+ e") for _ in range(r.randint(1, 30)))
    return f"{r.randint(1, 9999)}.{r.randint(0, 999)} items cost ${r.randint(1, 10 ** 6)}, ٣٤٥ ४५६ ๓๔ Ⅻ ½"


def contractions(r):
    out = []
    for _ in range(r.randint(1, 8)):
        out.append(r.choice(["I", "you", "WE", "they", "She", "it", "DON", "can", "isn"]) + r.choice(CONTRACTIONS))
    return " ".join(out) + r.choice(["", ".", "!", "?"])


def specials(r):
    out = []
    for _ in range(r.randint(1, 8)):
        k = r.random()
        if k < 0.5:
            out.append(r.choice(SPECIALS))
        elif k < 0.8:
            out.append(word(r))
        else:
            out.append(r.choice(SPACES))
    return r.choice(["", " ", "\n"]).join(out)


def long_word(r):
    unit = r.choice(["a", "ab", "xyz", "é", "日本", "0", "-", " ", "\n", "😀", "Hello", "▁", "aaaaab"])
    n = r.randint(5000, 9000) // max(1, len(unit))
    return unit * n


def punct(r):
    return "".join(r.choice(PUNCT + [" ", "\n"]) for _ in range(r.randint(1, 40)))


def combining(r):
    return " ".join(r.choice(COMBINING) + word(r) for _ in range(r.randint(1, 6)))


MARKS = None


def marks(r):
    """Letters with runs of combining marks of every class (canonical reordering, composition)."""
    global MARKS
    if MARKS is None:
        import unicodedata
        MARKS = [chr(c) for c in range(0x300, 0x1F000) if unicodedata.combining(chr(c))]
    out = []
    for _ in range(r.randint(1, 6)):
        out.append(r.choice("aeiouAOUnckszhCSZ\u3131\u1100\u0915\u05d0\u0627"
                            "\u0435\u0438\u304b\u30d2\uac00\u4e2d\u0416"))
        out.extend(r.choice(MARKS) for _ in range(r.randint(0, 4)))
        if r.random() < 0.3:
            out.append(" ")
    return "".join(out)


def random_mix(r):
    pool = [prose, code, emoji, spaces, digits, contractions, specials, punct, combining]
    return "".join(r.choice(pool)(r) for _ in range(r.randint(2, 5)))


def random_unicode(r):
    out = []
    for _ in range(r.randint(1, 30)):
        cp = r.choice([r.randint(0x20, 0x7e), r.randint(0xa0, 0x2fff), r.randint(0x3000, 0xd7ff),
                       r.randint(0xe000, 0xfffd), r.randint(0x10000, 0x10ffff), r.randint(1, 0x1f)])
        out.append(chr(cp))
    return "".join(out)


def invalid(r):
    """Bytes with invalid UTF-8 in them."""
    parts = []
    for _ in range(r.randint(1, 8)):
        k = r.random()
        if k < 0.3:
            parts.append(word(r).encode())
        elif k < 0.45:
            parts.append(bytes([r.randint(0x80, 0xbf)]))  # lone continuation
        elif k < 0.6:
            parts.append(r.choice(["é", "日", "😀", "ॐ"]).encode()[:-1])  # truncated
        elif k < 0.7:
            parts.append(bytes([r.choice([0xc0, 0xc1, 0xf5, 0xff, 0xfe])]))
        elif k < 0.8:
            parts.append(b"\xed\xa0\x80")  # a surrogate
        elif k < 0.9:
            parts.append(b"\xe0\x80\xaf")  # overlong
        else:
            parts.append(b" ")
    return b"".join(parts)


KINDS = [(prose, 22), (code, 8), (emoji, 6), (spaces, 10), (digits, 6), (contractions, 6), (specials, 8),
         (punct, 5), (combining, 5), (marks, 4), (random_mix, 12), (random_unicode, 6)]


class Tee:
    """The JSON lines out, and each text as a binary record beside them when asked."""

    def __init__(self, out, binf):
        self.out, self.binf = out, binf

    def write(self, line):
        self.out.write(line)
        if self.binf and line.strip():
            b = json.loads(line)["text"].encode("utf-8")
            self.binf.write(len(b).to_bytes(4, "little") + b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=10000)
    ap.add_argument("--bin", help="also write the texts here as [u32 length LE][UTF-8] records "
                    "(what `kvrouter bench tokenize` reads)")
    a = ap.parse_args()
    r = random.Random(a.seed)
    out = Tee(sys.stdout, open(a.bin, "wb") if a.bin else None)
    fixed = ["", " ", "\n", "a", "  leading", "trailing  ", "\r\n\r\n", "<|im_start|>", "<s>", "<s> <s>",
             "hello<|im_end|>world", " <|endoftext|> ", "I'm", "IT'S", "'s", "12345678901234567890"]
    n = 0
    for t in fixed:
        out.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
        n += 1
    for i in range(20):
        out.write(json.dumps({"text": long_word(r)}, ensure_ascii=False) + "\n")
        n += 1
    for i in range(150):
        b = invalid(r)
        out.write(json.dumps({"text": b.decode("utf-8", "replace"), "bytes_hex": b.hex()}, ensure_ascii=False) + "\n")
        n += 1
    weights = [w for _, w in KINDS]
    while n < a.count:
        f = r.choices([k for k, _ in KINDS], weights)[0]
        out.write(json.dumps({"text": f(r)}, ensure_ascii=False) + "\n")
        n += 1


if __name__ == "__main__":
    main()
