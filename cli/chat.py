"""`chat.py`: talk with a trained model in the terminal; each answer streams as it is decoded.

Every turn renders the whole conversation with the chat template (`minigpt.data.chat.template`), the form
fine-tuning trained on: a model fine-tuned with `sft.yaml` reads the role markers as their ids and
ends its answer with the end marker; a base model gets the template's plain speaker turns and its
answer ends at a blank line. The prompt is computed again each turn rather than continuing a KV
cache from the last one: filling the cache with the whole prompt is one forward pass, small beside
decoding the answer a token at a time.

Ctrl-C while an answer streams stops it and keeps what was shown of it in the conversation, as the
model's answer; Ctrl-C at the prompt leaves with exit code 130 (128 + SIGINT, as shells report a
command stopped by Ctrl-C), /quit and Ctrl-D with 0.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from minigpt.checkpoints import load_model
from minigpt.common import UsageError, one_line
from minigpt.common.text import TextStream
from minigpt.data import DataError, Tokenizer
from minigpt.data.chat.template import ChatPrompt, ChatTemplateText, chat_prompt
from minigpt.data.tokenizer import ChatTokenizer
from minigpt.model import GPT, generate_tokens, optimize_for_decoding
from minigpt.training.config import SampleConfig

from .command import USER_ERRORS, options_parser, parse_options, report

PROMPT = "you> "
INTERRUPTED = 130
"""Exit code of Ctrl-C at the prompt: 128 + SIGINT."""
HELP = """\
/reset        forget the conversation; the system message stays
/system TEXT  set the system message and start over (/system alone removes it)
/help         this list
/quit         leave (Ctrl-D too; Ctrl-C at the prompt leaves with exit code 130)
Ctrl-C while an answer streams stops it; what was shown stays in the conversation.
A line starting with // is sent as a message starting with /."""
COMMANDS = ("reset", "system", "help", "quit")


@dataclass(frozen=True)
class ChatOptions:
    """Which model to talk with, where, and what to show."""

    checkpoint: str
    """A run folder (its best checkpoint), a .ckpt or exported .safetensors file, or a Hugging Face
    folder: a model fine-tuned on conversations (train.py --config sft.yaml), or a base model."""
    system: str | None = None
    """The system message the conversation starts with (None: none); /system changes it."""
    show_prompt: bool = False
    """Print the prompt the model is given before each answer (to stderr), markers spelled out."""
    device: str = "auto"
    """cpu, cuda, cuda:1, ... (auto: cuda when available)."""
    cache: bool = True
    """Reuse each step's keys and values (the KV cache); --no_cache recomputes the whole window
    every step, which gives the same tokens, slower."""
    tokenizer_path: str | None = None
    """GPT-2's r50k_base.tiktoken ranks file, on machines that cannot fetch it."""


@dataclass(frozen=True)
class Command:
    """A line that starts with /: what to do, and the text after the command's name."""

    name: str
    argument: str = ""


def parse_line(line: str) -> Command | str | None:
    """What a typed line asks for: a `Command`, a message (its text), or None for a blank line.

    Raises:
        UsageError: An unknown command, or an argument to a command that takes none.
    """
    text = line.strip()
    if not text:
        return None
    if text.startswith("//"):
        return text[1:]
    if not text.startswith("/"):
        return text
    name, _, argument = text[1:].partition(" ")
    if name not in COMMANDS:
        raise UsageError(f"unknown command /{name}: /help lists the commands")
    if argument.strip() and name != "system":
        raise UsageError(f"/{name} takes no argument")
    return Command(name, argument.strip())


@dataclass
class Conversation:
    """The system message and the turns so far, each a message and the model's answer."""

    system: str | None = None
    turns: list[tuple[str, str]] = field(default_factory=list)

    def messages(self, message: str, first_turn: int = 0) -> list[dict[str, str]]:
        """The conversation from turn `first_turn` on, then `message`, as the template takes it."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        turns = [
            {"role": role, "content": text}
            for asked, answered in self.turns[first_turn:]
            for role, text in (("user", asked), ("assistant", answered))
        ]
        return [*system, *turns, {"role": "user", "content": message}]


def turns_to_drop(
    conversation: Conversation,
    message: str,
    prompt_length: Callable[[list[dict[str, str]]], int],
    budget: int,
) -> int:
    """How many of the oldest turns to leave out so that the prompt for `message` is at most
    `budget` tokens long; every turn when even `message` alone (and the system message) is longer."""
    for first in range(len(conversation.turns)):
        if prompt_length(conversation.messages(message, first)) <= budget:
            return first
    return len(conversation.turns)


class ChatFormat:
    """How a conversation becomes the model's prompt (`minigpt.data.chat.chat_prompt`)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tuned = isinstance(tokenizer, ChatTokenizer)
        """Whether the model was fine-tuned on conversations: its tokenizer has the chat markers."""
        self._template = ChatTemplateText.load()

    def prompt(self, messages: Sequence[Mapping[str, str]]) -> ChatPrompt:
        """The prompt for the answer to `messages`, and what ends the answer."""
        return chat_prompt(messages, self.tokenizer, self._template)


class Chat:
    """A conversation with a loaded model, one typed line at a time."""

    def __init__(self, model: GPT, chat_format: ChatFormat, opts: ChatOptions, sample: SampleConfig) -> None:
        self.model = model
        self.format = chat_format
        self.opts = opts
        self.sample = sample
        self.conversation = Conversation(opts.system)
        self.device = model.lm_head.weight.device
        self.generator = torch.Generator(device=self.device).manual_seed(sample.seed)
        self.context = model.config.context_length
        # Old turns go once the prompt leaves less than this for the answer; an answer may still run
        # on past the context, the oldest tokens sliding out of view as in generate.py.
        self.answer_room = min(sample.max_new_tokens, self.context // 2)

    def run(self) -> int:
        """Read lines until /quit, Ctrl-D or Ctrl-C at the prompt; the exit code."""
        if not self.format.tuned:
            note(
                "this model was not fine-tuned to chat (its tokenizer has no chat markers): it continues "
                "a plain transcript, and its answer ends at a blank line"
            )
        note(f"chatting with {self.opts.checkpoint}; /help lists the commands")
        while True:
            try:
                line = input(PROMPT)
            except EOFError:
                print()
                return 0
            except KeyboardInterrupt:
                print()
                return INTERRUPTED
            try:
                entry = parse_line(line)
                if isinstance(entry, Command):
                    if entry.name == "quit":
                        return 0
                    self.command(entry)
                elif entry is not None:
                    self.answer(entry)
            except (UsageError, DataError) as err:
                print(f"error: {one_line(err)}", file=sys.stderr)
            except KeyboardInterrupt:  # before the answer streamed: back to the prompt all the same
                print()

    def command(self, command: Command) -> None:
        if command.name == "help":
            print(HELP)
        elif command.name == "reset":
            self.conversation = Conversation(self.conversation.system)
            note("the conversation starts over")
        elif command.name == "system":
            self.conversation = Conversation(command.argument or None)
            note(f"system message {'set' if command.argument else 'removed'}; the conversation starts over")

    def answer(self, message: str) -> None:
        """Stream the model's answer to `message` and add the turn to the conversation.

        Raises:
            UsageError: The message does not fit the model's context, even alone.
            DataError: The tokenizer cannot encode the message.
        """
        conversation, length = self.conversation, lambda messages: len(self.format.prompt(messages).ids)
        dropped = turns_to_drop(conversation, message, length, self.context - self.answer_room)
        prompt = self.format.prompt(conversation.messages(message, dropped))
        ids = prompt.ids
        if len(ids) > self.context:
            raise UsageError(
                f"the message does not fit: its prompt has {len(ids)} tokens, "
                f"the model's context {self.context}"
            )
        if dropped:
            del conversation.turns[:dropped]
            note(
                f"the conversation outgrew the context of {self.context} tokens: "
                f"dropped its oldest {dropped} turn(s)"
            )
        if self.opts.show_prompt:
            text = self.format.tokenizer.decode(ids)
            print(f"--- prompt, {len(ids)} tokens ---\n{text}\n---", file=sys.stderr, flush=True)
        conversation.turns.append((message, self.stream(prompt)))

    def stream(self, prompt: ChatPrompt) -> str:
        """Write the answer to `prompt` as it is decoded; what was written."""
        shown: list[str] = []
        text = TextStream(self.format.tokenizer.decode, prompt.stop)
        ids = torch.tensor([prompt.ids], device=self.device)
        steps = generate_tokens(
            self.model,
            ids,
            self.sample.max_new_tokens,
            **self.sample.sampling(),
            use_cache=self.opts.cache,
            generator=self.generator,
        )
        interrupted = False
        try:
            for token in steps:
                if token.item() in prompt.stop_ids:
                    break
                write(text.push(token.item()), shown)
                if text.stopped:
                    break
            write(text.flush(), shown)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            steps.close()
        print(flush=True)
        if interrupted:
            note("stopped; the answer so far stays in the conversation")
        return "".join(shown)


def write(piece: str, shown: list[str]) -> None:
    shown.append(piece)
    sys.stdout.write(piece)
    sys.stdout.flush()


def note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr, flush=True)


def chat_main(args: Sequence[str] | None = None) -> int:
    """Parse the command line, load the model, chat. Returns the exit code."""
    parser = options_parser(
        "chat.py",
        "Chat with a trained minigpt model in the terminal; answers stream as they are decoded.",
        ChatOptions,
        SampleConfig,
        skip=frozenset({"prompt"}),  # the conversation is the prompt
        max_new_tokens=200,
        top_k=None,
    )
    try:
        opts, sample = parse_options(parser, args, ChatOptions, SampleConfig)
        device = ("cuda" if torch.cuda.is_available() else "cpu") if opts.device == "auto" else opts.device
        model, tokenizer = load_model(opts.checkpoint, device=device, tokenizer_path=opts.tokenizer_path)
        if device == "cpu":
            optimize_for_decoding(model)
        chat = Chat(model, ChatFormat(tokenizer), opts, sample)
        if sys.stdin.isatty():
            import readline  # noqa: F401  (input() then edits the line and keeps a history)
        return chat.run()
    except USER_ERRORS as err:
        return report(err)
    except KeyboardInterrupt:  # while the model loads, or a second Ctrl-C while an answer stops
        print(file=sys.stderr)
        return INTERRUPTED
