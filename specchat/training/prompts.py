"""Prompts for self-distillation data, from text every installation has: the Python standard library's
source and docstrings (explain, summarise, write code), the system's package documentation
(/usr/share/doc: summarise, explain), and open-chat prompts built from topics and forms written here; or a
user's own prompts from a JSONL file (`file_prompts`).

Every prompt has a stable id (a hash of its turns), so a data run can resume and split held-out prompts by
id. Prompts equal to a `specchat bench` prompt are dropped: the benchmarks measure drafters on text they
were not trained on.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import itertools
import json
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from specchat.bench.prompts import PROMPT_SETS
from specchat.errors import SpecchatError

SNIPPET_CHARS = 2400  # source and documents longer than this are cut: prompts stay short to answer quickly
SNIPPET_LINES = 60


@dataclass(frozen=True)
class Prompt:
    source: str  # "stdlib-explain", "docs-summarize", "chat", ...
    turns: tuple[str, ...]  # the user's messages; after the first, each follows the model's previous answer

    @property
    def id(self) -> str:
        return hashlib.sha1("\x1e".join(self.turns).encode()).hexdigest()[:16]


def all_prompts(seed: int = 0, *, stdlib: Path | None = None,
                docs: Path | None = Path("/usr/share/doc")) -> list[Prompt]:
    """Every source's prompts, deduplicated, bench prompts removed, in one seeded order that takes the
    families (stdlib, docs, chat) in turn: a partial run covers all of them about equally."""
    stdlib = stdlib or Path(sysconfig.get_paths()["stdlib"])
    unique = _unique(stdlib_prompts(stdlib) + doc_prompts(docs) + chat_prompts())
    families: dict[str, list[Prompt]] = {}  # stdlib, docs, chat: taken in turn, each in a seeded order
    for prompt in sorted(unique.values(), key=lambda prompt: prompt.id):
        families.setdefault(prompt.source.split("-")[0], []).append(prompt)
    rng = random.Random(seed)
    for family in families.values():
        rng.shuffle(family)
    rounds = itertools.zip_longest(*(families[name] for name in sorted(families)))
    return [prompt for round_ in rounds for prompt in round_ if prompt is not None]


def file_prompts(path: Path) -> list[Prompt]:
    """A JSONL file's prompts in its order, a line each: {"prompt": "..."} for one turn, or {"turns": ["...",
    "..."]} for a conversation whose later turns follow the model's answers. Duplicates and bench prompts are
    dropped, as from the built-in ones."""
    if not path.is_file():
        raise SpecchatError(f"no such prompts file: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecchatError(f"{path} is not UTF-8 text") from None
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            turns = entry["turns"] if "turns" in entry else [entry["prompt"]]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise SpecchatError(f'{path}:{number}: expected a JSON object with a "prompt" string or a "turns" '
                                "list") from None  # fmt: skip
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise SpecchatError(f"{path}:{number}: a prompt and every turn must be a non-empty string")
        prompts.append(Prompt("file", tuple(turns)))
    unique = _unique(prompts)
    if not unique:
        raise SpecchatError(f"{path} holds no prompts (besides the benchmarks' own)")
    return list(unique.values())


def _unique(prompts: list[Prompt]) -> dict[str, Prompt]:
    """The prompts by id, each once, those opening with a bench prompt left out (the benchmarks measure drafters
    on text they were not trained on)."""
    banned = {_normal(text) for texts in PROMPT_SETS.values() for text in texts}
    return {prompt.id: prompt for prompt in prompts if _normal(prompt.turns[0]) not in banned}


def stdlib_prompts(root: Path) -> list[Prompt]:
    """Per documented function or class of the standard library's modules (tests and private modules
    skipped): explain its code, summarise its docstring, or write it from its signature and docstring."""
    prompts = []
    for module, path in stdlib_modules(root):
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.ClassDef) or node.name.startswith("_"):
                continue
            docstring = ast.get_docstring(node)
            code = _cut(ast.get_source_segment(source, node) or "")
            if not docstring or len(docstring) < 40 or not code:
                continue
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            prompts.append(Prompt("stdlib-explain", (
                f"Explain what this {kind} from Python's `{module}` module does:\n\n```python\n{code}\n```",)))
            prompts.append(Prompt("stdlib-summarize", (
                f"Summarize this documentation of `{module}.{node.name}` in a few sentences:\n\n{_cut(docstring)}",)))
            if kind == "function":
                signature = f"{node.name}({ast.unparse(node.args)})"
                summary = docstring.strip().splitlines()[0]
                prompts.append(Prompt("stdlib-write", (
                    f"Write a Python function `{signature}`: {summary}",)))
    return prompts


def stdlib_modules(root: Path) -> list[tuple[str, Path]]:
    """The standard library's public modules under `root` (tests and private modules skipped), as (dotted
    name, path), in name order."""
    paths = sorted(root.glob("*.py")) + sorted(root.glob("*/*.py"))
    return [(".".join(path.relative_to(root).with_suffix("").parts), path) for path in paths
            if not any(part.startswith(("_", "test")) for part in path.relative_to(root).parts)]  # fmt: skip


def doc_prompts(root: Path | None) -> list[Prompt]:
    """Per package README in `root` (plain or gzipped): summarise it, or say what the package is for."""
    if root is None or not root.is_dir():
        return []
    prompts = []
    for path in sorted(root.glob("*/README*")):
        text = _read_doc(path)
        if text is None or len(text) < 400:
            continue
        package = path.parent.name
        prompts.append(Prompt("docs-summarize", (
            f"Summarize this README of the `{package}` package:\n\n{_cut(text)}",)))
        prompts.append(Prompt("docs-explain", (
            f"Here is the README of `{package}`:\n\n{_cut(text)}\n\n"
            "What is this software for, and who would use it?",)))
    return prompts


TOPICS = (
    "photosynthesis", "the water cycle", "volcanoes", "black holes", "the immune system", "compound interest",
    "the French Revolution", "machine learning", "climate change", "the printing press", "honey bees",
    "plate tectonics", "the internet", "vaccines", "electric cars", "the Roman Empire", "sleep", "coffee",
    "the stock market", "recycling", "the moon landing", "DNA", "rainbows", "earthquakes", "solar panels",
    "the human heart", "bread baking", "chess", "the Olympic Games", "jazz music", "coral reefs",
    "time zones", "inflation", "the Great Wall of China", "antibiotics", "wind turbines", "penguins",
    "the theory of evolution", "democracy", "the Renaissance", "nuclear energy", "tea", "the Silk Road",
    "glaciers", "bicycles", "public libraries", "the periodic table", "rain forests", "gravity", "music theory",
)
FORMS = (
    "Explain {topic} to a ten-year-old.",
    "What are the most important facts about {topic}?",
    "Write a short essay about {topic}.",
    "Give me five interesting questions about {topic}, with answers.",
    "What are common misconceptions about {topic}?",
    "Write a short story in which {topic} plays a central role.",
    "Write a poem about {topic}.",
    "How would you teach a beginner about {topic}? Give a step-by-step plan.",
    "Summarize the history of {topic}.",
    "Write a dialogue between a teacher and a student about {topic}.",
)
TASKS = (
    "How do I make a good cup of tea?", "How do I change a flat bicycle tyre?", "How can I sleep better?",
    "How do I start learning to play the guitar?", "How do I write a good cover letter?",
    "How can I save money on groceries?", "How do I keep houseplants alive?", "How do I prepare for a job interview?",
    "How do I plan a week of healthy meals?", "How do I organise a small birthday party?",
    "How do I back up my files?", "How do I learn to touch type?", "How do I train for a 5 km run?",
    "How do I write a clear email to my manager?", "How do I make a simple budget?",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python script that counts the words in a text file.",
    "Write a Python class for a bank account with deposit and withdraw methods.",
    "Write a function that returns the n-th Fibonacci number, and explain its complexity.",
    "Write a shell command that finds the ten largest files in a directory.",
    "Rewrite this sentence in a formal tone: hey, can u send me the report asap?",
    "Rewrite this paragraph to be clearer: The meeting that was planned for the team which was to be on "
    "Monday has been moved, because of the fact that many people are away, to Wednesday.",
    "Write a story about a robot who wants to become a gardener.",
    "Write a story about two friends lost in a forest at night.",
    "Write a letter from a lighthouse cat to its owner.",
    "Write a fairy tale about a shy dragon.",
    "Write a mystery story set on a train.",
    "Describe a busy kitchen in a restaurant at dinner time.",
)
FOLLOW_UPS = (
    "Make it shorter.", "Can you give an example?", "Explain that more simply.", "Now write it as a list.",
    "What is the most important point?", "Can you continue?",
)


def chat_prompts() -> list[Prompt]:
    """Open chat: forms x topics and how-to / writing / code tasks, a third of them with a follow-up turn."""
    firsts = [form.format(topic=topic) for topic in TOPICS for form in FORMS] + list(TASKS)
    prompts = []
    for i, first in enumerate(firsts):
        turns = (first, FOLLOW_UPS[i % len(FOLLOW_UPS)]) if i % 3 == 0 else (first,)
        prompts.append(Prompt("chat", turns))
    return prompts


def _cut(text: str) -> str:
    lines = text.strip().splitlines()[:SNIPPET_LINES]
    return "\n".join(lines)[:SNIPPET_CHARS]


def _read_doc(path: Path) -> str | None:
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None


def _normal(text: str) -> str:
    return " ".join(text.split()).lower()
