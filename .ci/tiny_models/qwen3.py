"""Qwen3 of Qwen3-0.6B's layout scaled down: per-head q/k RMSNorm, no q/k/v biases, head_dim
128 with n_heads * head_dim != d_model (as in the real family), GQA 2:1, tied head; the
Qwen2.5 tokenizer (Qwen3 uses the same vocabulary and pre-tokenizer)."""

CONFIG = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 151936,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
SEED = 1301
INIT_STD = 0.08
OUTPUT_SCALE = 8.0
TOKENIZER_GGUF = (
    "qwen2.5-coder-0.5b-instruct-awq.Q4_K_M.gguf",
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
OUTTYPE = "f16"


def final_norm(model):
    return model.model.norm
