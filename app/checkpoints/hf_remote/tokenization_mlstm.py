"""The tokenizer of an mlstm-ds export, for `transformers.AutoTokenizer` (trust_remote_code).

Two kinds, the same ids as mlstm-ds's own tokenizers (both lossless: decode(encode(text)) == text):
- "sentencepiece": the exported tokenizer.model (pad 0, unk 1, bos 2, eos 3, then the pieces);
- "byte": UTF-8 bytes, byte b is id b + 3 (pad 0, bos 1, eos 2), token strings "<0xNN>".
Text is never read as control tokens ("<s>" in a text is its characters), and add_special_tokens puts
the bos token in front, as mlstm-ds does before every document and prompt. Padding is on the left, as
batched generation needs.

A classifier folder whose model reads its texts as OpenAI's encoder did (`feature_preprocess: "openai"`,
an import's) prepares each text the same way before tokenizing it: HTML entities unescaped, newlines as
spaces, stripped, and padded " " + text + " " (mlstm-ds's app/classifier/features.prepare_texts).
"""

import html
from typing import ClassVar

from transformers import PreTrainedTokenizer


class MultiplicativeLSTMTokenizer(PreTrainedTokenizer):
    vocab_files_names: ClassVar[dict] = {"vocab_file": "tokenizer.model"}
    model_input_names: ClassVar[list] = ["input_ids", "attention_mask"]

    def __init__(
        self,
        vocab_file=None,
        tokenizer_type="sentencepiece",
        byte_offset=3,
        feature_preprocess="none",
        **kwargs,
    ):
        if feature_preprocess not in ("none", "openai"):
            raise ValueError(f"feature_preprocess must be 'none' or 'openai', got {feature_preprocess!r}")
        self.feature_preprocess = feature_preprocess
        self.vocab_file = vocab_file
        self.tokenizer_type = tokenizer_type
        self.byte_offset = byte_offset
        if tokenizer_type == "sentencepiece":
            import sentencepiece as spm

            if vocab_file is None:
                raise ValueError("a sentencepiece tokenizer needs its tokenizer.model file")
            self.sp = spm.SentencePieceProcessor(model_file=vocab_file)
            ids = {
                "pad": self.sp.pad_id(),
                "unk": self.sp.unk_id(),
                "bos": self.sp.bos_id(),
                "eos": self.sp.eos_id(),
            }
            self._pieces = [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]
        elif tokenizer_type == "byte":
            self.sp = None
            ids = {"pad": 0, "bos": 1, "eos": 2}
            names = {0: "<pad>", 1: "<s>", 2: "</s>"}
            self._pieces = [names.get(i, "") for i in range(byte_offset)]
            self._pieces += [f"<0x{b:02X}>" for b in range(256)]
        else:
            raise ValueError(f"tokenizer_type must be 'sentencepiece' or 'byte', got {tokenizer_type!r}")
        self._ids = {p: i for i, p in enumerate(self._pieces)}
        for name, i in ids.items():
            kwargs.setdefault(f"{name}_token", self._pieces[i])
        kwargs.setdefault("split_special_tokens", True)
        kwargs.setdefault("padding_side", "left")
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        super().__init__(**kwargs)

    @property
    def vocab_size(self):
        return len(self._pieces)

    def get_vocab(self):
        return dict(self._ids)

    def prepare_for_tokenization(self, text, is_split_into_words=False, **kwargs):
        if self.feature_preprocess == "openai":
            text = " " + html.unescape(text).replace("\n", " ").strip() + " "
        return super().prepare_for_tokenization(text, is_split_into_words=is_split_into_words, **kwargs)

    def _tokenize(self, text, **kwargs):
        if self.sp is not None:
            return self.sp.encode(text, out_type=str)
        return [self._pieces[b + self.byte_offset] for b in text.encode("utf-8")]

    def _convert_token_to_id(self, token):
        return self._ids.get(token, self.unk_token_id if self.unk_token is not None else 0)

    def _convert_id_to_token(self, index):
        return self._pieces[index]

    def convert_tokens_to_string(self, tokens):
        ids = [self._ids[t] for t in tokens if t in self._ids]
        if self.sp is not None:
            specials = {self.pad_token_id, self.bos_token_id, self.eos_token_id}
            return self.sp.decode([i for i in ids if i not in specials])
        data = bytes(i - self.byte_offset for i in ids if i >= self.byte_offset)
        return data.decode("utf-8", errors="replace")

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        ids = [self.bos_token_id, *token_ids_0]
        return ids if token_ids_1 is None else [*ids, self.bos_token_id, *token_ids_1]

    def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens=False):
        if already_has_special_tokens:
            return super().get_special_tokens_mask(token_ids_0, token_ids_1, already_has_special_tokens=True)
        mask = [1] + [0] * len(token_ids_0)
        return mask if token_ids_1 is None else [*mask, 1] + [0] * len(token_ids_1)

    def save_vocabulary(self, save_directory, filename_prefix=None):
        if self.sp is None:
            return ()
        import os

        name = (filename_prefix + "-" if filename_prefix else "") + "tokenizer.model"
        path = os.path.join(save_directory, name)
        if os.path.abspath(path) != os.path.abspath(self.vocab_file):
            with open(path, "wb") as f:
                f.write(self.sp.serialized_model_proto())
        return (path,)
