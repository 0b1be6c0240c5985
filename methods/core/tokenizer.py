"""A byte-level BPE tokenizer trained locally, with a chat template.

The small profile cannot download a tokenizer, so each warm start trains one on
its domain's training corpus with the ``tokenizers`` library and wraps it in a
``PreTrainedTokenizerFast`` that saves as an ordinary ``save_pretrained``
directory.  Pre-tokenization isolates whitespace runs, single digits and
punctuation, and BPE merges are capped at two characters, so that a name or a
number is split the same way wherever it appears (a tiny model must copy ids
and names from observations into calls; small-profile.md section 6).

The chat format is ChatML (``<|im_start|>role\\n...<|im_end|>\\n``), the same as
Qwen's, so a real Qwen checkpoint drops in with its own tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

IM_START, IM_END, PAD, LATENT = "<|im_start|>", "<|im_end|>", "<|pad|>", "<|latent|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END, LATENT]

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 768, max_token_length: int = 2) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``corpus`` (deterministic for a fixed corpus)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\s+|\d|[^\w\s]"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        max_token_length=max_token_length,
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START, LATENT],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


class ChatEncoder:
    """Incremental ChatML encoding that matches ``apply_chat_template`` token for token.

    Rollouts grow a conversation turn by turn; re-applying the template to the
    whole conversation each turn would re-tokenize everything.  Because every
    segment boundary is a pre-tokenization boundary, encoding the pieces
    separately gives the same ids (checked in tests, for the suite's own
    tokenizers and for SmolLM2's).  A real model's template may open every
    conversation that has no system message with its own (SmolLM2's does:
    "You are a helpful AI assistant named SmolLM, ..."); :meth:`prompt` adds it
    the same way (``default_system``, read from the template once).
    """

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.im_start = tokenizer.convert_tokens_to_ids(IM_START)
        self.im_end = tokenizer.convert_tokens_to_ids(IM_END)
        self.eos_id = self.im_end
        self.pad_id = tokenizer.pad_token_id
        self._newline = self.encode("\n")
        self._headers: dict[str, list[int]] = {}
        self.default_system = _default_system(tokenizer)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def header(self, role: str) -> list[int]:
        if role not in self._headers:
            self._headers[role] = [self.im_start] + self.encode(role + "\n")
        return self._headers[role]

    def message(self, role: str, content: str) -> list[int]:
        return self.header(role) + self.encode(content) + [self.im_end] + self._newline

    def prompt(self, messages: list[tuple[str, str]]) -> list[int]:
        """Ids of ``messages`` followed by the assistant generation header (after the template's
        default system message when ``messages`` opens with none)."""
        if self.default_system is not None and (not messages or messages[0][0] != "system"):
            messages = [("system", self.default_system), *messages]
        ids: list[int] = []
        for role, content in messages:
            ids += self.message(role, content)
        return ids + self.header("assistant")

    def after_assistant(self) -> list[int]:
        """Ids that close an assistant turn whose content ended with ``<|im_end|>``."""
        return self._newline

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def _default_system(tokenizer) -> str | None:
    """The system message ``tokenizer``'s chat template adds to a conversation that has none, if any."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    marker = "\x00user\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    head = f"{IM_START}system\n"
    if not text.startswith(head) or marker not in text:
        return None
    return text[len(head) : text.index(IM_END)]
