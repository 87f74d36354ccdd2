"""Fine-tuning on conversations: the data, apart from the pretraining text of `minigpt.data`.

- `template.py`: the one chat template (`chat_template.jinja`, which the server applies too),
  rendered to token ids with the ids the model learns to write.
- `instructions.py`: reading conversations (chats of messages, or Alpaca's instruction rows).
- `conversations.py`: encoding them and packing them into windows.
- `datamodule.py`: `ChatDataModule`, which `minigpt.data` exports.
"""
