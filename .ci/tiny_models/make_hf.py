"""Writes a small transformers model of one architecture, with seeded random weights and a real
tokenizer read from one of the project's GGUFs, into a folder that llama.cpp's
convert_hf_to_gguf.py converts.

Usage: make_hf.py SPEC.py MODELS_DIR OUT_DIR

SPEC.py (one per architecture, beside this file) defines:
  CONFIG         config.json of the model (model_type, architectures and the shape)
  SEED           the torch seed of the weights
  INIT_STD       the normal init's standard deviation (large enough for peaked outputs)
  OUTPUT_SCALE   the final norm's weight: scales the logits so next tokens are clear winners
  TOKENIZER_GGUF (file name in MODELS_DIR, sha256) whose tokenizer the model takes
  OUTTYPE        convert_hf_to_gguf.py's --outtype

and may define TOKENIZER_CLASS, the tokenizer_config.json class its converter expects.
Only the tokenizer kinds below are known; a new kind is a new writer here.
"""

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import torch


def load_spec(path):
    spec = importlib.util.spec_from_file_location("tiny_spec", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def read_tokenizer(gguf_path):
    """The GGUF's tokenizer fields as Python values (gguf-py comes with the converter)."""
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    fields = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            fields[key] = field.contents()
    return fields


def write_gpt2_bpe(fields, out_dir):
    """A byte-level BPE tokenizer (Qwen2's pre-tokenizer): vocab.json and merges.txt of the
    normal tokens, the control and user-defined tokens added after them in id order, and the
    chat template. Unused padding ids are left for the converter, which pads to vocab_size."""
    from tokenizers import AddedToken
    from transformers import Qwen2TokenizerFast

    pre = fields["tokenizer.ggml.pre"]
    if pre != "qwen2":
        raise SystemExit(f"make_hf: no writer for gpt2 tokenizers with pre-tokenizer {pre!r}")
    tokens = fields["tokenizer.ggml.tokens"]
    types = fields["tokenizer.ggml.token_type"]
    normal = {t: i for i, (t, kind) in enumerate(zip(tokens, types)) if kind == 1}
    if sorted(normal.values()) != list(range(len(normal))):
        raise SystemExit("make_hf: the normal tokens are not the first ids")
    (out_dir / "vocab.json").write_text(json.dumps(normal, ensure_ascii=False))
    merges = "\n".join(fields["tokenizer.ggml.merges"])
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + merges + "\n")
    # Special tokens are named only once all are added, so that each gets its GGUF id.
    tok = Qwen2TokenizerFast(
        vocab_file=str(out_dir / "vocab.json"),
        merges_file=str(out_dir / "merges.txt"),
        unk_token=None,
        bos_token=None,
        eos_token=None,
        pad_token=None,
        clean_up_tokenization_spaces=False,
    )
    for i, (text, kind) in enumerate(zip(tokens, types)):
        if kind in (3, 4):
            tok.add_tokens([AddedToken(text, special=kind == 3, normalized=False)])
            if tok.convert_tokens_to_ids(text) != i:
                raise SystemExit(f"make_hf: added token {text!r} did not get id {i}")
    tok.eos_token = tokens[fields["tokenizer.ggml.eos_token_id"]]
    tok.pad_token = tokens[fields["tokenizer.ggml.padding_token_id"]]
    tok.chat_template = fields.get("tokenizer.chat_template")
    tok.save_pretrained(str(out_dir))
    for extra in ("vocab.json", "merges.txt"):
        # tokenizer.json holds them; the converter reads that one.
        (out_dir / extra).unlink(missing_ok=True)


TOKENIZER_WRITERS = {"gpt2": write_gpt2_bpe}


def write_model(spec, out_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**spec.CONFIG, initializer_range=spec.INIT_STD)
    torch.manual_seed(spec.SEED)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    with torch.no_grad():
        # Norm weights start at 1; perturb them too so no path hides a missing norm.
        for name, param in model.named_parameters():
            if param.dim() == 1 and "norm" in name:
                param.mul_(1.0 + 0.1 * torch.randn_like(param))
        final_norm = spec.final_norm(model)
        final_norm.weight.mul_(spec.OUTPUT_SCALE)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    (out_dir / "generation_config.json").unlink(missing_ok=True)


def main():
    spec_path, models_dir, out_dir = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    spec = load_spec(spec_path)
    name, expected = spec.TOKENIZER_GGUF
    source = models_dir / name
    if not source.is_file():
        raise SystemExit(f"make_hf: the tokenizer's GGUF {source} is missing (fetch it first)")
    if sha256_of(source) != expected:
        raise SystemExit(f"make_hf: {source} does not have sha256 {expected}")
    out_dir.mkdir(parents=True, exist_ok=True)
    fields = read_tokenizer(source)
    kind = fields["tokenizer.ggml.model"]
    if kind not in TOKENIZER_WRITERS:
        raise SystemExit(f"make_hf: no writer for {kind!r} tokenizers")
    TOKENIZER_WRITERS[kind](fields, out_dir)

    if tokenizer_class := getattr(spec, "TOKENIZER_CLASS", None):
        # The class name the converter of some architectures reads (Phi-3: GPT2Tokenizer).
        config_path = out_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["tokenizer_class"] = tokenizer_class
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False))
    write_model(spec, out_dir)
    (out_dir / "outtype").write_text(spec.OUTTYPE)


if __name__ == "__main__":
    main()
