"""Tiny real-architecture models with random weights, for the tests (built once per session) and
the benchmarks: a BERT encoder with a WordPiece tokenizer trained on a few dozen lines
(ENVIRONMENT.md's recipe), a classifier, a cross-encoder, M2M100 and Marian translators (Marian's
embeddings tied or not), and Llama and GPT-2 causal LMs with a byte-level BPE tokenizer and a
chat template."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

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
    tok.train_from_iterator(
        CORPUS, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials)
    )
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[(s, tok.token_to_id(s)) for s in ("[CLS]", "[SEP]")],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=64,
    )
    fast.save_pretrained(out)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    BertModel(config).eval().save_pretrained(out)
    return out


# A few dozen short English lines for the translation fixtures' sentencepiece model.
SEQ2SEQ_CORPUS = list(dict.fromkeys(CORPUS)) + [
    "good morning, how are you today?",
    "the weather is nice and warm",
    "please send me the report by friday",
    "water boils at one hundred degrees",
    "she reads a book every week",
    "the children play in the park",
    "we need more time to finish the work",
    "open the door and close the window",
]


def _train_spm(out: Path, lines: list[str], vocab_size: int = 80) -> Path:
    import sentencepiece as spm

    model_prefix = out / "spm"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(model_prefix),
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        model_type="unigram",
        character_coverage=1.0,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        unk_id=0,
        minloglevel=2,
    )
    return model_prefix.with_suffix(".model")


def _spm_vocab(spm_path: Path, specials: list[str]) -> dict[str, int]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    vocab = {s: i for i, s in enumerate(specials)}
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    return vocab


def build_tiny_m2m100(out: Path, seed: int = 0, src_lang: str = "en", tgt_lang: str = "sw") -> Path:
    """Save a 2+2-layer M2M100 (d_model 16) with its sentencepiece tokenizer to `out`."""
    import json
    import shutil

    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer

    out.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.name}-spm"
    work.mkdir(exist_ok=True)
    spm_path = _train_spm(work, SEQ2SEQ_CORPUS)
    vocab = _spm_vocab(spm_path, ["<s>", "<pad>", "</s>", "<unk>"])
    (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    shutil.copyfile(spm_path, work / "sentencepiece.bpe.model")
    tok = M2M100Tokenizer(
        str(work / "vocab.json"),
        str(work / "sentencepiece.bpe.model"),
        src_lang=src_lang,
        tgt_lang=tgt_lang,
        model_max_length=64,
    )
    tok.save_pretrained(out)
    shutil.rmtree(work)
    torch.manual_seed(seed)
    config = M2M100Config(
        vocab_size=len(tok.encoder) + len(tok.lang_token_to_id) + 8,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        init_std=0.6,  # large enough that the translation depends on the source text
    )
    model = M2M100ForConditionalGeneration(config).eval()
    with torch.no_grad():
        # Random weights would mostly emit language tokens (they are most of this tiny vocab):
        # shrink their (tied) output rows so translations are made of ordinary pieces, and lift
        # </s> so some translations end before max_length.
        model.model.shared.weight[len(tok.encoder) :] *= 0.05
        model.model.shared.weight[config.eos_token_id] *= 2.0
    model.generation_config.max_length = 32
    # Exercised by the served decoder too (real seq2seq checkpoints such as Marian set it).
    model.generation_config.no_repeat_ngram_size = 3
    model.save_pretrained(out)
    return out


SENTIMENT_LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def build_tiny_marian(out: Path | str, seed: int = 0, tied: bool = True) -> Path:
    """Save a 2+2-layer MarianMTModel (d_model 16) and its MarianTokenizer to `out`.

    Its final_logits_bias stays all zeros (as MarianMTModel initialises it): OpenVINO's CPU
    plugin folds that Add away when compiling, which gives the decoders' `logits` output a second
    name (`/lm_head/MatMul_output_0`); the served decoder must still find it as `logits`.

    `tied` True keeps Marian's defaults (share_encoder_decoder_embeddings and
    tie_word_embeddings: encoder, decoder and lm_head share one matrix, which optimum's export
    then warns about); False unties the output projection from the embeddings."""
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.name}-spm"
    work.mkdir(exist_ok=True)
    spm_path = _train_spm(work, SEQ2SEQ_CORPUS)
    # Marian's layout: </s> 0, <unk> 1, the pieces, <pad> last (opus-mt: 58100).
    vocab = _spm_vocab(spm_path, ["</s>", "<unk>"])
    vocab["<pad>"] = len(vocab)
    (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    shutil.copyfile(spm_path, work / "source.spm")
    shutil.copyfile(spm_path, work / "target.spm")
    tok = MarianTokenizer(
        str(work / "source.spm"),
        str(work / "target.spm"),
        str(work / "vocab.json"),
        source_lang="en",
        target_lang="de",
        model_max_length=64,
    )
    tok.save_pretrained(out)
    shutil.rmtree(work)
    pad = vocab["<pad>"]
    torch.manual_seed(seed)
    config = MarianConfig(
        vocab_size=len(vocab),
        decoder_vocab_size=len(vocab),
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        bos_token_id=0,
        forced_eos_token_id=0,
        scale_embedding=True,
        static_position_embeddings=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=tied,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        init_std=0.3,  # with no_repeat_ngram_size 3: every corpus line translates differently
    )
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        # Lift </s> so some translations end before max_length (as in M2M100's); tied, this
        # scales the </s> embedding too.
        model.get_output_embeddings().weight[config.eos_token_id] *= 2.2
    # opus-mt's generation config: <pad> is never generated.
    model.generation_config.bad_words_ids = [[pad]]
    model.generation_config.max_length = 32
    model.generation_config.num_beams = 1
    # Tied random embeddings make a post-LN decoder repeat its input token; the served decoder
    # implements this (as for the tiny M2M100).
    model.generation_config.no_repeat_ngram_size = 3
    model.save_pretrained(out)
    return out


def build_tiny_classifier(out: Path, seed: int = 0) -> Path:
    """Save a 2-layer BERT sequence classifier (3 sentiment labels) and its fast tokenizer."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    build_tiny_bert(out, seed=seed)  # the tokenizer (and a base model we replace)
    base = BertConfig.from_pretrained(out)
    config = BertConfig(
        **{
            k: getattr(base, k)
            for k in (
                "vocab_size",
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "intermediate_size",
                "max_position_embeddings",
            )
        },
        id2label=SENTIMENT_LABELS,
        label2id={v: k for k, v in SENTIMENT_LABELS.items()},
        initializer_range=0.5,  # large enough that the label depends on the text
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config).eval()
    with torch.no_grad():  # spread the logits so labels differ between texts
        model.classifier.weight.mul_(4.0)
    model.save_pretrained(out)
    return out


def build_tiny_cross_encoder(out: Path, seed: int = 0) -> Path:
    """Save a 2-layer BERT cross-encoder (one relevance logit) and its fast tokenizer: the shape
    of cross-encoder/ms-marco-MiniLM-L-6-v2, with random weights."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    build_tiny_bert(out, seed=seed)  # the tokenizer (and a base model we replace)
    base = BertConfig.from_pretrained(out)
    config = BertConfig(
        **{
            k: getattr(base, k)
            for k in (
                "vocab_size",
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "intermediate_size",
                "max_position_embeddings",
            )
        },
        num_labels=1,
        initializer_range=0.5,  # large enough that scores depend on the pair
    )
    torch.manual_seed(seed)
    BertForSequenceClassification(config).eval().save_pretrained(out)
    return out


def rerank_pairs() -> list[tuple[str, str]]:
    """(query, passage) pairs: each query with 3 to 6 passages of the corpus, some long."""
    lines = list(dict.fromkeys(CORPUS))
    pairs = []
    for i, query in enumerate(lines[:10]):
        n = 3 + i % 4
        for k in range(n):
            passage = lines[(i * 3 + k * 5 + 1) % len(lines)]
            pairs.append((query, passage if k != 2 else " ".join([passage] * 6)))
    return pairs


# A chat template of the usual shape (role headers, the generation prompt at the end), so the
# served chat path renders what transformers' apply_chat_template renders; with tools, Qwen2's
# (Hermes) way: the functions in the system turn, each call a JSON object in <tool_call> tags,
# a tool's answer in <tool_response> tags.
TINY_CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    "For each function call, return a JSON object with the function name and arguments "
    "within <tool_call></tool_call> tags.<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and tools %}"
    "{% elif message['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ message['content'] }}\n</tool_response><|im_end|>\n"
    "{% elif message.get('tool_calls') %}<|im_start|>assistant\n"
    "{% for call in message['tool_calls'] %}<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_level_tokenizer(vocab_size: int = 300):
    """A GPT-2-style byte-level BPE trained on CORPUS, with <|endoftext|> and chat markers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(
        CORPUS + SEQ2SEQ_CORPUS,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    return tok


def _save_causal(out: Path, model, tok, max_positions: int, eos_boost: float) -> Path:
    import torch
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=max_positions,
        chat_template=TINY_CHAT_TEMPLATE,
        model_input_names=["input_ids", "attention_mask"],
    )
    fast.save_pretrained(out)
    with torch.no_grad():
        # Random weights: spread the output distribution so greedy text depends on the prompt,
        # and lift the end-of-text row a little so some continuations stop early.
        head = model.get_output_embeddings().weight
        head.mul_(3.0)
        head[tok.token_to_id("<|endoftext|>")] *= eos_boost
    model.generation_config.pad_token_id = tok.token_to_id("<|endoftext|>")
    model.eval().save_pretrained(out)
    return out


def build_tiny_llama(
    out: Path,
    seed: int = 0,
    max_positions: int = 128,
    hidden: int = 32,
    layers: int = 2,
    eos_boost: float = 1.5,
) -> Path:
    """Save a 2-layer Llama (hidden 32, grouped-query attention; the benchmark asks for a
    larger one, that never ends early: `eos_boost` 0) with a byte-level BPE tokenizer and a chat
    template to `out`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tok = _byte_level_tokenizer()
    eos = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        tie_word_embeddings=False,
        initializer_range=0.2,
    )
    return _save_causal(out, LlamaForCausalLM(config), tok, max_positions, eos_boost)


def build_tiny_gpt2(out: Path, seed: int = 0, max_positions: int = 128) -> Path:
    """Save a 2-layer GPT-2 (hidden 32) with a byte-level BPE tokenizer to `out`."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    out.mkdir(parents=True, exist_ok=True)
    tok = _byte_level_tokenizer()
    eos = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=tok.get_vocab_size(),
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=max_positions,
        bos_token_id=eos,
        eos_token_id=eos,
        initializer_range=0.2,
        tie_word_embeddings=False,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return _save_causal(out, GPT2LMHeadModel(config), tok, max_positions, eos_boost=1.5)


def kjv_tokenizer(vocab_size: int = 4096):
    """A byte-level BPE of `vocab_size` trained on the shipped King James text, with
    <|endoftext|> and ChatML markers: the tokenizer of the benchmarks' causal LMs."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = Path(__file__).resolve().parents[1] / "releases" / "data" / "kjv-pentateuch.txt"
    lines = [
        ln
        for ln in text.read_text(encoding="utf-8").splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        lines,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return tok


def build_qwen2(
    out: Path,
    seed: int = 0,
    layers: int = 8,
    hidden: int = 512,
    heads: int = 8,
    kv_heads: int = 2,
    vocab_size: int = 4096,
    max_positions: int = 2048,
) -> Path:
    """A Qwen2-architecture causal LM of about 25M parameters by default (8 layers, hidden 512,
    8 heads, 2 KV heads, tied embeddings), random weights, with a byte-level BPE tokenizer of
    `vocab_size` trained on the shipped King James text and a ChatML template: the benchmarks'
    model, of the shape the issue measured."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tok = kjv_tokenizer(vocab_size)
    eos = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        tie_word_embeddings=True,
        initializer_range=0.05,
    )
    return _save_causal(out, Qwen2ForCausalLM(config), tok, max_positions, eos_boost=0.0)


# Ten labels, so that top-5 overlap means something; names as ImageNet's read.
IMAGE_LABELS = {
    i: name
    for i, name in enumerate(
        [
            "tabby cat",
            "espresso",
            "rocket",
            "astronaut",
            "coin",
            "horse",
            "daisy",
            "pagoda",
            "galaxy",
            "cameraman",
        ]
    )
}
# The repository's validation photographs (releases/data/images/LICENSE.md).
PHOTOS = Path(__file__).resolve().parents[1] / "releases" / "data" / "images"


def build_tiny_vit(out: Path, seed: int = 0, image_size: int = 32) -> Path:
    """Save a 2-layer ViT image classifier (ten labels, `image_size` pixels, patches of 8) and
    its image processor (ViT's: resize to the square, rescale, normalise): the shape of
    google/vit-base-patch16-224, with random weights."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    config = ViTConfig(
        image_size=image_size,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        id2label=IMAGE_LABELS,
        label2id={v: k for k, v in IMAGE_LABELS.items()},
        initializer_range=0.2,
    )
    torch.manual_seed(seed)
    model = ViTForImageClassification(config).eval()
    with torch.no_grad():  # spread the logits so labels differ between images
        model.classifier.weight.mul_(8.0)
    model.save_pretrained(out)
    ViTImageProcessor(size={"height": image_size, "width": image_size}).save_pretrained(out)
    return out


def clip_tokenizer(out: Path) -> Any:
    """A CLIP tokenizer (byte-level BPE, lower-cased, `<|startoftext|>` and `<|endoftext|>`) with
    a vocabulary of every byte alone and at a word's end and a few merges: CLIPTokenizerFast's
    own code, a tiny vocabulary, nothing downloaded."""
    from transformers import CLIPTokenizerFast
    from transformers.models.clip.tokenization_clip import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    merges = ["t h", "th e</w>", "o f</w>", "p h", "ph o", "pho t", "phot o</w>"]
    words = ["th", "the</w>", "of</w>", "ph", "pho", "phot", "photo</w>"]
    vocab: dict[str, int] = {}
    for token in [*chars, *(c + "</w>" for c in chars), *words]:
        vocab.setdefault(token, len(vocab))
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    src = out / "bpe"
    src.mkdir(parents=True, exist_ok=True)
    (src / "vocab.json").write_text(json.dumps(vocab))
    (src / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return CLIPTokenizerFast(
        vocab_file=str(src / "vocab.json"), merges_file=str(src / "merges.txt")
    )


def build_tiny_clip(out: Path, seed: int = 0, image_size: int = 32) -> Path:
    """Save a CLIP model (2-layer text and image towers of width 32, images of `image_size`
    pixels in patches of 8, embeddings of 16), its image processor (CLIP's: resize the shorter
    side, center crop, normalise) and its tokenizer, with random weights: the shape of
    openai/clip-vit-base-patch32."""
    import shutil

    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    tokenizer = clip_tokenizer(out)
    shutil.rmtree(out / "bpe")
    config = CLIPConfig(
        text_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "vocab_size": len(tokenizer),
            "max_position_embeddings": 77,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": image_size,
            "patch_size": 8,
        },
        projection_dim=16,
    )
    torch.manual_seed(seed)
    CLIPModel(config).eval().save_pretrained(out)
    CLIPImageProcessor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    ).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# Whisper's special tokens after <|endoftext|>, in the real checkpoints' order: the language
# tokens (99, as whisper-tiny has them; large-v3's <|yue|> is not among them) sit between
# <|startoftranscript|> and <|translate|>, in English-only checkpoints too.
WHISPER_TASK_TOKENS = [
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nospeech|>",
    "<|notimestamps|>",
]
# GPT-2's ids of the symbols Whisper never writes (OpenAI's `non_speech_tokens`, single bytes
# only): the same ids here, since the vocabulary starts with the bytes in GPT-2's order.
WHISPER_SYMBOL_IDS = [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63]
WHISPER_SYMBOL_IDS += [90, 91, 92, 93]


def whisper_tokenizer(out: Path) -> Any:
    """A Whisper tokenizer (WhisperTokenizerFast's own code) over a tiny byte-level BPE: every
    byte in GPT-2's order (so the space, `Ġ`, is 220 as in Whisper), a few merges, then
    <|endoftext|>, Whisper's special tokens and the 1501 timestamp tokens <|0.00|> ... <|30.00|>
    (added tokens that are not special, as the real checkpoints' tokenizers have them)."""
    from tokenizers import AddedToken
    from transformers import WhisperTokenizerFast
    from transformers.models.clip.tokenization_clip import bytes_to_unicode
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    merges = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "e r", "o n", "Ġ s", "r e", "Ġ w"]
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    for merge in merges:
        vocab.setdefault(merge.replace(" ", ""), len(vocab))
    vocab["<|endoftext|>"] = len(vocab)
    src = out / "bpe"
    src.mkdir(parents=True, exist_ok=True)
    (src / "vocab.json").write_text(json.dumps(vocab))
    (src / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    languages = [f"<|{code}|>" for code in LANGUAGES if code != "yue"]
    tok = WhisperTokenizerFast(
        vocab_file=str(src / "vocab.json"),
        merges_file=str(src / "merges.txt"),
        additional_special_tokens=[
            "<|endoftext|>",
            "<|startoftranscript|>",
            *languages,
            *WHISPER_TASK_TOKENS,
        ],
        model_max_length=448,
    )
    shutil.rmtree(src)
    tok.add_tokens(
        [AddedToken(f"<|{i * 0.02:.2f}|>", normalized=False, special=False) for i in range(1501)]
    )
    return tok


def whisper_generation_config(tok: Any, multilingual: bool) -> Any:
    """The generation config of openai/whisper-tiny (`multilingual`) or whisper-tiny.en, with
    this tokenizer's ids: what WhisperForConditionalGeneration.generate reads."""
    from transformers import GenerationConfig

    ids = dict(zip(tok.additional_special_tokens, tok.additional_special_tokens_ids))
    eot, sot = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    extra: dict[str, Any] = {"forced_decoder_ids": [[1, ids["<|notimestamps|>"]]]}
    if multilingual:
        lang_to_id = {t: i for t, i in ids.items() if i > sot and i < ids["<|translate|>"]}
        extra = {
            "forced_decoder_ids": [[1, None], [2, ids["<|transcribe|>"]]],
            "lang_to_id": lang_to_id,
            "task_to_id": {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        }
    return GenerationConfig(
        # OpenAI's tiny has six; here the last decoder layer's two heads.
        alignment_heads=[[1, 0], [1, 1]],
        begin_suppress_tokens=[tok.convert_tokens_to_ids("Ġ"), eot],
        bos_token_id=eot if multilingual else sot,
        decoder_start_token_id=sot,
        eos_token_id=eot,
        pad_token_id=eot,
        is_multilingual=multilingual,
        max_initial_timestamp_index=50,
        max_length=448,
        no_timestamps_token_id=ids["<|notimestamps|>"],
        prev_sot_token_id=ids["<|startofprev|>"],
        return_timestamps=False,
        suppress_tokens=WHISPER_SYMBOL_IDS + [sot, *(ids[t] for t in WHISPER_TASK_TOKENS[:-1])],
        **extra,
    )


def _lift_whisper_text(model: Any, eot: int) -> None:
    """Random weights would mostly write special and timestamp tokens and never <|endoftext|>
    (the padding row, zero at init): shrink the rows of those and of the bytes that are not
    letters or the space, and point <|endoftext|>'s row where the decoder's states lean, so that
    the text differs between clips and some of it ends early. The rows are tied to the decoder's
    input embeddings, as in Whisper."""
    import torch
    from transformers.models.clip.tokenization_clip import bytes_to_unicode

    letters = {ord(" "), *range(ord("A"), ord("Z") + 1), *range(ord("a"), ord("z") + 1)}
    other = [i for i, b in enumerate(bytes_to_unicode()) if b not in letters]
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[eot + 1 :] *= 0.05
        head[other] *= 0.3
        prompt = torch.tensor([[eot + 1, *range(20, 60)]])  # <|startoftranscript|>, then text
        features = torch.zeros(1, model.config.num_mel_bins, 2 * model.config.max_source_positions)
        states = model.model(input_features=features, decoder_input_ids=prompt).last_hidden_state
        lean = states[0].mean(0)
        head[eot] = 1.4 * lean / lean.norm()


# The tests' Whisper: 2+2 layers of width 32 (`sizes` of build_tiny_whisper replace these).
TINY_WHISPER = {
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "init_std": 0.5,  # large enough that the text depends on the audio
}


def build_tiny_whisper(
    out: Path, seed: int = 0, multilingual: bool = False, sizes: dict[str, Any] | None = None
) -> Path:
    """Save a Whisper speech recogniser (TINY_WHISPER's sizes, or `sizes`; 80 mel bins, 1500
    encoder positions: 30 s of audio as the real ones take), its feature extractor (Whisper's
    defaults: 16 kHz, 30 s windows), its tokenizer and generation config, with random weights:
    the shape of openai/whisper-tiny (`multilingual`) or openai/whisper-tiny.en."""
    import torch
    from transformers import (
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
    )

    out.mkdir(parents=True, exist_ok=True)
    tok = whisper_tokenizer(out)
    generation = whisper_generation_config(tok, multilingual)
    config = WhisperConfig(
        vocab_size=len(tok),
        num_mel_bins=80,
        max_source_positions=1500,
        max_target_positions=448,
        bos_token_id=generation.bos_token_id,
        eos_token_id=generation.eos_token_id,
        pad_token_id=generation.pad_token_id,
        decoder_start_token_id=generation.decoder_start_token_id,
        begin_suppress_tokens=generation.begin_suppress_tokens,
        suppress_tokens=generation.suppress_tokens,
        **(TINY_WHISPER if sizes is None else sizes),
    )
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).eval()
    _lift_whisper_text(model, generation.eos_token_id)
    model.generation_config = generation
    model.save_pretrained(out)
    WhisperProcessor(WhisperFeatureExtractor(), tok).save_pretrained(out)
    return out
