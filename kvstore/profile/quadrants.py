"""The (input length, output length) quadrants that name a workload.

The one place the thresholds live (the README's profile section lists them).
A request is classed by its lengths alone, not by what the trace calls it:

============  =======================  ==================  =====================================
name          input tokens             output tokens       typical
============  =======================  ==================  =====================================
``chat``      < ``LONG_INPUT``         < ``LONG_OUTPUT``   a question and a short answer
``rag``       ``LONG_INPUT`` ..        < ``LONG_OUTPUT``   RAG / summarization: long documents
              < ``AGENT_INPUT``                            in, a short answer out
``agent``     >= ``AGENT_INPUT``       < ``LONG_OUTPUT``   a tool-using agent step: the whole
                                                           history resent, a short step out
``reasoning`` < ``LONG_INPUT``         >= ``LONG_OUTPUT``  a short prompt, a long chain of
                                                           thought
``batch``     >= ``LONG_INPUT``        >= ``LONG_OUTPUT``  long in and long out: offline
                                                           document generation / translation
============  =======================  ==================  =====================================

``LONG_INPUT`` = 4,096 tokens is past a chat turn with its system prompt;
``LONG_OUTPUT`` = 1,024 tokens is past a chat answer (a few hundred tokens) and
short of a reasoning trace (thousands); ``AGENT_INPUT`` = 32,768 tokens is an
accumulated tool-use history (Claude Code steps resend ~100k).
"""

from __future__ import annotations

__all__ = ["AGENT_INPUT", "LONG_INPUT", "LONG_OUTPUT", "QUADRANTS", "UNKNOWN", "classify"]

LONG_INPUT = 4096
LONG_OUTPUT = 1024
AGENT_INPUT = 32768

#: Quadrant names in display order, with the label the report prints.
QUADRANTS: dict[str, str] = {
    "chat": "chat",
    "rag": "RAG / summarization",
    "agent": "agents",
    "reasoning": "reasoning",
    "batch": "batch",
}
#: A request whose output length is not known (live traffic without it).
UNKNOWN = "unknown"


def classify(input_tokens: int, output_tokens: int | None) -> str:
    """The quadrant name of one request."""
    if output_tokens is None:
        return UNKNOWN
    if output_tokens >= LONG_OUTPUT:
        return "batch" if input_tokens >= LONG_INPUT else "reasoning"
    if input_tokens >= AGENT_INPUT:
        return "agent"
    return "rag" if input_tokens >= LONG_INPUT else "chat"
