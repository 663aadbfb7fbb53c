"""Writes docs/examples/chat-prompts.jsonl, everyday requests for `specchat train data --prompts`: how to get better
at an activity, why something happens, what tells two things apart; then a second batch asked in other ways (tips,
simple explanations, how things work, recipes, facts, stories and poems, pros and cons, advice, short emails). A
quarter of each batch has a follow-up turn. The second batch comes after the first, so a data directory answered
from the first goes on with it. None is about a bench chat prompt's topic (healthy habits, the sky's colour,
learning a language).

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
TIP_FORMS = ("Give me some tips for {x}.", "What are three good habits for {x}?")
SIMPLE_FORMS = ("Explain why {x} in simple words.",)
DEVICES = (
    "a fridge", "a microwave oven", "GPS", "a bicycle's gears", "a thermostat", "a vaccine", "a credit card payment",
    "a solar panel", "a wind turbine", "a dishwasher", "noise-cancelling headphones", "a touchscreen", "Wi-Fi",
    "a lock and key", "a flushing toilet", "an electric car", "a camera lens", "a pressure cooker", "a smoke alarm",
    "a barcode scanner", "an elevator", "a heat pump", "a search engine", "email", "a 3D printer", "a compass",
    "an X-ray machine", "a hot air balloon", "a sewing machine", "a mechanical watch",
)
DEVICE_FORMS = ("How does {x} work?", "Explain how {x} works to a ten-year-old.")
DISHES = (
    "pancakes", "tomato soup", "a vegetable curry", "guacamole", "banana bread", "fried rice", "a Greek salad",
    "lentil stew", "scrambled eggs", "hummus", "a tomato pasta sauce", "roast potatoes", "chocolate chip cookies",
    "a smoothie", "porridge", "a stir-fry", "apple crumble", "mashed potatoes", "a chickpea salad", "flatbread",
    "a frittata", "lemonade", "minestrone", "baked salmon", "rice pudding",
)
DISH_FORMS = ("Give me a simple recipe for {x}.", "What goes well with {x}?")
ANIMALS = (
    "octopuses", "penguins", "elephants", "honeybees", "owls", "dolphins", "kangaroos", "ants", "wolves", "sloths",
    "hedgehogs", "crows", "tortoises", "sharks", "giraffes", "bats", "otters", "hummingbirds", "jellyfish", "camels",
    "foxes", "parrots", "seahorses", "polar bears", "earthworms", "beavers", "flamingos", "spiders", "koalas",
    "salmon",
)
ANIMAL_FORMS = ("Tell me five interesting facts about {x}.", "Where do {x} live and what do they eat?")
SUBJECTS = (
    "a lighthouse keeper", "a lost umbrella", "the first day of school", "a robot that learns to cook",
    "a rainy Sunday", "an old bookshop", "a dragon who is afraid of fire", "a train journey", "a garden at night",
    "a forgotten letter", "the last day of summer", "a cat who runs a cafe", "a snowstorm", "moving to a new town",
    "a broken clock", "a picnic that goes wrong", "the sea", "an inventor's workshop",
    "a friendship between a fox and a crow", "a city waking up", "a message in a bottle", "a kite",
    "an astronaut's first night in space", "a village market", "a quiet library", "a grandmother's recipe", "the moon",
    "a marathon", "a violin", "a mountain cabin",
)
SUBJECT_FORMS = ("Write a short story about {x}.", "Write a short poem about {x}.")
DEBATES = (
    "working from home", "school uniforms", "self-driving cars", "a four-day working week", "social media",
    "nuclear power", "homework for young children", "living in a big city", "electric scooters", "online shopping",
    "learning two languages at school", "space exploration", "zoos", "tipping in restaurants", "video games",
    "open-plan offices", "fast fashion", "owning a car", "smartphones for children", "remote learning",
    "daylight saving time", "a universal basic income", "tourism in small towns", "plastic bags", "reality television",
)
DEBATE_FORMS = ("What are the pros and cons of {x}?", "Summarise the arguments for and against {x}.")
FEELINGS = (
    "nervous before a job interview", "lonely after moving abroad", "bored at work", "overwhelmed by my to-do list",
    "unmotivated to exercise", "anxious about an exam", "tired all the time", "stuck on a creative project",
    "worried about money", "homesick", "jealous of a friend's success", "restless in the evenings",
    "nervous about driving on the motorway", "frustrated with a slow computer", "guilty about procrastinating",
    "shy at parties", "annoyed by a noisy neighbour", "sad that summer is over", "scared of public speaking",
    "unsure which career to choose",
)
FEELING_FORMS = ("I feel {x}. What can I do?",)
EMAILS = (
    "my landlord asking to fix a leaking tap", "a colleague thanking them for their help",
    "my manager asking for a day off", "a neighbour about a parcel I took in for them",
    "a teacher asking about my child's progress", "a shop asking for a refund", "a friend I have not seen for years",
    "a client apologising for a delay", "a hotel asking for a late check-out", "my team announcing a new meeting time",
    "a plumber asking for a quote", "a club cancelling this week's session",
    "a new colleague welcoming them to the team", "my bank asking about an unknown charge",
    "a friend congratulating them on a new job", "a library asking to renew a book", "a gym cancelling my membership",
    "a local council about a broken streetlight", "my doctor's surgery asking to move an appointment",
    "a volunteer group offering to help",
)
EMAIL_FORMS = ("Write a short email to {x}.",)
FOLLOW_UPS = ("Can you say that in fewer words?", "Give me a concrete example.", "What would you do first?",
              "Why is that?", "Put that in a table.", "Tell me more about the second point.")


def main() -> None:
    prompts = [form.format(x=x) for x in ACTIVITIES for form in ACTIVITY_FORMS]
    prompts += [form.format(x=x) for x in PHENOMENA for form in PHENOMENON_FORMS]
    prompts += [form.format(a=a, b=b) for a, b in PAIRS for form in PAIR_FORMS]
    random.Random(0).shuffle(prompts)
    batches = ((ACTIVITIES, TIP_FORMS), (PHENOMENA, SIMPLE_FORMS), (DEVICES, DEVICE_FORMS), (DISHES, DISH_FORMS),
               (ANIMALS, ANIMAL_FORMS), (SUBJECTS, SUBJECT_FORMS), (DEBATES, DEBATE_FORMS), (FEELINGS, FEELING_FORMS),
               (EMAILS, EMAIL_FORMS))  # fmt: skip
    second = [form.format(x=x) for topics, forms in batches for x in topics for form in forms]
    random.Random(1).shuffle(second)
    lines = [{"turns": [p, FOLLOW_UPS[i % len(FOLLOW_UPS)]]} if i % 4 == 0 else {"prompt": p}
             for batch in (prompts, second) for i, p in enumerate(batch)]
    OUT.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"{OUT}: {len(lines)} prompts")


if __name__ == "__main__":
    main()
