"""Writes docs/examples/chat-prompts.jsonl, everyday requests for `specchat train data --prompts`: how to get better
at an activity, why something happens, what tells two things apart; a quarter with a follow-up turn. None is about
a bench chat prompt's topic (healthy habits, the sky's colour, learning a language).

    python scripts/chat_prompts.py
"""

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "docs/examples/chat-prompts.jsonl"
ACTIVITIES = (
    "cooking at home", "running", "swimming", "drawing", "public speaking", "writing fiction", "gardening",
    "playing chess", "photography", "baking bread", "budgeting", "investing for retirement", "negotiating a salary",
    "studying for exams", "managing time at work", "working from home", "making friends in a new city",
    "raising a puppy", "caring for a cat", "hiking in the mountains", "camping", "cycling to work",
    "meditation", "journaling", "reading more books", "learning to code", "playing the piano", "singing",
    "painting with watercolours", "knitting", "woodworking", "fixing things around the house", "moving house",
    "travelling on a budget", "packing for a trip", "job hunting", "writing a resume", "giving feedback",
    "leading a team", "starting a small business", "selling things online", "saving for a house",
    "decorating a small flat", "cleaning the house quickly", "cooking for a family", "meal prepping",
    "making coffee", "brewing tea", "growing tomatoes", "keeping chickens", "birdwatching", "stargazing",
    "learning maths as an adult", "teaching children to read", "helping a child with homework",
    "dealing with stress", "waking up early", "drinking more water", "reducing screen time", "quitting sugar",
    "stretching", "lifting weights", "yoga", "rock climbing", "skiing", "surfing", "playing football",
    "writing poetry", "keeping a blog", "recording a podcast", "editing videos", "learning history",
    "remembering names", "taking notes in lectures", "preparing a presentation", "running a meeting",
    "resolving an argument with a friend", "writing a thank-you note", "hosting a dinner party",
    "planning a wedding", "buying a used car", "renting a flat", "repairing a bicycle", "sewing on a button",
    "composting", "reducing food waste", "saving energy at home", "learning to drive", "flying with children",
)
PHENOMENA = (
    "leaves change colour in autumn", "the sea is salty", "we dream", "ice floats on water", "bread rises",
    "the moon has phases", "we get goosebumps", "cats purr", "onions make you cry", "the ocean has tides",
    "planes can fly", "soap removes grease", "metal feels colder than wood", "we yawn", "birds migrate",
    "the seasons change", "hair turns grey", "thunder follows lightning", "milk goes sour", "we hiccup",
    "the desert is cold at night", "coffee keeps you awake", "rivers bend", "stars twinkle",
    "fish can breathe in water", "popcorn pops", "we need sleep", "the Dead Sea is so salty", "bubbles are round",
    "batteries run down", "apples turn brown when cut", "boats float", "our ears pop on a plane",
    "dogs wag their tails", "the Earth has a magnetic field", "glass is transparent", "snowflakes have six sides",
    "muscles get sore after exercise", "spicy food feels hot",
)
PAIRS = (
    ("a virus", "a bacterium"), ("weather", "climate"), ("a crocodile", "an alligator"),
    ("baking soda", "baking powder"), ("stocks", "bonds"), ("RAM", "storage"), ("a latte", "a cappuccino"),
    ("a simile", "a metaphor"), ("speed", "velocity"), ("a republic", "a democracy"), ("an ebook", "a paper book"),
    ("renting", "buying a home"), ("a debit card", "a credit card"), ("a lake", "a pond"),
    ("a hurricane", "a typhoon"), ("jam", "jelly"), ("an apartment", "a house"), ("a comet", "an asteroid"),
    ("Python", "JavaScript"), ("a CV", "a cover letter"), ("a nap", "a full night's sleep"), ("walking", "running"),
    ("tea", "coffee"), ("cats", "dogs as pets"), ("a town", "a city"), ("an emulsion", "a solution"),
    ("a frog", "a toad"), ("a moth", "a butterfly"), ("a wind instrument", "a string instrument"),
    ("an introvert", "an extrovert"),
)
ACTIVITY_FORMS = (
    "How can I get better at {x}?", "What should a beginner know about {x}?",
    "What mistakes do people often make when {x}?", "Make me a four-week plan for {x}.",
    "What do I need to get started with {x}?", "Why do people enjoy {x}?",
)
PHENOMENON_FORMS = ("Why is it that {x}?", "Can you explain how it happens that {x}?")
PAIR_FORMS = ("What is the difference between {a} and {b}?", "Which is better, {a} or {b}, and why?")
FOLLOW_UPS = ("Can you say that in fewer words?", "Give me a concrete example.", "What would you do first?",
              "Why is that?", "Put that in a table.", "Tell me more about the second point.")


def main() -> None:
    prompts = [form.format(x=x) for x in ACTIVITIES for form in ACTIVITY_FORMS]
    prompts += [form.format(x=x) for x in PHENOMENA for form in PHENOMENON_FORMS]
    prompts += [form.format(a=a, b=b) for a, b in PAIRS for form in PAIR_FORMS]
    random.Random(0).shuffle(prompts)
    lines = [{"turns": [p, FOLLOW_UPS[i % len(FOLLOW_UPS)]]} if i % 4 == 0 else {"prompt": p}
             for i, p in enumerate(prompts)]
    OUT.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"{OUT}: {len(lines)} prompts")


if __name__ == "__main__":
    main()
