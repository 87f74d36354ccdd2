"""chat.py: a conversation in the terminal. Run in a pseudo-terminal (two turns, /reset, Ctrl-C
while an answer streams and at the prompt) and in-process with typed lines on stdin, against
models whose weights are set by hand so that every answer is known exactly; and its pure pieces,
reading a typed line and leaving old turns out to fit the context."""

from __future__ import annotations

import codecs
import fcntl
import os
import select
import signal
import string
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
import torch

import minigpt.cli.chat as chat_module
from minigpt.checkpoints import save_safetensors
from minigpt.cli.chat import Command, Conversation, chat_main, parse_line, turns_to_drop
from minigpt.common import UsageError
from minigpt.data import CharTokenizer
from minigpt.data.tokenizer import ChatTokenizer
from minigpt.model import GPT, GPTConfig

REPO = Path(__file__).resolve().parents[2]
BASE = CharTokenizer.from_texts([string.printable])
TUNED = ChatTokenizer(BASE)
CONTEXT = 64


def hadamard(n: int) -> torch.Tensor:
    """Sylvester's n x n matrix of +-1 (n a power of two): its rows are orthogonal."""
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    return h


def hand_set_gpt(vocab: int, successor: dict[int, int], trigger: int, boosted: int) -> GPT:
    """A one-layer GPT whose greedy choice is the current token's `successor`, until a `trigger`
    is in view; from then on it is `boosted`.

    Each token's embedding is a row of a Hadamard matrix but the first (mean 0, variance 1, and
    orthogonal to the others), which a LayerNorm leaves as it is; positions add nothing. The
    attention's scores are all 0, so it averages over the tokens in view: its value is 1 at a
    `trigger` and 0 elsewhere, and its output the trigger's share s (at least 1/64 once one is in
    view), written along one more Hadamard row. After the last LayerNorm the head scores the
    successor 10 / sqrt(1 + s^2) and `boosted` 1000 s / sqrt(1 + s^2).
    """
    width = 128
    rows = hadamard(width)[1:]
    tokens, signal = rows[:vocab], rows[vocab]
    config = GPTConfig(
        vocab_size=vocab, context_length=CONTEXT, n_layer=1, n_head=1, n_embd=width, tie_weights=False
    )
    model = GPT(config)
    block = model.transformer.h[0]
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        for norm in (block.ln_1, block.ln_2, model.transformer.ln_f):
            norm.weight.fill_(1.0)
        model.transformer.wte.weight.copy_(tokens)
        block.attn.W_value.weight[0] = tokens[trigger] / width
        block.attn.out_proj.weight[:, 0] = signal
        for current, following in successor.items():
            model.lm_head.weight[following] += 10 * tokens[current] / width
        model.lm_head.weight[boosted] += 1000 * signal / width
    return model


def char(c: str) -> int:
    return BASE.encode(c)[0]


@pytest.fixture(scope="module")
def tuned_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model with the chat markers, as `sft.yaml` makes one: it answers "ok" and the end marker,
    or "!" without end once a "!" is in view."""
    successor = {TUNED.ids["assistant"]: char("o"), char("o"): char("k"), char("k"): TUNED.end_id}
    model = hand_set_gpt(TUNED.n_vocab, successor | {char("!"): char("!")}, char("!"), char("!"))
    return save_safetensors(model, TUNED, tmp_path_factory.mktemp("chat") / "tuned.safetensors")


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A base model (no markers): it answers "ok" after the plain template's "ASSISTANT:" line,
    then only line breaks once a "k" is in view."""
    successor = {char("\n"): char("o"), char("o"): char("k"), char("k"): char("\n")}
    model = hand_set_gpt(BASE.n_vocab, successor, char("k"), char("\n"))
    return save_safetensors(model, BASE, tmp_path_factory.mktemp("chat") / "base.safetensors")


def chat(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], lines: list[str], *args: str
) -> tuple[int, str, str]:
    """chat.py in-process with `lines` typed, greedy: the exit code, stdout and stderr."""
    monkeypatch.setattr(sys, "stdin", StringIO("".join(line + "\n" for line in lines)))
    code = chat_main([*args, "--temperature", "0", "--device", "cpu"])
    out, err = capsys.readouterr()
    return code, out, err


def prompts(err: str) -> list[str]:
    """The prompts --show_prompt printed, each between its "--- prompt, N tokens ---" line and "---"."""
    return [block.split("\n", 1)[1].split("\n---\n")[0] for block in err.split("--- prompt, ")[1:]]


def test_each_turn_prompts_with_the_whole_conversation_and_reset_forgets_it(
    tuned_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = ["hi", "yo", "/reset", "hey", "/system Be brief.", "so", "/reset", "ah"]
    code, out, err = chat(monkeypatch, capsys, lines, "--checkpoint", str(tuned_model), "--show_prompt")
    assert code == 0
    assert prompts(err) == [
        "<|user|>hi<|end|><|assistant|>",
        "<|user|>hi<|end|><|assistant|>ok<|end|><|user|>yo<|end|><|assistant|>",
        "<|user|>hey<|end|><|assistant|>",
        "<|system|>Be brief.<|end|><|user|>so<|end|><|assistant|>",
        "<|system|>Be brief.<|end|><|user|>ah<|end|><|assistant|>",
    ]
    assert out.count("ok\n") == 5  # each answer ended at the end marker, not at max_new_tokens
    assert "not fine-tuned" not in err


def test_a_base_model_chats_in_the_plain_template_and_its_turn_ends_at_a_blank_line(
    base_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("--checkpoint", str(base_model), "--show_prompt", "--max_new_tokens", "8")
    code, out, err = chat(monkeypatch, capsys, ["hi", "yo"], *args)
    assert code == 0
    assert err.count("not fine-tuned to chat") == 1
    first, second = prompts(err)
    assert first == "USER:\nhi\n\nASSISTANT:\n"
    # The answer was "ok" and a blank line: the stop is no part of it.
    assert second == "USER:\nhi\n\nASSISTANT:\nok\n\nUSER:\nyo\n\nASSISTANT:\n"
    assert out.startswith("you> ok\n")


def test_ctrl_c_stops_the_answer_which_stays_in_the_conversation(
    tuned_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = chat_module.generate_tokens
    calls: list[int] = []

    def interrupted_once(*args: object, **kwargs: object) -> Iterator[torch.Tensor]:
        calls.append(1)
        for n, token in enumerate(real(*args, **kwargs)):
            if len(calls) == 1 and n == 3:
                raise KeyboardInterrupt  # as Ctrl-C does, mid-answer
            yield token

    monkeypatch.setattr(chat_module, "generate_tokens", interrupted_once)
    args = ("--checkpoint", str(tuned_model), "--show_prompt", "--max_new_tokens", "5")
    code, out, err = chat(monkeypatch, capsys, ["go!", "hi"], *args)
    assert code == 0
    assert "note: stopped; the answer so far stays in the conversation" in err
    assert prompts(err)[1].startswith("<|user|>go!<|end|><|assistant|>!!!<|end|><|user|>hi<|end|>")
    assert out == "you> !!!\nyou> !!!!!\nyou> \n"  # the "!" in view: five, then max_new_tokens


def test_the_oldest_turns_go_when_the_conversation_outgrows_the_context(
    tuned_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each turn of a 20-letter message is 26 tokens; 8 of the 64 are kept for the answer.
    first, second, third = ("a" * 20, "b" * 20, "c" * 20)
    lines = [first, second, third, "x" * 70, "hi"]
    args = ("--checkpoint", str(tuned_model), "--show_prompt", "--max_new_tokens", "8", "--system", "S")
    code, out, err = chat(monkeypatch, capsys, lines, *args)
    assert code == 0
    shown = prompts(err)
    assert len(shown) == 4 and all(prompt.startswith("<|system|>S<|end|><|user|>") for prompt in shown)
    assert first in shown[1] and first not in shown[2] and second in shown[2] and third in shown[2]
    assert err.count("dropped its oldest 1 turn(s)") == 2  # at the third message, and at "hi"
    assert "error: the message does not fit: its prompt has 76 tokens, the model's context 64" in err
    assert out.count("ok\n") == 4


def test_help_lists_the_commands_a_wrong_one_is_one_line_and_quit_leaves(
    tuned_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = chat(
        monkeypatch, capsys, ["/help", "/bogus", "/quit", "hi"], "--checkpoint", str(tuned_model)
    )
    assert code == 0
    assert all(command in out for command in ("/reset", "/system TEXT", "/help", "/quit"))
    assert "error: unknown command /bogus: /help lists the commands\n" in err
    assert out.count("you> ") == 3  # nothing after /quit was read


def test_a_typed_line_is_a_message_a_command_or_nothing() -> None:
    assert parse_line("  Who art thou? \n") == "Who art thou?"
    assert parse_line("   ") is None
    assert parse_line("/reset") == Command("reset")
    assert parse_line("/system  Answer in verse. ") == Command("system", "Answer in verse.")
    assert parse_line("/system") == Command("system")
    assert parse_line("//etc/hosts is a file") == "/etc/hosts is a file"
    with pytest.raises(UsageError, match="unknown command /clear: /help lists the commands"):
        parse_line("/clear")
    with pytest.raises(UsageError, match="/quit takes no argument"):
        parse_line("/quit now")


def test_the_oldest_turns_are_dropped_first_and_the_system_message_stays() -> None:
    conversation = Conversation("sys", [("a" * 10, "b" * 10), ("c" * 10, "d" * 10)])

    def length(messages: list[dict[str, str]]) -> int:
        return sum(len(m["content"]) for m in messages)

    assert turns_to_drop(conversation, "q", length, budget=44) == 0
    assert turns_to_drop(conversation, "q", length, budget=43) == 1
    assert conversation.messages("q", 1) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "c" * 10},
        {"role": "assistant", "content": "d" * 10},
        {"role": "user", "content": "q"},
    ]
    assert turns_to_drop(conversation, "q", length, budget=4) == 2
    assert turns_to_drop(conversation, "q" * 100, length, budget=4) == 2  # even alone too long
    assert turns_to_drop(Conversation(), "q", length, budget=0) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--checkpoint", "absent.ckpt"], "absent.ckpt"),
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--prompt", "hi"], "--prompt"),
    ],
)
def test_mistakes_on_the_command_line_are_one_line(
    tuned_model: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert chat_main(["--checkpoint", str(tuned_model), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


class Terminal:
    """A command run in a pseudo-terminal of its own, as a shell runs it: Ctrl-C typed there is
    SIGINT to the command."""

    def __init__(self, command: list[str]) -> None:
        self.master, terminal = os.openpty()
        self.process = subprocess.Popen(
            command,
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
            cwd=REPO,
            env=os.environ | {"TERM": "dumb"},
            start_new_session=True,
            preexec_fn=take_as_controlling_terminal,
        )
        os.close(terminal)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._unread = ""
        self.shown = ""
        """Everything the terminal showed, line ends as "\\n"."""

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def say(self, line: str) -> str:
        """Type `line` and Enter; what the terminal shows until the next prompt."""
        self.type(line + "\r")
        return self.read_until("you> ")

    def read_until(self, text: str, timeout: float = 30.0) -> str:
        """What the terminal shows from the last call on, up to and with `text`."""
        deadline = time.monotonic() + timeout
        while text not in self._unread:
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"no {text!r} on the terminal; it showed:\n{self.shown[-2000:]}")
        end = self._unread.index(text) + len(text)
        seen, self._unread = self._unread[:end], self._unread[end:]
        return seen

    def _read(self, timeout: float) -> bool:
        """Read what there is within `timeout`; False once the command has closed the terminal."""
        if not select.select([self.master], [], [], timeout)[0]:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: no process holds the terminal any more
            data = b""
        text = self._decoder.decode(data)
        self._unread = (self._unread + text).replace("\r\n", "\n")
        self.shown = (self.shown + text).replace("\r\n", "\n")
        return bool(data)

    def exit_code(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while self._read(0.1) and self.process.poll() is None and time.monotonic() < deadline:
            pass
        return self.process.wait(max(deadline - time.monotonic(), 1.0))

    def interrupt_at_the_prompt(self, timeout: float = 30.0) -> int:
        """Ctrl-C at the prompt; its exit code. A Ctrl-C typed the instant the prompt shows can land
        before readline waits for keys, where Python loses it (no person types that fast): while
        the terminal shows nothing after it, it is typed again."""
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            shown = len(self.shown)
            self.type("\x03")
            wait = time.monotonic() + 3.0
            while self.process.poll() is None and time.monotonic() < wait and len(self.shown) == shown:
                self._read(0.1)
            if len(self.shown) > shown:  # it answered the key: it is on its way out
                return self.exit_code(max(deadline - time.monotonic(), 1.0))
        return self.exit_code(1.0)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self.master)


def take_as_controlling_terminal() -> None:
    """In the new session's process: its stdin becomes the session's terminal, and Ctrl-C its
    default, as a shell starts a command. An ignored SIGINT is inherited through exec, and Python
    then leaves it ignored, so when the suite itself ran with SIGINT ignored
    chat.py never saw a Ctrl-C (a command a non-interactive shell starts in the background, as CI
    may start the suite, inherits SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@pytest.mark.slow  # starts chat.py, which imports torch
def test_a_conversation_in_a_terminal(tuned_model: Path) -> None:
    args = ["--checkpoint", str(tuned_model), "--temperature", "0", "--max_new_tokens", "100000"]
    terminal = Terminal([sys.executable, "chat.py", *args, "--show_prompt", "--device", "cpu"])
    try:
        terminal.read_until("you> ")
        assert "<|user|>hi<|end|><|assistant|>\n---\nok\n" in terminal.say("hi")
        second = terminal.say("yo")
        assert "<|user|>hi<|end|><|assistant|>ok<|end|><|user|>yo<|end|><|assistant|>\n---\nok\n" in second
        assert "the conversation starts over" in terminal.say("/reset")
        assert "\n<|user|>so<|end|><|assistant|>\n---\nok\n" in terminal.say("so")
        # A "!" in view: the answer is "!" without end, until Ctrl-C.
        terminal.type("go!\r")
        terminal.read_until("!!!!!!!!!!")
        terminal.type("\x03")
        assert "note: stopped; the answer so far stays in the conversation" in terminal.read_until("you> ")
        terminal.say("/reset")
        assert "\n<|user|>hi<|end|><|assistant|>\n---\nok\n" in terminal.say("hi")
        assert terminal.interrupt_at_the_prompt() == 130
        assert "Traceback" not in terminal.shown and "KeyboardInterrupt" not in terminal.shown
    finally:
        terminal.close()
