"""Python peer for the tokenize package: the HuggingFace `tokenizers` package itself.

  peer.py corpus OUT.jsonl [--min N] [--real DIR]   write >= N test texts as {"text": ...}
  peer.py encode TOKENIZER.json MAX_LEN IN.jsonl OUT.jsonl
                                                  ids per text, one JSON list per line
  peer.py bench TOKENIZER.json MAX_LEN IN.jsonl REPEAT
                                                  captions/s of encode_batch on one thread
  peer.py bench-serve TOKENIZER.json MAX_LEN IN.jsonl
                                                  one timed pass per stdin line (encode|ids|count)

The corpus is real text that ships with Python (the docstrings of the standard library,
English prose of every length), real sentences in twelve scripts recombined with digits,
punctuation, emoji, odd whitespace, control characters and stray bytes, a few very long
captions, and, with --real DIR, the fortune cookies of the shared corpus (text/*.jsonl).
"""
import json
import os
import pkgutil
import random
import sys
import time
import warnings

# One real sentence per script (the first article of the Universal Declaration of Human Rights).
UDHR = [
    "All human beings are born free and equal in dignity and rights.",
    "Tous les êtres humains naissent libres et égaux en dignité et en droits.",
    "Alle Menschen sind frei und gleich an Würde und Rechten geboren.",
    "Все люди рождаются свободными и равными в своем достоинстве и правах.",
    "Όλοι οι άνθρωποι γεννιούνται ελεύθεροι και ίσοι στην αξιοπρέπεια και τα δικαιώματα.",
    "人人生而自由，在尊严和权利上一律平等。",
    "すべての人間は、生まれながらにして自由であり、かつ、尊厳と権利とについて平等である。",
    "모든 인간은 태어날 때부터 자유로우며 그 존엄과 권리에 있어 동등하다.",
    "يولد جميع الناس أحرارًا متساوين في الكرامة والحقوق.",
    "सभी मनुष्यों को गौरव और अधिकारों के मामले में जन्मजात स्वतन्त्रता और समानता प्राप्त है।",
    "כל בני האדם נולדו בני חורין ושווים בערכם ובזכויותיהם.",
    "มนุษย์ทั้งหลายเกิดมามีอิสระและเสมอภาคกันในเกียรติศักด์และสิทธิ",
    "Todos los seres humanos nacen libres e iguales en dignidad y derechos.",
    "Tüm insanlar hür, haysiyet ve haklar bakımından eşit doğarlar.",
]
ODD = ["🙂", "👩‍🔬", "№", "½", "ﬁ", "Å", "e\u0301", "\u200b", "\u00a0", "\t", "\n\n", "  ", "...", "—",
       "\u0007", "\ufeff", "$3.50", "1,234,567", "C++", "https://example.org/a?b=c", "#tag", "@user"]


def docstrings():
    warnings.simplefilter("ignore")
    seen = set()
    for mod in sorted(m.name for m in pkgutil.iter_modules() if not m.name.startswith("_")):
        if mod in ("antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo") or "test" in mod:
            continue
        try:
            m = __import__(mod)
        except BaseException:
            continue
        for obj in [m] + [getattr(m, a, None) for a in sorted(dir(m)) if not a.startswith("_")]:
            d = getattr(obj, "__doc__", None)
            if isinstance(d, str) and d.strip() and d not in seen:
                seen.add(d)
                yield d


def mixed(rng, n):
    for _ in range(n):
        parts = []
        for _ in range(rng.choice([1, 1, 2, 3, 5, 12])):
            s = rng.choice(UDHR)
            if rng.random() < 0.3:
                s = s.upper() if rng.random() < 0.5 else s.lower()
            parts.append(s)
            if rng.random() < 0.5:
                parts.append(rng.choice(ODD))
        yield " ".join(parts)


def corpus(out, minimum, real):
    rng = random.Random(7)
    texts = list(docstrings())
    if real:
        for name in sorted(os.listdir(real)):
            if name.endswith(".jsonl"):
                with open(os.path.join(real, name), encoding="utf-8") as f:
                    texts += [json.loads(l)["text"] for l in f][:5000]
    texts += list(mixed(rng, max(3000, minimum - len(texts))))
    texts += ["", " ", "\n", "a", "[CLS] [SEP] [MASK]", "<|begin_of_text|>hi"]
    long = " ".join(texts[:400])
    texts += [long, long * 20, "x" * 300_000, ("word " * 250_000)]
    with open(out, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    print(len(texts))


def load(path, max_len):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(path)
    tok.no_padding()
    if max_len > 0:
        tok.enable_truncation(max_len)
    else:
        tok.no_truncation()
    return tok


def read_texts(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(l)["text"] for l in f]


def encode(path, max_len, inp, out):
    tok = load(path, max_len)
    texts = read_texts(inp)
    with open(out, "w") as f:
        for i in range(0, len(texts), 512):
            for enc in tok.encode_batch(texts[i:i + 512]):
                f.write(json.dumps(enc.ids) + "\n")


def bench(path, max_len, inp, repeat):
    os.environ["RAYON_NUM_THREADS"] = "1"
    tok = load(path, max_len)
    texts = read_texts(inp)
    tok.encode_batch(texts[:256])
    t0 = time.perf_counter()
    for _ in range(repeat):
        tok.encode_batch(texts)
    dt = time.perf_counter() - t0
    print(json.dumps({"captions_per_s": len(texts) * repeat / dt}))


def bench_serve(path, max_len, inp):
    """One timed pass per stdin line, so the Go benchmark can interleave its passes.

    Each line names a mode: "encode" (encode_batch, nothing read back), "ids" (encode_batch
    and every encoding's ids as a list) or "count" (encode_batch and len() of each).
    Answers one JSON line per pass: captions per process CPU-second and per wall second.
    """
    os.environ["RAYON_NUM_THREADS"] = "1"
    tok = load(path, max_len)
    texts = read_texts(inp)
    tok.encode_batch(texts[:256])
    passes = {
        "encode": lambda: tok.encode_batch(texts),
        "ids": lambda: [e.ids for e in tok.encode_batch(texts)],
        "count": lambda: [len(e) for e in tok.encode_batch(texts)],
    }
    for line in sys.stdin:
        run = passes[line.strip()]
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(json.dumps({"captions_per_cpu_s": len(texts) / cpu, "captions_per_s": len(texts) / wall}), flush=True)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "corpus":
        real = args[args.index("--real") + 1] if "--real" in args else None
        minimum = int(args[args.index("--min") + 1]) if "--min" in args else 10000
        corpus(args[0], minimum, real)
    elif cmd == "encode":
        encode(args[0], int(args[1]), args[2], args[3])
    elif cmd == "bench-serve":
        bench_serve(args[0], int(args[1]), args[2])
    elif cmd == "bench":
        bench(args[0], int(args[1]), args[2], int(args[3]))
    else:
        sys.exit(f"unknown command {cmd}")
