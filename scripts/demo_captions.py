"""Give the demo corpus captions that describe their images, so that the model has something to learn.

  demo_captions.py MANIFEST.jsonl OUT.jsonl

`mmfeed synth` draws captions and images independently: the best contrastive (ITC) and
matching (ITM) losses on unseen samples are then the chance levels, ln(keys) + 0.64, which
the tiny model reaches within ~10 steps, so a demo's loss cannot go down. This prefixes
each caption with "A <shape> <colour> picture." (shape from the aspect ratio, colour the
most frequent of 12 named colours over an 8x8 thumbnail), which the vision tower can see
and the text tower can read. Unreadable images (the corpus' deliberately broken samples)
keep their caption; the service quarantines them as before. The skew of the corpus (caption
lengths, image sizes) is unchanged but for 4 words per caption.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

from PIL import Image

PALETTE: dict[str, tuple[int, int, int]] = {
    "black": (20, 20, 20), "white": (235, 235, 235), "gray": (128, 128, 128), "red": (200, 40, 40),
    "green": (40, 160, 60), "blue": (40, 60, 200), "yellow": (220, 210, 50), "cyan": (50, 200, 210),
    "magenta": (200, 50, 190), "orange": (230, 140, 40), "purple": (110, 50, 150), "brown": (120, 80, 40)}


def colour_name(rgb: tuple[int, int, int]) -> str:
    return min(PALETTE, key=lambda k: sum((a - b) ** 2 for a, b in zip(PALETTE[k], rgb)))


def describe(path: str) -> str:
    """'A <wide|tall|square> <colour> picture.' for the image at path (raises on a bad image)."""
    with Image.open(path) as im:
        w, h = im.size
        im.draft("RGB", (64, 64))  # JPEG: decode at reduced size
        raw = im.convert("RGB").resize((8, 8)).tobytes()
    pixels = [tuple(raw[i:i + 3]) for i in range(0, len(raw), 3)]
    colour = Counter(colour_name(p) for p in pixels).most_common(1)[0][0]
    shape = "wide" if w > 1.25 * h else "tall" if h > 1.25 * w else "square"
    return f"A {shape} {colour} picture."


def main(src: str, dst: str) -> None:
    root = os.path.dirname(os.path.abspath(src))
    kinds: Counter = Counter()
    out = []
    with open(src, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            try:
                prefix = describe(os.path.join(root, rec["image"]))
            except (OSError, KeyError, ValueError, SyntaxError):
                prefix = None  # broken sample: left as it is
            if prefix and isinstance(rec.get("text"), str):
                rec["text"] = f"{prefix} {rec['text']}"
                kinds[prefix] += 1
            out.append(json.dumps(rec, ensure_ascii=False))
    with open(dst, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    print(f"captioned {sum(kinds.values())} of {len(out)} samples with {len(kinds)} distinct descriptions")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
