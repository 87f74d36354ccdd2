"""The chat template, rendered for training as the server renders it, and the ids the model learns."""

from __future__ import annotations

import string

import pytest

from minigpt.data import DataError
from minigpt.data.chat.template import CHAT_TEMPLATE, ChatEncoder, ChatTemplateText, chat_prompt
from minigpt.data.tokenizer import CharTokenizer, ChatTokenizer, with_chat_tokens
from minigpt.server import DEFAULT_TEMPLATE, ChatTemplate
from minigpt.server.errors import RequestError

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi <|end|> there\n"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Bye?"},
    {"role": "assistant", "content": "Bye!"},
]


@pytest.fixture(scope="module")
def chat_tokenizer() -> ChatTokenizer:
    return with_chat_tokens(CharTokenizer.from_texts([string.printable]))


def test_training_reads_the_template_the_server_applies() -> None:
    assert CHAT_TEMPLATE.resolve() == DEFAULT_TEMPLATE.resolve()
    # Without markers (a base model) both render the plain speaker turns, the same text.
    ours = ChatTemplateText.load().render(CHAT[:4], add_generation_prompt=True)
    assert ours == ChatTemplate.load().text.render(CHAT[:4], add_generation_prompt=True)
    assert ours == (
        "SYSTEM:\nBe brief.\n\nUSER:\nHi <|end|> there\n\n\nASSISTANT:\nHello.\n\nUSER:\nBye?\n\nASSISTANT:\n"
    )


def test_with_markers_each_message_is_marker_text_end(chat_tokenizer: ChatTokenizer) -> None:
    template = ChatTemplateText.load()
    text = template.render(CHAT[:3], add_generation_prompt=False, chat_tokens=chat_tokenizer.markers)
    assert text == "<|system|>Be brief.<|end|><|user|>Hi <|end|> there\n<|end|><|assistant|>Hello.<|end|>"
    prompt = template.render(CHAT[:2], add_generation_prompt=True, chat_tokens=chat_tokenizer.markers)
    assert prompt == "<|system|>Be brief.<|end|><|user|>Hi <|end|> there\n<|end|><|assistant|>"


def test_the_model_learns_the_assistants_turns_only(chat_tokenizer: ChatTokenizer) -> None:
    ids, learned = ChatEncoder(chat_tokenizer).encode(CHAT)
    tok = chat_tokenizer
    assert tok.decode(ids.tolist()) == (
        "<|system|>Be brief.<|end|><|user|>Hi <|end|> there\n<|end|>"
        "<|assistant|>Hello.<|end|><|user|>Bye?<|end|><|assistant|>Bye!<|end|>"
    )
    # Each answer and the end marker that closes it; the markers that open a turn are prompt.
    assert tok.decode(ids[learned].tolist()) == "Hello.<|end|>Bye!<|end|>"
    assert learned.sum() == len("Hello.") + len("Bye!") + 2
    # The user typed "<|end|>": it is text, so the conversation holds exactly five end markers.
    assert (ids == tok.end_id).sum() == 5


def test_the_prompt_is_the_conversation_up_to_the_reply(chat_tokenizer: ChatTokenizer) -> None:
    encoder = ChatEncoder(chat_tokenizer)
    ids, learned = encoder.encode(CHAT)
    prompt = encoder.prompt_ids(CHAT[:4])
    assert prompt == ids[: len(prompt)].tolist()
    assert prompt[-1] == chat_tokenizer.ids["assistant"] and learned[len(prompt) :].all()


def test_templates_that_cannot_train_are_data_errors(chat_tokenizer: ChatTokenizer) -> None:
    refusing = ChatTemplateText("{{ raise_exception('no system messages') }}", name="strict.jinja")
    with pytest.raises(DataError, match="strict.jinja cannot render the conversation: no system messages"):
        ChatEncoder(chat_tokenizer, refusing).encode(CHAT)
    backwards = ChatTemplateText(
        "{% for m in messages | reverse %}{{ m.role }}: {{ m.content }}\n{% endfor %}", name="backwards.jinja"
    )
    with pytest.raises(DataError, match="backwards.jinja does not render a conversation turn by turn"):
        ChatEncoder(chat_tokenizer, backwards).encode(CHAT)
    echoing = ChatTemplateText(
        "{% for m in messages %}{{ m.content }}{{ m.content }}{% endfor %}", name="echo"
    )
    with pytest.raises(DataError, match="echo must write every message's content once, as it is"):
        ChatEncoder(chat_tokenizer, echoing).encode(CHAT)
    with pytest.raises(DataError, match="not a valid Jinja template"):
        ChatTemplateText("{% for %}")
    with pytest.raises(DataError, match="cannot read the chat template nowhere.jinja"):
        ChatTemplateText.load("nowhere.jinja")
    with pytest.raises(DataError, match="unknown role end"):
        ChatEncoder(chat_tokenizer).encode([{"role": "end", "content": "x"}])


def test_a_prompt_is_the_markers_ids_for_a_tuned_model_and_the_plain_text_for_a_base_one(
    chat_tokenizer: ChatTokenizer,
) -> None:
    template = ChatTemplateText.load()
    tuned = chat_prompt(CHAT[:4], chat_tokenizer, template)
    assert tuned.ids == ChatEncoder(chat_tokenizer, template).prompt_ids(CHAT[:4])
    assert chat_tokenizer.ids["end"] in tuned.stop_ids and tuned.stop == ()
    base_tokenizer = CharTokenizer.from_texts([string.printable])
    base = chat_prompt(CHAT[:4], base_tokenizer, template, base_stop=("\n\n", "USER:"))
    assert base.ids == base_tokenizer.encode(template.render(CHAT[:4], add_generation_prompt=True))
    assert base.stop == ("\n\n", "USER:") and chat_tokenizer.ids["end"] not in base.stop_ids


def test_a_template_that_refuses_a_conversation_is_a_data_error_and_the_servers_400() -> None:
    refusing = "{{ raise_exception('no system messages') }}"
    base_tokenizer = CharTokenizer.from_texts([string.printable])
    with pytest.raises(DataError, match="^strict.jinja cannot render the conversation: no system messages$"):
        chat_prompt(CHAT[:4], base_tokenizer, ChatTemplateText(refusing, name="strict.jinja"))
    with pytest.raises(RequestError, match="no system messages") as refused:
        ChatTemplate(refusing).prompt(CHAT[:4], base_tokenizer)
    assert refused.value.status == 400 and refused.value.param == "messages"
