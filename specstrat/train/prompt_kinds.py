"""The kinds of prompt in the default pool besides the standard-library instructions: passages
from the standard library's own docstrings with a task around each, arithmetic word problems
made from a fixed seed, and everyday requests written for this module from word lists.

Each kind is a function of the Python version's standard library and of constants here only,
so one interpreter always builds the same prompts in the same order. None of the wording comes
from a benchmark (a test checks the pool against Spec-Bench).
"""

from __future__ import annotations

import importlib
import inspect
import random
from collections.abc import Iterator

__all__ = [
    "CHAT_TOPICS",
    "PASSAGE_MODULES",
    "chat_prompts",
    "math_prompts",
    "passage_prompts",
]

#: Modules whose docstrings (the module's and its public names') give the passages.
PASSAGE_MODULES = (
    *("argparse", "asyncio", "base64", "bisect", "calendar", "collections", "contextlib"),
    *("csv", "dataclasses", "datetime", "decimal", "difflib", "enum", "fractions", "functools"),
    *("gzip", "hashlib", "heapq", "html", "inspect", "io", "ipaddress", "itertools", "json"),
    *("logging", "math", "operator", "pathlib", "pickle", "queue", "random", "re", "sched"),
    *("secrets", "shlex", "shutil", "sqlite3", "statistics", "string", "struct", "subprocess"),
    *("tarfile", "tempfile", "textwrap", "threading", "timeit", "typing", "unittest", "uuid"),
    *("warnings", "weakref", "zipfile", "zlib"),
)

_PASSAGE_TASKS = (
    "Summarise the following passage in two or three sentences.\n\n{text}",
    "Read the passage below, then list its three most important points.\n\n{text}",
    "{text}\n\nRewrite the passage above so that someone new to programming can follow it.",
    "Translate this text into {language}:\n\n{first}",
    "Passage:\n{text}\n\nQuestion: according to the passage, what is `{name}` for? Answer "
    "using only the passage.",
    "Extract every technical term from the passage below and explain each in one line.\n\n{text}",
)

_LANGUAGES = ("French", "German", "Spanish", "Italian", "Portuguese", "Dutch", "Chinese")


def _paragraphs(doc: str) -> Iterator[str]:
    """The docstring's prose paragraphs of 30 words or more and at most 480 characters (no
    examples, lists, tables or format codes)."""
    for part in doc.split("\n\n"):
        text = " ".join(part.split())
        if len(text.split()) < 30 or len(text) > 480 or "%(" in text:
            continue
        if text.startswith((">>>", "-", "*", "+", "|")):
            continue
        yield text


def passage_prompts() -> tuple[str, ...]:
    """A task around each prose paragraph of :data:`PASSAGE_MODULES`' docstrings (the module's,
    then its public names' in sorted order), the tasks taken in turn."""
    out: list[str] = []
    seen: set[str] = set()
    for module_name in PASSAGE_MODULES:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None) or [n for n in dir(module) if n[:1] != "_"]
        owners: list[tuple[str, object]] = [(module_name, module)]
        owners += [(f"{module_name}.{n}", getattr(module, n, None)) for n in sorted(names)]
        for name, obj in owners:
            for text in _paragraphs(inspect.getdoc(obj) or ""):
                if text in seen:
                    continue
                seen.add(text)
                task = _PASSAGE_TASKS[len(out) % len(_PASSAGE_TASKS)]
                language = _LANGUAGES[(len(out) // len(_PASSAGE_TASKS)) % len(_LANGUAGES)]
                first = text.split(". ")[0].rstrip(".") + "."
                out.append(task.format(text=text, name=name, language=language, first=first))
    return tuple(out)


_MATH = (
    "A shop sells pencils at {a} cents each and erasers at {b} cents each. Nadia buys {c} "
    "pencils and {d} erasers. How much does she pay? Work it out step by step.",
    "A train leaves at 08:{m:02d} and travels {a} km at {b} km per hour. When does it arrive? "
    "Show your working.",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter? Explain each "
    "step.",
    "Tomas saves {a} euros a week. He already has {b} euros. How many weeks until he has {t} "
    "euros? Reason it through.",
    "A recipe for {c} people needs {a} grams of flour. How much flour is needed for {d} "
    "people? Show the calculation.",
    "What is {a} percent of {t}? Then add {b} to the result. Explain how you got the answer.",
    "A tank holds {t} litres and fills at {a} litres per minute while leaking {c} litres per "
    "minute. How long does it take to fill from empty? Think step by step.",
    "Solve for x: {a}x + {b} = {t}. Give the steps and check the answer.",
    "A class has {t} students; {a} of them walk to school and {b} come by bus. The rest "
    "cycle. What fraction of the class cycles? Simplify it and explain.",
    "The sum of two numbers is {t} and their difference is {a}. What are the numbers? Explain "
    "the method.",
    "A box holds {a} rows of {b} eggs. {c} eggs are broken. How many whole eggs are left? Show "
    "your reasoning.",
    "A bike costs {t} dollars and is on sale for {a} percent off. What is the sale price, and "
    "how much is saved? Work through it.",
)


def math_prompts(per_template: int = 25, seed: int = 20261203) -> tuple[str, ...]:
    """``per_template`` arithmetic word problems per template, their numbers drawn from
    ``random.Random(seed)`` (the templates taken in turn)."""
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(per_template):
        for template in _MATH:
            a, b = rng.randint(2, 40), rng.randint(2, 30)
            c, d = rng.randint(2, 9), rng.randint(3, 15)
            t = rng.randint(a + b + 10, 400)
            out.append(template.format(a=a, b=b, c=c, d=d, t=t, m=rng.randint(0, 59)))
    return tuple(out)


#: Everyday requests, written for this module (no benchmark's wording).
CHAT_TOPICS = (
    "Suggest three names for a small bakery that sells sourdough and rye bread.",
    "How do I keep basil alive on a windowsill through the winter?",
    "Describe the water cycle to a ten-year-old in a few sentences.",
    "Give me a packing list for a two-night camping trip in late autumn.",
    "What is the difference between weather and climate?",
    "Write a four-line poem about a lighthouse keeper's cat.",
    "How can I politely decline a meeting invitation from a colleague?",
    "Explain how a bicycle's gears make climbing hills easier.",
    "Plan a vegetarian dinner for four with a soup, a main dish and a dessert.",
    "What should I check before buying a used car?",
    "Summarise the rules of chess for someone who has never played.",
    "Why does bread go stale, and how can I slow it down?",
    "Give tips for practising a musical instrument with only twenty minutes a day.",
    "Write a short thank-you note to a neighbour who watered my plants.",
    "How do noise-cancelling headphones work?",
    "Explain compound interest with a small worked example.",
    "Suggest a weekly routine for learning to draw faces.",
    "What are some good ways to remember people's names?",
    "Describe how a rainbow forms after a storm.",
    "Write a riddle whose answer is a shadow.",
    "How can a small team run better stand-up meetings?",
    "List five board games that work well with two players and say why.",
    "What makes a good first sentence in a short story?",
    "Explain why the sky looks orange at sunset.",
    "How do I clean a cast-iron pan without ruining its coating?",
    "Give a beginner's plan for running five kilometres in eight weeks.",
    "Write a limerick about a forgetful robot.",
    "What is the difference between a virus and a bacterium?",
    "How should I organise a bookshelf that holds two hundred books?",
    "Explain what a budget spreadsheet is and how to start one.",
    "Suggest activities for a rainy afternoon with two young children.",
    "Why do onions make people cry when they are chopped?",
    "Describe a calm morning at a harbour in three sentences.",
    "How do bees decide where to build a new hive?",
    "Give advice for writing a clear bug report.",
    "What are the pros and cons of working from home?",
    "Explain how a refrigerator keeps food cold.",
    "Write a dialogue between a teapot and a coffee mug.",
    "How can I make a small balcony feel like a garden?",
    "What is a good way to learn the basics of a new language in a month?",
)

_FORMS = (
    "Write a short story of about two hundred words about {s}.",
    "Write a poem of three stanzas about {s}.",
    "Write a friendly email inviting the team to a talk about {s}.",
    "Write a persuasive paragraph arguing that schools should teach more about {s}.",
    "Write a product description for a board game themed around {s}.",
    "Write the opening scene of a play that involves {s}.",
)

_SUBJECTS = (
    "an old clockmaker",
    "a city garden on a rooftop",
    "the first snow of the year",
    "a lost library card",
    "a robot learning to cook",
    "a night market",
    "migrating geese",
    "a village without electricity",
    "a mountain rescue dog",
    "a paper boat race",
    "a museum after closing time",
    "an inventor's failed machine",
    "the last day of summer",
    "a ship's navigator",
    "a forest fire lookout",
    "a street musician",
    "a tidal island",
    "a desert observatory",
    "a bakery at dawn",
    "a chess tournament for beginners",
    "a lighthouse in fog",
    "recycling in a small town",
    "a bridge being rebuilt",
    "a beekeeper's first season",
)

_ROLES = (
    ("a museum guide", "A visitor asks you what the oldest object in the museum is."),
    ("a ship's captain", "A passenger wants to know why the voyage is delayed."),
    ("a chemistry teacher", "A student asks why ice floats on water."),
    ("a travel agent", "A customer wants a week-long trip with no flights."),
    ("a park ranger", "A family asks how to stay safe if they meet a bear."),
    ("a detective in 1920s London", "Your assistant asks what the muddy boots tell you."),
    ("a personal trainer", "A client with a sore knee wants to keep exercising."),
    ("a librarian", "A reader wants a book like one they loved as a child."),
    ("a chef", "A diner asks what makes your tomato soup different."),
    ("an astronaut on the space station", "A school class asks how you sleep in orbit."),
    ("a bank clerk", "A customer wants to understand a savings account."),
    ("a medieval innkeeper", "A traveller asks for news from the road."),
    ("a customer support agent", "A user cannot log in after changing their password."),
    ("a gardener", "A neighbour asks why their tomato leaves are turning yellow."),
    ("a tour guide in Rome", "A tourist asks how the Colosseum was built."),
    ("a job interviewer", "Ask the candidate three questions about teamwork."),
)

_CONCEPTS = (
    "photosynthesis",
    "supply and demand",
    "the greenhouse effect",
    "plate tectonics",
    "inflation",
    "natural selection",
    "electric circuits",
    "the immune system",
    "the printing press's effect on Europe",
    "opportunity cost",
    "black holes",
    "binary numbers",
    "the scientific method",
    "democracy in ancient Athens",
    "tides",
    "vaccines",
    "machine learning",
    "the French Revolution",
    "recursion",
    "entropy",
    "public key cryptography",
    "the Silk Road",
    "osmosis",
    "exchange rates",
    "sorting algorithms",
    "the Renaissance",
    "volcanoes",
    "DNA replication",
    "the stock market",
    "gravity",
)

_CONCEPT_ASKS = (
    "Explain {c} in simple terms, with one everyday example.",
    "Give a short lesson on {c} for high-school students, ending with two quiz questions.",
    "What are common misunderstandings about {c}? Correct each one.",
)


def chat_prompts() -> tuple[str, ...]:
    """Everyday requests: :data:`CHAT_TOPICS`, then writing tasks (forms by subjects, in turn),
    role plays and explanations of concepts."""
    writing = [f.format(s=s) for i, s in enumerate(_SUBJECTS) for f in _FORMS[i % 2 :: 2]]
    roles = [
        f"Pretend you are {role}. {situation} Reply in character." for role, situation in _ROLES
    ]
    concepts = [ask.format(c=c) for c in _CONCEPTS for ask in _CONCEPT_ASKS]
    return (*CHAT_TOPICS, *writing, *roles, *concepts)
