"""Our model behind lm-evaluation-harness's `LM` interface, so any of its tasks can score it.

lm-eval asks a model three things: the log-likelihood of a continuation after a context (multiple
choice, LAMBADA), the log-likelihood of a whole text (perplexity tasks), and text generated until a
stop string (generative tasks). `MiniGPTLM` answers them as lm-eval's own `hf` model does for a
decoder-only model, so a GPT-2 exported to the Hugging Face layout scores the same through either:

- a context and its continuation are encoded together and split where the context's tokens end,
  after moving the context's trailing spaces to the continuation (lm-eval's `TemplateLM` does this:
  "Answer:" + " Paris" keeps GPT-2's one token " Paris");
- what does not fit the context window is cropped from the left, keeping the continuation whole;
- an empty context, and the first token of a rolling text, are conditioned on end-of-text (the
  tokenizers without one, `char`, on a line break, the document boundary of their training text);
- generation uses our KV cache, batching prompts of equal length (our model takes no padding mask);
- with lm-eval's chat template on, a prompt is rendered through our one chat template
  (`data/chat/chat_template.jinja`) as fine-tuning renders it: with the role markers, each one id,
  for a model fine-tuned on conversations (its tokenizer has them), in the template's plain
  `USER:`/`ASSISTANT:` form for a base model. lm-eval hands the rendered prompt back as a string,
  so the ids of each marked-up prompt are kept and used for it: a message's text is never read as
  a marker. Generation after such a prompt stops at the end-of-turn marker.

lm-eval is an optional dependency (the `eval` extra); nothing else in minigpt imports this module.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import Collator, handle_stop_sequences, normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from minigpt.data import DataError, Tokenizer
from minigpt.data.chat.template import ChatEncoder, ChatTemplateText
from minigpt.data.tokenizer import ChatTokenizer
from minigpt.model import GPT, generate_tokens

Request = tuple[tuple[str, str] | None, list[int], list[int]]
"""What `_loglikelihood_tokens` scores: (the strings, for lm-eval's cache), context ids, continuation ids."""


class MiniGPTLM(TemplateLM):
    """A trained minigpt model (and its tokenizer) as an lm-eval language model."""

    def __init__(
        self, model: GPT, tokenizer: Tokenizer, batch_size: int = 16, max_gen_toks: int = 256
    ) -> None:
        """
        Args:
            model: The network, in eval mode, on the device it runs on.
            tokenizer: Its tokenizer.
            batch_size: Sequences per forward pass.
            max_gen_toks: Tokens generated when a task does not say how many.
        """
        super().__init__()
        self.model = model
        self.minigpt_tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_gen_toks = max_gen_toks
        self.max_length = model.config.context_length
        self._device = next(model.parameters()).device
        self._prefix = tokenizer.eot_id if tokenizer.eot_id is not None else _single_id(tokenizer, "\n")
        self._chat_prompts: dict[str, list[int]] = {}  # rendered prompt -> its ids, markers as markers

    @property
    def has_chat_markers(self) -> bool:
        """Whether the model was fine-tuned on conversations (its tokenizer has the role markers)."""
        return isinstance(self.minigpt_tokenizer, ChatTokenizer)

    @property
    def tokenizer_name(self) -> str:
        """Names the prompts' form in lm-eval's request cache."""
        return f"minigpt-{self.minigpt_tokenizer.name}" + ("-chat" if self.has_chat_markers else "")

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """The chat template's text of the messages, up to where the assistant's reply begins.

        Raises:
            DataError: A task asks to begin the assistant's reply itself (lm-eval's ``gen_prefix``)
                of a model with markers, which the template would close with the end marker.
        """
        if not self.has_chat_markers:
            return self._template.render(chat_history, add_generation_prompt)
        if not add_generation_prompt:
            raise DataError(
                "a task that begins the assistant's reply (gen_prefix) cannot use the chat markers"
            )
        ids = ChatEncoder(self.minigpt_tokenizer, self._template).prompt_ids(chat_history)
        text = self.tok_decode(ids)
        self._chat_prompts[text] = ids
        return text

    @functools.cached_property
    def _template(self) -> ChatTemplateText:
        return ChatTemplateText.load()

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """A chat prompt's own ids and the reply's, encoded apart as fine-tuning encodes them;
        any other pair as lm-eval encodes it (see the module)."""
        ids = self._chat_prompts.get(context)
        if ids is None:
            return super()._encode_pair(context, continuation)
        return list(ids), self.tok_encode(continuation)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def eot_token_id(self) -> int:
        return self._prefix

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.minigpt_tokenizer.encode(string)

    def tok_decode(self, tokens: list[int], **kwargs) -> str:
        return self.minigpt_tokenizer.decode(tokens)

    # -- log-likelihoods --------------------------------------------------------------------

    @torch.inference_mode()
    def _loglikelihood_tokens(
        self, requests: list[Request], disable_tqdm: bool = False, **kwargs
    ) -> list[tuple[float, bool]]:
        """(sum of the continuation's log-probabilities, whether greedy decoding gives it) per request."""
        # Longest first, as lm-eval's models do: the padding of a batch is then its first row's length.
        order = Collator(requests, sort_fn=lambda r: (-len(r[1]) - len(r[2]), tuple(r[1] + r[2])))
        results = []
        for batch in order.get_batched(n=self.batch_size):
            # The last max_length + 1 tokens: the input drops the last, whose prediction nothing needs.
            inputs = [
                (context + continuation)[-(self.max_length + 1) :][:-1] for _, context, continuation in batch
            ]
            width = max(len(ids) for ids in inputs)
            padded = torch.tensor([ids + [0] * (width - len(ids)) for ids in inputs], device=self.device)
            logprobs = F.log_softmax(
                self.model(padded).float(), dim=-1
            )  # (B, T, V); padding sits to the right
            for (strings, _, continuation), ids, rows in zip(batch, inputs, logprobs, strict=True):
                # The positions that predict the continuation: the last len(continuation) of the input.
                rows = rows[len(ids) - len(continuation) : len(ids)]
                target = torch.tensor(continuation, device=self.device)
                answer = (
                    float(rows.gather(-1, target[:, None]).sum()),
                    bool((rows.argmax(dim=-1) == target).all()),
                )
                results.append(answer)
                if strings is not None:
                    self.cache_hook.add_partial("loglikelihood", strings, answer)
        return order.get_original(results)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each whole text, in windows of the context length that each score
        new tokens only, the first token conditioned on the prefix token."""
        windows: list[tuple[int, Request]] = []
        for index, (text,) in enumerate(request.args for request in requests):
            tokens = self.tok_encode(text)
            pieces = get_rolling_token_windows(tokens, self.prefix_token_id, self.max_length, context_len=1)
            windows += [(index, (None, *make_disjoint_window(piece))) for piece in pieces]
        scores = self._loglikelihood_tokens([window for _, window in windows])
        totals = [0.0] * len(requests)
        for (index, _), (logprob, _) in zip(windows, scores, strict=True):
            totals[index] += logprob
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # -- generation -------------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled, where a task asks) continuations, cut at the first stop string."""
        answers: dict[int, str] = {}
        groups: dict[tuple[str, int, int | None], list[tuple[int, list[int]]]] = {}
        settings: dict[str, dict] = {}
        for index, (context, gen_kwargs) in enumerate(request.args for request in requests):
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            key = json.dumps(kwargs, sort_keys=True, default=str)
            settings[key] = kwargs
            # Room for the tokens to generate, as lm-eval's models leave it; at least one token of context.
            room = max(self.max_length - kwargs["max_gen_toks"], 1)
            chat = self._chat_prompts.get(context)
            ids = (chat or self.tok_encode(context) or [self.prefix_token_id])[-room:]
            stop = self.minigpt_tokenizer.end_id if chat else self.minigpt_tokenizer.eot_id
            groups.setdefault((key, len(ids), stop), []).append((index, ids))
        for (key, _, stop), items in groups.items():
            kwargs = dict(settings[key])
            until = handle_stop_sequences(kwargs.pop("until", None), eos=None)
            for start in range(0, len(items), self.batch_size):
                batch = items[start : start + self.batch_size]
                texts = self._generate([ids for _, ids in batch], until, kwargs, stop)
                for (index, _), text in zip(batch, texts, strict=True):
                    answers[index] = text
                    self.cache_hook.add_partial("generate_until", requests[index].args, text)
        return [answers[i] for i in range(len(requests))]

    def _generate(
        self, prompts: list[list[int]], until: list[str], kwargs: dict, stop: int | None
    ) -> list[str]:
        """Continue prompts of one length together with the KV cache until each has a stop string,
        the `stop` id (end-of-text, or the end of the assistant's turn) or `max_gen_toks` tokens;
        each text cut before its first stop string."""
        temperature = float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample") else 0.0
        generator = torch.Generator(device=self.device).manual_seed(int(kwargs.get("seed", 1234)))
        steps = generate_tokens(
            self.model,
            torch.tensor(prompts, device=self.device),
            kwargs["max_gen_toks"],
            temperature=temperature,
            top_k=kwargs.get("top_k"),
            top_p=kwargs.get("top_p"),
            stop_token=stop,
            generator=generator,
        )
        new: list[list[int]] = [[] for _ in prompts]
        for step in _until_stopped(steps, new, self.minigpt_tokenizer, until, stop):
            for row, token in zip(new, step[:, 0].tolist(), strict=True):
                row.append(token)
        return [_cut(self.tok_decode(ids[: ids.index(stop)] if stop in ids else ids), until) for ids in new]


def _until_stopped(
    steps: Iterator[torch.Tensor],
    new: list[list[int]],
    tokenizer: Tokenizer,
    until: list[str],
    stop: int | None,
):
    """The generation steps, until every row holds the `stop` id or its text a stop string (checked
    as rows grow)."""
    for step in steps:
        yield step
        if until and all(stop in row or any(s in tokenizer.decode(row) for s in until) for row in new):
            return


def _cut(text: str, until: list[str]) -> str:
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text


def _single_id(tokenizer: Tokenizer, text: str) -> int:
    ids = tokenizer.encode(text) if text else []
    if len(ids) != 1:
        raise DataError(f"the {tokenizer.name} tokenizer has no end-of-text token nor one token for {text!r}")
    return ids[0]
