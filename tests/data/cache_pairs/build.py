"""Builds tests/data/cache_pairs_topics.jsonl from the hand-written groups in seeds_*.txt.

A group is one line: `prompt | paraphrase | ... ~ hard negative ~ ...` under a `# topic` header.
Every hard negative differs from the group's prompt in one thing that changes the answer; each
paraphrase asks exactly what the prompt asks. Pairs made from a group: prompt ~ each paraphrase,
paraphrase ~ paraphrase, prompt ~ each negative, the first paraphrase ~ each negative (another
register against the same difference), the prompt with a typo ~ its first paraphrase, and one
unrelated prompt of the same topic (an easy negative). Which prompt is the cached one is drawn at
random (seeded), so the set has no direction. Same-language prompts in other languages are labeled
as any other; a prompt against its English translation is not the same request (the answer's
language differs). Run: python tests/data/cache_pairs/build.py

`--seeds DIR --out FILE --prefix ID` builds another set the same way from DIR's seeds_*.txt (the
fresh set, tests/data/cache_pairs_fresh/: written after the verifier was trained, never trained on).
"""

import argparse
import itertools
import json
import random
from pathlib import Path

HERE = Path(__file__).parent
OUT = HERE.parent / "cache_pairs_topics.jsonl"


def typo(text: str, rng: random.Random) -> str:
    words = text.split(" ")
    candidates = [i for i, w in enumerate(words) if w.isalpha() and len(w) >= 6]
    if not candidates:
        return text.lower()
    i = rng.choice(candidates)
    w = words[i]
    j = rng.randrange(1, len(w) - 2)
    words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2 :] if rng.random() < 0.5 else w[:j] + w[j + 1 :]
    return " ".join(words)


def groups(seeds: Path = HERE):
    for path in sorted(seeds.glob("seeds_*.txt")):
        topic = None
        for line in path.read_text("utf-8").splitlines():
            if line.startswith("# "):
                topic = line[2:].strip()
            elif line.strip():
                same, *negatives = (part.strip() for part in line.split(" ~ "))
                prompt, *paraphrases = (part.strip() for part in same.split(" | "))
                yield topic, prompt, paraphrases, negatives


def pairs(seeds: Path = HERE):
    rng = random.Random(17)
    by_topic: dict[str, list[str]] = {}
    for topic, prompt, paraphrases, negatives in groups(seeds):
        by_topic.setdefault(topic, []).append(prompt)
        for p in paraphrases:
            yield topic, prompt, p, "paraphrase"
        for x, y in itertools.pairwise(paraphrases):
            yield topic, x, y, "paraphrase"
        for n in negatives:
            yield topic, prompt, n, "hard_negative"
            if paraphrases:
                yield topic, paraphrases[0], n, "hard_negative"
        if paraphrases and topic != "languages":
            yield topic, typo(prompt, rng), paraphrases[0], "paraphrase"
    for topic, prompts in by_topic.items():
        for i, prompt in enumerate(prompts):
            yield topic, prompt, prompts[(i + 3) % len(prompts)], "easy_negative"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=Path, default=HERE)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--prefix", default="tp")
    args = parser.parse_args()
    rng = random.Random(1717)
    lines = []
    for n, (topic, a, b, kind) in enumerate(pairs(args.seeds), 1):
        if rng.random() < 0.5:
            a, b = b, a
        record = {
            "id": f"{args.prefix}-{n:04d}",
            "a": a,
            "b": b,
            "same": kind == "paraphrase",
            "kind": kind,
            "domain": topic,
        }
        lines.append(json.dumps(record, ensure_ascii=False))
    args.out.write_text("\n".join(lines) + "\n", "utf-8")
    print(f"{len(lines)} pairs -> {args.out}")


if __name__ == "__main__":
    main()
