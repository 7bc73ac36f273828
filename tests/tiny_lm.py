"""Tiny causal LMs with random weights, built from configs (no download)."""
import transformers

from helpers import FAKES


def tiny_model(path, positions=4096, seed=0):
    """A byte-level BPE tokenizer trained on the fake train.py and a 1-layer GPT-2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([(FAKES / "curve.py").read_text()] * 4, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")
    fast.save_pretrained(path)
    config = transformers.GPT2Config(vocab_size=tokenizer.get_vocab_size(), n_positions=positions,
                                     n_embd=32, n_layer=1, n_head=2, eos_token_id=0, bos_token_id=0)
    transformers.set_seed(seed)
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    return path


CHARS = list("0123456789 =._:\n") + [chr(c) for c in range(ord("A"), ord("Z") + 1)]


def tiny_char_model(path, seed=0, init=0.02):
    """A character-level tokenizer (digits, '=', '.', capitals) and a 1-layer GPT-2: a small
    action space in which a toy reward is learnt in a few dozen episodes."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(["<|endoftext|>", "<unk>"] + CHARS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tokenizer.decoder = decoders.Fuse()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>",
                                         unk_token="<unk>").save_pretrained(path)
    config = transformers.GPT2Config(vocab_size=len(vocab), n_positions=128, n_embd=32, n_layer=1,
                                     n_head=2, eos_token_id=0, bos_token_id=0, initializer_range=init)
    transformers.set_seed(seed)
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    return path
