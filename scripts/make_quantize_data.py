"""Write the project's offline eval tasks and calibration text (configs/eval_tasks, calibration).

Everything is generated from templates and small hand-written fact lists with a fixed seed, so the
files are reproducible and carry no third-party dataset licence. Re-run after editing a list:

    .venv/bin/python scripts/make_quantize_data.py configs

Tasks:
- onb_facts_mc: 4-way multiple choice (loglikelihood) over capitals, day/month order, opposites,
  plurals, number order and comparisons, small sums. Easy on purpose: a 135M model scores well
  above chance, so a quantization that damages the model shows up as a drop.
- onb_arith_gen: generative exact match ("Question: What is 3 + 5?\\nAnswer:" -> "8") with three
  fixed few-shot examples from a separate file.
Calibration: templated prose about everyday processes (no eval facts), plus a held-out split the
export check measures perplexity on.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = 20261130

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Spain": "Madrid", "Italy": "Rome",
    "Japan": "Tokyo", "China": "Beijing", "Russia": "Moscow", "Egypt": "Cairo",
    "Greece": "Athens", "Portugal": "Lisbon", "Austria": "Vienna", "Norway": "Oslo",
    "Sweden": "Stockholm", "Finland": "Helsinki", "Denmark": "Copenhagen", "Poland": "Warsaw",
    "Ireland": "Dublin", "England": "London", "Hungary": "Budapest", "Belgium": "Brussels",
    "the Netherlands": "Amsterdam", "Canada": "Ottawa", "Mexico": "Mexico City",
    "Argentina": "Buenos Aires", "Peru": "Lima", "Chile": "Santiago", "Kenya": "Nairobi",
    "Thailand": "Bangkok", "South Korea": "Seoul", "India": "New Delhi", "Turkey": "Ankara",
    "Iran": "Tehran", "Cuba": "Havana", "Australia": "Canberra", "Czechia": "Prague",
    "Switzerland": "Bern", "Vietnam": "Hanoi", "the Philippines": "Manila",
    "Indonesia": "Jakarta", "Colombia": "Bogota",
}
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
OPPOSITES = {
    "hot": "cold", "big": "small", "up": "down", "fast": "slow", "happy": "sad",
    "light": "dark", "open": "closed", "early": "late", "full": "empty", "rich": "poor",
    "strong": "weak", "old": "young", "hard": "soft", "wet": "dry", "high": "low",
    "loud": "quiet", "long": "short", "thick": "thin", "clean": "dirty", "day": "night",
    "win": "lose", "push": "pull", "buy": "sell", "true": "false", "inside": "outside",
    "left": "right", "north": "south", "east": "west", "first": "last", "heavy": "light",
    "good": "bad", "cheap": "expensive", "near": "far", "sweet": "sour", "begin": "end",
}
PLURALS = {
    "mouse": "mice", "child": "children", "foot": "feet", "tooth": "teeth", "man": "men",
    "woman": "women", "goose": "geese", "person": "people", "cat": "cats", "dog": "dogs",
    "box": "boxes", "city": "cities", "leaf": "leaves", "knife": "knives", "wolf": "wolves",
    "baby": "babies", "bus": "buses", "glass": "glasses", "church": "churches",
    "potato": "potatoes", "tomato": "tomatoes", "story": "stories", "party": "parties",
    "wife": "wives", "ox": "oxen", "sheep": "sheep", "fish": "fish", "book": "books",
}
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                "seventeen", "eighteen", "nineteen", "twenty"]


def _mc(rng: random.Random, question: str, answer: str, pool: list[str], family: str) -> dict:
    distractors = rng.sample(sorted(set(pool) - {answer}), 3)
    choices = distractors + [answer]
    rng.shuffle(choices)
    return {"question": question, "choices": choices, "answer": choices.index(answer),
            "family": family}


def facts_mc(rng: random.Random) -> list[dict]:
    items = []
    caps = list(CAPITALS.values())
    for country, city in CAPITALS.items():
        items.append(_mc(rng, f"The capital of {country} is", city, caps, "capital"))
    for i, d in enumerate(DAYS):
        items.append(_mc(rng, f"The day after {d} is", DAYS[(i + 1) % 7], DAYS, "day_after"))
        items.append(_mc(rng, f"The day before {d} is", DAYS[i - 1], DAYS, "day_before"))
    for i, m in enumerate(MONTHS):
        items.append(_mc(rng, f"The month after {m} is", MONTHS[(i + 1) % 12], MONTHS,
                         "month_after"))
        items.append(_mc(rng, f"The month before {m} is", MONTHS[i - 1], MONTHS,
                         "month_before"))
    opp_pool = sorted(set(OPPOSITES) | set(OPPOSITES.values()))
    for w, o in OPPOSITES.items():
        items.append(_mc(rng, f"The opposite of {w} is", o, opp_pool, "opposite"))
    plural_pool = sorted(set(PLURALS.values()) | {w + "s" for w in PLURALS})
    for w, p in PLURALS.items():
        wrong = sorted({w + "s", w + "es", w + "en", p} - {p})
        pool = sorted(set(wrong) | set(rng.sample(plural_pool, 4)))
        items.append(_mc(rng, f"The plural of {w} is", p, pool, "plural"))
    for i in range(len(NUMBER_WORDS) - 1):
        items.append(_mc(rng, f"The number after {NUMBER_WORDS[i]} is", NUMBER_WORDS[i + 1],
                         NUMBER_WORDS, "number_after"))
    for _ in range(50):
        a, b = rng.sample(range(10, 100), 2)
        items.append({"question": f"Which number is larger, {a} or {b}? The larger number is",
                      "choices": [str(a), str(b)], "answer": 0 if a > b else 1,
                      "family": "compare"})
    seen = set()
    while len([i for i in items if i["family"] == "sum"]) < 60:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        pool = [str(a + b + d) for d in (-2, -1, 1, 2, 3) if a + b + d >= 0] + [str(a + b)]
        items.append(_mc(rng, f"{a} plus {b} equals", str(a + b), pool, "sum"))
    rng.shuffle(items)
    return items


def arith_gen(rng: random.Random) -> tuple[list[dict], list[dict]]:
    pairs = [(a, b) for a in range(10) for b in range(10)]
    rng.shuffle(pairs)
    items = [{"question": f"What is {a} + {b}?", "answer": str(a + b), "family": "add"}
             for a, b in pairs]
    subs = [(a, b) for a in range(3, 20) for b in range(1, 10) if a - b >= 0]
    for a, b in rng.sample(subs, 80):
        items.append({"question": f"What is {a} - {b}?", "answer": str(a - b), "family": "sub"})
    for n in rng.sample(range(1, 99), 60):
        items.append({"question": f"What number comes after {n}?", "answer": str(n + 1),
                      "family": "succ"})
    for n in rng.sample(range(1, 50), 40):
        items.append({"question": f"What is {n} times 2?", "answer": str(2 * n),
                      "family": "double"})
    rng.shuffle(items)
    fewshot = [{"question": "What is 10 + 10?", "answer": "20", "family": "add"},
               {"question": "What number comes after 100?", "answer": "101", "family": "succ"},
               {"question": "What is 30 - 10?", "answer": "20", "family": "sub"}]
    return items, fewshot


SUBJECTS = ["The baker", "A gardener", "The engineer", "My neighbour", "The teacher",
            "A young student", "The river guide", "An old sailor", "The librarian",
            "A careful driver", "The painter", "Our team lead", "The night nurse"]
ACTIONS = ["checks the oven before dawn", "waters the tomatoes after lunch",
           "reads the manual twice", "writes a short note for tomorrow",
           "sorts the letters by street", "tests the pump at the dock",
           "sweeps the floor before the shop opens", "labels every jar on the shelf",
           "counts the boxes in the storeroom", "measures the wall before drilling",
           "closes the windows when the wind rises", "packs a small bag for the trip"]
REASONS = ["because small mistakes grow into large ones", "so that nothing is forgotten",
           "since the weather changes quickly here", "as the rules of the workshop require",
           "which saves an hour later in the day", "so the next shift starts smoothly",
           "because customers notice the details", "to keep the old machine running"]
CLOSERS = ["Most days this routine takes only a few minutes.",
           "Nobody remembers when the habit started.",
           "On holidays the work waits until the morning.",
           "The result is usually worth the effort.",
           "Visitors often ask why it is done this way.",
           "A printed checklist hangs next to the door.",
           "Some weeks are busier than others, of course.",
           "The same steps are written in the logbook."]
CODE = ["def area(width, height):\n    return width * height\n",
        "for item in basket:\n    if item.fresh:\n        keep(item)\n",
        "total = sum(prices) * (1 + tax_rate)\nprint(f\"total: {total:.2f}\")\n",
        "SELECT name, count(*) FROM orders GROUP BY name ORDER BY 2 DESC;\n"]


def paragraph(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(3, 5)):
        parts.append(f"{rng.choice(SUBJECTS)} {rng.choice(ACTIONS)} {rng.choice(REASONS)}.")
    parts.append(rng.choice(CLOSERS))
    text = " ".join(parts)
    if rng.random() < 0.15:
        text += "\n\n" + rng.choice(CODE)
    return text


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    print(f"{path}: {len(rows)} rows")


def main(config_dir: Path) -> None:
    rng = random.Random(SEED)
    write_jsonl(config_dir / "eval_tasks" / "onb_facts_mc.jsonl", facts_mc(rng))
    items, fewshot = arith_gen(rng)
    write_jsonl(config_dir / "eval_tasks" / "onb_arith_gen.jsonl", items)
    write_jsonl(config_dir / "eval_tasks" / "onb_arith_gen_fewshot.jsonl", fewshot)
    write_jsonl(config_dir / "calibration" / "onboarding_text.jsonl",
                [{"text": paragraph(rng)} for _ in range(400)])
    write_jsonl(config_dir / "calibration" / "onboarding_text_heldout.jsonl",
                [{"text": paragraph(rng)} for _ in range(64)])


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "configs"))
