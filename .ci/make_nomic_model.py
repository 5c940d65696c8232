#!/usr/bin/env python3
"""A small transformers model of nomic-bert's shape (NomicBertModel: rotary positions,
SwiGLU feed-forward, fused qkv, no biases, post-layer LayerNorms), with seeded random
weights, for llama.cpp's converter: no registry package ships a nomic-bert GGUF.

Usage: make_nomic_model.py MINILM_DIR OUT_DIR
MINILM_DIR is all-MiniLM-L6-v2 (build_embed_model.sh unpacks it): its WordPiece tokenizer
files and its sentence-transformers pooling (mean) are copied; its weights are not used.
The weights come from numpy's PCG64 with a fixed seed, so the output is the same everywhere.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

SEED = 18
D_MODEL, HEADS, LAYERS, FF, VOCAB, TYPES = 128, 4, 2, 256, 30522, 2
COPIED = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "modules.json", "sentence_bert_config.json", "1_Pooling/config.json"]

CONFIG = {
    "architectures": ["NomicBertModel"],
    "model_type": "nomic_bert",
    "n_embd": D_MODEL,
    "n_head": HEADS,
    "n_layer": LAYERS,
    "n_inner": FF,
    "vocab_size": VOCAB,
    "type_vocab_size": TYPES,
    # The converter maps 2048/2048 to a context of 512 (as nomic-embed-text-v2).
    "n_positions": 2048,
    "max_trained_positions": 2048,
    "activation_function": "swiglu",
    "causal": False,
    "qkv_proj_bias": False,
    "mlp_fc1_bias": False,
    "mlp_fc2_bias": False,
    "prenorm": False,
    "rotary_emb_fraction": 1.0,
    "rotary_emb_interleaved": False,
    "rotary_emb_scale_base": None,
    "rotary_emb_base": 1000,
    "layer_norm_epsilon": 1e-12,
    "pad_token_id": 0,
}


def tensors(rng):
    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(prefix):
        return {
            f"{prefix}.weight": (1.0 + normal((D_MODEL,), 0.1)),
            f"{prefix}.bias": normal((D_MODEL,), 0.1),
        }

    out = {
        "embeddings.word_embeddings.weight": normal((VOCAB, D_MODEL), 0.5),
        "embeddings.token_type_embeddings.weight": normal((TYPES, D_MODEL), 0.5),
        **norm("emb_ln"),
    }
    for layer in range(LAYERS):
        p = f"encoder.layers.{layer}"
        out[f"{p}.attn.Wqkv.weight"] = normal((3 * D_MODEL, D_MODEL), 0.15)
        out[f"{p}.attn.out_proj.weight"] = normal((D_MODEL, D_MODEL), 0.1)
        out[f"{p}.mlp.fc11.weight"] = normal((FF, D_MODEL), 0.1)
        out[f"{p}.mlp.fc12.weight"] = normal((FF, D_MODEL), 0.1)
        out[f"{p}.mlp.fc2.weight"] = normal((D_MODEL, FF), 0.1)
        out.update(norm(f"{p}.norm1"))
        out.update(norm(f"{p}.norm2"))
    return out


def main():
    minilm, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(minilm / name, out / name)
    (out / "config.json").write_text(json.dumps(CONFIG, indent=1) + "\n")
    save_file(tensors(np.random.Generator(np.random.PCG64(SEED))), str(out / "model.safetensors"))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
