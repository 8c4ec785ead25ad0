"""The code-editing workload: rewrite a named standard-library function so that the answer
mostly copies the prompt (where prompt lookup and other copy-drafters pay).

Each prompt is an instruction plus ``inspect.getsource`` of a function every Python install has,
so the workload needs no data file (:func:`specstrat.hf.hf_demo.code_requests` turns the prompts
into requests with a model's tokenizer).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

__all__ = ["CODE_TASKS", "CodeTask", "code_prompts"]


@dataclass(frozen=True, slots=True)
class CodeTask:
    """One prompt of the workload: ``instruction`` applied to the function ``target``
    (``module.name``)."""

    target: str
    instruction: str = "Add type hints to this function. Keep its body exactly the same."

    def source(self) -> str:
        """The function's source, from the running interpreter's standard library."""
        module, _, name = self.target.rpartition(".")
        return inspect.getsource(getattr(importlib.import_module(module), name))

    def text(self) -> str:
        """The prompt: the instruction, then the source in a fenced block."""
        return f"{self.instruction}\n\n```python\n{self.source()}```"


#: Eight short pure-Python functions (148-585 characters of source). Beside each: transformers'
#: prompt lookup (``prompt_lookup_num_tokens=8``) over its plain ``generate`` on that prompt
#: alone, SmolLM2-135M-Instruct, 64 new tokens, one thread, mean 1.95x
#: (``python bench/hf_speed.py --rounds 1 --sections 5``, 2026-12-01).
CODE_TASKS = (
    CodeTask("shlex.quote"),  # 3.45x
    CodeTask("textwrap.shorten"),  # 1.66x
    CodeTask("colorsys.rgb_to_hsv"),  # 2.21x
    CodeTask("html.escape"),  # 1.77x
    CodeTask("calendar.leapdays"),  # 2.15x
    CodeTask("statistics.median"),  # 1.06x
    CodeTask("string.capwords"),  # 2.25x
    CodeTask("fnmatch.filter"),  # 1.01x
)


def code_prompts(count: int) -> list[tuple[str, str]]:
    """``count`` (name, prompt text) pairs, cycling through :data:`CODE_TASKS`."""
    tasks = [CODE_TASKS[i % len(CODE_TASKS)] for i in range(count)]
    return [(f"{t.target}#{i // len(CODE_TASKS)}", t.text()) for i, t in enumerate(tasks)]
