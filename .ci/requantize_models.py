#!/usr/bin/env python3
"""Re-quantizes SmolLM2-135M-Instruct (Q4_1) with llama.cpp's own quantizer to the layouts of
Q2_K, Q3_K, IQ4_NL and IQ4_XS: real weights in the new block layouts.

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
        -DGGML_AMX_BF16=OFF" MAKEFLAGS=-j1 pip install llama-cpp-python==0.3.36
    python3 .ci/requantize_models.py [--models DIR] [--out DIR] [--only TYPE --output FILE]

(.ci/build_requantized.sh TYPE OUTPUT WORKDIR does both steps for .ci/fetch_models.py.)

Prints each output's sha256. Every tensor is quantized to the target type (llama-quantize's
--pure): llama.cpp's mixtures would give no tensor of the named type in so small a model (its
Q2_K mixture makes ffn_down Q3_K, its Q3_K_M mixture Q4_K/Q5_K). Tensors whose rows do not fill
whole 256-element blocks (d_model 576) take llama.cpp's own fallback type, as llama-quantize
does: Q4_0 for Q2_K and Q3_K, IQ4_NL for IQ4_XS. So ffn_down (1536 columns) holds the 256-block
types, and the IQ4_NL file holds IQ4_NL everywhere, the embedding included.
"""

import argparse
import ctypes
import hashlib
import pathlib

import llama_cpp

SOURCE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# output suffix: llama_ftype
TARGETS = {
    "Q2_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K,
    "Q3_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M,  # pure: its default type, Q3_K
    "IQ4_NL": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_NL,
    "IQ4_XS": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_XS,
}


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def requantize(source, target, ftype):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.pure = True
    params.nthread = 1
    status = llama_cpp.llama_model_quantize(
        str(source).encode(), str(target).encode(), ctypes.byref(params)
    )
    if status != 0:
        raise SystemExit(f"llama_model_quantize {target.name}: status {status}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="models", type=pathlib.Path)
    parser.add_argument("--out", default="/work/models-requant", type=pathlib.Path)
    parser.add_argument("--only", choices=sorted(TARGETS), help="one type, into --output")
    parser.add_argument("--output", type=pathlib.Path, help="the file --only writes")
    args = parser.parse_args()
    source = args.models / SOURCE
    if args.only:
        if args.output is None:
            raise SystemExit("--only needs --output")
        requantize(source, args.output, TARGETS[args.only])
        print(f"{args.output.name} sha256={sha256(args.output)}")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for name, ftype in TARGETS.items():
        target = args.out / SOURCE.replace("Q4_1", name)
        requantize(source, target, ftype)
        print(f"{target.name} sha256={sha256(target)}")


if __name__ == "__main__":
    main()
