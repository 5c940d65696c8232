//! Tokenizers built from GGUF metadata alone: byte-level BPE and SentencePiece; chat templates.
