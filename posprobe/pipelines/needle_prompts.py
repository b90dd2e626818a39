"""Needle-in-a-haystack prompts built in tokens (SPEC §18), so that length and depth are measured, not assumed.

A prompt is the concatenation of separately tokenised pieces: the tokenizer's leading special tokens (a BOS where
it adds one), the intro, the haystack (the tail of one sentence of the haystack text, cut to the token so that the
prompt has exactly the requested length, then whole sentences), the needle inserted at the sentence boundary
nearest to the requested depth, then the question. The answer (`" " + answer`) is the continuation the model
should produce. Every piece's token span is known by construction and recorded; nothing is capped: a haystack too
short for a length is refused.

Token spans are [start, end) indices into the prompt's ids. depth = haystack tokens before the needle / haystack
tokens (the needle excluded).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from posprobe.errors import ArgumentValueError, PosprobeError
from posprobe.pipelines.defaults import NEEDLE_DIGITS

ANSWER_FIELD = "{answer}"
DEFAULT_INTRO = (
    "A pass key is hidden somewhere in the long text below. Find it and remember it: "
    "you will be asked for it at the end.\n"
)
DEFAULT_NEEDLE = " The pass key is {answer}. Remember it. {answer} is the pass key."
DEFAULT_QUESTION = "\nWhat is the pass key? The pass key is"
DEFAULT_DIGITS = NEEDLE_DIGITS
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class NeedleTask:
    """What is hidden and asked: `needle` holds `{answer}`; `question` is the prompt's end, the answer its
    continuation. `answer` None: a random `digits`-digit pass key per trial (seeded); else this fixed text."""

    intro: str = DEFAULT_INTRO
    needle: str = DEFAULT_NEEDLE
    question: str = DEFAULT_QUESTION
    answer: str | None = None
    digits: int = DEFAULT_DIGITS
    # True: the prompt in the tokenizer's own chat template (the intro, haystack and the question's sentences as the
    # user's message; the question's last words, after its last sentence end, open the assistant's reply); False:
    # plain text; None: the chat template where the tokenizer ships one (resolved when the prompts are built)
    chat: bool | None = None

    def __post_init__(self) -> None:
        if ANSWER_FIELD not in self.needle:
            raise ArgumentValueError(
                "needle",
                f"the {{arg}} template {self.needle!r} does not contain {ANSWER_FIELD}: the model could not find "
                "the answer anywhere",
                f"put {ANSWER_FIELD} where the answer goes, e.g. {{arg}} ' The secret word is {ANSWER_FIELD}.'",
            )
        if ANSWER_FIELD in self.question:
            raise ArgumentValueError(
                "question",
                f"the {{arg}} template {self.question!r} contains {ANSWER_FIELD}: it would give the answer away",
                "end the question where the answer should follow, e.g. {arg} ' The secret word is'",
            )
        if self.answer is not None and not self.answer.strip():
            raise ArgumentValueError("answer", "{arg} is empty", "pass a word or a number, or drop {arg}")
        if not 1 <= self.digits <= 18:
            raise ArgumentValueError("digits", f"{{arg}} {self.digits} is not in 1..18", "use e.g. {arg} 5")

    def answer_for(self, seed: int, trial: int) -> str:
        """The answer of trial `trial`: the fixed answer, or a pass key drawn from (seed, trial) alone (the same in
        every length and depth, so cells differ by position only; any rank can draw it)."""
        if self.answer is not None:
            return self.answer.strip()
        rng = np.random.default_rng([seed, trial])
        return str(int(rng.integers(10 ** (self.digits - 1), 10**self.digits)))


@dataclass(frozen=True)
class NeedlePrompt:
    """One prompt: requested `length` (tokens) and `depth` (0..1), `trial`; `prompt_ids`, `answer_ids`;
    `needle_span` and `haystack_span` [start, end) token indices of the prompt (the haystack span holds the
    needle); `answer` the answer text; `text` the prompt's ids decoded."""

    length: int
    depth: float
    trial: int
    prompt_ids: tuple[int, ...]
    answer_ids: tuple[int, ...]
    needle_span: tuple[int, int]
    haystack_span: tuple[int, int]
    answer: str
    text: str
    chat: dict | None = None  # chat format: {'messages': the user's message, 'assistant_prefix': the reply's start}

    @property
    def achieved_length(self) -> int:
        return len(self.prompt_ids)

    @property
    def achieved_depth(self) -> float:
        """Haystack tokens before the needle / haystack tokens (the needle excluded)."""
        hay = self.haystack_span[1] - self.haystack_span[0] - (self.needle_span[1] - self.needle_span[0])
        return (self.needle_span[0] - self.haystack_span[0]) / hay if hay else 0.0

    def record(self) -> dict:
        """The prompts.jsonl record."""
        return {
            "length": self.length,
            "depth": self.depth,
            "trial": self.trial,
            "achieved_length": self.achieved_length,
            "achieved_depth": self.achieved_depth,
            "answer": self.answer,
            "prompt_ids": list(self.prompt_ids),
            "answer_ids": list(self.answer_ids),
            "needle_span": list(self.needle_span),
            "haystack_span": list(self.haystack_span),
            "text": self.text,
            "format": "plain" if self.chat is None else "chat",
            **({} if self.chat is None else self.chat),
        }


def sentences(texts: Iterable[str]) -> Iterator[str]:
    """The sentences of `texts` in order (split after '.', '!' or '?' followed by white space)."""
    for text in texts:
        for sentence in _SENTENCE_END.split(text.strip()):
            if sentence.strip():
                yield " ".join(sentence.split())


class Haystack:
    """The haystack text as tokenised sentences, read lazily from `texts` as far as the longest prompt needs.
    `encode(text) -> ids` tokenises without special tokens; `name` says where the text came from."""

    def __init__(self, texts: Iterable[str], encode: Callable[[str], list[int]], name: str):
        self._sentences = sentences(texts)
        self.encode = encode
        self.name = name
        self.pieces: list[list[int]] = []  # token ids of each sentence read so far, " " + sentence
        self.tokens = 0  # tokens read so far

    def _piece(self, index: int) -> list[int] | None:
        """The token ids of sentence `index` (reading on as far as needed), None past the end of the text."""
        while len(self.pieces) <= index:
            sentence = next(self._sentences, None)
            if sentence is None:
                return None
            ids = self.encode(" " + sentence)
            if ids:
                self.pieces.append(ids)
                self.tokens += len(ids)
        return self.pieces[index]

    def take(self, n_tokens: int) -> tuple[list[int], list[int]] | None:
        """(ids, sentence boundaries) of exactly `n_tokens` haystack tokens: the tail of one sentence, cut to the
        token, then whole sentences, so that every boundary after the first fragment, the end included, lies
        between whole sentences. Boundaries are token offsets: 0, the end of the fragment, the end of each
        sentence. The window starts at the text's second sentence and moves on only where the first one is
        shorter than the fragment needed. None when the text holds too few tokens."""
        first = 1
        while (lead := self._piece(first - 1)) is not None:
            total, last, ends = 0, first, []
            while (piece := self._piece(last)) is not None and total + len(piece) <= n_tokens:
                total, last = total + len(piece), last + 1
                ends.append(total)
            fragment = n_tokens - total
            if piece is None and fragment > len(lead):
                return None
            if fragment <= len(lead):
                ids = lead[len(lead) - fragment :] if fragment else []
                for index in range(first, last):
                    ids = ids + self.pieces[index]
                boundaries = sorted({0, fragment, *(fragment + end for end in ends)})
                return ids, boundaries
            first += 1
        return None


def leading_special_ids(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts before a text (a BOS), [] when none."""
    plain = tokenizer("x", add_special_tokens=False)["input_ids"]
    full = tokenizer("x", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if list(full[start : start + len(plain)]) == list(plain):
            return list(full[:start])
    return []


class PromptBuilder:
    """Builds `NeedlePrompt`s of a task over a haystack with one tokenizer (`decode` for the prompt text)."""

    def __init__(self, task: NeedleTask, haystack: Haystack, tokenizer, seed: int):
        self.task, self.haystack, self.seed = task, haystack, seed
        self.encode = haystack.encode
        self.decode = lambda ids: tokenizer.decode(list(ids))
        self.unknown = getattr(tokenizer, "unk_token_id", None)
        self.chat = has_chat_template(tokenizer) if task.chat is None else bool(task.chat)
        if not self.chat:
            self.prefix = leading_special_ids(tokenizer) + self.encode(task.intro)
            self.question = self.encode(task.question)
            self.user_end, self.reply = 0, ""
            return
        if not has_chat_template(tokenizer):
            raise ArgumentValueError(
                "chat",
                "{arg}: the model's tokenizer ships no chat template",
                "drop {arg} (plain prompts), or use a chat model's folder",
            )
        before, after = chat_frame(tokenizer)
        asked, self.reply = split_question(task.question)
        self.prefix = self.encode(before) + self.encode(task.intro)
        # the user's message ends with `asked`; the template's end of turn and start of the reply, then the reply
        self.user_end = len(self.encode(after)) + len(self.encode(self.reply))
        self.question = self.encode(asked) + self.encode(after) + self.encode(self.reply)
        self.frame_start = len(self.encode(before))

    def _needle(self, trial: int) -> tuple[list[int], str]:
        answer = self.task.answer_for(self.seed, trial)
        return self.encode(self.task.needle.replace(ANSWER_FIELD, answer)), answer

    def _answer_ids(self, answer: str) -> list[int]:
        """The token ids of " " + `answer`, refused where they do not read back as the answer (white space aside):
        characters the tokenizer maps to its unknown token, or normalises (case, accents), would score another
        answer than the one asked for."""
        ids = self.encode(" " + answer)
        back = self.decode(ids)
        if (self.unknown is not None and self.unknown in ids) or "".join(back.split()) != "".join(answer.split()):
            raise ArgumentValueError(
                "answer",
                f"the answer '{answer}' does not survive the model's tokenizer: it reads back as '{back.strip()}'",
                "pass {arg} with characters the tokenizer knows (e.g. digits or plain words)",
            )
        return ids

    def build(self, length: int, depth: float, trial: int) -> NeedlePrompt:
        """The prompt of exactly `length` tokens with the needle at the sentence boundary nearest `depth`."""
        needle, answer = self._needle(trial)
        budget = length - len(self.prefix) - len(needle) - len(self.question)
        if budget < 1:
            raise ArgumentValueError(
                "lengths",
                f"a length of {length} tokens leaves no room for haystack: the intro, needle and question take "
                f"{length - budget} tokens",
                f"use {{arg}} of at least {length - budget + 64}",
            )
        taken = self.haystack.take(budget)
        if taken is None:
            raise PosprobeError(
                f"the haystack {self.haystack.name} holds {self.haystack.tokens} tokens, fewer than the {budget} a "
                f"prompt of {length} tokens needs",
                "pass a longer --haystack (builtin:kjv holds about a million tokens) or smaller --lengths",
            )
        hay, boundaries = taken
        at = min(boundaries, key=lambda b: (abs(b - depth * budget), b))
        start = len(self.prefix)
        ids = self.prefix + hay[:at] + needle + hay[at:] + self.question
        answer_ids = self._answer_ids(answer)
        return NeedlePrompt(
            length=length,
            depth=depth,
            trial=trial,
            prompt_ids=tuple(ids),
            answer_ids=tuple(answer_ids),
            needle_span=(start + at, start + at + len(needle)),
            haystack_span=(start, start + budget + len(needle)),
            answer=answer,
            text=self.decode(ids),
            chat=None
            if not self.chat
            else {
                "messages": [
                    {"role": "user", "content": self.decode(ids[self.frame_start : len(ids) - self.user_end])}
                ],
                "assistant_prefix": self.reply,
            },
        )


CHAT_MARK = "\u2063posprobe-needle\u2063"  # stands for the user's message while the template is rendered


def has_chat_template(tokenizer) -> bool:
    """Whether the tokenizer ships a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def chat_frame(tokenizer) -> tuple[str, str]:
    """(text before, text after) the user's message in the tokenizer's own chat template, for one user turn with
    the generation prompt (the assistant's turn opened): the template rendered around a marker."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": CHAT_MARK}], tokenize=False,
                                         add_generation_prompt=True)  # fmt: skip
    if not isinstance(text, str) or text.count(CHAT_MARK) != 1:
        raise PosprobeError(
            "the tokenizer's chat template does not place a user's message once in its text",
            "drop --chat (plain prompts)",
        )
    before, after = text.split(CHAT_MARK)
    return before, after


def split_question(question: str) -> tuple[str, str]:
    """(the user's part, the reply's start) of a question template in chat format: the words after its last
    sentence end ('.', '!', '?', a new line) open the assistant's reply ('The pass key is'); a question that ends
    a sentence is the user's alone."""
    cut = max((m.end() for m in re.finditer(r"[.!?\n]", question)), default=0)
    return question[:cut], question[cut:].strip()
