"""Tiny real-architecture models with random weights, built once per test session: a BERT
encoder with a WordPiece tokenizer trained on a few dozen lines (ENVIRONMENT.md's recipe)."""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a patient with high blood pressure was given medicine",
    "the bank raised interest rates by half a percent",
    "how do i reset my password on this website",
    "the team won the match after extra time",
    "bake the bread at two hundred degrees for forty minutes",
    "the server returned an error when the disk was full",
    "der hund läuft schnell über die wiese",
    "le chat dort sur le canapé",
    "el tren llega a las ocho de la mañana",
    "thanks a lot, that was great!",
    "prices rose 12.5% to $43,210 on tuesday",
    "call me at 555-0100 tomorrow?",
    "new york is a large city",
    "protein folding and gene expression in cells",
    "the court ruled that the contract was void",
] * 4


def build_tiny_bert(out: Path, seed: int = 0, vocab_size: int = 200) -> Path:
    """Save a 2-layer BERT (hidden 32) and its fast WordPiece tokenizer to `out`."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[(s, tok.token_to_id(s)) for s in ("[CLS]", "[SEP]")],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=64,
    )
    fast.save_pretrained(out)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
    )
    BertModel(config).eval().save_pretrained(out)
    return out
