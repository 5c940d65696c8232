"""LFM2 of LFM2-350M's layout scaled down: gated short-convolution blocks (L = 3) and GQA
attention blocks with q/k norms in the real model's opening pattern (conv, conv, attention,
conv, conv, attention), head_dim 64, tied head; the Qwen2.5 tokenizer (LFM2's own is not in
any package here)."""

CONFIG = {
    "model_type": "lfm2",
    "architectures": ["Lfm2ForCausalLM"],
    "vocab_size": 151936,
    "hidden_size": 256,
    "intermediate_size": 1024,
    "block_auto_adjust_ff_dim": True,
    "block_multiple_of": 256,
    "block_ffn_dim_multiplier": 1.0,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "layer_types": ["conv", "conv", "full_attention", "conv", "conv", "full_attention"],
    "conv_L_cache": 3,
    "conv_bias": False,
    "max_position_embeddings": 128000,
    "norm_eps": 1e-5,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "pad_token_id": 151643,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
SEED = 1302
INIT_STD = 0.08
OUTPUT_SCALE = 8.0
TOKENIZER_GGUF = (
    "qwen2.5-coder-0.5b-instruct-awq.Q4_K_M.gguf",
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
OUTTYPE = "f16"


def final_norm(model):
    return model.model.embedding_norm
