"""The model: loading it (`loading`, `weights_identity`), laying out prompts (`prompt`,
`plain_text`), decoding (`generation`, `text_stream`), and the worker that batches every reply
generated on it (`scheduler`, `batch_kv`), driven for the engine by `runner`."""
