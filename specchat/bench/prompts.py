"""Built-in benchmark prompt sets, and user sets from JSONL files ({"prompt": ...} per line, with "suffix": a
fill-in-the-middle prompt)."""

from __future__ import annotations

import json
from pathlib import Path

from specchat.errors import SpecchatError
from specchat.fill_in_middle import Infill, infill_ids

Prompt = str | Infill  # a chat prompt (through the chat template), or code to fill in

_CODE_SNIPPET = """def parse_config(path):
    config = {}
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, value = line.split("=", 1)
            config[key.strip()] = value.strip()
    return config


def merge_configs(base, override):
    merged = dict(base)
    for key, value in override.items():
        merged[key] = value
    return merged
"""

_PASSAGE = (
    "The lighthouse at Carrow Point was built in 1871 to warn ships away from a reef that had sunk eleven "
    "vessels in forty years. Its first keeper, Thomas Avery, kept a log of every ship that passed, the "
    "weather each morning and evening, and the amount of oil the lamp consumed. The log shows that in the "
    "winter of 1874 the lamp burned for sixteen hours a day and that Avery climbed the one hundred and "
    "twelve steps of the tower nine times each night to trim the wick. In 1902 the oil lamp was replaced by "
    "an incandescent vapour burner, which tripled the light's range to twenty-two nautical miles. The "
    "keepers' cottages were enlarged in 1923 so that three families could live at the station, and a school "
    "room was added for their children. Electricity arrived in 1956, and the light was automated in 1989, "
    "when the last keeper, Margaret Hale, left the point after thirty-one years of service. Today the tower "
    "is run by a local trust that opens it to visitors in the summer months. The trust restored the lens in "
    "2014, a first-order Fresnel lens made in Paris, and it still turns on its original mercury bath. "
    "Visitors can read Avery's log in the museum that now occupies the old oil store, and on clear nights "
    "the beam can still be seen from the harbour town of Penwick, eighteen miles to the north."
)

PROMPT_SETS: dict[str, list[str]] = {
    "chat": [
        "What are three good habits for staying healthy?",
        "Explain why the sky is blue in simple words.",
        "Give me some tips for learning a new language.",
    ],
    "code": [
        f"Here is some Python code:\n\n{_CODE_SNIPPET}\nRewrite this code with type hints and docstrings.",
        f"Here is some Python code:\n\n{_CODE_SNIPPET}\nAdd a function `save_config(config, path)` that "
        "writes the file format `parse_config` reads, and show the whole module.",
    ],
    "summarize": [
        f"{_PASSAGE}\n\nSummarize the history of the lighthouse in a few sentences.",
        f"{_PASSAGE}\n\nList the dates mentioned in the text and what happened at each.",
    ],
    "json": [  # for `--format json`: structured answers, two of them drawn from a text
        f"{_PASSAGE}\n\nReturn a JSON object whose key \"events\" lists every dated event of the text, each an "
        "object with the keys \"year\" (a number) and \"event\" (a string).",
        f"{_PASSAGE}\n\nDescribe the lighthouse as a JSON object with the keys name, built (a year), keepers (a "
        "list of names), range_nautical_miles and automated (a year).",
        "Return a JSON object describing three fictional books, each with a title, an author, a year and a list of "
        "genres.",
    ],
}


# Long inputs (SpecExtend's setting): about this many tokens of the Python reference manual, which every
# CPython installation carries (`pydoc_data.topics`, 465K characters; about 4.2 characters a token here).
LONG_SETS = {"long1k": 1000, "long4k": 4000, "long7k": 7000, "long16k": 16000, "long30k": 30000}
# Code completion at a cursor: holes of HOLE_LINES lines in these standard-library modules' function bodies, with
# the 60 lines before and the 20 after (about 800 tokens).
FIM_MODULES = ("json/decoder.py", "textwrap.py", "csv.py", "shlex.py")
HOLE_LINES = 6
PROMPT_SET_NAMES = (*PROMPT_SETS, *LONG_SETS, "fim")


def infill_prompts() -> list[Infill]:
    """One hole a module: the first body lines of its largest function, from the middle of its first half."""
    import ast
    import sysconfig

    holes = []
    for module in FIM_MODULES:
        source = (Path(sysconfig.get_paths()["stdlib"]) / module).read_text()
        functions = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)]
        largest = max(functions, key=lambda node: node.end_lineno - node.lineno)
        start = largest.body[0].lineno - 1 + (largest.end_lineno - largest.lineno) // 4  # 0-based: the hole's first
        lines = source.splitlines(keepends=True)
        holes.append(Infill("".join(lines[max(0, start - 60) : start]),
                            "".join(lines[start + HOLE_LINES : start + HOLE_LINES + 20])))  # fmt: skip
    return holes


def prompt_ids(tokenizer, prompt: Prompt) -> list[int]:
    """The ids a run starts from: a chat prompt through the template, an infill through the FIM markers."""
    from specchat.engine.prompt import encode_prompt

    if isinstance(prompt, str):
        return encode_prompt(tokenizer, prompt)
    return infill_ids(tokenizer, prompt)


def long_document(tokens: int) -> str:
    """About `tokens` tokens of the reference manual, its topics in alphabetical order (`assert` first)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))[: int(tokens * 4.2)]


def long_prompts(tokens: int) -> list[str]:
    """Four tasks over the same ~`tokens` tokens of documentation, each needing the whole of it or its far
    end: summarise it, list what it describes, continue it, and recall a detail of its very first topic."""
    document = long_document(tokens)
    return [
        f"{document}\n\nSummarize the documentation above in a few paragraphs.",
        f"{document}\n\nList the Python statements the documentation above describes, one sentence each.",
        f"{document}\n\nContinue the documentation above with its next topic, in the same style.",
        f"{document}\n\nAt its very start, the documentation above gives the grammar of the assert statement. "
        "Quote that grammar rule and say what the simple form of assert is equivalent to.",
    ]


def load_prompt_sets(names: list[str], prompts_file: Path | None = None) -> dict[str, list[Prompt]]:
    """The requested built-in sets, plus the file's prompts as a set named after the file."""
    sets = {}
    for name in names:
        if name not in PROMPT_SET_NAMES:
            raise SpecchatError(f"unknown prompt set '{name}'; built-in sets: {', '.join(PROMPT_SET_NAMES)}")
        if name == "fim":
            sets[name] = infill_prompts()
        else:
            sets[name] = PROMPT_SETS[name] if name in PROMPT_SETS else long_prompts(LONG_SETS[name])
    if prompts_file is not None:
        sets[prompts_file.stem] = _read_jsonl(prompts_file)
    return sets


def _read_jsonl(path: Path) -> list[Prompt]:
    if not path.is_file():
        raise SpecchatError(f"no such prompts file: {path}")
    prompts: list[Prompt] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            prompt, suffix = entry["prompt"], entry.get("suffix")
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise SpecchatError(f'{path}:{number}: expected a JSON object with a "prompt" string') from None
        if suffix is not None:
            if not isinstance(prompt, str) or not isinstance(suffix, str):
                raise SpecchatError(f'{path}:{number}: "prompt" and "suffix" must be strings')
            prompts.append(Infill(prompt, suffix))
            continue
        if not isinstance(prompt, str) or not prompt.strip():
            raise SpecchatError(f'{path}:{number}: "prompt" must be a non-empty string')
        prompts.append(prompt)
    if not prompts:
        raise SpecchatError(f"{path} holds no prompts")
    return prompts
